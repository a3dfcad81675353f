"""Whether an optimizer step's gradient (or loss) is non-finite, decided the same on every rank, and how the update is
kept out of the weights.

Why: a NaN gradient that reaches ``optimizer.step()`` writes NaN into every weight and, with Adam, into its moments
for the rest of the run; a checkpoint saved after it holds NaN weights. The verdict is one that every rank shares: the
gradient norm transformers computes is already global (DDP all-reduces the gradients; FSDP2's norm reduces its
shards), and the loss flags, which differ per rank, are summed over ranks.

Where the update is kept out depends on who steps the optimizer:

- transformers (one process, DDP, FSDP2): at ``on_pre_optimizer_step``, after the gradients are reduced and clipped
  and before the step, the gradients are dropped (``grad = None`` for every parameter the optimizer holds), so that
  ``optimizer.step()`` skips every parameter: no moment update, no weight decay, no weight change (PyTorch's
  optimizers skip parameters without a gradient). The learning-rate schedule advances as for any step.
- fp16 with a loss scaler (torch's ``GradScaler``): the scaler skips a step whose gradients overflowed and lowers its
  scale, which at a scale above 1 is its routine, not a fault: such a step is not counted (``Verdict.scaler_overflow``)
  and nothing is dropped. At a scale of 1 or less the gradient itself is non-finite: counted as any other.
- DeepSpeed: the engine steps inside ``accelerator.backward``, before ``on_pre_optimizer_step``. :meth:`StepCheck.
  install_deepspeed` decides inside the engine's step instead: a hook on every trainable parameter flags a non-finite
  gradient as backward computes it (each rank, each micro-batch), and a step pre-hook on the torch optimizer that
  DeepSpeed's ZeRO optimizer steps (:func:`rookgrpo.dynamics.deepspeed.stepped_optimizers`) shares the flags over the
  ranks and, on a non-finite verdict, drops the fp32 partitions' gradients, so that no master weight, moment or
  decay changes and the module's weights, rewritten from the master, stay as they were. Where DeepSpeed's own overflow
  check skips the step first (fp16's loss scaler in every version; a non-finite norm in every precision from 0.19.5;
  bf16's ``check_grad_overflow``), the pre-hook never runs and ``engine.was_step_applied()`` says it was skipped. Either
  way :attr:`Verdict.kept_out` says how. (Where DeepSpeed skips, it does not advance its learning-rate schedule.)

:class:`StepCheck` is shared by the callbacks that act on the verdict (``skip_nonfinite``, the ``doctor``'s
``halt_on: [nonfinite]``), so they agree and the gradients are inspected once per step.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

from . import deepspeed as ds

logger = logging.getLogger("rookgrpo.nonfinite")


@dataclass
class Verdict:
    """One optimizer step's verdict: its gradient norm (NaN where only finiteness is known), whether every loss of
    the step (all micro-batches, all ranks) was finite, whether a loss scaler's routine overflow explains a non-finite
    gradient, and (once :meth:`StepCheck.keep_out` ran) how the update was kept out of the weights."""

    step: int
    grad_norm: float
    loss_finite: bool
    scaler_overflow: bool = False
    #: ``"dropped"`` (gradients dropped before the step), ``"vetoed"`` (inside DeepSpeed's step), ``"deepspeed"``
    #: (DeepSpeed's overflow check skipped it), ``"scaler"`` (the loss scaler skipped it), ``"applied"`` (nothing
    #: kept it out), ``""`` (not decided yet, or a finite step)
    kept_out: str = ""

    @property
    def nonfinite(self) -> bool:
        """A step that must not be applied and is counted: a non-finite loss, or a non-finite gradient that is not a
        loss scaler's routine overflow."""
        return not self.loss_finite or (not math.isfinite(self.grad_norm) and not self.scaler_overflow)

    @property
    def cause(self) -> str:
        """``"loss"`` when a loss was non-finite, ``"gradient"`` when only the gradient was (a backward kernel's
        fault: the loss was finite), ``""`` when the step is finite or the scaler's routine overflow."""
        if not self.loss_finite:
            return "loss"
        return "gradient" if self.nonfinite else ""

    @property
    def how(self) -> str:
        """How the update was kept out, in words (for the warnings)."""
        return {"dropped": "this update was not applied",
                "vetoed": "this update was not applied (vetoed inside DeepSpeed's optimizer step)",
                "deepspeed": "DeepSpeed's overflow check skipped this update",
                "scaler": "the fp16 loss scaler skipped this update",
                "applied": "THIS UPDATE WAS APPLIED (nothing could keep it out: docs/howto.md)"}.get(self.kept_out, "")


