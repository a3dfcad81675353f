"""Code execution with split trust: HumanEval canonical solutions pass, broken ones do not, and a hostile corpus earns 0,
returns in time and leaves nothing behind (no surviving process, no file, socket or IPC object outside the work dir).
"""

import json
import os
import threading
import time
from pathlib import Path

import pytest

from hostile.corpus import HOSTILE, VERDICT_CHANNEL
from hostile.harness import (CASES, CLEAN, FENCED, LIMITS, SQ_TESTS, bubblewrap_hidden, check_hostile, ipc_objects,
                             isolation_mode, survivors)
from rookgrpo.code import wire
from rookgrpo.code.pool import START_MARGIN
from rookgrpo.code.problems import builtin_rows, from_verification_info, humaneval_rows
from rookgrpo.code.runner import Remote, run_job
from rookgrpo.code.sandbox import (
    Sandbox,
    SandboxLimits,
    isolation,
    next_sandbox_uid,
    processes_of_uids,
)
from rookgrpo.code.reward import CodeExec, code_exec, code_format, extract_code



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
    # A body that returns None answers every input alike: it passes the asserts whose right answer is None or falsy
    # (HumanEval/12, 52, 56, 61, 90, 128, 137, 162: e.g. longest([]) is None), and earns nothing for them.
    assert scores == [0.0] * 164
    binary = CodeExec(binary=True)([r["prompt"] for r in humaneval], broken, tests=[r["tests"] for r in humaneval])
    assert binary == [0.0] * 164


def test_builtin_problems_cover_all_test_shapes_and_pass_with_their_solutions():
    rows = builtin_rows()
    assert {json.loads(r["tests"])["type"] for r in rows} == {"asserts", "calls", "stdio"}
    assert code_exec([r["prompt"] for r in rows], [FENCED.format(r["canonical_solution"]) for r in rows],
                     tests=[r["tests"] for r in rows]) == [1.0] * len(rows)


def test_stdio_is_exact_after_trailing_whitespace_no_prefix_match():
    tests = json.dumps({"type": "stdio", "cases": [{"input": "", "output": "42\n"}]})
    outs = ["print(42)", "print('42   ')\nprint()", "print(420)", "print(4)", "print('42\\nextra')"]
    assert code_exec(["p"] * 5, [FENCED.format(o) for o in outs], tests=[tests] * 5) == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_partial_credit_counts_non_trivial_tests_binary_mode_and_zero_cases(tmp_path, monkeypatch):
    """sq(2) == 4 is passed by a program that doubles its input (a simple transform of the trivial family): trivial.
    sq(3) == 9 is not. Partial credit counts sq(3) alone, and a program that answers every input alike or hands its
    input back earns none."""
    monkeypatch.setenv("ROOKGRPO_CACHE", str(tmp_path))
    partial = FENCED.format("def sq(x):\n    return x * 3")  # passes sq(3) only
    doubling = FENCED.format("def sq(x):\n    return x + x")  # passes the trivial sq(2) only
    constant = FENCED.format("def sq(x):\n    return 9")  # passes sq(3), the same answer for 2 and 3
    reward = CodeExec()
    assert reward(["p"] * 3, [partial, doubling, constant], tests=[SQ_TESTS] * 3) == [0.5, 0.0, 0.0]
    assert reward.trivial_tests([json.loads(SQ_TESTS)]) == [frozenset({0})]
    assert len(list((tmp_path / "code-trivial").glob("*.json"))) == 1  # the table is cached on disk
    assert CodeExec(binary=True)(["p"], [partial], tests=[SQ_TESTS]) == [0.0]
    assert CodeExec(partial_credit=0.2)(["p"], [partial], tests=[SQ_TESTS]) == [0.2]
    zero = ["no code here", FENCED.format("def sq(x) return"), FENCED.format("def sq(x):\n    while True: pass")]
    assert CodeExec(limits=SandboxLimits(timeout=2, cpu_seconds=2))(["p"] * 3, zero, tests=[SQ_TESTS] * 3) == [0.0] * 3
    assert code_exec(["p"], [partial], tests=[None]) == [None]  # a row without tests is not this reward's


