"""Reward isolation: a reward call that raises, hangs or returns a bad result never kills or stalls a run, and never
scores a row with a component silently counted as 0.

What TRL 1.16 does without it: an exception in any reward function ends the run (async ones through
``asyncio.gather``), nothing times a call out, a result of the wrong length is a ``ValueError`` and a string a
``TypeError`` deep in the step. The common workaround, a function that catches its own errors and returns ``None``,
goes wrong where other functions scored the row: TRL sums the components with ``nansum``, so the failed component
counts as 0, lowers that completion's reward and hands its group-mates an advantage.

What it does instead (``RookGRPOTrainer``, on by default: ``reward_isolation``):

- every call of every reward function (sync and async, a user's and each pack's; reward *models* are TRL's own
  forward pass and are not wrapped) runs with exceptions caught and a timeout (``reward_timeout`` seconds);
- a call that raises, times out, returns a result of the wrong length, or a value that is not a number (a string, a
  list, ``inf``) has *failed*: every row it scored is unscorable for the whole row. All of that row's components
  become NaN, so TRL's own rule for a row no function scored applies: it is left out of its group's baseline and
  gets advantage 0. No other component of that row is used;
- a function that scores row by row and fails on some rows returns :data:`FAILED` for them (not ``None``): those rows
  are unscorable in the same way, the rest of its batch is used;
- ``None`` (and NaN) keeps TRL's meaning, "this function does not apply to this row", and is counted;
- logged per function: ``rewards/<name>/failed`` (share of the batch's rows whose call failed) and
  ``rewards/<name>/none`` (share of rows it returned ``None`` for); the first failure of each function (and each new
  kind of error) is logged with its type and first line, and kept for the doctor and ``run_info.json``;
- a function that failed on every row of ``reward_failure_patience`` consecutive training batches stops the run
  with :class:`RewardFunctionError`: its name, the batches, and the last traceback;
- every rank decides the same: which calls failed is gathered with the rewards, so a timeout on one rank excludes
  that rank's rows on every rank and never desynchronises the collectives that follow.

What becomes of a call that timed out: a synchronous function runs in a daemon thread; Python cannot stop a thread,
so the call is abandoned and keeps running (holding what it holds) until it returns, and its result is thrown away. An
async function's task is cancelled (``asyncio.wait_for``): it stops at its next ``await``; one that blocks the event
loop without awaiting cannot be interrupted and holds up TRL's async loop, as it would without isolation.

With every call succeeding the rewards are TRL's, bit for bit (the parity tests run with isolation on); the cost is a
thread per call (``benchmarks/bench_reward_isolation.py``).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import numbers
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)


class RewardFunctionError(RuntimeError):
    """A reward function failed on every row of ``reward_failure_patience`` consecutive batches: a bug, not a flake.
    The message names the function, the steps and carries the last traceback."""


@dataclass
class Failure:
    """Why one call of a reward function failed."""

    kind: str  #: "exception", "timeout", "length", "value" (the whole call failed) or "rows" (FAILED for some rows)
    summary: str  #: the exception's type and first line, or what was wrong with the result
    traceback: str = ""  #: the formatted traceback (exceptions), else the summary
    exception: BaseException | None = field(default=None, repr=False)


class _Timeout(Exception):
    pass


class _Failed(float):
    """The type of :data:`FAILED`: a NaN float, so a trainer without isolation (plain TRL) reads it as ``None``."""

    def __new__(cls):
        return super().__new__(cls, "nan")

    def __repr__(self) -> str:
        return "FAILED"

    def __reduce__(self):
        return (_Failed, ())


#: What a reward function returns for a row it tried and failed to score (a judge request that failed for that row, a
#: sandbox that crashed on it): unlike ``None`` ("does not apply"), the whole row becomes unscorable, every component
#: left out and advantage 0, and it is counted in ``rewards/<name>/failed``. The way to catch errors per row inside a
#: reward function without TRL's ``nansum`` counting the component as 0. Under plain TRL it reads as ``None``.
FAILED = _Failed()


def check_result(result: Any, n: int) -> tuple[list | None, Failure | None]:
    """A reward function's result as TRL takes it (a list of ``n`` floats, ``None`` for "does not apply"), or why it
    cannot be used.

    >>> check_result([1, None, 0.5], 3)
    ([1.0, None, 0.5], None)
    >>> check_result([1.0, float("nan")], 2)[0]
    [1.0, None]
    >>> check_result([1.0], 2)[1].summary
    'returned 1 rewards for 2 completions'
    >>> check_result(["1.0", 0.0], 2)[1].summary
    "returned '1.0' (str) at row 0: a reward is a number, or None where the function does not apply"
    >>> check_result([FAILED, 1.0], 2)[0]
    [FAILED, 1.0]
    """
    if isinstance(result, (str, bytes)) or not hasattr(result, "__len__"):
        return None, Failure("value", f"returned {_short(result)} ({type(result).__name__}), not a list of {n} rewards")
    if hasattr(result, "tolist"):  # numpy arrays, tensors
        result = result.tolist()
    if len(result) != n:
        return None, Failure("length", f"returned {len(result)} rewards for {n} completions")
    out = []
    for i, value in enumerate(result):
        if value is None or isinstance(value, _Failed):
            out.append(value)
            continue
        if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
            value = value.item()
        if not isinstance(value, numbers.Real):
            return None, Failure("value", f"returned {_short(value)} ({type(value).__name__}) at row {i}: a reward is "
                                          "a number, or None where the function does not apply")
        value = float(value)
        if math.isnan(value):
            out.append(None)
        elif math.isinf(value):
            return None, Failure("value", f"returned {value} at row {i}: a reward must be finite (None where the "
                                          "function does not apply)")
        else:
            out.append(value)
    return out, None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _exception_failure(exc: BaseException) -> Failure:
    first = (str(exc).strip().splitlines() or [""])[0]
    summary = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return Failure("exception", summary, tb, exc)


def _timeout_failure(timeout: float, name: str, abandoned: str) -> Failure:
    summary = f"timed out: no result within reward_timeout={timeout:g} s"
    return Failure("timeout", summary, f"reward function {name!r} {summary}; {abandoned}")


class IsolatedSync:
    """A synchronous reward function, called in a daemon thread with a timeout; failures recorded, never raised.
    Keeps the function's name (TRL's metric names) and calls it with the caller's grad mode and context."""

    def __init__(self, func, index: int, name: str, record, timeout: float | None):
        self.func, self.index, self.__name__, self.record, self.timeout = func, index, name, record, timeout

    def __call__(self, prompts, completions, **kwargs):
        n = len(prompts)
        try:
            if self.timeout is None:
                result = self.func(prompts=prompts, completions=completions, **kwargs)
            else:
                result = self._call_in_thread(prompts, completions, kwargs)
        except _Timeout:
            return self._fail(n, _timeout_failure(self.timeout, self.__name__,
                                                  "its thread is left running and its result will be discarded"))
        except Exception as exc:  # noqa: BLE001 - a reward's bug must not end the run (counted, named, stopped on)
            return self._fail(n, _exception_failure(exc))
        return self._checked(result, n)

    def _call_in_thread(self, prompts, completions, kwargs):
        import torch

        box: dict = {}
        grad = torch.is_grad_enabled()
        context = contextvars.copy_context()

        def run():
            try:
                with torch.set_grad_enabled(grad):
                    box["result"] = context.run(self.func, prompts=prompts, completions=completions, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                box["error"] = exc

        thread = threading.Thread(target=run, name=f"reward:{self.__name__}", daemon=True)
        thread.start()
        thread.join(self.timeout)
        if thread.is_alive():
            raise _Timeout
        if "error" in box:
            raise box["error"]
        return box["result"]

    def _checked(self, result, n: int) -> list:
        """The result as TRL takes it, recorded; a result TRL cannot use is this call's failure."""
        rewards, failure = check_result(result, n)
        if failure is not None:
            return self._fail(n, failure)
        self.record(self.index, None, rewards)
        return rewards

    def _fail(self, n: int, failure: Failure) -> list:
        self.record(self.index, failure, None)
        return [None] * n


class IsolatedAsync(IsolatedSync):
    """An async reward function: awaited with ``asyncio.wait_for`` (cancelled at its timeout); failures recorded."""

    async def __call__(self, prompts, completions, **kwargs):
        n = len(prompts)
        try:
            coro = self.func(prompts=prompts, completions=completions, **kwargs)
            result = await (coro if self.timeout is None else asyncio.wait_for(coro, self.timeout))
        except asyncio.TimeoutError:
            return self._fail(n, _timeout_failure(self.timeout, self.__name__, "its task was cancelled"))
        except Exception as exc:  # noqa: BLE001
            return self._fail(n, _exception_failure(exc))
        return self._checked(result, n)


def is_async(func) -> bool:
    """Whether calling ``func`` returns a coroutine: an async function, a ``functools.partial`` of one, or an object
    whose ``__call__`` is async (TRL 1.16's ``is_async_callable``; TRL 1.10 has none)."""
    import functools
    import inspect

    while isinstance(func, functools.partial):
        func = func.func
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None))


