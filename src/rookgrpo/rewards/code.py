"""Code rewards: run the completion's Python against the row's tests in the sandbox (see :mod:`rookgrpo.code`).

- ``code_exec``: 1.0 when every test passes; otherwise partial credit ``0.5 x pass fraction`` (configurable), or
  0 in binary mode. No code block, a syntax error or a timeout earns 0.
- ``code_format``: 1.0 when the completion holds a fenced Python block, else 0.

Rows need a ``tests`` column (JSON; shapes in :mod:`rookgrpo.code.problems`). The completions of a batch are judged
in parallel by a pool of trusted runner processes, each program in a sandbox of its own (and one per stdin/stdout
case).
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from ..code.pool import get_pool
from ..code.runner import rewrite_asserts
from ..code.sandbox import SandboxLimits
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


class CodeExec:
    """Run the last fenced Python block against the row's tests. Range [0, 1].

    1.0 when every counted test passes; else ``partial_credit x (passed / counted)`` (default 0.5, so at most 0.5),
    or 0 with ``binary=True``. An assert counts only if it exercises the candidate (``assert True`` counts for
    nothing). No code, a program that does not load (syntax error, exit at import), a timeout, or no test that
    calls the candidate: 0. The verdict is decided by a trusted runner process on plain data; the program's
    sandbox holds no test (see :mod:`rookgrpo.code.runner` and ``docs/sandbox.md``).

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
        for owner, verdict in zip(owners, get_pool(self.workers, self.limits).map(jobs) if jobs else []):
            scores[owner] = self._score(verdict)
        return scores

    def _score(self, verdict) -> float:
        if verdict.timed_out or not verdict.loaded or verdict.counted == 0:
            return 0.0
        if verdict.passed == verdict.counted:
            return 1.0
        return 0.0 if self.binary else self.partial_credit * verdict.passed / verdict.counted


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
    elif kind not in ("calls", "stdio"):
        raise ConfigError(f"code_exec: unknown tests type {kind!r} (asserts, calls or stdio).")
    return spec


def code_format(completions, **kwargs) -> list[float]:
    """1.0 when the completion contains a fenced Python (or bare) code block, else 0.0. Range {0, 1}.

    >>> code_format(["```python\\nprint(1)\\n```", "print(1)"])
    [1.0, 0.0]
    """
    return [1.0 if extract_code(c) is not None else 0.0 for c in completions]


code_exec = register_reward("code_exec")(CodeExec())
register_reward("code_format")(code_format)