def test_stdio_constant_and_echo_programs_earn_no_partial_credit():
    tests = json.dumps({"type": "stdio", "cases": [{"input": "3\n", "output": "9\n"}, {"input": "2\n", "output": "4\n"},
                                                   {"input": "1\n", "output": "1\n"}, {"input": "0\n", "output": "0\n"}]})
    programs = ["print(int(input()) ** 2)", "print(9)", "print(input())", "n = int(input())\nprint(n * 3 if n == 3 else n * 2)"]
    # The echo passes 1 -> 1 and 0 -> 0, so those two cases are trivial; the last program passes both others (and
    # 0 -> 0): 0.5 x 2/2. print(9) passes 3 -> 9 with the same output for every input.
    assert code_exec(["p"] * 4, [FENCED.format(p) for p in programs], tests=[tests] * 4) == [1.0, 0.0, 0.0, 0.5]


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

FULL = isolation().bwrap is not None and isolation().root


@pytest.fixture(scope="module")
def listener():
    """A TCP listener on the host's loopback: a sandboxed program that reaches it has network access."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    yield server.getsockname()[1]
    server.close()


# What reduced isolation leaves open where root cannot make namespaces and Landlock stands in (docs/sandbox.md): a
# program sees which paths exist (Landlock does not cover stat) and may create a user namespace.
OPEN_UNDER_LANDLOCK = {"read_the_checkout", "new_user_namespace"}


# The corpus in three modes; in the third, where Landlock stands in, only the programs that reach past their own
# process (the verdict channel's attacks meet the same split trust in every mode, and run in the other two).
CORPUS_RUNS = [(name, mode) for mode in ("full", "reduced", "reduced-no-namespaces") for name in sorted(CASES)
               if mode != "reduced-no-namespaces" or name not in VERDICT_CHANNEL]


@pytest.mark.parametrize("name,mode", CORPUS_RUNS)
def test_hostile_program_earns_zero_and_harms_nothing(name, mode, listener):
    """Reward 0, no exception, in time, nothing left running, no file outside the work dir, no new IPC object, and
    the sandbox that follows is as good as new. ``full``: bubblewrap. ``reduced``: bubblewrap hidden from this process
    and its runners, reduced isolation accepted; as root, rookgrpo makes the namespaces itself. ``reduced-no-
    namespaces``: as where root may not make them (a container without CAP_SYS_ADMIN, or not root): Landlock stands
    in, and the two probes it cannot stop (OPEN_UNDER_LANDLOCK) are pinned as breaches, documented."""
    if not FULL:
        pytest.skip(f"the corpus needs root and bubblewrap; here: {'; '.join(isolation().lost)}")
    assert len(HOSTILE) >= 60
    with isolation_mode(mode) as iso:
        assert (iso.bwrap is None) == (mode != "full")
        if mode == "reduced" and not iso.namespaces or mode == "reduced-no-namespaces" and not iso.landlock:
            pytest.skip(f"{mode} is not to be had here: {'; '.join(iso.lost)}")
        found = check_hostile(name, mode, listener, CodeExec(limits=LIMITS, workers=2,
                                                             isolation="full" if mode == "full" else "reduced"))
    open_breach = mode == "reduced-no-namespaces" and name in OPEN_UNDER_LANDLOCK
    assert found == {**CLEAN, "score": 1.0 if open_breach else 0.0}


def test_program_that_never_reads_a_large_stdin_returns_in_time():
    if not FULL:
        pytest.skip("needs root and bubblewrap")
    tests = json.dumps({"type": "stdio", "cases": [{"input": "x" * (1 << 20), "output": "done"}]})
    program = "import time\ntime.sleep(60)\nprint('done')\n"
    start = time.monotonic()
    reward = CodeExec(limits=LIMITS)
    assert reward(["p"], [FENCED.format(program)], tests=[tests]) == [0.0]
    assert time.monotonic() - start < LIMITS.timeout + START_MARGIN
    assert survivors() == []


def _run_program(program: str, uid: int | None) -> str:
    """``program``'s stdout, run as a script in a fresh sandbox under ``uid``."""
    box = Sandbox(LIMITS, uid)
    try:
        box.start_program(program)
        out, timed_out, _ = box.wait_output(10)
    finally:
        box.close()
    assert not timed_out
    return out.decode()