def _as_coroutine_function(isolated: IsolatedAsync):
    """An async isolated call as a coroutine *function* named like the reward: what every TRL version runs
    concurrently (TRL 1.10 recognises async rewards with ``inspect.iscoroutinefunction`` only)."""

    async def call(prompts, completions, **kwargs):
        return await isolated(prompts, completions, **kwargs)

    call.__name__ = call.__qualname__ = isolated.__name__
    return call


def call_isolated(func, name: str, timeout: float | None, **kwargs) -> tuple[list | None, Failure | None]:
    """Call one reward function outside a training batch (a held-out evaluation scoring with the run's rewards),
    isolated as a training call is: (its rewards, with :data:`FAILED` rows as ``None``; ``None``) or (``None``, why
    the call failed). An async function runs to completion in an event loop of its own."""
    seen: dict = {}

    def record(index, failure, rewards):
        seen["failure"] = failure

    cls = IsolatedAsync if is_async(func) else IsolatedSync
    out = cls(func, 0, name, record, timeout)(**kwargs)
    if asyncio.iscoroutine(out):
        out = asyncio.run(out)
    if seen.get("failure") is not None and seen["failure"].kind != "rows":
        return None, seen["failure"]
    return [None if isinstance(r, _Failed) else r for r in out], None


@dataclass
class FunctionRecord:
    """What isolation has seen of one reward function over the run (``run_info.json``'s ``reward_failures``)."""

    name: str
    calls: int = 0
    failed_calls: int = 0
    failed_rows: int = 0  #: rows it failed on, all processes (failed calls and rows returned FAILED)
    first_error: str | None = None  #: the first failure's summary
    first_step: int | None = None  #: the training step at which it came
    last_traceback: str = ""  #: of the last failure on this process
    streak: int = 0  #: consecutive training batches in which it failed on every row (every rank)
    streak_from: int | None = None
    kinds_said: set = field(default_factory=set)
    last_exception: BaseException | None = field(default=None, repr=False)

    def to_dict(self) -> dict:
        return {"calls": self.calls, "failed_calls": self.failed_calls, "failed_rows": self.failed_rows,
                "first_error": self.first_error, "first_step": self.first_step}


