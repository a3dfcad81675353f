"""The trusted side of code execution: run a problem's tests against a sandboxed program and decide the verdict.

Trust is split. The model's program runs in a sandbox (:mod:`rookgrpo.code.sandbox`) that never holds test code,
expected values or a secret. This module, running in a runner process of its own (never the trainer process), holds
the tests: it runs them with ``candidate`` bound to a proxy whose calls cross to the sandbox as plain data
(:mod:`rookgrpo.code.wire`); every comparison and every piece of arithmetic on a result happens here, on decoded
plain values, so an object whose ``__eq__`` always says True, a patched harness or a forged record has nothing to act
on. Prompt helpers the tests use (``encode_cyclic``, ``poly``...) come from the problem's own prompt (``prelude``),
not from the completion.

Tests, per shape (see :mod:`rookgrpo.code.problems`):

- ``asserts``: each ``assert`` statement is one test; it counts only if the candidate was called since the previous
  test (``assert True`` exercises nothing and counts for nothing); an assert never reached counts as failed;
- ``calls``: each case calls the entry point and compares with its expected value;
- ``stdio``: each case runs the program on its input in a fresh sandbox and compares the output.

A timeout anywhere makes the verdict ``timed_out`` (the reward gives 0).

Run as ``python -m rookgrpo.code.runner``: a worker that reads jobs from stdin and writes verdicts to stdout, one
length-prefixed message each (see :class:`RunnerPool`).
"""

from __future__ import annotations

import ast
import builtins
import functools
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

from ..errors import ConfigError
from . import wire
from .sandbox import Sandbox, SandboxLimits


@dataclass
class Verdict:
    """What a program earned: tests passed out of tests counted, and how the run ended."""

    passed: int = 0
    counted: int = 0
    total: int = 0
    passed_ids: list = field(default_factory=list)  # which counted tests passed (assert or case index)
    counted_ids: list = field(default_factory=list)  # which tests counted
    variant_passed_ids: list = field(default_factory=list)  # a variants job: each variant's passed tests
    constant: bool = False  # the same answer for every input (two or more distinct inputs seen)
    echo: bool = False  # an input handed back as the answer, on every call
    loaded: bool = True
    timed_out: bool = False
    note: str = ""
    spare_pid: int = 0  # the runner's idle, pre-started sandbox (bwrap's pid): not a survivor of this job
    spare_workdir: str = ""  # and its work dir on the host (reduced isolation without namespaces), not a leftover


class TimedOut(BaseException):
    """The run's wall-clock budget is spent (a BaseException so test code's ``except Exception`` cannot catch it)."""


class CandidateRaised(Exception):
    """The candidate raised an exception that is not a builtin one (its name is kept)."""