def test_sandbox_sees_only_the_interpreter_no_network_and_runs_unprivileged():
    if not FULL:
        pytest.skip("needs root and bubblewrap")
    probe = ("import os, socket\nprint(os.getuid(), os.geteuid(), os.getpid())\n"
             "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=2)\n    print('NET')\n"
             "except OSError as e:\n    print('nonet')\n"
             "print(sorted(name for _, name in socket.if_nameindex()))\nprint(sorted(os.listdir('/')))\n"
             "print(open('/proc/self/status').read().split('NoNewPrivs:')[1].split()[0])\n")
    uid = next_sandbox_uid()
    lines = _run_program(probe, uid).splitlines()
    real, effective, pid = (int(x) for x in lines[0].split())
    assert (real, effective) == (uid, uid) and pid < 10  # unprivileged, in its own PID namespace
    assert lines[1] == "nonet" and lines[2] == "['lo']"
    assert lines[3] == str(sorted(["bin", "dev", "lib", "lib64", "proc", "usr", "work"]))
    assert lines[4] == "1"  # no_new_privs


def test_two_jobs_on_one_machine_get_disjoint_sandbox_uids(monkeypatch):
    """ROOKGRPO_SANDBOX_UID_BASE moves a job's uids (its ranks' 64 each after it); a bad value is refused by name."""
    from rookgrpo.code.sandbox import UID_BASE_ENV, UIDS_PER_PROCESS, sandbox_uid_base

    monkeypatch.delenv(UID_BASE_ENV, raising=False)
    monkeypatch.setenv("LOCAL_RANK", "1")
    default = {next_sandbox_uid() for _ in range(UIDS_PER_PROCESS)}
    assert default == set(range(61000 + UIDS_PER_PROCESS, 61000 + 2 * UIDS_PER_PROCESS))
    monkeypatch.setenv(UID_BASE_ENV, "70000")
    moved = {next_sandbox_uid() for _ in range(UIDS_PER_PROCESS)}
    assert moved == set(range(70000 + UIDS_PER_PROCESS, 70000 + 2 * UIDS_PER_PROCESS))
    if os.geteuid() == 0:  # the sandbox runs as the moved uid
        monkeypatch.setenv("LOCAL_RANK", "0")
        assert int(_run_program("import os\nprint(os.getuid())\n", next_sandbox_uid())) in range(70000, 70064)
    for bad in ("abc", "10", "-5"):
        monkeypatch.setenv(UID_BASE_ENV, bad)
        with pytest.raises(ValueError, match=f"{UID_BASE_ENV}={bad!r}: expected a uid of at least 1000"):
            sandbox_uid_base()


RLIMIT_PROBE = ("import resource\nfor name in ('AS', 'CPU', 'FSIZE', 'NOFILE', 'CORE', 'MSGQUEUE', 'NPROC'):\n"
                "    print(name, *resource.getrlimit(getattr(resource, 'RLIMIT_' + name)))\n")


def _probe_rlimits(uid):
    lines = _run_program(RLIMIT_PROBE, uid).splitlines()
    return {name: (int(soft), int(hard)) for name, soft, hard in (line.split() for line in lines)}


def _expected_rlimits(uid):
    mb = 1024 * 1024
    expected = {"AS": LIMITS.memory_mb * mb, "CPU": LIMITS.cpu_seconds, "FSIZE": LIMITS.file_size_mb * mb,
                "NOFILE": LIMITS.open_files, "CORE": 0, "MSGQUEUE": 0}
    if uid is not None:
        expected["NPROC"] = LIMITS.processes
    return {name: (value, value) for name, value in expected.items()}


