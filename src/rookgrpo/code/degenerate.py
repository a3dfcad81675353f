"""Programs that do not solve a problem, for measuring what a code reward pays them: degenerate answers (constants,
echoes, ``pass``, raising, an empty block, the prompt copied back) and canonical solutions with one mutation.

Used by ``rookgrpo rewards audit`` on code recipes and by ``benchmarks/bench_code_degenerate.py``.
"""

from __future__ import annotations

import ast

# Degenerate answers for a function problem: (label, body of the entry point; ``a``: the positional arguments).
DEGENERATE = [("return None", "return None"), ("return 0", "return 0"), ("return True", "return True"),
              ("return False", "return False"), ("return []", "return []"), ("return ''", "return ''"),
              ("return 2", "return 2"), ("echo the first argument", "return a[0]"), ("pass", "pass"),
              ("raise ValueError", "raise ValueError()")]


def degenerate_program(entry: str, body: str) -> str:
    """A function ``entry`` that ignores what it is given.

    >>> print(degenerate_program("f", "return 0"))
    def f(*a, **k):
        return 0
    <BLANKLINE>
    """
    return f"def {entry}(*a, **k):\n    {body}\n"


class Mutator(ast.NodeTransformer):
    """Applies one mutation of kind ``kind`` at the first place it fits."""

    FLIP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq}

    def __init__(self, kind: str):
        self.kind, self.done = kind, False

    def visit_Constant(self, node):
        if self.kind == "off_by_one" and not self.done and type(node.value) is int:
            self.done = True
            return ast.copy_location(ast.Constant(node.value + 1), node)
        return node

    def visit_Compare(self, node):
        self.generic_visit(node)
        if self.kind == "flip_comparison" and not self.done and type(node.ops[0]) in self.FLIP:
            self.done = True
            node.ops = [self.FLIP[type(node.ops[0])](), *node.ops[1:]]
        return node

    def visit_If(self, node):
        if self.kind == "negate_if" and not self.done:
            self.done = True
            node.test = ast.UnaryOp(ast.Not(), node.test)
        self.generic_visit(node)
        return node

    def visit_Return(self, node):
        if self.kind == "drop_return" and not self.done and node.value is not None:
            self.done = True
            return ast.copy_location(ast.Return(None), node)
        return node


def mutants(source: str) -> list[tuple[str, str]]:
    """(kind, mutated source) of ``source`` for each mutation that applies.

    >>> [k for k, _ in mutants("def f(x):\\n    if x < 1:\\n        return 0\\n    return x")]
    ['off_by_one', 'flip_comparison', 'negate_if', 'drop_return']
    """
    out = []
    for kind in ("off_by_one", "flip_comparison", "negate_if", "drop_return"):
        tree = ast.parse(source)
        mutator = Mutator(kind)
        tree = ast.fix_missing_locations(mutator.visit(tree))
        if mutator.done:
            out.append((kind, ast.unparse(tree)))
    return out


