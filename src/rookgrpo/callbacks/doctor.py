"""``doctor``: run the doctor's detectors while training, warn once per finding, and stop the run on the ones named.

Why: the runs rookgrpo's users lost days to "did nothing" or got worse, and the numbers that said so were in the
logs all along (KL at most of the update, a held-out metric falling while the reward rose, components carrying no
spread). This callback reads the same log history ``rookgrpo doctor RUN`` reads after the fact
(:mod:`rookgrpo.doctor.detectors`), after every ``check_every``-th log, and says each new finding once, with its
cause and fix. With ``halt_on`` it ends the run on the named findings, saving a checkpoint first; ``nonfinite`` is
judged before each optimizer step (:mod:`rookgrpo.dynamics.nonfinite`), so a NaN update is never applied or saved.

On a plain TRL ``GRPOTrainer`` (an ordinary ``TrainerCallback`` there) the detectors, warnings, ``halt_on`` and
``doctor.json`` work the same; the KL gradient needs :class:`~rookgrpo.RookGRPOTrainer`'s hooks.

It also measures what the logged numbers cannot say: every ``kl_grad_every`` optimizer steps, how much of the update
the KL term makes (:mod:`rookgrpo.dynamics.kl_grad`): ``loss/kl_grad_share``, ``grad/kl_norm``,
``grad/policy_norm``, ``grad/kl_policy_cos``, in the next log. At the end it writes ``doctor.json`` (findings and
skipped detectors) into the output directory.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping, Sequence

from ..dynamics.nonfinite import StepCheck, judge_step, step_check
from ..errors import ConfigError
from .base import RookCallback
from .registry import register_callback

logger = logging.getLogger("rookgrpo.doctor")


@register_callback("doctor")
class Doctor(RookCallback):
    """Detect the ways a GRPO run fails from its logs, live (see the module docstring and ``rookgrpo doctor``).

    Args:
        check_every: run the detectors after every this many training logs.
        kl_grad_every: measure the KL term's share of the gradient every this many optimizer steps (0: never). Costs
            one extra backward pass on those steps.
        halt_on: finding kinds that stop the run (a checkpoint is saved first), e.g. ``[nonfinite, heldout_drop]``;
            an ``info`` finding (a real change too small to matter) never stops it. ``nonfinite`` acts before the
            optimizer step that would apply a NaN/inf gradient or loss, which is then not applied, so the checkpoint
            holds the last finite weights.
        thresholds: overrides of ``rookgrpo.doctor.Thresholds`` fields, e.g. ``{entropy_drop: 0.3}``.
        report: file name of the findings written into ``output_dir`` at the end (``null``: none).

    Example::

        >>> from rookgrpo.callbacks import resolve_callback
        >>> cb = resolve_callback({"doctor": {"halt_on": ["nonfinite"], "thresholds": {"entropy_drop": 0.3}}})
        >>> type(cb).__name__, cb.halt_on, cb.thresholds.entropy_drop
        ('Doctor', ['nonfinite'], 0.3)
    """

    state_key = "doctor"

    #: its detectors read the log history, which TRL's AsyncGRPOTrainer writes too (tests/test_async_grpo.py)
    async_grpo = True

    def __init__(self, check_every: int = 1, kl_grad_every: int = 10, halt_on: Sequence[str] = (),
                 thresholds: Mapping | None = None, report: str | None = "doctor.json"):
        from ..doctor import Thresholds
        from ..doctor.detectors import KINDS

        if int(check_every) < 1:
            raise ConfigError(f"doctor.check_every: got {check_every}; it must be >= 1 (logs between checks).")
        if int(kl_grad_every) < 0:
            raise ConfigError(f"doctor.kl_grad_every: got {kl_grad_every}; it must be >= 0 (0 turns it off).")
        if isinstance(halt_on, str):
            halt_on = [halt_on]
        unknown = [k for k in halt_on if k not in KINDS]
        if unknown:
            raise ConfigError(f"doctor.halt_on: unknown finding kind(s) {unknown}; kinds: {', '.join(KINDS)}.")
        fields = {f.name for f in dataclasses.fields(Thresholds)}
        bad = sorted(set(thresholds or {}) - fields)
        if bad:
            raise ConfigError(f"doctor.thresholds: unknown field(s) {bad}; fields: {', '.join(sorted(fields))}.")
        self.check_every, self.kl_grad_every = int(check_every), int(kl_grad_every)
        self.halt_on = list(halt_on)
        self.thresholds = Thresholds(**dict(thresholds or {}))
        self.report = report
        self.reported: dict[str, dict] = {}  # finding key -> the finding when first said
        self.halted: str | None = None
        self._logs = 0
        self._pending: list[dict] = []
        self.meter = None
        self._own_check = StepCheck()  # halt_on nonfinite on a plain TRL trainer, which never binds

    def bind(self, trainer) -> None:
        super().bind(trainer)
        if not self.thresholds.reward_weights:
            weights = getattr(trainer, "reward_weights", None)
            if weights is not None:
                self.thresholds.reward_weights = {n: float(w) for n, w in zip(trainer.reward_func_names, weights.tolist())}
        if self.thresholds.precision is None:
            args = trainer.args
            self.thresholds.precision = "fp16" if args.fp16 else "bf16" if args.bf16 else "fp32"
        if not self.thresholds.measured:
            self.thresholds.measured = dict(getattr(trainer.args, "measured_settings", None) or {})
        if self.thresholds.judges is None and getattr(trainer, "reward_funcs", None) is not None:
            from ..rewards.registry import judge_names

            self.thresholds.judges = judge_names(trainer)
        if self.kl_grad_every:
            from ..dynamics.kl_grad import KLGradMeter

            self.meter = KLGradMeter(trainer)

    # ---- the KL gradient ------------------------------------------------------------------------------------------

    def on_step_begin(self, args, state, control, **kwargs):
        if self.meter is not None and state.global_step % self.kl_grad_every == 0:
            self.meter.begin_step()

    def on_loss_logps(self, trainer, inputs, per_token_logps) -> None:
        if self.meter is not None and self.meter.measuring and trainer.model.training:
            self.meter.swap_beta()

    def on_training_loss(self, trainer, model, loss) -> None:
        if "nonfinite" in self.halt_on:
            step_check(trainer).observe_loss(loss)
        if self.meter is not None:
            self.meter.after_loss(loss)

    def on_pre_optimizer_step(self, args, state, control, model=None, optimizer=None, **kwargs):
        if self.meter is not None and self.meter.measuring:
            values = self.meter.finish()
            if values:
                self._pending.append(values)
        if "nonfinite" in self.halt_on and self.halted is None:
            self._halt_before_a_nonfinite_step(state, control, model, optimizer)

    def on_train_begin(self, args, state, control, **kwargs):
        trainer = getattr(self, "trainer", None)
        if "nonfinite" in self.halt_on and trainer is not None and getattr(trainer, "is_deepspeed_enabled", False):
            step_check(trainer).install_deepspeed(trainer, veto=True)  # the engine steps before on_pre_optimizer_step

    def _halt_before_a_nonfinite_step(self, state, control, model, optimizer) -> None:
        """``halt_on: [nonfinite]`` acts here, before the optimizer step, not after the step's log: the step's
        update is kept out (its gradients dropped; under DeepSpeed, vetoed inside the engine's step), so the checkpoint
        saved on stopping holds the last finite weights."""
        trainer = getattr(self, "trainer", None)
        check, verdict, optimizer = judge_step(self._own_check, trainer, state, model, optimizer)
        if not verdict.nonfinite:
            return
        check.keep_out(verdict, optimizer, trainer)
        subject = "loss" if verdict.cause == "loss" else "grad_norm"
        self.halted = f"nonfinite:{subject}"
        control.should_training_stop = True
        control.should_save = True
        if state.is_world_process_zero:
            what = ("the loss was NaN/inf" if verdict.cause == "loss" else
                    f"the gradient norm was {verdict.grad_norm} with a finite loss (a backward kernel's fault)")
            kept = verdict.kept_out != "applied"
            logger.warning("doctor: stopping the run before step %d's update (halt_on: nonfinite): %s; %s, so the "
                           "checkpoint saved now holds %s.", state.global_step + 1, what, verdict.how,
                           f"step {state.global_step}'s weights" if kept else "that update")

    def before_log(self, trainer, logs: dict) -> None:
        if self._pending and "loss" in logs:
            for name in self._pending[0]:
                logs[name] = sum(v[name] for v in self._pending) / len(self._pending)
            self._pending = []

    # ---- the detectors --------------------------------------------------------------------------------------------

    def _check(self, state):
        from ..doctor import History, diagnose

        entries = [e for e in state.log_history if "train_runtime" not in e]  # not the closing summary
        isolation = getattr(getattr(self, "trainer", None), "_isolation", None)  # reward_isolation's first errors
        if isolation is not None:
            self.thresholds.reward_errors = {n: r["first_error"] for n, r in isolation.summary().items()}
        findings, skipped = diagnose(History(entries, "live"), self.thresholds)
        return findings, skipped

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs and not any(k.startswith(("heldout/", "eval_")) for k in logs):
            return
        self._logs += 1
        if self._logs % self.check_every:
            return
        from ..doctor.detectors import SEVERITIES

        findings, _ = self._check(state)
        main = state.is_world_process_zero  # not the trainer's: on a plain TRL GRPOTrainer bind() never ran
        halt = None
        for finding in findings:
            before = self.reported.get(finding.key)
            if before is not None and SEVERITIES.index(finding.severity) >= SEVERITIES.index(before["severity"]):
                continue  # said already, at this severity or a higher one; a finding that grows is said again
            self.reported[finding.key] = finding.to_dict()
            if main:
                logger.warning("doctor: %s", finding.line())
            if finding.kind in self.halt_on and finding.severity != "info" and halt is None:
                halt = finding.key
        if self.halted is None and self.halt_on:
            halt = self._any_rank(halt)
        if halt is not None and self.halted is None:
            self.halted = halt
            control.should_training_stop = True
            control.should_save = True
            if main:
                logger.warning("doctor: stopping the run at step %d on %s (halt_on); a checkpoint is saved.",
                               state.global_step, halt.split(":")[0])

    def _any_rank(self, halt: str | None) -> str | None:
        """The halt every rank takes: the first rank's finding to halt on, if any rank has one. The detectors read
        each rank's own log, and a metric a rank measures alone (``compile/graphs``, a rank's timing) can differ:
        a rank that stopped alone would leave the others waiting in the next collective."""
        accelerator = getattr(getattr(self, "trainer", None), "accelerator", None)
        if accelerator is None or accelerator.num_processes < 2:
            return halt
        from accelerate.utils import gather_object

        return next((key for key in gather_object([halt]) if key is not None), None)

    def on_train_end(self, args, state, control, **kwargs):
        if self.meter is not None:
            self.meter.restore()
        if not state.is_world_process_zero:
            return
        findings, skipped = self._check(state)
        if self.report and args.output_dir:
            os.makedirs(args.output_dir, exist_ok=True)
            with open(os.path.join(args.output_dir, self.report), "w") as f:
                json.dump({"findings": [x.to_dict() for x in findings], "skipped": skipped, "halted_on": self.halted},
                          f, indent=1)
        kinds = sorted({x.kind for x in findings})
        logger.warning("doctor: %d finding(s) at the end of training%s%s", len(findings),
                       f" ({', '.join(kinds)})" if kinds else "",
                       f"; details in {os.path.join(args.output_dir, self.report)}" if self.report and args.output_dir else "")

    def state_dict(self) -> dict:
        return {"reported": self.reported, "halted": self.halted, "logs": self._logs}

    def load_state_dict(self, state: dict) -> None:
        self.reported = dict(state.get("reported", {}))
        self.halted = state.get("halted")
        self._logs = int(state.get("logs", 0))