class Remote:
    """Calls into the sandboxed program: arguments go out as plain data, the plain result (or exception) comes back."""

    def __init__(self, box: Sandbox, deadline: float):
        self.box, self.deadline, self.calls, self.seq = box, deadline, 0, 0
        self.seen: list[tuple[tuple, object]] = []  # (arguments, answer) of each call that answered

    def behaviour(self) -> tuple[bool, bool]:
        """(constant, echo) over the calls that answered: the same answer for two or more distinct inputs; an
        argument position whose value every answer equals."""
        inputs = {repr(args) for args, _ in self.seen}
        if len(inputs) < 2:
            return False, False
        constant = len({repr(answer) for _, answer in self.seen}) == 1
        width = min(len(args) for args, _ in self.seen)
        echo = any(all(equal(answer, args[i]) for args, answer in self.seen) for i in range(width))
        return constant, echo

    def _read(self) -> dict | None:
        try:
            return wire.read_message(self.box.resp_r, self.deadline)
        except TimeoutError as exc:
            raise TimedOut() from exc

    def loaded(self) -> bool:
        answer = self._read()
        return bool(answer) and answer.get("loaded") is True

    def call(self, name: str, args: tuple, kwargs: dict):
        self.calls += 1
        self.seq += 1
        if not (wire.is_plain(args) and wire.is_plain(kwargs)):
            raise TypeError("only plain data can be passed to the candidate")
        try:
            wire.write_literal(self.box.req_w, (self.seq, name, tuple(args), dict(kwargs)))
        except (BrokenPipeError, OSError) as exc:
            raise CandidateRaised("program gone") from exc
        answer = self._read()
        if answer is None or answer.get("seq") != self.seq:
            raise CandidateRaised("no answer")
        if "raised" in answer:
            name = answer["raised"] if type(answer["raised"]) is str else ""
            error = getattr(builtins, name, None)
            if isinstance(error, type) and issubclass(error, Exception) and error is not StopIteration:
                raise error(f"raised by the candidate: {name}")
            raise CandidateRaised(name[:100])
        value = wire.decode(answer.get("value"))
        if len(self.seen) < 1000:
            self.seen.append((tuple(args) + tuple(sorted(kwargs.items())), value))
        return value

    def function(self, name: str):
        """The trusted stand-in for the program's function ``name``."""
        remote = self

        def candidate(*args, **kwargs):
            return remote.call(name, args, kwargs)

        candidate.__name__ = name
        return candidate


# --- assert-style tests -----------------------------------------------------------------------------------------


def _no_args() -> ast.arguments:
    return ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[])


@functools.lru_cache(maxsize=4096)
def rewrite_asserts(tests: str) -> tuple[str, int]:
    """Each ``assert x`` in ``tests`` becomes ``__rk_test__(i, lambda: x)`` with a stable id; returns (code, count).

    Trusted code only (the problem's tests): the thunk is evaluated here, on values the sandbox returned as data.
    """
    tree = ast.parse(tests)
    counter = [0]

    class Rewriter(ast.NodeTransformer):
        def visit_Assert(self, node: ast.Assert):
            call = ast.Call(func=ast.Name("__rk_test__", ast.Load()),
                            args=[ast.Constant(counter[0]), ast.Lambda(_no_args(), node.test)], keywords=[])
            counter[0] += 1
            return ast.copy_location(ast.Expr(call), node)

    tree = ast.fix_missing_locations(Rewriter().visit(tree))
    return ast.unparse(tree), counter[0]


@functools.lru_cache(maxsize=1024)
def _compiled(source: str, name: str):
    """A problem's (trusted) test or prelude code, compiled once per runner: a GRPO group runs it G times."""
    return compile(source, name, "exec")


def run_asserts(box: Sandbox, remote: Remote, spec: dict, target: str | None = None) -> Verdict:
    """The asserts of ``spec`` against the program's function ``target`` (default: the entry point), bound under the
    entry point's name."""
    code, total = rewrite_asserts(spec["code"])
    entry = spec.get("entry_point")
    verdict = Verdict(total=total)
    results: dict[int, list[bool]] = {}  # id -> [exercised, passed]
    mark = [remote.calls]

    def record(test_id: int, thunk) -> None:
        try:
            ok = bool(thunk())
        except TimedOut:
            raise
        except BaseException:  # noqa: BLE001 (a failing test, whatever it raised)
            ok = False
        exercised = remote.calls > mark[0]
        mark[0] = remote.calls
        seen = results.setdefault(test_id, [False, True])
        seen[0] = seen[0] or exercised
        seen[1] = seen[1] and ok

    namespace: dict = {"__name__": "__rk_tests__", "__rk_test__": record}
    try:
        if spec.get("prelude"):
            exec(_compiled(spec["prelude"], "prelude.py"), namespace)  # the problem's own helpers (trusted)
        if entry:
            namespace[entry] = remote.function(target or entry)
        exec(_compiled(code, "tests.py"), namespace)
        if entry and callable(namespace.get("check")):
            namespace["check"](namespace[entry])
    except TimedOut:
        verdict.timed_out = True
    except BaseException as exc:  # noqa: BLE001 (the tests stopped early: the asserts not reached fail)
        verdict.note = f"tests stopped: {type(exc).__name__}"
    verdict.constant, verdict.echo = remote.behaviour()
    verdict.counted_ids = [i for i in range(total) if i not in results or results[i][0]]
    verdict.passed_ids = [i for i in verdict.counted_ids if i in results and results[i][1]]
    verdict.counted, verdict.passed = len(verdict.counted_ids), len(verdict.passed_ids)
    return verdict


