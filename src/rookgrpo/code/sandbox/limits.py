"""The sandbox's resource limits: what one program may use (:class:`SandboxLimits`, applied as rlimits per process
and as a cgroup per run), and the uids sandboxes run under (RLIMIT_NPROC counts per uid, so each sandbox gets its own).

Cgroups: creating and removing a memory cgroup costs the kernel several milliseconds, so each process keeps the empty
ones for its next runs (:func:`take_cgroup`, :func:`give_back_cgroup`) and removes them at exit
(:func:`remove_cgroups`); a killed runner's are removed by whoever starts the next (:func:`remove_stale_cgroups`).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import secrets
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SANDBOX_UID_BASE = 61000  # sandboxes run as uids from here on when started as root (see next_sandbox_uid)
UIDS_PER_PROCESS = 64
UIDS_PER_JOB = 16 * UIDS_PER_PROCESS  # 16 local ranks: the next job's base is at least this far on
#: Two jobs on one machine (two trainings, or test workers) each get their own uids from this variable.
UID_BASE_ENV = "ROOKGRPO_SANDBOX_UID_BASE"
_UIDS = {"next": 0}
_UID_LOCK = threading.Lock()


def sandbox_uid_base() -> int:
    """The first sandbox uid of this job: ``ROOKGRPO_SANDBOX_UID_BASE`` where set, else 61000. The job's ranks use
    it and the 1023 uids after it (64 per ``LOCAL_RANK``, 16 ranks), so two jobs on one machine set bases 1024
    apart."""
    raw = os.environ.get(UID_BASE_ENV, "").strip()
    if not raw:
        return SANDBOX_UID_BASE
    try:
        base = int(raw)
    except ValueError:
        base = -1
    if not 1000 <= base <= 2**31 - 1 - UIDS_PER_JOB:
        raise ValueError(f"{UID_BASE_ENV}={raw!r}: expected a uid of at least 1000 that no user of this machine has "
                         f"(the job's ranks use it and the {UIDS_PER_JOB - 1} after it); unset it for "
                         f"{SANDBOX_UID_BASE}")
    return base


def next_sandbox_uid() -> int:
    """A sandbox uid no other user in this process has (runner, or a sandbox started directly): RLIMIT_NPROC counts
    per uid, and without namespaces teardown kills by uid, so two users of one uid would starve or kill each other.
    Training processes on one machine get disjoint ranges (LOCAL_RANK); two jobs on one machine, from
    ``ROOKGRPO_SANDBOX_UID_BASE`` (:func:`sandbox_uid_base`)."""
    with _UID_LOCK:
        index = _UIDS["next"] % UIDS_PER_PROCESS
        _UIDS["next"] += 1
    return sandbox_uid_base() + int(os.environ.get("LOCAL_RANK", "0") or 0) * UIDS_PER_PROCESS + index


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for one sandboxed program (all of its processes together where a cgroup is available)."""

    timeout: float = 10.0  # wall clock, seconds, for loading the program and every call (per case for stdin/stdout)
    cpu_seconds: int = 10
    memory_mb: int = 1024  # the whole process tree (cgroup) and, as address space, each process
    file_size_mb: int = 16
    workdir_mb: int = 64  # the work dir is a tmpfs of this size inside the sandbox
    open_files: int = 64
    processes: int = 32
    output_bytes: int = 256 * 1024  # stdout captured for stdin/stdout tests


def rlimits(limits: SandboxLimits, uid: int | None) -> list[tuple[str, int]]:
    """The rlimits of a sandboxed program, as (``resource.RLIMIT_`` name suffix, value): address space, CPU time,
    file size, open files, no core dumps, no POSIX message queue memory (a queue could outlive the run where no IPC
    namespace holds it), and, when it runs under a uid of its own, processes (RLIMIT_NPROC counts every process of the
    uid, so under a shared uid it would count the trainer's too)."""
    mb = 1024 * 1024
    out = [("AS", limits.memory_mb * mb), ("CPU", limits.cpu_seconds), ("FSIZE", limits.file_size_mb * mb),
           ("NOFILE", limits.open_files), ("CORE", 0), ("MSGQUEUE", 0)]
    return out + [("NPROC", limits.processes)] if uid is not None else out


# --- cgroups ---------------------------------------------------------------------------------------------------


CGROUP_PREFIX = "rookgrpo-"


