"""``skip_nonfinite``: an optimizer step whose gradient norm or loss is NaN/inf is not applied, and the run goes on.

Why: one NaN gradient applied is the end of a run: the weights turn NaN, Adam's moments keep NaN for every later step,
and any checkpoint saved after it is unusable. A NaN gradient with a finite loss is usually a backward kernel's fault
(the cuDNN attention fault, :mod:`rookgrpo.dynamics.attention`), which a later batch of another width does not hit;
a NaN loss is the data's, the rewards' or the step size's. Either way the update must not land. Each optimizer step
gets a verdict from :mod:`rookgrpo.dynamics.nonfinite`, the same on every rank, and a non-finite step's update is kept
out: its gradients are dropped before ``optimizer.step()`` (one process, DDP, FSDP2), so that no weight, optimizer
moment or weight decay changes; under DeepSpeed ZeRO the update is vetoed inside the engine's step (or DeepSpeed's own
overflow check skips it first), master weights included. The learning-rate schedule advances as for any step, except
where DeepSpeed skips the step itself. Under fp16 a loss scaler's routine overflow (a non-finite gradient with a finite
loss, at a scale above 1) is the scaler's to skip, and is neither counted nor warned about.

:class:`~rookgrpo.RookGRPOTrainer` adds it on its own (config field ``skip_nonfinite_updates``, on by default); on a
plain TRL ``GRPOTrainer`` name it in ``callbacks`` (there it judges the gradients alone, on each process, and logs
nothing but the warning; under DeepSpeed it needs ``RookGRPOTrainer``).

Logged in every training log entry: ``skipped_updates`` (steps skipped so far in the run) and
``skipped_updates/nonfinite_loss`` (of them, steps whose loss was non-finite); the step's ``grad_norm`` stays NaN (or
DeepSpeed's inf) in the log, so the doctor and a reader see what happened. Each skipped step is also said once at
warning level, with how it was kept out.
"""

from __future__ import annotations

import logging

from ..dynamics.nonfinite import StepCheck, judge_step, step_check
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
        self.trainer = None
        self._check = StepCheck()  # on a plain TRL trainer, which never binds: gradients only, this process

    def on_train_begin(self, args, state, control, **kwargs):
        if self.trainer is not None and getattr(self.trainer, "is_deepspeed_enabled", False):
            step_check(self.trainer).install_deepspeed(self.trainer, veto=True)  # the engine exists from here on

    def on_training_loss(self, trainer, model, loss) -> None:
        step_check(trainer).observe_loss(loss)

    def on_pre_optimizer_step(self, args, state, control, model=None, optimizer=None, **kwargs):
        check, verdict, optimizer = judge_step(self._check, self.trainer, state, model, optimizer)
        if not verdict.nonfinite:
            return
        check.keep_out(verdict, optimizer, self.trainer)
        self.skipped += 1
        self.skipped_loss += verdict.cause == "loss"
        if state.is_world_process_zero:
            what = ("the loss was NaN/inf" if verdict.cause == "loss" else
                    f"the gradient norm was {verdict.grad_norm} with a finite loss (a backward kernel's fault, e.g. "
                    "the cuDNN attention one: docs/howto.md)")
            logger.warning("step %d: %s; %s (%d skipped so far). The weights and optimizer state are the previous "
                           "step's.", state.global_step + 1, what, verdict.how, self.skipped)

    def before_log(self, trainer, logs: dict) -> None:
        if "loss" in logs:
            logs["skipped_updates"] = self.skipped
            logs["skipped_updates/nonfinite_loss"] = self.skipped_loss

    def state_dict(self) -> dict:
        return {"skipped": self.skipped, "skipped_loss": self.skipped_loss}

    def load_state_dict(self, state: dict) -> None:
        self.skipped = int(state.get("skipped", 0))
        self.skipped_loss = int(state.get("skipped_loss", 0))