# --- function-call and stdin/stdout tests --------------------------------------------------------------------------


def equal(got, expected) -> bool:
    """Equality for function-call cases: tuples compare as lists (JSON has none), floats to 1e-9 relative, and
    ``True`` never equals ``1``."""
    if isinstance(got, tuple):
        got = list(got)
    if isinstance(expected, tuple):
        expected = list(expected)
    if type(got) is float and isinstance(expected, (int, float)) and type(expected) is not bool:
        return math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-12)
    if type(got) is list and type(expected) is list:
        return len(got) == len(expected) and all(equal(a, b) for a, b in zip(got, expected))
    if type(got) is dict and type(expected) is dict:
        return got.keys() == expected.keys() and all(equal(got[k], expected[k]) for k in got)
    return type(got) is type(expected) and got == expected


def run_calls(box: Sandbox, remote: Remote, spec: dict, target: str | None = None) -> Verdict:
    cases = spec["cases"]
    verdict = Verdict(total=len(cases), counted=len(cases), counted_ids=list(range(len(cases))))
    candidate = remote.function(target or spec["entry_point"])
    for i, case in enumerate(cases):
        try:
            if equal(candidate(*case["args"]), case["expected"]):
                verdict.passed_ids.append(i)
        except TimedOut:
            verdict.timed_out = True
            break
        except Exception:  # noqa: BLE001
            pass
    verdict.passed = len(verdict.passed_ids)
    verdict.constant, verdict.echo = remote.behaviour()
    return verdict


def normalize_output(text: str) -> str:
    """Trailing whitespace removed per line and at the end; nothing else (no prefix or substring matches)."""
    return "\n".join(line.rstrip() for line in text.rstrip().splitlines())


def run_stdio(code: str, spec: dict, limits: SandboxLimits, uid: int | None, isolation: str = "full") -> Verdict:
    cases = spec["cases"]
    verdict = Verdict(total=len(cases), counted=len(cases), counted_ids=list(range(len(cases))))
    outputs: list[tuple[str, str]] = []  # (input, output) of each case, for the constant and echo checks
    for i, case in enumerate(cases):
        box = Sandbox(limits, uid, isolation)
        try:
            box.start_program(code)
            out, timed_out, over = box.wait_output(limits.timeout, str(case["input"]).encode())
        finally:
            box.close()
        if timed_out:
            verdict.timed_out = True
            break
        text = out.decode("utf-8", errors="replace")
        outputs.append((normalize_output(str(case["input"])), normalize_output(text)))
        if not over and normalize_output(text) == normalize_output(str(case["output"])):
            verdict.passed_ids.append(i)
    verdict.passed = len(verdict.passed_ids)
    if len({given for given, _ in outputs}) >= 2:
        verdict.constant = len({printed for _, printed in outputs}) == 1
        verdict.echo = all(given == printed for given, printed in outputs)
    return verdict


# A job whose spec holds this key runs variants of one program (rookgrpo.code.trivial): for function tests, the names of
# the functions its code defines, each tested in turn under the entry point's name; for stdin/stdout tests, programs.
VARIANTS = "__variants__"