class Cgroup:
    """A cgroup for one run at a time: memory and process limits for the whole tree, and kill-all.

    Creating and removing a memory cgroup costs the kernel several milliseconds, so each process keeps the empty
    ones for its next runs (:func:`take_cgroup`, :func:`give_back_cgroup`) and removes them at exit.
    """

    def __init__(self, kind: str, limits: SandboxLimits):
        self.kind = kind
        name = f"{CGROUP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        if kind == "v1":
            self.dirs = [Path("/sys/fs/cgroup/memory") / name, Path("/sys/fs/cgroup/pids") / name]
        else:
            self.dirs = [Path("/sys/fs/cgroup") / name]
        for d in self.dirs:
            d.mkdir()
        self.limits: SandboxLimits | None = None
        self.set_limits(limits)
        self.procs_files = [str(d / "cgroup.procs") for d in self.dirs]

    def set_limits(self, limits: SandboxLimits) -> None:
        if limits == self.limits:
            return
        memory, pids = str(limits.memory_mb * 1024 * 1024), str(limits.processes + 4)
        if self.kind == "v1":
            _write(self.dirs[0] / "memory.limit_in_bytes", memory)
            _write(self.dirs[1] / "pids.max", pids)
        else:
            _write(self.dirs[0] / "memory.max", memory)
            _write(self.dirs[0] / "memory.swap.max", "0")
            _write(self.dirs[0] / "pids.max", pids)
        self.limits = limits

    @contextlib.contextmanager
    def holding_spawn(self):
        """(v1) The calling thread joins the cgroup while it forks a sandbox, so the child starts inside it; then it
        returns to its own cgroups. Only this thread moves (v1's ``tasks`` file): the pids limit counts it, not the
        caller's other threads, and the caller's memory stays charged where it was."""
        if self.kind != "v1":
            raise OSError("holding_spawn needs cgroup v1 (v2 moves whole processes)")
        home = _own_cgroup_files("tasks")
        tid = str(threading.get_native_id())
        try:
            for d in self.dirs:
                (d / "tasks").write_text(tid)
            yield
        finally:
            for path in home:
                Path(path).write_text(tid)

    def pids(self) -> set[int]:
        out = set()
        for path in self.procs_files:
            try:
                out |= {int(x) for x in Path(path).read_text().split()}
            except OSError:
                pass
        return out

    def kill(self) -> None:
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def remove(self) -> bool:
        """Remove the cgroup's directories; False while processes are still exiting."""
        for d in self.dirs:
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                return False
        return True


@functools.lru_cache(maxsize=1)
def _own_cgroups_known() -> bool:
    """Whether :meth:`Cgroup.holding_spawn` can find its way back here (else sandboxes join their cgroup from the
    child, the slower way)."""
    try:
        return all(os.path.exists(path) for path in _own_cgroup_files("tasks"))
    except OSError:
        return False


def _own_cgroup_files(name: str) -> tuple[str, str]:
    """The calling thread's own v1 ``memory`` and ``pids`` cgroups' file ``name`` (from ``/proc/thread-self``)."""
    paths = {}
    for line in Path("/proc/thread-self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            if controller in ("memory", "pids"):
                paths[controller] = str(Path("/sys/fs/cgroup") / controller / path.lstrip("/") / name)
    if sorted(paths) != ["memory", "pids"]:
        raise OSError("cannot tell this thread's own memory and pids cgroups from /proc/thread-self/cgroup")
    return paths["memory"], paths["pids"]


_CGROUPS: dict[str, list[Cgroup]] = {"free": [], "draining": [], "all": []}


def take_cgroup(kind: str, limits: SandboxLimits) -> Cgroup:
    """An empty cgroup for a new run: a drained one from an earlier run, or a new one."""
    for cgroup in list(_CGROUPS["draining"]):
        if not cgroup.pids():
            _CGROUPS["draining"].remove(cgroup)
            _CGROUPS["free"].append(cgroup)
    if _CGROUPS["free"]:
        cgroup = _CGROUPS["free"].pop()
        cgroup.set_limits(limits)
        return cgroup
    cgroup = Cgroup(kind, limits)
    _CGROUPS["all"].append(cgroup)
    return cgroup


def give_back_cgroup(cgroup: Cgroup) -> None:
    """After a run: kill what is left in it; it is reused once empty (never while a process of the run lives)."""
    cgroup.kill()
    _CGROUPS["draining" if cgroup.pids() else "free"].append(cgroup)


def remove_cgroups() -> None:
    """Remove this process's cgroups (at exit; processes left in one are killed first)."""
    for cgroup in _CGROUPS["all"]:
        cgroup.kill()
        for _ in range(100):
            if cgroup.remove():
                break
            time.sleep(0.01)
    _CGROUPS["all"].clear()
    _CGROUPS["free"].clear()
    _CGROUPS["draining"].clear()


def remove_stale_cgroups(pid: int, wait: float = 2.0) -> None:
    """Remove the cgroups a dead process (a killed runner) left behind, killing anything still in them (processes
    take a moment to exit after SIGKILL, and a cgroup cannot be removed before they have)."""
    dirs = [d for root in (Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup"))
            for d in root.glob(f"{CGROUP_PREFIX}{pid}-*")]
    deadline = time.monotonic() + wait
    while dirs and time.monotonic() < deadline:
        for d in list(dirs):
            try:
                for line in (d / "cgroup.procs").read_text().split():
                    os.kill(int(line), signal.SIGKILL)
                d.rmdir()
                dirs.remove(d)
            except FileNotFoundError:
                dirs.remove(d)
            except (OSError, ValueError):
                pass
        if dirs:
            time.sleep(0.01)


atexit.register(remove_cgroups)


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError:
        pass  # a knob this kernel lacks (e.g. no swap accounting): the other layers still hold
