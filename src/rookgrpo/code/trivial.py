"""Trivial programs, and the tests of a problem that one of them passes.

Why: partial credit that counts passing tests pays a program that ignores its input whenever some tests happen to
expect a constant (``False``, ``0``, ``[]``) or the input back. Measured on the 164 HumanEval problems under
``0.5 x pass fraction``, the best constant or echo earned 0.146 of full credit on average, more than 0 on 129 problems
(``benchmarks/bench_code_degenerate.py``).
In a GRPO group where no sample solves the problem, that constant then beats every honest attempt that crashes.

So, per problem, a family of programs that do not compute the answer runs against its tests once (cached in memory
and on disk, keyed by the tests): constants of the common return types, the arguments echoed, and simple transforms
of the first argument (its length, sorted, reversed, negated, ...); for stdin/stdout problems, constant outputs and
the input echoed. A test that any of them passes is *trivial*: passing it shows nothing about the program.
``code_exec`` counts partial credit on the other tests only (:func:`rookgrpo.code.reward.CodeExec`).

All function variants are defined in one program and tested in one sandbox (the tests run once per variant), so a
problem's table costs about one program's run for function tests; stdin/stdout tests run each variant program.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

# Bump when the family changes: cached tables of an older family are not reused.
FAMILY_VERSION = 1

# What a function that ignores its input returns.
CONSTANTS = ("None", "True", "False", "0", "1", "-1", "0.0", "''", "' '", "[]", "{}", "()", "[0]", "'a'")
# Echoes and simple transforms of the arguments (``a``: the positional arguments).
TRANSFORMS = ("a[0]", "a[-1]", "a[1]", "list(a)", "len(a[0])", "sorted(a[0])", "a[0][::-1]", "not a[0]", "bool(a[0])",
              "str(a[0])", "list(a[0])", "abs(a[0])", "-a[0]", "a[0] + 1", "a[0] - 1", "a[0] * 2", "a[0] // 2",
              "a[0] % 2 == 0", "sum(a[0])", "min(a[0])", "max(a[0])", "a[0][0]", "a[0][-1]", "a[0].lower()",
              "a[0].upper()", "a[0].split()", "set(a[0])", "sorted(set(a[0]))", "a[0] + a[1]", "a[0] * a[1]")
EXPRESSIONS = CONSTANTS + TRANSFORMS
# Programs for stdin/stdout tests.
STDIO_PROGRAMS = ("pass", "print()", "print(0)", "print(1)", "print(-1)", "print('YES')", "print('NO')",
                  "import sys\nsys.stdout.write(sys.stdin.read())", "print(input())")


def function_variants() -> tuple[str, list[str]]:
    """(program source, names of its functions): one function per expression of :data:`EXPRESSIONS`.

    >>> code, names = function_variants()
    >>> names[:2], "def __rk_v0__(*a, **k):\\n    return None" in code
    (['__rk_v0__', '__rk_v1__'], True)
    """
    names = [f"__rk_v{i}__" for i in range(len(EXPRESSIONS))]
    code = "\n".join(f"def {name}(*a, **k):\n    return {expr}\n" for name, expr in zip(names, EXPRESSIONS))
    return code, names


def variants_job(spec: dict) -> tuple[str, dict]:
    """The runner job (code, spec) that runs the trivial family against ``spec``'s tests."""
    from .runner import VARIANTS

    if spec.get("type") == "stdio":
        return "", {**spec, VARIANTS: list(STDIO_PROGRAMS)}
    code, names = function_variants()
    return code, {**spec, VARIANTS: names}


def spec_key(spec: dict) -> str:
    """A stable key of a problem's tests and the family version."""
    text = json.dumps({k: v for k, v in spec.items() if not k.startswith("__")}, sort_keys=True)
    return hashlib.sha1(f"{FAMILY_VERSION}\n{text}".encode()).hexdigest()


def cache_file(spec: dict) -> Path:
    from ..assets import cache_dir

    return cache_dir() / "code-trivial" / f"{spec_key(spec)}.json"


def load_cached(spec: dict) -> frozenset[int] | None:
    path = cache_file(spec)
    try:
        return frozenset(json.loads(path.read_text())["trivial"])
    except (OSError, ValueError, KeyError):
        return None


def store_cached(spec: dict, trivial: frozenset[int], by_variant: list[list[int]]) -> None:
    path = cache_file(spec)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"trivial": sorted(trivial), "by_variant": by_variant}))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache only costs the table again next time
