"""Run the hostile corpus (:mod:`hostile.corpus`) through ``code_exec`` and count what each program got away with.

Shared by the tests (``tests/test_sandbox.py``, one assertion per program and mode) and by the table in
docs/sandbox.md (``benchmarks/bench_sandbox_corpus.py``), so both judge a run the same way. Modes: ``full``
(bubblewrap as installed) and ``reduced`` (bubblewrap hidden from this process and the runners it starts, reduced
isolation accepted on purpose).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from pathlib import Path

from hostile.corpus import HOSTILE, PLAUSIBLE
from rookgrpo.code.pool import START_MARGIN
from rookgrpo.code.sandbox import UIDS_PER_PROCESS, SandboxLimits, processes_of_uids, sandbox_uid_base
from rookgrpo.code.reward import CodeExec

SQ_TESTS = json.dumps({"type": "asserts", "entry_point": "sq",
                       "code": "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(3) == 9\n"})
FENCED = "Here you go:\n```python\n{}\n```\n"
LIMITS = SandboxLimits(timeout=2, cpu_seconds=2, memory_mb=512, workdir_mb=32, output_bytes=64 * 1024)
SANDBOX_UIDS = set(range(sandbox_uid_base(), sandbox_uid_base() + UIDS_PER_PROCESS))  # this process's (LOCAL_RANK 0)
CASES = {**{name: (program, SQ_TESTS) for name, program in HOSTILE.items()},
         **{name: (program, json.dumps(tests)) for name, (program, tests) in PLAUSIBLE.items()}}
PLAUSIBLE_SOLUTIONS = {
    "redefine_prompt_helper_as_identity": "def decode_shift(s):\n    return ''.join(chr((ord(c) - 97 - 5) % 26 + 97) "
                                          "for c in s)\n",
}
CLEAN = {"score": 0.0, "error": None, "late": False, "survivors": [], "files": [], "ipc": [], "solution_after": 1.0}


def ipc_objects() -> list[str]:
    """The host's SysV shared memory segments, semaphores and message queues, one line each, but those created by
    another test worker's sandbox uids: the suite's workers run sandboxes at once, each from its own uid range
    (conftest), so a hostile program on one worker must not count as a leftover of a job on another."""
    from rookgrpo.code.sandbox import SANDBOX_UID_BASE, UIDS_PER_JOB, sandbox_uid_base

    own = range(sandbox_uid_base(), sandbox_uid_base() + UIDS_PER_JOB)
    out = []
    for kind in ("shm", "sem", "msg"):
        try:
            header, *lines = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()
        except (OSError, ValueError):
            continue
        column = header.split().index("cuid")
        for line in lines:
            creator = int(line.split()[column])
            if creator < SANDBOX_UID_BASE or creator in own:
                out.append(line)
    return out


def _tree(pid: int) -> set[int]:
    """``pid`` and its descendants (from /proc's children lists)."""
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        out.add(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
    return out


def survivors(wait: float = 3.0) -> list:
    """Processes whose real or effective uid is a sandbox uid, polled for up to ``wait`` seconds. Not survivors: the
    live pools' idle pre-started sandboxes (waiting for their next program), and zombies whose parent is one of the
    pools' runners (dead, reaped by that runner after its next job). A zombie of any other parent counts: where the
    host's PID 1 does not reap, such zombies pile up under the sandbox uid."""
    from rookgrpo.code.pool import _POOLS

    runners = {str(r.proc.pid) for pool in _POOLS.values() for r in pool.runners if r.proc is not None}
    deadline = time.monotonic() + wait
    while True:
        spares = set().union(*(_tree(pid) for pool in _POOLS.values() for pid in pool.spare_pids()))
        found = [p for p in processes_of_uids(SANDBOX_UIDS, zombies=True)
                 if p[0] not in spares and not any(p[1].endswith(f"(zombie of {r})") for r in runners)]
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


@contextlib.contextmanager
def bubblewrap_hidden(namespaces: bool = True, landlock: bool = True):
    """This process and the runners it starts see no ``bwrap`` (an empty PATH, as on a machine where nobody installed
    it); ``namespaces=False``: nor the namespaces reduced mode makes as root (``ROOKGRPO_REDUCED_NAMESPACES=0``, as
    where root lacks CAP_SYS_ADMIN); ``landlock=False``: nor Landlock (``ROOKGRPO_REDUCED_LANDLOCK=0``, as on an old
    kernel). The isolation probe runs again on entry and on exit."""
    import rookgrpo.code.sandbox as sandbox

    changes = {"PATH": "/nonexistent", "ROOKGRPO_REDUCED_NAMESPACES": None if namespaces else "0",
               "ROOKGRPO_REDUCED_LANDLOCK": None if landlock else "0"}
    old = {name: os.environ.get(name) for name in changes}

    def put(values):
        for name, value in values.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        sandbox.isolation.cache_clear()
        sandbox.landlock_abi.cache_clear()

    put(changes)
    try:
        yield sandbox.isolation()
    finally:
        put(old)


# full: bubblewrap as installed. The others hide it and accept reduced isolation: as root rookgrpo's own namespaces;
# without them, Landlock where the kernel has it; without either, what is left (uid, cgroup, rlimits, removal by uid).
MODES = {"full": None, "reduced": {}, "reduced-no-namespaces": {"namespaces": False},
         "reduced-uid-only": {"namespaces": False, "landlock": False}}


@contextlib.contextmanager
def isolation_mode(mode: str):
    """One of :data:`MODES`, for this process and the runners it starts from now on."""
    from rookgrpo.code.sandbox import isolation

    if MODES[mode] is None:
        yield isolation()
    else:
        with bubblewrap_hidden(**MODES[mode]) as iso:
            yield iso


def _tmp_entries() -> set[Path]:
    """What is in /tmp (where an escaped program writes) and in this process's temporary folder (where sandboxes make
    their work dirs: ``TMPDIR``, one per test worker)."""
    return {p for d in {Path("/tmp"), Path(tempfile.gettempdir())} for p in d.iterdir()}


def check_hostile(name: str, mode: str, port: int, reward: CodeExec) -> dict:
    """Run corpus program ``name`` once through ``reward`` and count what it got away with: a reward above 0, an
    exception from the reward, a reward later than its deadline, processes left under a sandbox uid, files left outside
    the work dir, new SysV IPC objects; and whether a correct solution earns 1.0 right after (:data:`CLEAN` is the
    verdict with nothing got away with). ``port``: a TCP port listening on the host's loopback."""
    marker_name = f"rookgrpo-hostile-{name}-{mode}-{os.getpid()}"
    mark = f"/tmp/{marker_name}"
    program, tests = CASES[name]
    program = program.replace("{MARK}", mark).replace("{NAME}", marker_name).replace("{PORT}", str(port))
    tmp_before, ipc_before = _tmp_entries(), ipc_objects()
    start = time.monotonic()
    try:
        score = reward(["p"], [FENCED.format(program)], tests=[tests])[0]
        error = None
    except Exception as exc:  # noqa: BLE001 (counted: a reward must never raise on a program)
        score, error = None, f"{type(exc).__name__}: {exc}"
    seconds = time.monotonic() - start
    found = survivors()
    leftovers = [p for p in (Path(mark + "-tmp"), Path(mark + "-late"), Path(f"/var/tmp/{marker_name}-var"),
                             Path(f"/run/lock/{marker_name}-lock"), Path(f"/dev/shm/{marker_name}-shm"),
                             Path(f"/dev/shm/{marker_name}"), Path(f"/root/{marker_name}-root"),
                             Path(f"/etc/{marker_name}-etc"), Path(f"/usr/{marker_name}-usr")) if p.exists()]
    from rookgrpo.code.pool import _POOLS

    spares = {Path(d) for pool in _POOLS.values() for d in pool.spare_workdirs()}  # the next job's, waiting
    leftovers += [p for p in _tmp_entries() - tmp_before - spares if "rookgrpo" in p.name]
    ipc = [o for o in ipc_objects() if o not in ipc_before]
    solution = PLAUSIBLE_SOLUTIONS.get(name, "def sq(x):\n    return x * x\n")
    after = reward(["p"], [FENCED.format(solution)], tests=[tests])[0]
    return {"score": score, "error": error, "late": seconds >= reward.limits.timeout + START_MARGIN,
            "survivors": found, "files": [str(p) for p in leftovers], "ipc": ipc, "solution_after": after}