class StepCheck:
    """The non-finite check of one trainer's optimizer steps (one instance per trainer: :func:`step_check`)."""

    def __init__(self):
        self._bad_loss: torch.Tensor | None = None  # summed non-finite losses since the last verdict (no host sync)
        self._bad_grad: torch.Tensor | None = None  # DeepSpeed: non-finite gradients flagged by the parameter hooks
        self._verdict: Verdict | None = None
        self.dropped_step: int | None = None
        self.trainer = None  # set by install_deepspeed
        self.deepspeed = False
        self.veto = False  # DeepSpeed: a callback asked for the update to be kept out
        self.vetoed_step: int | None = None

    def observe_loss(self, loss: torch.Tensor) -> None:
        """Note a micro-batch's training loss (kept on its device until the step's verdict)."""
        bad = (~torch.isfinite(loss.detach())).any().to(torch.float32)
        self._bad_loss = bad if self._bad_loss is None else self._bad_loss + bad

    def verdict(self, step: int, params: list, accelerator=None, grad_norm=None, scale: float | None = None) -> Verdict:
        """The verdict of the step about to be applied (computed once per ``step``; the same on every rank).

        ``params``: the parameters the optimizer steps; ``grad_norm``: the step's norm where it is known (transformers
        computes it when it clips), else the gradients are inspected; ``accelerator``: to share the flags with the
        other ranks; ``scale``: the fp16 loss scale the step's gradients were computed at (``None``: no scaler)."""
        if self._verdict is not None and self._verdict.step == step:
            return self._verdict
        full = getattr(grad_norm, "full_tensor", None)  # FSDP2: a DTensor norm, the same on every rank once full
        if callable(full):
            grad_norm = full()
        device = params[0].device if params else getattr(accelerator, "device", None) or torch.device("cpu")
        flags = torch.zeros(2, dtype=torch.float32, device=device)
        if self._bad_loss is not None:
            flags[0] = self._bad_loss.to(device)
        if self._bad_grad is not None:  # DeepSpeed: what the parameter hooks saw (the norm comes after the step)
            flags[1] = self._bad_grad.to(device)
        elif grad_norm is None:  # not clipped this step (max_grad_norm 0): look at the gradients themselves
            for p in params:
                if p.grad is not None:
                    flags[1] += _nonfinite(p.grad)
        if accelerator is not None and accelerator.num_processes > 1:
            flags = accelerator.reduce(flags, reduction="sum")
        bad_loss, bad_grad = (float(v) > 0 for v in flags.tolist())
        if grad_norm is not None and not bad_grad:
            bad_grad = not math.isfinite(float(grad_norm)) or float(grad_norm) < 0  # DeepSpeed's -1: inf/NaN
        norm = float("nan") if bad_grad else float(grad_norm) if grad_norm is not None else 0.0
        self._bad_loss = self._bad_grad = None
        overflow = bad_grad and not bad_loss and scale is not None and scale > 1
        self._verdict = Verdict(step, norm, not bad_loss, scaler_overflow=overflow)
        return self._verdict

    def keep_out(self, verdict: Verdict, optimizer, trainer=None) -> Verdict:
        """Keep a non-finite step's update out of the weights, where it is still to be applied, and record how
        (:attr:`Verdict.kept_out`). Idempotent per step: both callbacks may call it."""
        if verdict.kept_out or not (verdict.nonfinite or verdict.scaler_overflow):
            return verdict
        if self.deepspeed:
            verdict.kept_out = ("vetoed" if self.vetoed_step == verdict.step else
                                "deepspeed" if not ds.step_applied(trainer) else "applied")
        elif _loss_scaler(trainer) is not None and not math.isfinite(verdict.grad_norm):
            verdict.kept_out = "scaler"  # it found the overflow when it unscaled the gradients, and skips the step
        else:
            self.drop_gradients(verdict.step, optimizer)
            verdict.kept_out = "dropped"
        return verdict

    def drop_gradients(self, step: int, optimizer) -> None:
        """Drop the step's gradients so the coming ``optimizer.step()`` changes nothing (once per step)."""
        if self.dropped_step == step:
            return
        for group in getattr(optimizer, "param_groups", ()):
            for p in group["params"]:
                p.grad = None
        self.dropped_step = step

    # ---- DeepSpeed: the verdict inside the engine's step ------------------------------------------------------------

    def install_deepspeed(self, trainer, veto: bool) -> None:
        """Judge a DeepSpeed run's steps inside the engine's step (module docstring); ``veto``: keep a non-finite
        update out (``skip_nonfinite``, ``halt_on: [nonfinite]``). Call once the engine exists (``on_train_begin``);
        idempotent."""
        self.veto = self.veto or veto
        if self.deepspeed:
            return
        self.trainer, self.deepspeed = trainer, True
        if ds.precision(trainer) != "fp16":  # fp16's scaled gradients overflow routinely: its loss scaler judges them
            for p in trainer.model.parameters():
                if p.requires_grad:
                    p.register_hook(self._flag_gradient)
        for optimizer in ds.stepped_optimizers(trainer.optimizer):
            optimizer.register_step_pre_hook(self._before_deepspeed_step)

    def _flag_gradient(self, grad: torch.Tensor) -> None:
        bad = (~torch.isfinite(grad)).any().to(torch.float32)
        self._bad_grad = bad if self._bad_grad is None else self._bad_grad + bad

    def _before_deepspeed_step(self, optimizer, args, kwargs) -> None:
        """The torch optimizer DeepSpeed steps is about to change the fp32 master weights (called once per parameter
        group or ZeRO-3 sub-group, the same number of times on every rank): the verdict, shared, on its first call."""
        trainer = self.trainer
        # The flags alone: transformers' gradient norm of this step comes after the engine's step.
        verdict = self.verdict(int(trainer.state.global_step), [], trainer.accelerator, None, _loss_scale(trainer))
        if self.veto and verdict.nonfinite:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    p.grad = None
            self.vetoed_step = verdict.step


