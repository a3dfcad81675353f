"""A pool of trusted test-runner processes (``python -m rookgrpo.code.runner``), driven from the trainer process.

The trainer never runs tests or untrusted code itself: each job goes to a runner process, which starts the sandbox and
judges the program (:mod:`rookgrpo.code.runner`). Each job has a hard deadline (the sandbox timeout per test run plus a
margin); a runner that misses it is killed with everything it started and replaced, and the job scores as timed out.
So a reward call always returns within its deadline, whatever the program does.
"""

from __future__ import annotations

import atexit
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

from . import wire
from .runner import Verdict
from .sandbox import SandboxLimits, next_sandbox_uid, require

START_MARGIN = 5.0  # seconds a job may take beyond its tests' timeouts (runner and sandbox start-up, teardown)


def job_deadline(spec: dict, limits: SandboxLimits) -> float:
    """Seconds a job may take: one timeout per sandbox it starts (one per stdin/stdout case), plus the margin."""
    runs = len(spec.get("cases", [])) if spec.get("type") == "stdio" else 1
    variants = len(spec.get("__variants__") or ()) or 1  # a variants job runs the tests once per variant
    return limits.timeout * max(1, runs) * variants + START_MARGIN


class RunnerProcess:
    """One runner worker process; restarted after a missed deadline or a crash."""

    def __init__(self, uid: int):
        self.uid = uid
        self.spare_pid, self.spare_workdir = 0, ""
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ROOKGRPO_SANDBOX", "HF_TOKEN"))}
        self.proc = subprocess.Popen([sys.executable, "-m", "rookgrpo.code.runner"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
                                     env=env)

    def kill(self) -> None:
        if self.proc is None:
            return
        exited = self.proc.poll() is not None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the runner; its sandboxes die with it (parent-death signal)
        except (ProcessLookupError, PermissionError):
            pass
        if not exited:  # a runner that exited by itself removed its own cgroups
            from .sandbox import remove_stale_cgroups

            remove_stale_cgroups(self.proc.pid)
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except (OSError, ValueError):
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.proc = None

    def run(self, job: dict, deadline: float) -> Verdict:
        try:
            wire.write_message(self.proc.stdin.fileno(), job)
            answer = self._read(deadline)
        except (OSError, wire.WireError, TimeoutError) as exc:
            self.kill()
            self.start()
            timed_out = isinstance(exc, TimeoutError)
            return Verdict(loaded=False, timed_out=timed_out, note=f"runner: {type(exc).__name__}")
        if answer is None:
            self.kill()
            self.start()
            return Verdict(loaded=False, note="runner exited")
        self.spare_pid = 0
        fields = Verdict.__dataclass_fields__
        return Verdict(**{k: v for k, v in answer.items() if k in fields})

    def _read(self, deadline: float) -> dict | None:
        return wire.read_message(self.proc.stdout.fileno(), deadline)


class RunnerPool:
    """``workers`` runner processes; :meth:`map` runs jobs in parallel over them, each within its deadline.

    ``isolation``: the sandboxes' mode; ``"full"`` (default) is refused here, before any runner starts, where
    bubblewrap is missing (:func:`rookgrpo.code.sandbox.require`), and again by each sandbox.
    """

    def __init__(self, workers: int | None = None, limits: SandboxLimits = SandboxLimits(), isolation: str = "full"):
        require(isolation)
        self.limits, self.isolation = limits, isolation
        n = workers or max(1, min(2 * (os.cpu_count() or 1), 8))  # runners mostly wait on their sandbox
        self._idle: queue.Queue[RunnerProcess] = queue.Queue()
        with ThreadPoolExecutor(max_workers=n) as starter:  # runners start in parallel
            self.runners = list(starter.map(RunnerProcess, [next_sandbox_uid() for _ in range(n)]))
        for runner in self.runners:
            self._idle.put(runner)
        self._executor = ThreadPoolExecutor(max_workers=n, thread_name_prefix="code-runner")
        self._closed = False

    def run(self, code: str, spec: dict) -> Verdict:
        runner = self._idle.get()
        try:
            job = {"code": code, "spec": spec, "limits": asdict(self.limits), "uid": runner.uid,
                   "isolation": self.isolation}
            verdict = runner.run(job, time.monotonic() + job_deadline(spec, self.limits))
            runner.spare_pid, runner.spare_workdir = verdict.spare_pid, verdict.spare_workdir
            return verdict
        finally:
            self._idle.put(runner)

    def spare_pids(self) -> set[int]:
        """The runners' idle, pre-started sandboxes (bwrap pids): waiting for a program, not left over from one."""
        return {r.spare_pid for r in self.runners if getattr(r, "spare_pid", 0)}

    def spare_workdirs(self) -> set[str]:
        """Their work dirs on the host (reduced isolation without namespaces; none otherwise)."""
        return {r.spare_workdir for r in self.runners if getattr(r, "spare_workdir", "")}

    def map(self, jobs: list[tuple[str, dict]]) -> list[Verdict]:
        return list(self._executor.map(lambda job: self.run(*job), jobs))

    def close(self) -> None:
        """End the runners politely (end of input: each closes its spare and removes its cgroups), then kill."""
        if self._closed:
            return
        self._closed = True
        self._executor.shutdown(wait=False)
        for runner in self.runners:
            try:
                runner.proc.stdin.close()
            except (OSError, AttributeError):
                pass
        deadline = time.monotonic() + 3
        for runner in self.runners:
            try:
                runner.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except (subprocess.TimeoutExpired, AttributeError):
                pass
            runner.kill()


_POOLS: dict[tuple, RunnerPool] = {}
_LOCK = threading.Lock()


def get_pool(workers: int | None = None, limits: SandboxLimits = SandboxLimits(),
             isolation: str = "full") -> RunnerPool:
    """The process-wide pool for (workers, limits, isolation) and the layers this process finds (a pool's runners
    keep what they found when they started), created on first use and closed at exit."""
    from .sandbox import isolation as layers

    key = (workers, limits, isolation, layers())
    with _LOCK:
        pool = _POOLS.get(key)
    if pool is None or pool._closed:
        pool = RunnerPool(workers, limits, isolation)
        with _LOCK:
            _POOLS[key] = pool
    return pool


@atexit.register
def _close_pools() -> None:
    for pool in list(_POOLS.values()):
        pool.close()
