"""Sandboxed code execution: HumanEval canonical solutions pass, broken ones do not, and a hostile corpus earns 0
and leaves nothing behind (no surviving process, no file outside the work dir)."""

import json
import os
import time
from pathlib import Path

import pytest

from hostile.corpus import HOSTILE
from rookgrpo.code.problems import builtin_rows, from_verification_info, humaneval_rows
from rookgrpo.code.sandbox import SANDBOX_UID_BASE, SandboxLimits, namespaces_available, run_job
from rookgrpo.rewards.code import CodeExec, code_exec, code_format, extract_code

SQ_TESTS = json.dumps({"type": "asserts", "entry_point": "sq",
                       "code": "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(3) == 9\n"})
FENCED = "Here you go:\n```python\n{}\n```\n"


@pytest.fixture(scope="module")
def humaneval():
    return humaneval_rows()


def test_all_humaneval_canonical_solutions_earn_one(humaneval):
    assert len(humaneval) == 164
    scores = code_exec([r["prompt"] for r in humaneval], [FENCED.format(r["canonical_solution"]) for r in humaneval],
                       tests=[r["tests"] for r in humaneval])
    assert scores == [1.0] * 164


def test_humaneval_bodies_replaced_by_pass_earn_less_than_one(humaneval):
    import ast

    broken = []
    for r in humaneval:
        tree = ast.parse(r["canonical_solution"])
        entry = json.loads(r["tests"])["entry_point"]
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == entry:
                node.body = [ast.Pass()]
        broken.append(FENCED.format(ast.unparse(tree)))
    scores = code_exec([r["prompt"] for r in humaneval], broken, tests=[r["tests"] for r in humaneval])
    assert all(s < 1.0 for s in scores)
    assert all(0.0 <= s <= 0.5 for s in scores)  # partial credit is capped at 0.5


def test_builtin_problems_cover_all_test_shapes_and_pass_with_their_solutions():
    rows = builtin_rows()
    assert {json.loads(r["tests"])["type"] for r in rows} == {"asserts", "calls", "stdio"}
    assert code_exec([r["prompt"] for r in rows], [FENCED.format(r["canonical_solution"]) for r in rows],
                     tests=[r["tests"] for r in rows]) == [1.0] * len(rows)


def test_stdio_is_exact_after_trailing_whitespace_no_prefix_match():
    tests = json.dumps({"type": "stdio", "cases": [{"input": "", "output": "42\n"}]})
    outs = ["print(42)", "print('42   ')\nprint()", "print(420)", "print(4)", "print('42\\nextra')"]
    assert code_exec(["p"] * 5, [FENCED.format(o) for o in outs], tests=[tests] * 5) == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_partial_credit_binary_mode_and_zero_cases():
    half = FENCED.format("def sq(x):\n    return 4")
    assert code_exec(["p"], [half], tests=[SQ_TESTS]) == [0.25]
    assert CodeExec(binary=True)(["p"], [half], tests=[SQ_TESTS]) == [0.0]
    assert CodeExec(partial_credit=1.0)(["p"], [half], tests=[SQ_TESTS]) == [0.5]
    zero = ["no code here", FENCED.format("def sq(x) return"), FENCED.format("def sq(x):\n    while True: pass")]
    assert CodeExec(limits=SandboxLimits(timeout=2, cpu_seconds=2))(["p"] * 3, zero, tests=[SQ_TESTS] * 3) == [0.0] * 3
    assert code_exec(["p"], [half], tests=[None]) == [None]  # a row without tests is not this reward's


def test_code_extraction_and_format_reward():
    assert extract_code("```py\na = 1\n```\n```python\nb = 2\n```") == "b = 2\n"
    assert extract_code("```\nc = 3\n```") == "c = 3\n"
    assert extract_code("```javascript\nlet x = 1\n```") is None
    assert code_format(["```python\nx\n```", "x = 1", [{"role": "assistant", "content": "```py\nx\n```"}]]) == [1.0, 0.0, 1.0]


def test_open_r1_verification_info_shapes():
    stdio = from_verification_info({"language": "python", "test_cases": [{"type": "stdin_stdout", "input": "1\n", "output": "2\n"}]})
    assert stdio == {"type": "stdio", "cases": [{"input": "1\n", "output": "2\n"}]}
    calls = from_verification_info('{"test_cases": [{"fn_name": "f", "input": [1, 2], "output": 3}]}')
    assert calls == {"type": "calls", "entry_point": "f", "cases": [{"args": [1, 2], "expected": 3}]}
    assert code_exec(["p"], [FENCED.format("def f(a, b):\n    return a + b")], tests=[json.dumps(calls)]) == [1.0]


# --- hostile corpus -----------------------------------------------------------------------------------------------


def _sandbox_processes(wait: float = 3.0):
    """Live (non-zombie) processes running as a sandbox uid, polled until none remain or ``wait`` runs out."""
    deadline = time.monotonic() + wait
    while True:
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if not SANDBOX_UID_BASE <= entry.stat().st_uid < SANDBOX_UID_BASE + 64:
                    continue
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            if state != "Z":  # a zombie has exited; it only waits for its parent to reap it
                found.append((entry.name, state))
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_program_earns_zero_and_harms_nothing(name, tmp_path):
    if os.geteuid() != 0 or not namespaces_available():
        pytest.skip("full isolation needs root with namespaces (see docs/sandbox.md for what remains otherwise)")
    assert len(HOSTILE) >= 20
    marker_name = f"rookgrpo-hostile-{name}-{os.getpid()}"
    mark = f"/tmp/{marker_name}"
    program = HOSTILE[name].replace("{MARK}", mark).replace("{NAME}", marker_name)
    before = set(Path("/tmp").iterdir())
    reward = CodeExec(limits=SandboxLimits(timeout=4, cpu_seconds=3, memory_mb=512, output_bytes=64 * 1024))
    start = time.monotonic()
    assert reward(["p"], [FENCED.format(program)], tests=[SQ_TESTS]) == [0.0]
    assert time.monotonic() - start < 30
    assert _sandbox_processes() == []  # nothing survives: not the fork bomb, not the setsid grandchild
    leftovers = [p for p in (Path(mark + "-tmp"), Path(mark + "-system"), Path(mark + "-late"),
                             Path(f"/var/tmp/{marker_name}-var"), Path(f"/run/lock/{marker_name}-lock"),
                             Path(f"/dev/shm/{marker_name}-shm"), Path(f"/root/{marker_name}-root"),
                             Path(f"/etc/{marker_name}-etc")) if p.exists()]
    assert leftovers == []
    new_tmp = [p for p in set(Path("/tmp").iterdir()) - before if p.name.startswith("rookgrpo-sandbox-")]
    assert new_tmp == []  # work dirs are removed


def test_sandbox_blocks_network_and_runs_unprivileged():
    if os.geteuid() != 0 or not namespaces_available():
        pytest.skip("needs root with namespaces")
    probe = ("import os, socket\nprint(os.getuid(), os.getgid())\n"
             "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=2)\n    print('NET')\n"
             "except OSError as e:\n    print('nonet', type(e).__name__)\n"
             "print(sorted(name for _, name in socket.if_nameindex()))\n")  # the sandbox's own net namespace
    result = run_job({"mode": "program", "code": probe})
    lines = result.stdout.split("\n")
    assert int(lines[0].split()[0]) >= SANDBOX_UID_BASE and lines[1].startswith("nonet")
    assert lines[2] == "['lo']"
