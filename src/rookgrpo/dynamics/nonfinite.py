"""Whether an optimizer step's gradient (or loss) is non-finite, decided the same on every rank, and how to drop it.

Why: a NaN gradient that reaches ``optimizer.step()`` writes NaN into every weight and, with Adam, into its moments
for the rest of the run; a checkpoint saved after it holds NaN weights. The check runs at ``on_pre_optimizer_step``,
after the gradients are reduced and clipped and before the step, and the verdict is one that every rank shares: the
gradient norm transformers computes is already global (DDP all-reduces the gradients; FSDP2's norm reduces its
shards), and the loss flags, which differ per rank, are summed over ranks. Dropping the gradients (``grad = None`` for
every parameter the optimizer holds) makes that ``optimizer.step()`` skip every parameter: no moment update, no
weight decay, no weight change (PyTorch's optimizers skip parameters without a gradient).

:class:`StepCheck` is shared by the callbacks that act on the verdict (``skip_nonfinite``, the ``doctor``'s
``halt_on: [nonfinite]``), so they agree and the gradients are inspected once per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class Verdict:
    """One optimizer step's verdict: its gradient norm (NaN where only finiteness is known), whether every loss of
    the step (all micro-batches, all ranks) was finite, and whether the step must not be applied."""

    step: int
    grad_norm: float
    loss_finite: bool

    @property
    def nonfinite(self) -> bool:
        return not (self.loss_finite and math.isfinite(self.grad_norm))

    @property
    def cause(self) -> str:
        """``"loss"`` when a loss was non-finite, ``"gradient"`` when only the gradient was (a backward kernel's
        fault: the loss was finite), ``""`` when the step is finite."""
        if not self.loss_finite:
            return "loss"
        return "" if math.isfinite(self.grad_norm) else "gradient"


class StepCheck:
    """The non-finite check of one trainer's optimizer steps (one instance per trainer: :func:`step_check`)."""

    def __init__(self):
        self._bad_loss: torch.Tensor | None = None  # summed non-finite losses since the last verdict (no host sync)
        self._verdict: Verdict | None = None
        self.dropped_step: int | None = None

    def observe_loss(self, loss: torch.Tensor) -> None:
        """Note a micro-batch's training loss (kept on its device until the step's verdict)."""
        bad = (~torch.isfinite(loss.detach())).any().to(torch.float32)
        self._bad_loss = bad if self._bad_loss is None else self._bad_loss + bad

    def verdict(self, step: int, params: list, accelerator=None, grad_norm=None) -> Verdict:
        """The verdict of the step about to be applied (computed once per ``step``; the same on every rank).

        ``params``: the parameters the optimizer steps; ``grad_norm``: the step's norm where it is known (transformers
        computes it when it clips), else the gradients are inspected; ``accelerator``: to share the loss flags with
        the other ranks."""
        if self._verdict is not None and self._verdict.step == step:
            return self._verdict
        full = getattr(grad_norm, "full_tensor", None)  # FSDP2: a DTensor norm, the same on every rank once full
        if callable(full):
            grad_norm = full()
        device = params[0].device if params else torch.device("cpu")
        flags = torch.zeros(2, dtype=torch.float32, device=device)
        if self._bad_loss is not None:
            flags[0] = self._bad_loss.to(device)
        if grad_norm is None:  # not clipped this step (max_grad_norm 0): look at the gradients themselves
            for p in params:
                if p.grad is not None:
                    flags[1] += _nonfinite(p.grad)
        if accelerator is not None and accelerator.num_processes > 1:
            flags = accelerator.reduce(flags, reduction="sum")
        bad_loss, bad_grad = (float(v) > 0 for v in flags.tolist())
        norm = float("nan") if bad_grad else float(grad_norm) if grad_norm is not None else 0.0
        self._bad_loss = None
        self._verdict = Verdict(step, norm, not bad_loss)
        return self._verdict

    def drop_gradients(self, step: int, optimizer) -> None:
        """Drop the step's gradients so the coming ``optimizer.step()`` changes nothing (once per step)."""
        if self.dropped_step == step:
            return
        for group in getattr(optimizer, "param_groups", ()):
            for p in group["params"]:
                p.grad = None
        self.dropped_step = step


def trainer_verdict(trainer, model=None, optimizer=None) -> Verdict:
    """:meth:`StepCheck.verdict` for the step a trainer is about to apply (``model``/``optimizer``: the event's, where
    the trainer's attributes are not set, e.g. a plain TRL trainer's callback)."""
    optimizer = optimizer if optimizer is not None else getattr(trainer, "optimizer", None)
    return step_check(trainer).verdict(int(trainer.state.global_step), optimizer_params(optimizer, model or trainer.model),
                                       getattr(trainer, "accelerator", None),
                                       getattr(trainer, "grad_norm_before_clip", None))


def _nonfinite(grad: torch.Tensor) -> torch.Tensor:
    local = getattr(grad, "to_local", None)  # an FSDP2 DTensor shard: this rank's part (ranks are summed after)
    g = local() if callable(local) else grad
    return (~torch.isfinite(g)).any().to(torch.float32).to(g.device)


def optimizer_params(optimizer, model) -> list:
    """The parameters ``optimizer`` steps (``model``'s trainable ones where there is no optimizer yet)."""
    if optimizer is not None and getattr(optimizer, "param_groups", None):
        return [p for group in optimizer.param_groups for p in group["params"]]
    return [p for p in model.parameters() if p.requires_grad] if model is not None else []


def step_check(trainer) -> StepCheck:
    """The trainer's :class:`StepCheck`, made on first use."""
    check = getattr(trainer, "_rookgrpo_step_check", None)
    if check is None:
        check = StepCheck()
        trainer._rookgrpo_step_check = check
    return check
