"""One sandboxed program: spawned into the machine's isolation layers (:mod:`.layers`) under its limits (:mod:`.limits`),
then driven over two pipes, requests in and answers out (the job protocol: :mod:`rookgrpo.code.wire` literals, read by
``_sandbox_server.py`` inside), and torn down with everything it had (:mod:`.cleanup` where no namespace holds it).

:func:`isolation` probes the layers once by running such a program (bubblewrap with user namespaces, a writable
cgroup, root for the uid drop, and without bubblewrap whether root can make reduced mode's namespaces or the kernel has
Landlock); :func:`require` refuses a mode the machine cannot serve, before any program runs.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import resource
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from ..wire import write_all, write_literal
from .cleanup import kill_uid, remove_tree, remove_uid_leftovers
from .layers import (FIX_NO_BWRAP, FIX_NO_USERNS, NAMESPACE_ROOT, OPT_IN, PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG,
                     VIEW_TOP, Isolation, SandboxUnavailable, _bwrap_command, _cgroup_kind, _enter_landlock,
                     _enter_namespaces, _libc, _sandbox_python, check_mode, landlock_abi)
from .limits import (Cgroup, SandboxLimits, _own_cgroups_known, give_back_cgroup, next_sandbox_uid, rlimits,
                     take_cgroup)

logger = logging.getLogger("rookgrpo.code.sandbox")
_CODE = Path(__file__).resolve().parent.parent
SERVER_SOURCE = (_CODE / "_sandbox_server.py").read_text()
# The sandbox's ``-c`` program when the server arrives compiled: it reads N bytes of marshalled code from the request
# pipe (N is its last argument) and runs them as ``__main__``. Compiling the server's source in every sandbox cost
# about 0.8 ms of CPU, 4% of a short program's whole run.
BOOTSTRAP = ("import marshal,os,sys\nf,n=int(sys.argv[1]),int(sys.argv[-1])\nb=b''\nwhile len(b)<n:\n c=os.read(f,n-len(b))"
             "\n if not c:raise SystemExit(1)\n b+=c\nexec(marshal.loads(b))")
_COMPILE = ("import marshal,sys;sys.stdout.buffer.write(marshal.dumps(compile(sys.stdin.buffer.read(),"
            "'_sandbox_server.py','exec')))")


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