def run_job(code: str, spec: dict, limits: SandboxLimits = SandboxLimits(), uid: int | None = None,
            box: Sandbox | None = None, isolation: str = "full") -> Verdict:
    """Run ``code`` against the tests ``spec``; never raises on anything the program does.

    ``box``: a sandbox already started in call mode with these limits, uid and isolation, waiting for its program (the
    runner keeps one ready); otherwise one is started here. ``isolation``: the sandbox's mode (``"full"`` refuses to
    start without bubblewrap: :class:`~rookgrpo.code.sandbox.SandboxUnavailable`).
    """
    kind = spec.get("type")
    variants = spec.get(VARIANTS)
    if kind == "stdio":
        if box is not None:
            box.close()
        if variants:  # each variant a program of its own
            return Verdict(total=_total(spec), variant_passed_ids=[
                run_stdio(program, spec, limits, uid, isolation).passed_ids for program in variants])
        return run_stdio(code, spec, limits, uid, isolation)
    if box is not None:
        try:
            box.load(code)
        except OSError:  # the pre-started sandbox died while it waited (killed, out of memory): start a new one
            box.close()
            box = None
    if box is None:
        box = Sandbox(limits, uid, isolation)
        box.start_calls(code)
    try:
        remote = Remote(box, time.monotonic() + limits.timeout * max(1, len(variants or ())))
        try:
            if not remote.loaded():
                return Verdict(total=_total(spec), loaded=False, note="the program did not load")
        except TimedOut:
            return Verdict(total=_total(spec), loaded=False, timed_out=True)
        except wire.WireError:
            return Verdict(total=_total(spec), loaded=False, note="unreadable answer")
        run = run_asserts if kind == "asserts" else run_calls
        if variants:  # one program defining every variant function; the tests run once per variant
            found = [run(box, remote, spec, name) for name in variants]
            return Verdict(total=_total(spec), timed_out=any(v.timed_out for v in found),
                           variant_passed_ids=[v.passed_ids for v in found])
        return run(box, remote, spec)
    finally:
        box.close()


def _total(spec: dict) -> int:
    return rewrite_asserts(spec["code"])[1] if spec.get("type") == "asserts" else len(spec.get("cases", []))


# --- the runner process --------------------------------------------------------------------------------------------


def main() -> int:
    """Worker loop: a job per message on stdin, a verdict per message on stdout (fd 1 kept for the protocol)."""
    from .sandbox import become_subreaper, reap_orphans

    become_subreaper()  # a killed sandbox's namespace init is reparented here and reaped after each job
    out_fd = os.dup(1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # stray prints (from a prelude) must not corrupt the protocol
    spare: tuple | None = None  # (limits, uid, isolation, sandbox started in call mode, waiting for its program)
    while True:
        try:
            job = wire.read_message(0)
        except wire.WireError:
            return 2
        if job is None:
            if spare:
                spare[3].close()
            return 0
        reap_orphans()
        limits, uid, mode = SandboxLimits(**job["limits"]), int(job["uid"]), job.get("isolation", "full")
        box = None
        if spare and spare[:3] == (limits, uid, mode):
            box = spare[3]
        elif spare:
            spare[3].close()
        try:
            verdict = run_job(job["code"], job["spec"], limits, uid, box, mode)
        except Exception as exc:  # noqa: BLE001 (a bug here must not kill the worker: the job scores 0)
            verdict = Verdict(loaded=False, note=f"runner error: {type(exc).__name__}: {exc}"[:300])
        reap_orphans()
        try:  # the next job's sandbox starts while this verdict travels and the next job is chosen
            spare = (limits, uid, mode, Sandbox(limits, uid, mode))
            spare[3].start_calls()
            verdict.spare_pid = spare[3].proc.pid
            verdict.spare_workdir = spare[3].workdir or ""
        except (OSError, subprocess.SubprocessError, ConfigError):  # e.g. no bubblewrap in full mode: refused
            spare = None
        reap_orphans()  # what the teardown's kill left has usually exited by now
        wire.write_message(out_fd, asdict(verdict))


if __name__ == "__main__":
    sys.exit(main())