def test_the_program_runs_under_its_rlimits_and_in_its_cgroup_without_code_between_fork_and_exec():
    """With bubblewrap the spawn runs no Python in the child: the rlimits come from the sandbox's first process
    (soft and hard, so the program cannot raise them), and the child starts inside the run's cgroup because the
    runner forks it from there; the runner itself is back in its own cgroup afterwards."""
    if not FULL:
        pytest.skip("needs root and bubblewrap")
    uid = next_sandbox_uid()
    limits = _probe_rlimits(uid)
    for name, value in _expected_rlimits(uid).items():
        assert limits[name] == value, name
    own = Path("/proc/self/cgroup").read_text()
    # More threads in the starting process than the run's pids limit: only the forking thread may count there.
    release = threading.Event()
    threads = [threading.Thread(target=release.wait, daemon=True) for _ in range(LIMITS.processes + 8)]
    for t in threads:
        t.start()
    box = Sandbox(LIMITS, uid)
    try:
        box.start_calls("def sq(x):\n    return x * x\n")
        if box.cgroup is None:
            pytest.skip("no writable cgroup here")
        assert Path("/proc/self/cgroup").read_text() == own
        inside = box.cgroup.pids()
        assert box.proc.pid in inside and os.getpid() not in inside
        remote = Remote(box, time.monotonic() + LIMITS.timeout)
        assert remote.loaded() and remote.call("sq", (3,), {}) == 9
    finally:
        box.close()
        release.set()


def test_where_the_thread_cannot_find_its_own_cgroup_the_child_joins_the_run_itself(monkeypatch):
    import rookgrpo.code.sandbox.program as program  # where Sandbox asks

    if not FULL:
        pytest.skip("needs root and bubblewrap")
    monkeypatch.setattr(program, "_own_cgroups_known", lambda: False)
    uid = next_sandbox_uid()
    assert _probe_rlimits(uid) == _expected_rlimits(uid)
    box = Sandbox(LIMITS, uid)
    try:
        box.start_calls()
        if box.cgroup is None:
            pytest.skip("no writable cgroup here")
        assert box.proc.pid in box.cgroup.pids() and os.getpid() not in box.cgroup.pids()
    finally:
        box.close()


def test_without_bubblewrap_the_rlimits_are_set_before_exec(monkeypatch):
    with bubblewrap_hidden():
        uid = next_sandbox_uid() if os.geteuid() == 0 else None
        box = Sandbox(LIMITS, uid, isolation="reduced")
        try:
            box.start_program(RLIMIT_PROBE)
            out = box.wait_output(10)[0].decode()
        finally:
            box.close()
    limits = {name: (int(soft), int(hard)) for name, soft, hard in (line.split() for line in out.splitlines())}
    for name, value in _expected_rlimits(uid).items():
        assert limits[name] == value, name