def trainer_verdict(trainer, model=None, optimizer=None) -> Verdict:
    """:meth:`StepCheck.verdict` for the step a trainer is about to apply (``model``/``optimizer``: the event's, where
    the trainer's attributes are not set, e.g. a plain TRL trainer's callback)."""
    optimizer = optimizer if optimizer is not None else getattr(trainer, "optimizer", None)
    return step_check(trainer).verdict(int(trainer.state.global_step), optimizer_params(optimizer, model or trainer.model),
                                       getattr(trainer, "accelerator", None),
                                       getattr(trainer, "grad_norm_before_clip", None), _loss_scale(trainer))


def judge_step(own: StepCheck, trainer, state, model, optimizer) -> tuple[StepCheck, Verdict, object]:
    """The step's check, verdict and optimizer, for a callback at ``on_pre_optimizer_step``: the trainer's shared
    check when the callback is bound to a ``RookGRPOTrainer``, else (a plain TRL trainer) the callback's ``own`` check
    of the event's gradients on this process."""
    if trainer is None:
        return own, own.verdict(int(state.global_step), optimizer_params(optimizer, model)), optimizer
    optimizer = optimizer if optimizer is not None else trainer.optimizer
    return step_check(trainer), trainer_verdict(trainer, model, optimizer), optimizer


def _loss_scale(trainer) -> float | None:
    """The fp16 loss scale of the step being judged: the ``GradScaler``'s (before its update), ``inf`` under
    DeepSpeed's fp16 (its scaler judges every overflow and stops the run itself at its minimum scale), ``None``
    without a loss scaler."""
    if trainer is None:
        return None
    if getattr(trainer, "is_deepspeed_enabled", False):
        return float("inf") if ds.precision(trainer) == "fp16" else None
    scaler = _loss_scaler(trainer)
    return None if scaler is None else float(scaler.get_scale())


def _loss_scaler(trainer):
    """The fp16 ``GradScaler`` the trainer's accelerator steps through, if any (DeepSpeed keeps its own)."""
    if trainer is None or getattr(trainer, "is_deepspeed_enabled", False):
        return None
    return getattr(getattr(trainer, "accelerator", None), "scaler", None)


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
