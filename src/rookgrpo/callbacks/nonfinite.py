"""``skip_nonfinite``: an optimizer step whose gradient norm or loss is NaN/inf is not applied, and the run goes on.

Why: one NaN gradient applied is the end of a run: the weights turn NaN, Adam's moments keep NaN for every later step,
and any checkpoint saved after it is unusable. A NaN gradient with a finite loss is usually a backward kernel's fault
(the cuDNN attention fault, :mod:`rookgrpo.dynamics.attention`), which a later batch of another width does not hit;
a NaN loss is the data's, the rewards' or the step size's. Either way the update must not land. Before each optimizer
step (after the gradients are reduced and clipped) this callback asks :mod:`rookgrpo.dynamics.nonfinite` for the step's
verdict, the same on every rank, and drops the gradients of a non-finite step, so that ``optimizer.step()`` changes no
weight, no optimizer moment and applies no weight decay. The learning-rate schedule advances as for any step.

:class:`~rookgrpo.RookGRPOTrainer` adds it on its own (config field ``skip_nonfinite_updates``, on by default); on a
plain TRL ``GRPOTrainer`` name it in ``callbacks`` (there it judges the gradients alone, on each process, and logs
nothing but the warning). Under DeepSpeed, whose engine steps its own optimizer, it cannot
act and says so once.

Logged in every training log entry: ``skipped_updates`` (steps skipped so far in the run) and
``skipped_updates/nonfinite_loss`` (of them, steps whose loss was non-finite); the step's ``grad_norm`` stays NaN in the
log, so the doctor and a reader see what happened. Each skipped step is also said once at warning level.
"""

from __future__ import annotations

import logging

from ..dynamics.nonfinite import StepCheck, optimizer_params, step_check, trainer_verdict
from .base import RookCallback
from .registry import register_callback

logger = logging.getLogger("rookgrpo.nonfinite")


@register_callback("skip_nonfinite")
class SkipNonfinite(RookCallback):
    """Drop the gradients of an optimizer step whose gradient norm or loss is NaN/inf (see the module docstring).

    Args:
        (none): it has no settings; ``RookGRPOTrainer`` adds it unless ``skip_nonfinite_updates: false``.

    Example::

        >>> from rookgrpo.callbacks import resolve_callback
        >>> cb = resolve_callback("skip_nonfinite")
        >>> type(cb).__name__, cb.skipped, cb.implements("on_training_loss")
        ('SkipNonfinite', 0, True)
    """

    state_key = "skip_nonfinite"

    def __init__(self):
        self.skipped = 0  # steps not applied, over the run (checkpointed)
        self.skipped_loss = 0  # ... of them, steps with a non-finite loss
        self.active = True
        self.trainer = None
        self._check = StepCheck()  # on a plain TRL trainer, which never binds: gradients only, this process

    def bind(self, trainer) -> None:
        super().bind(trainer)
        if getattr(trainer, "is_deepspeed_enabled", False):
            self.active = False
            if trainer.accelerator.is_main_process:
                logger.warning("skip_nonfinite: DeepSpeed steps its own optimizer, so a non-finite step cannot be "
                               "dropped here; use bf16 with gradient clipping (DeepSpeed's fp16 loss scaler skips "
                               "overflowing steps itself).")

    def on_training_loss(self, trainer, model, loss) -> None:
        if self.active:
            step_check(trainer).observe_loss(loss)

    def on_pre_optimizer_step(self, args, state, control, model=None, optimizer=None, **kwargs):
        trainer = self.trainer
        if not self.active:
            return
        if trainer is None:  # a plain TRL GRPOTrainer: the event's model and optimizer, the gradients' finiteness
            check = self._check
            verdict = check.verdict(int(state.global_step), optimizer_params(optimizer, model))
        else:
            check = step_check(trainer)
            optimizer = optimizer if optimizer is not None else trainer.optimizer
            verdict = trainer_verdict(trainer, model, optimizer)
        if not verdict.nonfinite:
            return
        check.drop_gradients(verdict.step, optimizer)
        self.skipped += 1
        self.skipped_loss += verdict.cause == "loss"
        if state.is_world_process_zero:
            what = ("the loss was NaN/inf" if verdict.cause == "loss" else
                    f"the gradient norm was {verdict.grad_norm} with a finite loss (a backward kernel's fault, e.g. "
                    "the cuDNN attention one: docs/howto.md)")
            logger.warning("step %d: %s; this update was not applied (%d skipped so far). The weights and optimizer "
                           "state are the previous step's.", state.global_step + 1, what, self.skipped)

    def before_log(self, trainer, logs: dict) -> None:
        if self.active and "loss" in logs:
            logs["skipped_updates"] = self.skipped
            logs["skipped_updates/nonfinite_loss"] = self.skipped_loss

    def state_dict(self) -> dict:
        return {"skipped": self.skipped, "skipped_loss": self.skipped_loss}

    def load_state_dict(self, state: dict) -> None:
        self.skipped = int(state.get("skipped", 0))
        self.skipped_loss = int(state.get("skipped_loss", 0))
