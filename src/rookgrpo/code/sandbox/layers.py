"""Which isolation layers this machine has, and how a sandboxed program enters them.

The probe that says which of them work here runs a program, so it lives with :class:`~.program.Sandbox`
(:func:`~.program.isolation`, :func:`~.program.require`). With bubblewrap the program's view is
:func:`_bwrap_command`'s; without it, as root, :func:`_enter_namespaces` builds the same view by hand, and without
namespaces :func:`_enter_landlock` limits what the program may touch.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import ConfigError
from .limits import SandboxLimits

logger = logging.getLogger("rookgrpo.code.sandbox")
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38  # prctl(2) options

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


# --- the filesystem view, and reduced mode's own namespaces and Landlock -----------------------------------


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


@functools.lru_cache(maxsize=1)
def _libc():
    return ctypes.CDLL(None, use_errno=True)


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
