"""Run untrusted, model-written Python against tests, one isolated process per program.

Isolation, outermost first:

- a separate process in its own session (so the whole group can be killed), a wall-clock timeout, and capped
  stdout/stderr/result output (over the cap, the run is killed);
- when ``unshare`` works (root, or user namespaces): fresh network namespace (no interfaces: no network), PID
  namespace (when the program's PID 1 exits, the kernel kills every process it left behind, including ``setsid``
  escapes), and mount namespace, in which the work dir is bind-mounted over ``/tmp``, ``/var/tmp``, ``/run/lock`` and
  ``/dev/shm`` (so no file can appear outside it);
- rlimits on address space, CPU time, file size, open files and processes; as root the program drops to an
  unprivileged uid first (one per pool worker), because ``RLIMIT_NPROC`` does not bind root;
- an isolated interpreter (``python -I -S``: no site-packages, no ``PYTHON*`` variables, no cwd on ``sys.path``), a
  minimal environment, and a fresh temporary work dir that is removed afterwards.

Where ``unshare`` is unavailable (an unprivileged user without user namespaces) there is no network or PID
isolation, and ``/tmp`` stays writable: the rlimits, timeout, process-group kill and output caps still apply
(:func:`namespaces_available` tells which case holds; the docs say so too).

Verdicts are decided in this process, never from the exit code: the harness reports each test's values (strictly
serialized: exact builtin types only) tagged with a per-run nonce, and the comparison runs here.
"""

from __future__ import annotations

import ast
import functools
import json
import logging
import math
import operator
import os
import queue
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

HARNESS = Path(__file__).with_name("_harness.py")
SANDBOX_UID_BASE = 61000  # worker i runs as uid 61000 + i when started as root


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for one sandboxed run."""

    timeout: float = 10.0  # wall clock, seconds
    cpu_seconds: int = 10
    memory_mb: int = 1024  # address space
    file_size_mb: int = 16
    open_files: int = 64
    processes: int = 32  # per sandbox uid (only enforced when running as root, which drops to that uid)
    output_bytes: int = 256 * 1024  # per stream


@dataclass
class RunResult:
    stdout: str = ""
    stderr: str = ""
    records: list[dict] = field(default_factory=list)
    exit_code: int | None = None
    timed_out: bool = False
    output_exceeded: bool = False
    duration: float = 0.0


@functools.lru_cache(maxsize=1)
def namespaces_available() -> bool:
    """Whether ``unshare --net --pid --mount --fork`` works here (checked once)."""
    unshare = shutil.which("unshare")
    if not unshare:
        return False
    try:
        proc = subprocess.run([unshare, "--net", "--pid", "--mount", "--fork", "--kill-child", "true"],
                              capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def run_job(job: dict, stdin: str = "", limits: SandboxLimits = SandboxLimits(), uid: int = SANDBOX_UID_BASE) -> RunResult:
    """Run one harness job (see ``_harness.py``) in a fresh sandbox and return what it printed and reported."""
    nonce = secrets.token_hex(16)
    workdir = Path(tempfile.mkdtemp(prefix="rookgrpo-sandbox-"))
    is_root = os.geteuid() == 0
    try:
        (workdir / "job.json").write_text(json.dumps(job))
        if is_root:
            os.chown(workdir, uid, uid)
        os.chmod(workdir, 0o700)
        read_fd, write_fd = os.pipe()
        cmd = [sys.executable, "-I", "-S", str(HARNESS), str(workdir), str(write_fd)]
        if namespaces_available():
            cmd = ["unshare", "--net", "--pid", "--mount", "--fork", "--kill-child", *cmd]
        env = {
            "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(workdir), "PYTHONHASHSEED": "0",
            "ROOKGRPO_SANDBOX_NONCE": nonce, "ROOKGRPO_SANDBOX_UID": str(uid),
            "ROOKGRPO_SANDBOX_NPROC": str(limits.processes),
        }
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=workdir, env=env,
                pass_fds=(write_fd,), preexec_fn=functools.partial(_child_limits, limits), close_fds=True,
            )
        finally:
            os.close(write_fd)
        result = _collect(proc, read_fd, stdin, limits)
        result.duration = time.monotonic() - start
        result.records = [r for r in result.records if r.pop("n", None) == nonce]
        if is_root:
            _kill_uid(uid)  # belt and braces where there is no PID namespace
        return result
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _child_limits(limits: SandboxLimits) -> None:
    """In the child before exec: a new session (killable as a group) and the rlimits that bind root too."""
    os.setsid()
    mb = 1024 * 1024
    for kind, value in (
        (resource.RLIMIT_AS, limits.memory_mb * mb),
        (resource.RLIMIT_CPU, limits.cpu_seconds),
        (resource.RLIMIT_FSIZE, limits.file_size_mb * mb),
        (resource.RLIMIT_NOFILE, limits.open_files),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(kind, (value, value))


def _collect(proc: subprocess.Popen, read_fd: int, stdin: str, limits: SandboxLimits) -> RunResult:
    result = RunResult()
    buffers = {"stdout": bytearray(), "stderr": bytearray(), "records": bytearray()}
    exceeded = threading.Event()

    def pump(stream_fd: int, name: str) -> None:
        while True:
            try:
                chunk = os.read(stream_fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            buf = buffers[name]
            if len(buf) + len(chunk) > limits.output_bytes:
                buf.extend(chunk[: max(0, limits.output_bytes - len(buf))])
                exceeded.set()
                _kill_group(proc)
                return
            buf.extend(chunk)

    threads = [threading.Thread(target=pump, args=(proc.stdout.fileno(), "stdout"), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr.fileno(), "stderr"), daemon=True),
               threading.Thread(target=pump, args=(read_fd, "records"), daemon=True)]
    for t in threads:
        t.start()
    try:
        proc.stdin.write(stdin.encode())
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass
    try:
        proc.wait(timeout=limits.timeout)
    except subprocess.TimeoutExpired:
        result.timed_out = True
        _kill_group(proc)
        proc.wait()
    for t in threads:
        t.join(timeout=5)
    os.close(read_fd)
    for stream in (proc.stdout, proc.stderr):
        stream.close()
    result.exit_code = proc.returncode
    result.output_exceeded = exceeded.is_set()
    result.stdout = buffers["stdout"].decode("utf-8", "replace")
    result.stderr = buffers["stderr"].decode("utf-8", "replace")
    for line in buffers["records"].decode("utf-8", "replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            result.records.append(record)
    return result


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the session leader's group: unshare (which kills its child) + harness
    except (ProcessLookupError, PermissionError):
        pass


def _kill_uid(uid: int) -> None:
    """Kill every process still running as the sandbox uid (escapes from the process group, e.g. via setsid)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid == uid:
                os.kill(int(entry.name), signal.SIGKILL)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue


