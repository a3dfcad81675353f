"""How much of an update the KL term makes: the gradient of ``beta·KL`` apart from the rest of TRL's loss.

Why: ``loss/kl_share`` is a share of the loss *value*, and sits near 1 in healthy runs (the policy term's value
averages to about 0 over a group while its gradient does not), so it cannot say whether the KL term dominates the
update. The gradient can. On a measured optimizer step:

1. before TRL adds the KL term to each micro-batch's loss, ``trainer.beta`` is swapped for a 0-dim tensor ``b`` that
   requires grad (TRL computes ``per_token_loss + self.beta * per_token_kl`` and aggregates it with its own loss
   type's normaliser), and swapped back once the loss is built;
2. ``d loss / d b`` is then TRL's own aggregated KL term ``K`` (with its graph), and one extra backward pass gives
   ``beta·∇K``, accumulated over the step's micro-batches (and averaged over processes, as DDP averages gradients);
3. at ``on_pre_optimizer_step`` the whole gradient is in ``.grad`` (the clip factor undone with the norm before
   clipping), and the policy part (everything but ``beta·KL``: the advantage term, an entropy bonus, an SFT anchor) is
   the difference.

Cost: one extra backward pass per micro-batch on measured steps; nothing on the others. Not available where
gradients are sharded or kept outside ``.grad`` (DeepSpeed, FSDP) or with reentrant gradient checkpointing: the meter
switches itself off there and says so once.
"""

from __future__ import annotations

import logging
import math

import torch

logger = logging.getLogger("rookgrpo.doctor")


class KLGradMeter:
    """Measures ``beta·∇KL`` and the rest of the gradient on the optimizer steps it is told to (see module docstring).

    Call :meth:`begin_step` at the start of a measured step, :meth:`swap_beta` before TRL builds each micro-batch's
    KL term, :meth:`after_loss` with each micro-batch's loss, and :meth:`finish` at ``on_pre_optimizer_step``, which
    returns the step's numbers.
    """

    def __init__(self, trainer):
        self.trainer = trainer
        self.params = [p for p in trainer.model.parameters() if p.requires_grad]
        self.enabled = True
        if getattr(trainer, "is_deepspeed_enabled", False) or getattr(trainer, "is_fsdp_enabled", False):
            self._disable("gradients are kept by DeepSpeed/FSDP, not in each parameter's .grad")
        self.measuring = False
        self._kl: list[torch.Tensor | None] | None = None
        self._beta: float | None = None

    def _disable(self, reason: str) -> None:
        if self.enabled:
            self.enabled = False
            if self.trainer.accelerator.is_main_process:
                logger.info("loss/kl_grad_share is not measured: %s.", reason)

    def begin_step(self) -> bool:
        """Start measuring this optimizer step; False when the meter cannot (off, or beta is 0: no KL term)."""
        self.measuring = self.enabled and float(self.trainer.beta) != 0.0
        self._kl = None
        return self.measuring

    def swap_beta(self) -> None:
        """Replace ``trainer.beta`` with a tensor that records how the loss depends on it (this micro-batch)."""
        if not self.measuring or self._beta is not None or not torch.is_grad_enabled():
            return
        self._beta = float(self.trainer.beta)
        device = self.params[0].device if self.params else None
        self.trainer.beta = torch.tensor(self._beta, device=device, requires_grad=True)

    def after_loss(self, loss: torch.Tensor) -> None:
        """Restore ``trainer.beta`` and add this micro-batch's ``beta·∇K`` to the step's sum."""
        if self._beta is None:
            return
        b, self.trainer.beta, self._beta = self.trainer.beta, self._beta, None
        try:
            (k,) = torch.autograd.grad(loss, b, create_graph=True, allow_unused=True)
            if k is None or not k.requires_grad:
                return
            grads = torch.autograd.grad(k * b.detach(), self.params, retain_graph=True, allow_unused=True)
        except RuntimeError as err:  # reentrant checkpointing, a model the extra pass cannot go through
            self._disable(f"the extra backward pass failed ({str(err).splitlines()[0][:120]})")
            self.measuring = False
            return
        if self._kl is None:  # autograd.grad returns fresh tensors: kept as they are
            self._kl = [None if g is None else g.detach() for g in grads]
        else:
            self._kl = [a if g is None else (g.detach() if a is None else a.add_(g)) for a, g in zip(self._kl, grads)]

    def restore(self) -> None:
        """Put a float back in ``trainer.beta`` if a loss never reached :meth:`after_loss` (an exception in it)."""
        if self._beta is not None:
            self.trainer.beta, self._beta = self._beta, None

    def finish(self) -> dict[str, float] | None:
        """The step's numbers, from the accumulated KL gradient and the whole gradient in ``.grad``:
        ``loss/kl_grad_share`` = |beta·∇KL| / (|beta·∇KL| + |∇policy|), ``grad/kl_norm``, ``grad/policy_norm`` and
        ``grad/kl_policy_cos`` (their cosine; negative when the KL term pulls against the policy term). A share or
        cosine that cannot be computed (a NaN gradient, or a zero one) is NaN."""
        self.restore()
        if not self.measuring or self._kl is None:
            self.measuring = False
            return None
        self.measuring = False
        trainer = self.trainer
        kl_grads, self._kl = self._kl, None
        if trainer.accelerator.num_processes > 1:  # averaged over processes, as DDP averages the gradients in .grad
            flat = torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1).float()
                              for p, g in zip(self.params, kl_grads)])
            flat = trainer.accelerator.reduce(flat, reduction="mean")
            kl_grads = list(torch.split(flat, [p.numel() for p in self.params]))
        max_norm = float(getattr(trainer.args, "max_grad_norm", 0) or 0)
        before = trainer.grad_norm_before_clip
        scale = 1.0
        if max_norm > 0 and before is not None:
            coef = min(1.0, max_norm / (float(before) + 1e-6))  # torch.nn.utils.clip_grad_norm_'s factor
            if coef > 0 and math.isfinite(coef):
                scale = 1.0 / coef
        # Per parameter, no concatenated copies: |kl|^2, |policy|^2 and <policy, kl> with policy = total - kl.
        sums = torch.zeros(3, dtype=torch.float64, device=self.params[0].device)
        for p, g in zip(self.params, kl_grads):
            if p.grad is None and g is None:
                continue
            k = torch.zeros_like(p, dtype=torch.float32) if g is None else g.reshape(p.shape).float()
            total = torch.zeros_like(k) if p.grad is None else p.grad.float() * scale
            policy = total - k
            sums += torch.stack([(k * k).sum(), (policy * policy).sum(), (policy * k).sum()]).double()
        kk, pp, pk = sums.tolist()  # one device sync
        kl_norm, policy_norm = math.sqrt(kk), math.sqrt(pp)  # NaN when a gradient is (math.sqrt(nan) is nan)
        # A share or cosine that cannot be computed (a NaN gradient, a zero one) is NaN, never a made-up 0.
        nan = float("nan")
        finite = math.isfinite(kl_norm) and math.isfinite(policy_norm)
        cos = pk / (kl_norm * policy_norm) if finite and kl_norm > 0 and policy_norm > 0 else nan
        share = kl_norm / (kl_norm + policy_norm) if finite and kl_norm + policy_norm > 0 else nan
        return {"loss/kl_grad_share": share, "grad/kl_norm": kl_norm, "grad/policy_norm": policy_norm,
                "grad/kl_policy_cos": cos}