def test_without_bubblewrap_code_exec_refuses_before_any_program_runs(monkeypatch, tmp_path, tiny_model_dir):
    """Fail closed: no bubblewrap and no opt-in is a ConfigError that names the package and the opt-in field, raised
    by the reward's first call (a plain TRL trainer, or a direct call) and by rookgrpo's trainer before training;
    no runner starts and the program never runs."""
    from conftest import tiny_grpo_args
    from datasets import Dataset

    from rookgrpo import ConfigError, RookGRPOTrainer
    from rookgrpo.code.pool import _POOLS

    marker = tmp_path / "ran"
    program = FENCED.format(f"open({str(marker)!r}, 'w').write('x')\ndef sq(x):\n    return x * x\n")
    with bubblewrap_hidden() as iso:
        assert iso.bwrap is None and "apt-get install bubblewrap" in iso.missing
        pools = set(_POOLS)
        for reward in (CodeExec(limits=LIMITS), code_exec):
            with pytest.raises(ConfigError) as refused:
                reward(["p"], [program], tests=[SQ_TESTS])
            message = str(refused.value)
            assert "bubblewrap" in message and "apt-get install bubblewrap" in message
            assert "code_sandbox_isolation: reduced" in message and 'CodeExec(isolation="reduced")' in message
        with pytest.raises(ConfigError, match="code_sandbox_isolation: reduced"):
            Sandbox(LIMITS).start_program("print(1)")
        assert set(_POOLS) == pools and not marker.exists()  # nothing started, nothing ran
        data = Dataset.from_list([{"prompt": "Write sq.", "tests": SQ_TESTS}] * 4)
        with pytest.raises(ConfigError, match=r"(?s)code_exec: refusing.*apt-get install bubblewrap.*code_sandbox"):
            RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=["code_exec"], args=tiny_grpo_args(tmp_path),
                            train_dataset=data)
        if iso.namespaces or os.geteuid() != 0:  # the opt-in builds the trainer and runs the program
            args = tiny_grpo_args(tmp_path, code_sandbox_isolation="reduced")
            trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=["code_exec"], args=args,
                                      train_dataset=data)
            (reward,) = trainer.reward_funcs
            assert reward.isolation == "reduced"
            assert reward(["p"], [FENCED.format("def sq(x):\n    return x * x\n")], tests=[SQ_TESTS]) == [1.0]
            # The opt-in given to the reward in Python holds under a config that leaves the field at its default.
            trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=[CodeExec(isolation="reduced")],
                                      args=tiny_grpo_args(tmp_path), train_dataset=data)
            assert trainer.reward_funcs[0].isolation == "reduced"
    with pytest.raises(ConfigError, match="code_sandbox_isolation: 'none' is not an isolation mode"):
        tiny_grpo_args(tmp_path, code_sandbox_isolation="none")


def test_reduced_isolation_is_reported_and_still_judged(monkeypatch):
    """Without bubblewrap, reduced mode (accepted) still runs and judges the program, and the loss is said plainly;
    as root the program sees the same view as under bubblewrap, without network."""
    with bubblewrap_hidden() as iso:
        assert iso.bwrap is None and any("no bubblewrap" in reason for reason in iso.lost)
        verdict = run_job("def sq(x):\n    return x * x\n", json.loads(SQ_TESTS), LIMITS, isolation="reduced")
        assert (verdict.passed, verdict.counted) == (2, 2)
        if not iso.namespaces:
            assert any("no network, PID, IPC or mount isolation" in reason for reason in iso.lost)
            return
        assert any("made by rookgrpo itself" in reason for reason in iso.lost)
        box = Sandbox(LIMITS, isolation="reduced")
        try:
            box.start_program("import os, socket\nprint(sorted(os.listdir('/')), os.getcwd(), socket.gethostname())\n"
                              "print(sorted(n for _, n in socket.if_nameindex()))\nopen('f', 'w').write('x')\n"
                              "print(os.listdir('.'))")
            out = box.wait_output(10)[0].decode().splitlines()
        finally:
            box.close()
        assert out == [f"{sorted(['bin', 'dev', 'lib', 'lib64', 'usr', 'work'])} /work sandbox", "['lo']", "['f']"]


@pytest.mark.parametrize("name", ["read_the_checkout", "read_etc_files", "list_the_root", "read_site_packages",
                                  "network_connect_loopback", "read_host_proc_cmdlines"])
def test_host_probes_do_detect_a_breach_where_the_layer_is_missing(name, listener):
    """The corpus's probes answer right only when they reach the host: with bubblewrap, rookgrpo's namespaces and
    Landlock all off they do, so their 0 in the corpus test is the isolation's doing, not a probe that cannot
    succeed."""
    if os.geteuid() != 0:
        pytest.skip("the uid drop needs root")
    with bubblewrap_hidden(namespaces=False, landlock=False) as iso:
        assert not iso.namespaces and not iso.landlock
        program = HOSTILE[name].replace("{PORT}", str(listener))
        verdict = run_job(program, json.loads(SQ_TESTS), LIMITS, isolation="reduced")
    assert (verdict.passed, verdict.counted) == (2, 2), verdict