class RewardIsolation:
    """Isolates a trainer's reward calls; :meth:`wrap` the functions for one batch, then :meth:`apply` to the gathered
    rewards. Owned by ``RookGRPOTrainer`` (``reward_isolation``); usable by any trainer that calls reward functions
    and gathers their rewards as TRL does."""

    def __init__(self, names: list[str], timeout: float | None, patience: int):
        self.names = list(names)
        self.timeout = timeout
        self.patience = int(patience)
        self.records = {name: FunctionRecord(name) for name in self.names}
        self._batch: dict[int, Failure | None] = {}  # this batch: the function's failure, if any
        self._rows: dict[int, list | None] = {}  # this batch: rows it returned FAILED for; None: the call failed

    # ---- one batch ---------------------------------------------------------------------------------------------

    def wrap(self, funcs: list) -> list:
        """The batch's functions, each isolated (reward models, ``nn.Module``, are left to TRL)."""
        import torch

        self._batch, self._rows = {}, {}
        out = []
        for i, (func, name) in enumerate(zip(funcs, self.names)):
            if isinstance(func, torch.nn.Module):
                out.append(func)
            elif is_async(func):
                out.append(_as_coroutine_function(IsolatedAsync(func, i, name, self._record, self.timeout)))
            else:
                out.append(IsolatedSync(func, i, name, self._record, self.timeout))
        return out

    def _record(self, index: int, failure: Failure | None, rewards: list | None) -> None:
        if failure is not None:
            self._batch[index] = failure
            self._rows[index] = None  # every row
            return
        self._batch[index] = None
        rows = [isinstance(r, _Failed) for r in rewards]
        self._rows[index] = rows if any(rows) else []
        if any(rows):
            self._batch[index] = Failure("rows", f"returned FAILED for {sum(rows)} of {len(rows)} rows")

    def apply(self, rewards_per_func, n_local: int, gather, gather_object, process_index: int, step: int,
              training: bool):
        """Mark every row whose call failed (on any rank), or that a function returned :data:`FAILED` for,
        unscorable in the gathered ``rewards_per_func`` (all its components NaN); returns (rewards, {metric: value}).
        ``gather``/``gather_object`` are the trainer's collectives (every rank calls this, with its own batch).
        Raises :class:`RewardFunctionError` on every rank when a function has failed on every row of ``patience``
        consecutive training batches."""
        import torch

        n_funcs = len(self.names)
        local = torch.zeros(n_local, n_funcs, device=rewards_per_func.device)
        for i in range(n_funcs):
            rows = self._rows.get(i, [])
            if rows is None:
                local[:, i] = 1.0
            elif rows:
                local[:, i] = torch.tensor(rows, dtype=torch.float32, device=local.device)
        rows_failed = gather(local).view(-1, n_funcs).bool()  # (all ranks' rows, functions)
        bad_rows = rows_failed.any(dim=1)
        was_nan = torch.isnan(rewards_per_func)
        if bad_rows.any():
            rewards_per_func = rewards_per_func.clone()
            rewards_per_func[bad_rows] = torch.nan
            # Every rank knows now that something failed, so every rank takes part in this gather: what failed where.
            said = [(f.kind, f.summary) if (f := self._batch.get(i)) is not None else None for i in range(n_funcs)]
            self._note(gather_object([said]), rows_failed, step, process_index, training)
        total = max(rewards_per_func.shape[0], 1)
        metrics = {}
        for i, name in enumerate(self.names):
            if i in self._batch:
                self.records[name].calls += 1
            metrics[f"rewards/{name}/failed"] = rows_failed[:, i].float().sum().item() / total
            metrics[f"rewards/{name}/none"] = (was_nan[:, i] & ~rows_failed[:, i]).float().sum().item() / total
        if training:
            n_proc = rows_failed.shape[0] // max(n_local, 1)
            self._check_streaks(rows_failed.all(dim=0).tolist(), step, n_proc)
        return rewards_per_func, metrics

    def _note(self, said: list, rows_failed, step: int, process_index: int, training: bool = True) -> None:
        """Count this batch's failures (``said``: each rank's (kind, summary) per function) and log each function's
        first failure, and each new kind of failure, once (on the main process)."""
        for i, name in enumerate(self.names):
            where = [(rank, entry[i]) for rank, entry in enumerate(said) if entry[i] is not None]
            if not where:
                continue
            record = self.records[name]
            record.failed_calls += sum(kind != "rows" for _, (kind, _) in where)
            record.failed_rows += int(rows_failed[:, i].sum().item())
            failure = self._batch.get(i)
            if failure is not None:
                record.last_traceback = failure.traceback or failure.summary
                record.last_exception = failure.exception
            rank, (kind, summary) = where[0]
            if record.first_error is None:
                record.first_error = summary if len(said) == 1 else f"{summary} (process {rank})"
                record.first_step = step
            key = kind if kind != "exception" else summary.split(":")[0]
            if key in record.kinds_said:
                continue
            record.kinds_said.add(key)
            if process_index == 0:
                ranks = "" if len(said) == 1 else f" on process(es) {', '.join(str(r) for r, _ in where)}"
                logger.warning("reward function %r failed at step %d%s (%s): %s. Its %d row(s) of this %s are "
                               "unscorable (every component left out, advantage 0); counted in %srewards/%s/failed.",
                               name, step, ranks, kind, summary, int(rows_failed[:, i].sum().item()),
                               "batch" if training else "evaluation batch", "" if training else "eval_", name)

    def _check_streaks(self, all_failed: list[bool], step: int, n_proc: int) -> None:
        for name, every in zip(self.names, all_failed):
            record = self.records[name]
            if not every:
                record.streak, record.streak_from = 0, None
                continue
            record.streak += 1
            record.streak_from = step if record.streak_from is None else record.streak_from
            if self.patience and record.streak >= self.patience:
                where = f"on all {n_proc} processes " if n_proc > 1 else ""
                message = (f"reward function {name!r} failed on every row {where}of {record.streak} consecutive "
                           f"training batch(es) (from step {record.streak_from}, reward_failure_patience="
                           f"{self.patience}): a bug in the function, not a flaky call, so the run stops here. First "
                           f"error: {record.first_error}. Last failure on this process:\n{record.last_traceback}\n"
                           "Fix the function (rookgrpo rewards audit RECIPE calls it on the recipe's data); raise "
                           "reward_failure_patience to ride out longer outages; reward_isolation: false lets the "
                           "exception end the run as TRL does.")
                raise RewardFunctionError(message) from record.last_exception

    def summary(self) -> dict:
        """{name: calls, failed calls, failed rows, first error, its step} for every function that has failed (a whole
        call, or rows it returned :data:`FAILED` for)."""
        return {name: r.to_dict() for name, r in self.records.items() if r.first_error is not None}