# --- tests: rewriting asserts, deserializing and comparing in the parent -----------------------------------------


def rewrite_asserts(tests: str) -> tuple[str, int]:
    """Rewrite every ``assert`` in ``tests`` into a reporting call with a stable id; return (code, number of asserts).

    ``assert a == b`` becomes ``__rk_compare__(i, ["Eq"], lambda: (a, b))``: the sandbox serializes ``a`` and ``b``
    and this process compares them, so an object whose ``__eq__`` always returns True cannot pass (it does not
    serialize). Any other ``assert x`` becomes ``__rk_truth__(i, lambda: x)``: ``x`` must serialize and be truthy.
    """
    tree = ast.parse(tests)
    counter = [0]

    class Rewriter(ast.NodeTransformer):
        def visit_Assert(self, node: ast.Assert):
            test_id = counter[0]
            counter[0] += 1
            if isinstance(node.test, ast.Compare):
                operands = [node.test.left, *node.test.comparators]
                call = ast.Call(
                    func=ast.Name("__rk_compare__", ast.Load()),
                    args=[ast.Constant(test_id), ast.List([ast.Constant(type(op).__name__) for op in node.test.ops],
                                                          ast.Load()),
                          ast.Lambda(_no_args(), ast.Tuple(operands, ast.Load()))],
                    keywords=[])
            else:
                call = ast.Call(func=ast.Name("__rk_truth__", ast.Load()),
                                args=[ast.Constant(test_id), ast.Lambda(_no_args(), node.test)], keywords=[])
            return ast.copy_location(ast.Expr(call), node)

    tree = ast.fix_missing_locations(Rewriter().visit(tree))
    return ast.unparse(tree), counter[0]


def _no_args() -> ast.arguments:
    return ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[])


