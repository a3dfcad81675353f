"""Start and tear down the process that runs untrusted, model-written Python.

This module only isolates; it never judges. The program runs in a fresh sandbox that holds no test, expected value or
secret; the trusted test runner (:mod:`rookgrpo.code.runner`, its own process) talks to it over two pipes in plain data
(:mod:`rookgrpo.code.wire`) and decides every verdict. Layers, outermost first (``docs/sandbox.md`` says what each
stops and what remains):

- **bubblewrap** (``bwrap``, Debian's ``bubblewrap``): new user, PID (with its own ``/proc``), IPC, network, UTS and
  cgroup namespaces; a filesystem view of the interpreter and its stdlib read-only, a minimal ``/dev``, and a fresh
  size-capped tmpfs work dir, so the checkout, site-packages, the data set, the host's ``/tmp`` and its Unix sockets
  do not exist; ``no_new_privs`` (setuid binaries cannot raise privileges); ``--die-with-parent``; when the program's
  first process exits, the kernel kills everything left in its PID namespace (``setsid`` and fork escapes included),
  and its IPC objects vanish with the namespace.
- **an unprivileged uid** (as root: one per runner worker). With bubblewrap the spawn drops the uid in C (no Python
  runs between fork and exec) and bwrap then sets ``no_new_privs`` and its parent-death signal; otherwise the child
  sets ``no_new_privs`` before the uid change and the parent-death signal after it (a uid change clears it).
- **a cgroup** per run where the machine lets us create one (v1 ``memory`` + ``pids`` or v2): memory and process
  limits for the whole process tree, and a way to kill every process of the run.
- **rlimits** per process: address space, CPU time, file size, open files, processes, no core dumps; set by the
  sandbox's first process before it reads the program (or before exec without bubblewrap).
- **a wall-clock timeout** enforced by the caller, which kills the process group, the cgroup and the namespace.

It fails closed. Without bubblewrap (or without user namespaces) a :class:`Sandbox` refuses to start
(:class:`SandboxUnavailable`, a ``ConfigError`` naming what is missing, the fix and the opt-in) unless its caller
accepts reduced isolation on purpose (``isolation="reduced"``; ``code_sandbox_isolation: reduced`` in a recipe).
Reduced isolation keeps the layers below and, where the process is root, rebuilds the filesystem view, network and IPC
isolation itself (:func:`_enter_namespaces`: new mount, network, IPC and UTS namespaces, no user namespace needed);
what a pid namespace and a non-root run would add is lost, and :func:`isolation` says so.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import logging
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError
from .wire import write_all, write_literal

logger = logging.getLogger(__name__)

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
_HERE = Path(__file__).resolve().parent
SERVER_SOURCE = (_HERE / "_sandbox_server.py").read_text()
# The sandbox's ``-c`` program when the server arrives compiled: it reads N bytes of marshalled code from the request
# pipe (N is its last argument) and runs them as ``__main__``. Compiling the server's source in every sandbox cost
# about 0.8 ms of CPU, 4% of a short program's whole run.
BOOTSTRAP = ("import marshal,os,sys\nf,n=int(sys.argv[1]),int(sys.argv[-1])\nb=b''\nwhile len(b)<n:\n c=os.read(f,n-len(b))"
             "\n if not c:raise SystemExit(1)\n b+=c\nexec(marshal.loads(b))")
_COMPILE = ("import marshal,sys;sys.stdout.buffer.write(marshal.dumps(compile(sys.stdin.buffer.read(),"
            "'_sandbox_server.py','exec')))")
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38


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


ISOLATION_MODES = ("full", "reduced")
# Where an essential layer is missing: what to install or enable, by cause (SandboxUnavailable's message).
FIX_NO_BWRAP = "install it: `apt-get install bubblewrap` (Debian, Ubuntu) or `dnf install bubblewrap` (Fedora, RHEL)"
FIX_NO_USERNS = ("enable unprivileged user namespaces (`sysctl -w kernel.unprivileged_userns_clone=1`; on Ubuntu 24.04 "
                 "and later also `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`), or in a container start "
                 "it with `--security-opt seccomp=unconfined --security-opt apparmor=unconfined`")
OPT_IN = ("To run model-written programs without it on purpose, with the layers docs/sandbox.md lists for that mode, "
          "set `code_sandbox_isolation: reduced` in the recipe (RookGRPOConfig(code_sandbox_isolation=\"reduced\"), "
          "or CodeExec(isolation=\"reduced\") outside rookgrpo's trainer).")


class SandboxUnavailable(ConfigError):
    """The machine lacks a layer the sandbox requires in the asked-for isolation mode (see :func:`require`)."""


@dataclass(frozen=True)
class Isolation:
    """Which layers work on this machine, and what is lost where one does not."""

    bwrap: str | None
    python: str
    cgroup: str | None  # "v1", "v2" or None
    root: bool
    lost: tuple[str, ...] = field(default=())
    missing: str | None = None  # without bubblewrap: what is missing here and the one-line fix
    namespaces: bool = False  # without bubblewrap: mount/network/IPC/UTS namespaces made as root (reduced mode)
    landlock: int = 0  # without bubblewrap or namespaces: the Landlock ABI the sandbox restricts itself with (0: none)


def check_mode(mode: str, field_name: str = "isolation") -> str:
    """``mode`` if it is an isolation mode, else a ConfigError naming ``field_name``."""
    if mode not in ISOLATION_MODES:
        raise ConfigError(f"{field_name}: {mode!r} is not an isolation mode; use 'full' (bubblewrap, the default) or "
                          "'reduced' (without bubblewrap, on purpose; docs/sandbox.md).")
    return mode


def require(mode: str = "full", who: str = "code sandbox") -> Isolation:
    """The machine's isolation, if it serves ``mode``; else :class:`SandboxUnavailable` before any program runs.

    ``full`` needs bubblewrap with user namespaces (the layer docs/sandbox.md calls essential); ``reduced`` runs
    without it, with what is left (accepted on purpose).
    """
    check_mode(mode)
    iso = isolation()
    if mode == "full" and iso.bwrap is None:
        raise SandboxUnavailable(f"{who}: refusing to run model-written code without bubblewrap: {iso.missing}. "
                                 + OPT_IN)
    return iso


def _sandbox_python() -> str:
    """An interpreter whose files lie under /usr (the only tree the sandbox sees): the system Python 3."""
    for candidate in (os.path.realpath(sys.executable), shutil.which("python3") or "", "/usr/bin/python3"):
        if candidate and candidate.startswith("/usr/") and os.access(candidate, os.X_OK):
            return os.path.realpath(candidate)
    return os.path.realpath(sys.executable)


def _cgroup_kind() -> str | None:
    if os.geteuid() != 0:
        return None
    v1 = [Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup/pids")]
    if all(p.is_dir() and os.access(p, os.W_OK) for p in v1):
        return "v1"
    v2 = Path("/sys/fs/cgroup/cgroup.controllers")
    if v2.exists() and {"memory", "pids"} <= set(v2.read_text().split()) and os.access(v2.parent, os.W_OK):
        return "v2"
    return None


@functools.lru_cache(maxsize=1)
def isolation() -> Isolation:
    """Probe the layers once: bubblewrap with user namespaces, a writable cgroup, root (for the uid drop), and,
    without bubblewrap, whether root can make the namespaces of reduced mode itself."""
    root = os.geteuid() == 0
    python = _sandbox_python()
    bwrap = shutil.which("bwrap")
    lost, missing, namespaces, landlock = [], None, False, 0
    if bwrap:
        probe = Sandbox(SandboxLimits(timeout=10), _iso=Isolation(bwrap, python, None, root))
        said = b""
        try:
            probe.start_program("print('ok')", stderr=subprocess.PIPE)
            out = probe.wait_output(10)[0]
            said = probe.proc.stderr.read(2000) if probe.proc.stderr else b""
            ok = out.strip() == b"ok"
        except OSError as exc:
            ok, said = False, str(exc).encode()
        finally:
            probe.close()
        if not ok:
            reason = said.decode(errors="replace").strip().splitlines()
            missing = (f"{bwrap} cannot create a user namespace here"
                       f"{' (bwrap: ' + reason[-1][:200] + ')' if reason else ''}; {FIX_NO_USERNS}")
            lost.append("bubblewrap is installed but cannot create namespaces here (user namespaces disabled?)")
            bwrap = None
    else:
        missing = f"bubblewrap (`bwrap`) is not on PATH; {FIX_NO_BWRAP}"
        lost.append("no bubblewrap (apt-get install bubblewrap)")
    if not bwrap:
        # ROOKGRPO_REDUCED_NAMESPACES=0: without them, as where root lacks CAP_SYS_ADMIN (to measure that mode)
        namespaces = root and os.environ.get("ROOKGRPO_REDUCED_NAMESPACES") != "0" and _namespaces_work(python)
        landlock = 0 if namespaces else landlock_abi()
        if namespaces:
            lost.append("without it (reduced mode, as root): mount, network, IPC and UTS namespaces and the filesystem "
                        "view are made by rookgrpo itself; no PID namespace (escapes are killed by uid) and no /proc")
        elif landlock:
            lost.append(f"without it: no namespaces; Landlock (ABI {landlock}) limits the program to reading the "
                        "interpreter and writing its work dir" + (", and forbids TCP" if landlock >= 4 else "") +
                        "; it can still see which paths exist, use UDP and create user namespaces; setsid/fork "
                        "escapes are killed by uid only")
        else:
            lost.append("without it: no network, PID, IPC or mount isolation; the program sees the host's files "
                        "(read-only where permissions say so) and its /tmp; setsid/fork escapes are killed by uid "
                        "only; files and SysV IPC objects it leaves are removed by uid")
    if not python.startswith("/usr/"):
        lost.append(f"no system Python under /usr: the sandbox runs {python}")
    cgroup = _cgroup_kind()
    if cgroup is None:
        lost.append("no writable cgroup: memory and process limits hold per process and per uid, not per run")
    if not root:
        lost.append("not root: no uid drop (the program runs as the trainer's user); RLIMIT_NPROC counts all of "
                    "that user's processes")
    iso = Isolation(bwrap, python, cgroup, root, tuple(lost), missing, namespaces, landlock)
    if lost:
        logger.warning("code sandbox: %s isolation here: %s", "full" if bwrap else "reduced", "; ".join(lost))
    return iso


_machine_isolation = isolation  # for Sandbox, whose ``isolation`` argument is the mode asked for


def _namespaces_work(python: str) -> bool:
    """Whether this (root) process can give a sandbox the mount, network, IPC and UTS namespaces of reduced mode
    (not in a container that withholds CAP_SYS_ADMIN or blocks ``unshare``)."""
    probe = Sandbox(SandboxLimits(timeout=10), isolation="reduced",
                    _iso=Isolation(None, python, None, True, namespaces=True))
    try:
        probe.start_program("import os\nprint(sorted(os.listdir('/')))")
        out = probe.wait_output(10)[0]
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        probe.close()
    return out.strip() == str(sorted(VIEW_TOP)).encode()


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


# --- one sandboxed program ---------------------------------------------------------------------------------------


VIEW_TOP = ("bin", "dev", "lib", "lib64", "usr", "work")  # the top of the sandbox's filesystem (reduced mode: no proc)
VIEW_DEVICES = ("null", "zero", "full", "random", "urandom")


def _view_paths(python: str) -> list[str]:
    """What the sandbox sees of the host, read-only: the interpreter, its stdlib and the shared libraries."""
    stdlib = f"/usr/lib/python{sys.version_info.major}.{sys.version_info.minor}"
    paths = [python] + [p for p in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib/aarch64-linux-gnu")
                        if os.path.isdir(p)]
    version = Path(python).name  # e.g. python3.11
    candidates = [f"/usr/lib/{version}", stdlib] if version.startswith("python3.") else [stdlib]
    return paths + [p for p in dict.fromkeys(candidates) if os.path.isdir(p)]


def _bwrap_command(iso: Isolation, limits: SandboxLimits, argv: list[str]) -> list[str]:
    python_dir = Path(iso.python).parent
    binds = [arg for path in _view_paths(iso.python) for arg in ("--ro-bind", path, path)]
    return [
        iso.bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
        "--clearenv", "--setenv", "PATH", "/usr/bin", "--setenv", "HOME", "/work", "--setenv", "LANG", "C.UTF-8",
        "--setenv", "PYTHONHASHSEED", "0", *binds,
        "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--symlink", str(python_dir), "/bin",
        "--proc", "/proc", "--dev", "/dev",
        "--size", str(limits.workdir_mb * 1024 * 1024), "--tmpfs", "/work", "--chdir", "/work",
        "--hostname", "sandbox",
        *argv,
    ]


@functools.lru_cache(maxsize=4)
def server_code(python: str) -> bytes | None:
    """The sandbox server compiled and marshalled by the sandbox's own interpreter (marshal data is specific to a
    Python version), once per process; None if that fails (the server's source is then passed with ``-c``)."""
    try:
        done = subprocess.run([python, "-I", "-S", "-c", _COMPILE], input=SERVER_SOURCE.encode(), capture_output=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 and done.stdout else None


@functools.lru_cache(maxsize=1)
def _libc():
    return ctypes.CDLL(None, use_errno=True)


def rlimits(limits: SandboxLimits, uid: int | None) -> list[tuple[str, int]]:
    """The rlimits of a sandboxed program, as (``resource.RLIMIT_`` name suffix, value): address space, CPU time,
    file size, open files, no core dumps, no POSIX message queue memory (a queue could outlive the run where no IPC
    namespace holds it), and, when it runs under a uid of its own, processes (RLIMIT_NPROC counts every process of the
    uid, so under a shared uid it would count the trainer's too)."""
    mb = 1024 * 1024
    out = [("AS", limits.memory_mb * mb), ("CPU", limits.cpu_seconds), ("FSIZE", limits.file_size_mb * mb),
           ("NOFILE", limits.open_files), ("CORE", 0), ("MSGQUEUE", 0)]
    return out + [("NPROC", limits.processes)] if uid is not None else out


NAMESPACE_ROOT = "/tmp"  # reduced mode's view is mounted here, in the program's own mount namespace only
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWNET = 0x00020000, 0x04000000, 0x08000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if x is None else x.encode() for x in (source, target, fstype, data)]
    if _libc().mount(enc[0], enc[1], enc[2], flags, enc[3]) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _enter_namespaces(python: str, root: str, limits: SandboxLimits, uid: int | None) -> None:
    """Reduced mode as root, in the child before exec: what bubblewrap would give, made without a user namespace.

    New mount, network, IPC and UTS namespaces; a read-only tmpfs over ``root`` (``/tmp``; private to the new mount
    namespace, so the host's ``/tmp`` is untouched and the view vanishes with the program) holding the interpreter,
    its stdlib and shared libraries bound read-only, five character devices and ``/work``, a tmpfs of ``workdir_mb``
    the program's uid owns; then ``chroot`` into it. The program, dropped to its uid with ``no_new_privs``, cannot leave
    the chroot (that takes CAP_SYS_CHROOT), reach the network (only a down loopback), or create IPC objects that
    outlive it. Not rebuilt: a PID namespace (the program's own first process would have to be its init) and
    ``/proc``.
    """
    libc = _libc()
    if libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare: {os.strerror(err)}")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for path in _view_paths(python):
        target = root + path
        if os.path.isdir(path):
            os.makedirs(target, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            open(target, "a").close()
        _mount(path, target, None, MS_BIND | MS_REC)
        _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.mkdir(root + "/dev")
    for name in VIEW_DEVICES:
        open(f"{root}/dev/{name}", "a").close()
        _mount(f"/dev/{name}", f"{root}/dev/{name}", None, MS_BIND)
    for link, target in (("lib", "usr/lib"), ("lib64", "usr/lib64"), ("bin", str(Path(python).parent))):
        os.symlink(target, f"{root}/{link}")
    os.mkdir(root + "/work", 0o700)
    _mount(None, root, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)  # only /work is writable
    owner = f",uid={uid},gid={uid}" if uid is not None else ""
    _mount("tmpfs", root + "/work", "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={limits.workdir_mb * 1024 * 1024},mode=0700{owner}")
    libc.sethostname(b"sandbox", 7)
    os.chroot(root)
    os.chdir("/work")


# Landlock (Linux 5.13+, unprivileged): the calling process and its children may touch only the paths given rights.
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_READ = 1 | 4 | 8  # EXECUTE, READ_FILE, READ_DIR
LANDLOCK_DEVICE = 2 | 4  # WRITE_FILE, READ_FILE
LANDLOCK_FS_BY_ABI = {1: 0x1FFF, 2: 0x3FFF, 3: 0x7FFF, 4: 0x7FFF, 5: 0xFFFF}  # every filesystem right the ABI knows
LANDLOCK_NET_TCP = 1 | 2  # BIND_TCP, CONNECT_TCP (ABI 4+)
LANDLOCK_SCOPED = 1 | 2  # ABSTRACT_UNIX_SOCKET, SIGNAL (ABI 6+)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


@functools.lru_cache(maxsize=1)
def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: none, or blocked, e.g. by a container's seccomp profile)."""
    if os.environ.get("ROOKGRPO_REDUCED_LANDLOCK") == "0":  # to measure the mode without it
        return 0
    abi = _libc().syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(int(abi), 0)


def _enter_landlock(abi: int, python: str, workdir: str) -> None:
    """Reduced mode without namespaces, in the child before exec (after ``no_new_privs``): the program may read and
    execute only the interpreter, its stdlib and shared libraries, read and write only its work dir and five devices,
    and (ABI 4+) neither bind nor connect TCP sockets; (ABI 6+) it may not signal, or reach abstract Unix sockets of,
    processes outside its own Landlock domain. What Landlock does not cover: ``stat`` of any path (existence is
    visible), UDP, and Unix sockets reached by path where it may not list the directory but knows the name."""
    libc = _libc()
    fs = LANDLOCK_FS_BY_ABI.get(abi, LANDLOCK_FS_BY_ABI[5])
    attr = _RulesetAttr(fs, LANDLOCK_NET_TCP if abi >= 4 else 0, LANDLOCK_SCOPED if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        rules = [(path, LANDLOCK_READ) for path in _view_paths(python)] + [(workdir, fs)]
        rules += [(f"/dev/{name}", LANDLOCK_DEVICE) for name in VIEW_DEVICES]
        prefix = sys.base_prefix if not python.startswith("/usr/") else None  # an interpreter outside /usr
        if prefix:
            rules.append((prefix, LANDLOCK_READ))
        for path, access in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                if not os.path.isdir(path):
                    access &= 1 | 2 | 4 | (1 << 14) | (1 << 15)  # rights a file can have
                rule = _PathBeneathAttr(access & fs, fd)
                if libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, 1, ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
            finally:
                os.close(fd)
        if libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset)


def _child_setup(limits: SandboxLimits, uid: int | None, cgroup_procs: list[str],
                 view: tuple[str, str] | None = None, landlock: tuple[int, str, str] | None = None) -> None:
    """Without bubblewrap, in the child before exec: own session, into the run's cgroup, (as root, reduced mode) the
    namespaces and filesystem view of :func:`_enter_namespaces` (``view``: interpreter, root), rlimits,
    no_new_privs, (without namespaces, where the kernel has it) Landlock (``landlock``: ABI, interpreter, work dir),
    then the uid drop and the parent-death signal (a uid change clears it)."""
    os.setsid()
    pid = str(os.getpid())
    for path in cgroup_procs:
        with open(path, "w") as fh:
            fh.write(pid)
    if view is not None:
        _enter_namespaces(view[0], view[1], limits, uid)
    for name, value in rlimits(limits, uid):
        resource.setrlimit(getattr(resource, "RLIMIT_" + name), (value, value))
    libc = _libc()
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if landlock is not None:
        _enter_landlock(*landlock)
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Sandbox:
    """One untrusted program in a fresh sandbox, reachable through two pipes (requests in, answers out).

    ``isolation``: ``"full"`` (default) refuses to start without bubblewrap (:class:`SandboxUnavailable`);
    ``"reduced"`` accepts the layers this machine has without it (docs/sandbox.md).
    """

    def __init__(self, limits: SandboxLimits, uid: int | None = None, isolation: str = "full",
                 _iso: Isolation | None = None):
        self.limits = limits
        self.mode = check_mode(isolation)
        self.iso = _iso or _machine_isolation()
        self.uid = (uid if uid is not None else next_sandbox_uid()) if self.iso.root else None
        self.proc: subprocess.Popen | None = None
        self.cgroup: Cgroup | None = None
        self.workdir: str | None = None
        self.req_w = self.resp_r = None

    def _start(self, stdin, stderr=subprocess.DEVNULL) -> None:
        if self.iso.bwrap is None and self.mode != "reduced":  # fail closed, before anything runs
            raise SandboxUnavailable(f"code sandbox: refusing to run model-written code without bubblewrap: "
                                     f"{self.iso.missing}. " + OPT_IN)
        req_r, self.req_w = os.pipe()
        self.resp_r, resp_w = os.pipe()
        limits = ",".join(f"{name}={value}" for name, value in rlimits(self.limits, self.uid))
        code = server_code(self.iso.python)
        argv = [self.iso.python, "-I", "-S", "-c", BOOTSTRAP if code else SERVER_SOURCE, str(req_r), str(resp_w),
                limits, *([str(len(code))] if code else [])]
        cwd = None
        if self.iso.bwrap:
            cmd = _bwrap_command(self.iso, self.limits, argv)
            env = {}
        elif self.iso.namespaces:  # the view is built over /tmp inside the new mount namespace: nothing on the host
            cmd, env = argv, {"PATH": "/usr/bin:/bin", "HOME": "/work", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
        else:
            self.workdir = tempfile.mkdtemp(prefix="rookgrpo-sandbox-")
            if self.uid is not None:
                os.chown(self.workdir, self.uid, self.uid)
            os.chmod(self.workdir, 0o700)
            cmd, cwd = argv, self.workdir
            env = {"PATH": "/usr/bin:/bin", "HOME": self.workdir, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
        if self.iso.cgroup:
            try:
                self.cgroup = take_cgroup(self.iso.cgroup, self.limits)
            except OSError:
                self.cgroup = None
        direct = self.iso.bwrap and (self.cgroup is None or (self.cgroup.kind == "v1" and _own_cgroups_known()))
        if direct:
            # No Python code runs in the child between fork and exec (that cost about 2 ms of CPU per sandbox, a
            # tenth of a program's whole run): the session and the uid drop are done by the spawn itself, bwrap sets
            # no_new_privs and its parent-death signal once it runs (after the uid drop, which would clear the
            # latter), the rlimits are set by the sandbox's first process before it reads the program, and the child
            # starts in the run's cgroup because this thread forks it from inside that cgroup. (cgroup v2 moves
            # whole processes, so there the child joins the cgroup itself, below.)
            drop = {"user": self.uid, "group": self.uid, "extra_groups": []} if self.uid is not None else {}
            spawn = {"start_new_session": True, **drop}
        else:
            procs = self.cgroup.procs_files if self.cgroup else []
            _libc()  # loaded here, so the child (between fork and exec) does not dlopen
            view = (self.iso.python, NAMESPACE_ROOT) if self.iso.namespaces else None
            landlock = (self.iso.landlock, self.iso.python, self.workdir) \
                if self.iso.landlock and not self.iso.bwrap and not self.iso.namespaces else None
            spawn = {"preexec_fn": functools.partial(_child_setup, self.limits, self.uid, procs, view, landlock)}
        try:
            with self.cgroup.holding_spawn() if self.cgroup and direct else contextlib.nullcontext():
                self.proc = subprocess.Popen(
                    cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=stderr, cwd=cwd, env=env,
                    pass_fds=(req_r, resp_w), close_fds=True, **spawn,
                )
        finally:
            os.close(req_r)
            os.close(resp_w)
        if code:
            try:
                write_all(self.req_w, code)
            except OSError:
                self.close()
                raise

    def start_calls(self, code: str | None = None) -> None:
        """Start the sandbox in call mode; with ``code``, send it the program at once (else :meth:`load` later:
        a started sandbox waits for its program, so a runner can start the next one before the job arrives)."""
        self._start(subprocess.DEVNULL)
        if code is not None:
            self.load(code)

    def load(self, code: str) -> None:
        """Send the program to a sandbox started in call mode; it loads it and answers the calls that follow."""
        write_literal(self.req_w, {"mode": "calls", "code": code})

    def start_program(self, code: str, stderr=subprocess.DEVNULL) -> None:
        """Start the program as a script reading stdin (see :meth:`wait_output`) and writing stdout (``stderr``:
        where its stderr goes, by default nowhere)."""
        self._start(subprocess.PIPE, stderr)
        write_literal(self.req_w, {"mode": "program", "code": code})

    def wait_output(self, timeout: float, stdin: bytes = b"") -> tuple[bytes, bool, bool]:
        """Feed ``stdin`` (without blocking on a program that never reads it), collect stdout up to the cap, wait
        for the program to exit. Returns (stdout, timed out, output over the cap)."""
        import threading

        out = bytearray()
        over = threading.Event()

        def feed():
            try:
                self.proc.stdin.write(stdin)
                self.proc.stdin.close()
            except (BrokenPipeError, OSError, ValueError):
                pass

        def pump():
            while True:
                chunk = self.proc.stdout.read1(65536)
                if not chunk:
                    return
                out.extend(chunk)
                if len(out) > self.limits.output_bytes:
                    over.set()
                    self.kill()
                    return

        threads = [threading.Thread(target=feed, daemon=True), threading.Thread(target=pump, daemon=True)]
        for t in threads:
            t.start()
        try:
            self.proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            self.kill()
        threads[1].join(timeout=1)
        return bytes(out[: self.limits.output_bytes]), timed_out, over.is_set()

    def kill(self) -> None:
        # Only a child not yet reaped: once waited for, its pid (and group id) may belong to another process.
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.cgroup is not None:
            for pid in self.cgroup.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def close(self, grace: float = 0.5) -> None:
        """End the program and release everything it had (pipes, cgroup, work dir).

        First the polite way: end of input, so the program returns and bubblewrap's init reaps its namespace; after
        ``grace`` seconds, kill. (Killing the outer bwrap first would orphan the namespace's init; where the host's
        PID 1 does not reap, such zombies pile up under the sandbox uid until its process limit refuses new runs.)
        """
        if self.req_w is not None:
            try:
                os.close(self.req_w)
            except OSError:
                pass
            self.req_w = None
        if self.proc is not None and self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        if self.proc is not None and self.proc.returncode is None:
            import threading

            timer = threading.Timer(grace, self.kill)  # a blocking wait returns at once; polling would sleep
            timer.start()
            try:
                self.proc.wait()
            finally:
                timer.cancel()
        self.kill()
        for fd in (self.req_w, self.resp_r):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.req_w = self.resp_r = None
        if self.proc is not None:
            for stream in (self.proc.stdin, self.proc.stdout):
                if stream is not None:
                    try:
                        stream.close()
                    except OSError:
                        pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if self.cgroup is not None:
            give_back_cgroup(self.cgroup)
            self.cgroup = None
        if self.uid is not None and not self.iso.bwrap:
            kill_uid(self.uid)  # no PID namespace: what escaped the session is found by uid
            if not self.iso.namespaces:  # no mount or IPC namespace: what it left in shared places, by uid too
                remove_uid_leftovers(self.uid)
        if self.workdir:
            remove_tree(self.workdir)


def processes_of_uids(uids: set[int], zombies: bool = False) -> list[tuple[int, str]]:
    """(pid, name) of processes whose real or effective uid is in ``uids`` (from /proc); zombies only if asked
    (then as (pid, "name (zombie of PPID)"), so a caller can tell whose child it is)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        real, effective = (int(x) for x in fields.get("Uid", "-1 -1").split()[:2])
        zombie = "Z" in fields.get("State", "")
        if (real in uids or effective in uids) and (zombies or not zombie):
            name = fields.get("Name", "").strip()
            found.append((int(entry), f"{name} (zombie of {fields.get('PPid', '?').strip()})" if zombie else name))
    return found


def remove_tree(path: str) -> None:
    """``rm -rf --one-file-system``: symlinks removed, not followed; no other mount entered; any depth (a program may
    nest directories 1,500 deep, past ``shutil.rmtree``'s recursion). By absolute path: PATH may lack ``rm``."""
    rm = next((p for p in ("/usr/bin/rm", "/bin/rm") if os.access(p, os.X_OK)), None)
    if rm is not None:
        subprocess.run([rm, "-rf", "--one-file-system", path], capture_output=True)
    else:
        try:
            shutil.rmtree(path, ignore_errors=True)
        except RecursionError:
            pass


SHARED_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue")
IPC_RMID = 0


def remove_uid_leftovers(uid: int) -> int:
    """Remove what a sandbox uid left where any user may write (``SHARED_WRITABLE``: files, directories, sockets,
    POSIX shared memory and queues) and its SysV IPC objects (never uid 0). Returns how many were removed. For reduced
    isolation without namespaces, where nothing else would take them away."""
    if uid <= 0:
        return 0
    removed = 0
    for top in SHARED_WRITABLE:
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    remove_tree(entry.path)
                else:
                    os.unlink(entry.path)
                removed += 1
            except OSError:
                pass
    libc = _libc()
    for kind, remove in (("shm", lambda i: libc.shmctl(i, IPC_RMID, None)),
                         ("sem", lambda i: libc.semctl(i, 0, IPC_RMID)),
                         ("msg", lambda i: libc.msgctl(i, IPC_RMID, None))):
        try:
            header, *rows = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()
        except OSError:
            continue
        names = header.split()
        for row in rows:
            fields = dict(zip(names, row.split()))
            if int(fields.get("uid", -1)) == uid or int(fields.get("cuid", -1)) == uid:
                ident = int(fields.get("shmid") or fields.get("semid") or fields.get("msqid") or -1)
                if ident >= 0 and remove(ident) == 0:
                    removed += 1
    return removed


def kill_uid(uid: int) -> None:
    """Kill every process whose real or effective uid is ``uid`` (never 0)."""
    if uid <= 0:
        return
    for _ in range(20):
        found = processes_of_uids({uid})
        if not found:
            return
        for pid, _ in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)


def become_subreaper() -> None:
    """Adopt orphaned descendants (a killed sandbox's namespace init) so :func:`reap_orphans` can reap them."""
    _libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def reap_orphans() -> int:
    """Reap every finished child of this process (call only in a process whose children are all sandboxes)."""
    reaped = 0
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped += 1