@pytest.mark.parametrize("name", ["write_outside_workdir", "sysv_shared_memory", "posix_message_queue_and_shm",
                                  "setsid_and_sleep_in_function"])
def test_without_namespaces_what_a_program_leaves_is_removed_by_uid(name):
    """Reduced mode with neither namespaces nor Landlock: files, POSIX and SysV IPC objects a program leaves in places
    any user may write, and processes that escaped its session, are found by the sandbox uid and removed at
    teardown."""
    if os.geteuid() != 0:
        pytest.skip("removal by uid needs the uid drop (root)")
    marker_name = f"rookgrpo-leftover-{name}-{os.getpid()}"
    program = HOSTILE[name].replace("{MARK}", f"/tmp/{marker_name}").replace("{NAME}", marker_name)
    with bubblewrap_hidden(namespaces=False, landlock=False) as iso:
        assert not iso.namespaces and not iso.landlock
        tmp_before, ipc_before = set(Path("/tmp").iterdir()), ipc_objects()
        uid = next_sandbox_uid()
        verdict = run_job(program, json.loads(SQ_TESTS), LIMITS, uid=uid, isolation="reduced")
    assert verdict.passed == 0
    assert processes_of_uids({uid}) == []
    assert [p for p in Path("/tmp").iterdir() if p not in tmp_before and "rookgrpo" in p.name] == []
    assert [p for p in (Path(f"/var/tmp/{marker_name}-var"), Path(f"/run/lock/{marker_name}-lock"),
                        Path(f"/dev/shm/{marker_name}-shm"), Path(f"/dev/shm/{marker_name}")) if p.exists()] == []
    assert [o for o in ipc_objects() if o not in ipc_before] == []


def test_wire_rejects_what_is_not_plain_data():
    for value in [None, True, 3, -2.5, float("inf"), "s", b"\x00", 1 + 2j, [1, (2, 3)], {"a": {1, 2}}, frozenset({1})]:
        assert wire.decode(json.loads(wire.dumps({"v": wire.encode(value)}))["v"]) == value
    assert isinstance(wire.decode(wire.encode(object())), wire.Unsupported)
    assert wire.Unsupported("x") != wire.Unsupported("x")
    for raw in [b"[" * 200000, b'{"v": ' + b"9" * 5000 + b"}", b"\xff\xfe", b"[1, 2]", b"{" * 3000]:
        with pytest.raises(wire.WireError):
            wire.loads(raw)
    for data in [{"__t": "tuple"}, {"__t": "dict", "v": [[[], 1]]}, {"__t": "set", "v": [[1]]}, {"x": 1},
                 {"__t": "evil", "v": 1}, {"__t": "bytes", "v": "zz"}]:
        with pytest.raises(wire.WireError):
            wire.decode(data)


def test_tests_that_use_a_helper_nothing_defines_stop_before_training(tiny_model_dir, tmp_path):
    """HumanEval/38's tests call the prompt's encode_cyclic: without the row's prelude a correct solution would score 0
    without a word. The trainer refuses the data before training, naming the row and the name."""
    from datasets import Dataset

    from conftest import tiny_grpo_args
    from rookgrpo import ConfigError, RookGRPOTrainer
    from rookgrpo.code.problems import humaneval_rows

    rows = humaneval_rows()[36:40]
    spec = json.loads(rows[2]["tests"])
    spec.pop("prelude")
    rows[2] = {**rows[2], "tests": json.dumps(spec)}
    data = Dataset.from_list([{"prompt": r["prompt"], "tests": r["tests"], "task_id": r["task_id"]} for r in rows])
    with pytest.raises(ConfigError, match=r"HumanEval/38 \(row 2\).*use encode_cyclic"):
        RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="code_exec", args=tiny_grpo_args(tmp_path),
                        train_dataset=data)
