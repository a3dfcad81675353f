"""Code rewards: run the completion's Python against the row's tests in the sandbox (see :mod:`rookgrpo.code`).

- ``code_exec``: 1.0 when every test passes; otherwise partial credit ``0.5 x pass fraction`` (configurable), or
  0 in binary mode. No code block, a syntax error or a timeout earns 0.
- ``code_format``: 1.0 when the completion holds a fenced Python block, else 0.

Rows need a ``tests`` column (JSON; shapes in :mod:`rookgrpo.code.problems`). The completions of a batch run in
parallel in a pool of sandboxes, one process per program (and per stdin/stdout case).
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from ..code.sandbox import SandboxLimits, get_pool, normalize_output, record_passes, rewrite_asserts
from ..errors import ConfigError
from .registry import register_reward
from .utils import completion_text

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


@functools.lru_cache(maxsize=4096)
def _rewritten(tests_code: str) -> tuple[str, int]:
    return rewrite_asserts(tests_code)


class CodeExec:
    """Run the last fenced Python block against the row's tests. Range [0, 1].

    1.0 when all tests pass; else ``partial_credit x (passed / total)`` (default 0.5, so at most 0.5), or 0 with
    ``binary=True``. No code, a syntax error or a timeout: 0.

    Example:
        >>> tests = '{"type": "calls", "entry_point": "sq", "cases": [{"args": [2], "expected": 4}, {"args": [3], "expected": 9}]}'
        >>> good, half = "```python\\ndef sq(x):\\n    return x * x\\n```", "```py\\ndef sq(x):\\n    return 4\\n```"
        >>> code_exec(["p"] * 3, [good, half, "no code"], tests=[tests] * 3)
        [1.0, 0.25, 0.0]
    """

    name = "code_exec"
    required_columns = ("tests",)

    def __init__(self, partial_credit: float = 0.5, binary: bool = False, workers: int | None = None,
                 limits: SandboxLimits = SandboxLimits()):
        self.partial_credit, self.binary, self.workers, self.limits = partial_credit, binary, workers, limits
        self.__name__ = self.name

    def __call__(self, prompts, completions, tests=None, **kwargs) -> list[float | None]:
        if tests is None:
            raise ConfigError("code_exec: the dataset has no 'tests' column (see rookgrpo.code.problems for its shape).")
        jobs, owners, plans = [], [], []
        for i, (completion, spec) in enumerate(zip(completions, tests, strict=True)):
            plan = self._plan(completion, spec)
            plans.append(plan)
            for job, stdin in plan.get("jobs", []):
                jobs.append((job, stdin))
                owners.append(i)
        results = get_pool(self.workers, self.limits).map(jobs) if jobs else []
        per_row: dict[int, list] = {}
        for owner, result in zip(owners, results):
            per_row.setdefault(owner, []).append(result)
        return [self._score(plan, per_row.get(i, [])) for i, plan in enumerate(plans)]

    def _plan(self, completion: Any, spec: Any) -> dict:
        if spec is None:
            return {"skip": True}
        code = extract_code(completion)
        if code is None:
            return {"zero": True}
        try:
            compile(code, "solution.py", "exec")
        except (SyntaxError, ValueError):
            return {"zero": True}
        spec = json.loads(spec) if isinstance(spec, str) else spec
        kind = spec.get("type")
        if kind == "asserts":
            tests_code, total = _rewritten(spec["code"])
            if total == 0:
                raise ConfigError("code_exec: an asserts test has no assert statements.")
            job = {"mode": "asserts", "code": code, "tests": tests_code, "entry_point": spec.get("entry_point")}
            return {"kind": kind, "total": total, "jobs": [(job, "")]}
        if kind == "calls":
            job = {"mode": "calls", "code": code, "entry_point": spec["entry_point"],
                   "calls": [c["args"] for c in spec["cases"]]}
            return {"kind": kind, "total": len(spec["cases"]), "expected": [c["expected"] for c in spec["cases"]],
                    "jobs": [(job, "")]}
        if kind == "stdio":
            cases = spec["cases"]
            return {"kind": kind, "total": len(cases), "expected": [c["output"] for c in cases],
                    "jobs": [({"mode": "program", "code": code}, c["input"]) for c in cases]}
        raise ConfigError(f"code_exec: unknown tests type {kind!r} (asserts, calls or stdio).")

    def _score(self, plan: dict, results: list) -> float | None:
        if plan.get("skip"):
            return None
        if plan.get("zero") or any(r.timed_out for r in results):
            return 0.0
        total = plan["total"]
        if plan["kind"] == "stdio":
            passed = sum(not r.output_exceeded and normalize_output(r.stdout) == normalize_output(expected)
                         for r, expected in zip(results, plan["expected"]))
        else:
            verdicts: dict[int, bool] = {}
            for record in results[0].records:
                if "id" in record and isinstance(record["id"], int) and 0 <= record["id"] < total:
                    expected = plan["expected"][record["id"]] if plan["kind"] == "calls" else None
                    ok = record_passes(record, expected)
                    verdicts[record["id"]] = verdicts.get(record["id"], True) and ok
            passed = sum(verdicts.get(i, False) for i in range(total))  # a test with no record failed
        if passed == total:
            return 1.0
        return 0.0 if self.binary else self.partial_credit * passed / total


def code_format(completions, **kwargs) -> list[float]:
    """1.0 when the completion contains a fenced Python (or bare) code block, else 0.0. Range {0, 1}.

    >>> code_format(["```python\\nprint(1)\\n```", "print(1)"])
    [1.0, 0.0]
    """
    return [1.0 if extract_code(c) is not None else 0.0 for c in completions]


code_exec = register_reward("code_exec")(CodeExec())
register_reward("code_format")(code_format)
