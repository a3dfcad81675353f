"""Code rewards: run the completion's Python against the row's tests in the sandbox (see :mod:`rookgrpo.code`).

- ``code_exec``: 1.0 when every test passes; otherwise partial credit ``0.5 x`` the share of the problem's
  non-trivial tests it passes (tests no trivial program passes, :mod:`rookgrpo.code.trivial`), or 0 in binary mode.
  No code block, a syntax error or a timeout earns 0.
- ``code_format``: 1.0 when the completion holds a fenced Python block, else 0.

Rows need a ``tests`` column (JSON; shapes in :mod:`rookgrpo.code.problems`). The completions of a batch are judged
in parallel by a pool of trusted runner processes, each program in a sandbox of its own (and one per stdin/stdout
case).
"""

from __future__ import annotations

import copy
import functools
import json
import re
from typing import Any

from ..code.pool import get_pool
from ..code.runner import rewrite_asserts
from ..code.sandbox import SandboxLimits, check_mode, require
from ..errors import ConfigError
from ..rewards.registry import register_reward
from ..rewards.utils import completion_text

_FENCE = re.compile(r"```[ \t]*(python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(text: Any) -> str | None:
    """The last fenced code block tagged ``python``/``py`` or bare; ``None`` when there is none.

    >>> extract_code("Here:\\n```python\\nx = 1\\n```\\nand\\n```\\ny = 2\\n```")
    'y = 2\\n'
    >>> extract_code("```js\\nlet x\\n```") is None
    True
    """
    matches = [m for m in _FENCE.finditer(completion_text(text))]
    return matches[-1].group(2) if matches else None


class CodeExec:
    """Run the last fenced Python block against the row's tests. Range [0, 1].

    1.0 when every counted test passes. Otherwise partial credit for behaviour, not coincidence::

        partial_credit x (non-trivial tests passed) / (non-trivial tests counted)

    where a test is trivial when a program that ignores its input passes it (a constant, the arguments echoed, a
    simple transform of them: :mod:`rookgrpo.code.trivial`, run once per problem and cached). A problem whose every
    test is trivial gives no partial credit, only the full 1.0. And a program that behaves trivially gets no partial
    credit whatever it passed: one that gave the same answer to two or more distinct inputs (a constant of any
    value), or handed one of its arguments back on every call (an echo); for stdin/stdout tests, the same output for
    distinct inputs, or the input printed back. ``binary=True``: 0 below a full pass. An assert
    counts only if it exercises the candidate (``assert True`` counts for nothing). No code, a program that does not
    load (syntax error, exit at import), a timeout, or no test that calls the candidate: 0. The verdict is decided by a
    trusted runner process on plain data; the program's sandbox holds no test (:mod:`rookgrpo.code.runner`,
    ``docs/sandbox.md``).

    Worked example: ``sq(x)`` tested on 3 → 9, 1 → 1 and 0 → 0. ``return 1`` passes the second case and the echo
    ``return a[0]`` the second and third, so only the first is non-trivial. ``x * x`` earns 1.0; ``x * 3`` passes the
    first and third cases, 0.5 x 1/1 = 0.5; ``return 9`` passes the first case but answers every input alike, and
    ``return x`` passes the two trivial cases and is an echo: both earn 0 (0.17 and 0.33 under a plain pass
    fraction).

    It fails closed: ``isolation="full"`` (the default) needs bubblewrap with user namespaces, and where this machine
    lacks them the first call (or the trainer, before training) raises a ``ConfigError`` naming what is missing and
    the fix, before any program runs. ``isolation="reduced"`` (``code_sandbox_isolation: reduced`` in a recipe) runs
    programs without bubblewrap on purpose, under the layers docs/sandbox.md lists for that mode.

    Example:
        >>> tests = '{"type": "calls", "entry_point": "sq", "cases": [{"args": [3], "expected": 9}, ' \\
        ...         '{"args": [1], "expected": 1}, {"args": [0], "expected": 0}]}'
        >>> code = ["```python\\ndef sq(x):\\n    return x * x\\n```", "```py\\ndef sq(x):\\n    return x * 3\\n```",
        ...         "```py\\ndef sq(x):\\n    return 9\\n```", "```py\\ndef sq(x):\\n    return x\\n```", "no code"]
        >>> code_exec(["p"] * 5, code, tests=[tests] * 5)
        [1.0, 0.5, 0.0, 0.0, 0.0]
    """

    name = "code_exec"
    required_columns = ("tests",)

    def __init__(self, partial_credit: float = 0.5, binary: bool = False, workers: int | None = None,
                 limits: SandboxLimits = SandboxLimits(), isolation: str = "full"):
        self.partial_credit, self.binary, self.workers, self.limits = partial_credit, binary, workers, limits
        self.isolation = check_mode(isolation, "code_exec isolation")
        self.__name__ = self.name
        self._trivial: dict[str, frozenset[int]] = {}

    def setup(self, args: Any) -> "CodeExec":
        """The trainer's hook, before training: reduced isolation applies when the recipe
        (``code_sandbox_isolation: reduced``) or this reward (``isolation="reduced"``) accepts it, and a machine without
        the layers the mode needs is a ConfigError now, not at the first batch."""
        asked = check_mode(getattr(args, "code_sandbox_isolation", None) or "full", "code_sandbox_isolation")
        mode = "reduced" if "reduced" in (asked, self.isolation) else "full"
        require(mode, "code_exec")
        if mode == self.isolation:
            return self
        reward = copy.copy(self)  # every setting kept, the trivial-test tables shared
        reward.isolation = mode
        return reward

    def pool(self):
        """The runner pool this reward's programs run in; refuses (ConfigError) where its isolation mode cannot be
        had, before any program runs."""
        require(self.isolation, "code_exec")
        return get_pool(self.workers, self.limits, self.isolation)

    def __call__(self, prompts, completions, tests=None, **kwargs) -> list[float | None]:
        if tests is None:
            raise ConfigError("code_exec: the dataset has no 'tests' column (see rookgrpo.code.problems for its shape).")
        jobs, owners, scores = [], [], []
        for i, (completion, spec) in enumerate(zip(completions, tests, strict=True)):
            if spec is None:
                scores.append(None)  # not this reward's row
                continue
            scores.append(0.0)
            code = extract_code(completion)
            if code is None:
                continue
            jobs.append((code, _spec(spec)))
            owners.append(i)
        if not jobs:
            return scores
        pool = self.pool()
        tables = self.trivial_tests([spec for _, spec in jobs], pool) \
            if not (self.binary or self.partial_credit == 0) else [frozenset()] * len(jobs)
        for table, owner, verdict in zip(tables, owners, pool.map(jobs)):
            scores[owner] = self._score(verdict, table)
        return scores

    def check_rows(self, dataset) -> None:
        """Check every row's tests before training (the trainer calls this): a malformed spec, or tests that use a
        helper nothing defines, is a ConfigError naming the row."""
        for i, spec in enumerate(dataset["tests"]):
            if spec is None:
                continue
            try:
                _spec(spec)
            except ConfigError as exc:
                row = dataset[i]
                name = row.get("task_id") or row.get("id") or f"row {i}"
                raise ConfigError(f"train_dataset {name} (row {i}): {exc}") from None
            except (ValueError, TypeError, KeyError) as exc:
                raise ConfigError(f"train_dataset row {i}: its 'tests' cannot be read ({exc}).") from None

    def trivial_tests(self, specs: list[dict], pool=None) -> list[frozenset[int]]:
        """The trivial tests of each spec (:mod:`rookgrpo.code.trivial`): from memory, the disk cache, or one runner
        job per problem not seen before (in parallel)."""
        from ..code import trivial

        keys = [trivial.spec_key(spec) for spec in specs]
        missing = {}
        for key, spec in zip(keys, specs):
            if key not in self._trivial:
                cached = trivial.load_cached(spec)
                if cached is not None:
                    self._trivial[key] = cached
                else:
                    missing[key] = spec
        if missing:
            pool = pool or self.pool()
            for (key, spec), verdict in zip(missing.items(),
                                            pool.map([trivial.variants_job(s) for s in missing.values()])):
                table = frozenset(i for ids in verdict.variant_passed_ids for i in ids)
                self._trivial[key] = table
                if not verdict.timed_out and verdict.variant_passed_ids:
                    trivial.store_cached(spec, table, verdict.variant_passed_ids)
        return [self._trivial[key] for key in keys]

    def _score(self, verdict, trivial: frozenset[int] = frozenset()) -> float:
        """The reward of one verdict, given its problem's trivial tests (:meth:`trivial_tests`)."""
        if verdict.timed_out or not verdict.loaded or verdict.counted == 0:
            return 0.0
        if verdict.passed == verdict.counted:
            return 1.0
        if self.binary or self.partial_credit == 0 or verdict.constant or verdict.echo:
            return 0.0
        counted = [i for i in verdict.counted_ids if i not in trivial]
        if not counted:
            return 0.0
        passed = sum(i not in trivial for i in verdict.passed_ids)
        return self.partial_credit * passed / len(counted)


@functools.lru_cache(maxsize=4096)
def _spec_from_text(text: str) -> dict:
    return _check_spec(json.loads(text))


def _spec(spec: Any) -> dict:
    return _spec_from_text(spec) if isinstance(spec, str) else _check_spec(spec)


def _check_spec(spec: dict) -> dict:
    """Tests are the data set's (trusted), but a malformed row is an error before it reaches a runner."""
    kind = spec.get("type") if isinstance(spec, dict) else None
    if kind == "asserts":
        if rewrite_asserts(spec["code"])[1] == 0:
            raise ConfigError("code_exec: an asserts test has no assert statements.")
        missing = undefined_names(spec["code"], spec.get("prelude") or "", spec.get("entry_point"))
        if missing:
            raise ConfigError(
                f"code_exec: the tests of {spec.get('entry_point') or 'a row'!r} use {', '.join(sorted(missing))}, which "
                "neither the tests, the row's prelude nor the candidate define, so a correct solution would fail "
                "them. Give the row a 'prelude' with the prompt's helper code (rookgrpo.code.problems).")
    elif kind not in ("calls", "stdio"):
        raise ConfigError(f"code_exec: unknown tests type {kind!r} (asserts, calls or stdio).")
    return spec


def undefined_names(tests: str, prelude: str = "", entry_point: str | None = None) -> set[str]:
    """Names the test code reads that nothing defines: not a builtin, not bound in the tests or the prelude (a def,
    class, import, assignment, parameter or loop target), not the entry point.

    >>> sorted(undefined_names("def check(candidate):\\n    assert candidate(1) == helper(2)", entry_point="f"))
    ['helper']
    >>> undefined_names("def check(c):\\n    assert c(1) == helper(2)", prelude="def helper(x): return x")
    set()
    """
    import ast
    import builtins

    defined = set(dir(builtins)) | {entry_point, "__name__"}
    loaded = set()
    for source in (tests, prelude):
        for node in ast.walk(ast.parse(source or "")):
            if isinstance(node, ast.Name):
                (loaded if isinstance(node.ctx, ast.Load) else defined).add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, ast.arg):
                defined.add(node.arg)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                defined.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                defined.add(node.name)
    return {name for name in loaded - defined if name}


def code_format(completions, **kwargs) -> list[float]:
    """1.0 when the completion contains a fenced Python (or bare) code block, else 0.0. Range {0, 1}.

    >>> code_format(["```python\\nprint(1)\\n```", "print(1)"])
    [1.0, 0.0]
    """
    return [1.0 if extract_code(c) is not None else 0.0 for c in completions]


code_exec = register_reward("code_exec")(CodeExec())
register_reward("code_format")(code_format)