class _Bad(Exception):
    pass


def deserialize(tagged: Any) -> Any:
    """Inverse of the harness's strict serialization; raises on anything malformed."""
    if not (isinstance(tagged, list) and len(tagged) == 2 and isinstance(tagged[0], str)):
        raise _Bad("malformed value")
    kind, value = tagged
    if kind == "NoneType":
        return None
    if kind in ("bool", "int", "str") and type(value).__name__ == kind:
        return value
    if kind == "float":
        return float(value)
    if kind == "complex":
        return complex(float(value[0]), float(value[1]))
    if kind in ("list", "tuple", "set", "frozenset"):
        items = [deserialize(x) for x in value]
        return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[kind](items)
    if kind == "dict":
        return {deserialize(k): deserialize(v) for k, v in value}
    if kind == "bytes":
        return bytes(value)
    raise _Bad(f"unknown kind {kind}")


_COMPARE = {
    "Eq": operator.eq, "NotEq": operator.ne, "Lt": operator.lt, "LtE": operator.le, "Gt": operator.gt,
    "GtE": operator.ge, "In": lambda a, b: a in b, "NotIn": lambda a, b: a not in b,
    "Is": lambda a, b: a == b and type(a) is type(b), "IsNot": lambda a, b: not (a == b and type(a) is type(b)),
}


def record_passes(record: dict, expected: Any = None) -> bool:
    """Evaluate one harness record here. ``expected`` is for function-call cases."""
    if "error" in record or "values" not in record:
        return False
    try:
        values = [deserialize(v) for v in record["values"]]
        ops = record["ops"]
        if ops == ["truth"]:
            return bool(values[0])
        if ops == ["call"]:
            return _equal(values[0], expected)
        if len(values) != len(ops) + 1:
            return False
        return all(_COMPARE[op](a, b) for op, a, b in zip(ops, values, values[1:]))
    except Exception:
        return False


def _equal(got: Any, expected: Any) -> bool:
    """Equality for function-call cases: JSON has no tuples, so tuples compare as lists; floats to 1e-9 relative."""
    if isinstance(got, tuple):
        got = list(got)
    if isinstance(expected, tuple):
        expected = list(expected)
    if isinstance(got, float) and isinstance(expected, (int, float)) and not isinstance(expected, bool):
        return math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(got, list) and isinstance(expected, list):
        return len(got) == len(expected) and all(_equal(a, b) for a, b in zip(got, expected))
    if isinstance(got, dict) and isinstance(expected, dict):
        return got.keys() == expected.keys() and all(_equal(got[k], expected[k]) for k in got)
    return type(got) is type(expected) and got == expected  # so True never equals 1


def normalize_output(text: str) -> str:
    """Trailing whitespace removed per line and at the end; nothing else (no prefix or substring matches)."""
    return "\n".join(line.rstrip() for line in text.rstrip().splitlines())


# --- the pool ---------------------------------------------------------------------------------------------------


class SandboxPool:
    """Runs sandbox jobs in parallel; worker ``i`` uses uid ``SANDBOX_UID_BASE + i`` so limits do not collide."""

    def __init__(self, workers: int | None = None, limits: SandboxLimits = SandboxLimits()):
        self.workers = workers or max(1, min(os.cpu_count() or 1, 8))
        self.limits = limits
        self._uids: queue.Queue[int] = queue.Queue()
        for i in range(self.workers):
            self._uids.put(SANDBOX_UID_BASE + i)
        self._executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="sandbox")

    def run(self, job: dict, stdin: str = "") -> RunResult:
        uid = self._uids.get()
        try:
            return run_job(job, stdin, self.limits, uid)
        finally:
            self._uids.put(uid)

    def map(self, calls: list[tuple[dict, str]]) -> list[RunResult]:
        return list(self._executor.map(lambda c: self.run(*c), calls))

    def close(self) -> None:
        self._executor.shutdown(wait=True)


_POOLS: dict[tuple, SandboxPool] = {}
_POOLS_LOCK = threading.Lock()


def get_pool(workers: int | None = None, limits: SandboxLimits = SandboxLimits()) -> SandboxPool:
    with _POOLS_LOCK:
        key = (workers, limits)
        if key not in _POOLS:
            _POOLS[key] = SandboxPool(workers, limits)
        return _POOLS[key]
