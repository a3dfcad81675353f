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

Cost: one extra backward pass per micro-batch on measured steps; nothing on the others.

Sharded (FSDP2): ``autograd.grad`` cannot reach a sharded parameter (FSDP2 gathers each layer's weights outside
autograd and reduce-scatters the gradients in its own hooks), so there the extra backward of ``beta·K`` runs through
FSDP2's hooks into ``.grad`` (each rank's shard, reduced as the training gradient is), the meter keeps the difference
and puts ``.grad`` back as it was, bit for bit, before the training backward; the norms are summed over the shards of
every rank. This needs each micro-batch's gradient reduced in its own backward, so with gradient accumulation under
FSDP2 (whose ``no_sync`` defers the reduction to the last micro-batch) the meter is off. Off too, said once at
warning level: DeepSpeed at every ZeRO stage (the engine reduces the gradients into its own buffers and steps inside
accelerate's backward, so no whole gradient is ever in ``.grad`` at ``on_pre_optimizer_step``; under ZeRO-3 the
weights are partitioned too), FSDP1 (flat buffers), and reentrant gradient checkpointing.
"""

from __future__ import annotations

import logging
import math

import torch

from .deepspeed import zero_stage
from .sharding import local as _local

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
        #: ``"autograd"`` (whole weights: one process, DDP, ZeRO-1/2 excluded) or ``"backward"`` (FSDP2 shards)
        self.mode = "autograd"
        stage = zero_stage(trainer)
        if stage is not None:
            self._disable(f"under DeepSpeed ZeRO-{stage} the engine reduces the gradients into its own "
                          f"{'partitioned ' if stage else ''}buffers and applies the step inside accelerate's "
                          "backward, so the whole gradient is never in each parameter's .grad"
                          + (", and the weights themselves are partitioned" if stage == 3 else ""), warn=True)
        elif getattr(trainer, "is_fsdp_enabled", False):
            version = int(getattr(trainer.accelerator.state.fsdp_plugin, "fsdp_version", 1) or 1)
            if version < 2:
                self._disable("FSDP1 keeps the gradients in flat buffers; use FSDP2 (fsdp_version: 2)", warn=True)
            elif int(trainer.args.gradient_accumulation_steps) > 1:
                self._disable("under FSDP2 with gradient accumulation the gradient is reduced once per optimizer step, "
                              "so the KL term's part cannot be read per micro-batch (gradient_accumulation_steps: 1 "
                              "measures it)", warn=True)
            else:
                self.mode = "backward"
        self.measuring = False
        self._kl: list[torch.Tensor | None] | None = None
        self._beta: float | None = None

    def _disable(self, reason: str, warn: bool = False) -> None:
        if self.enabled:
            self.enabled = False
            if self.trainer.accelerator.is_main_process:
                (logger.warning if warn else logger.info)("loss/kl_grad_share is not measured: %s.", reason)

    def begin_step(self) -> bool:
        """Start measuring this optimizer step; False when the meter cannot (off, or beta is 0: no KL term)."""
        self.measuring = self.enabled and float(self.trainer.beta) != 0.0
        # The model's parameters now: FSDP2's fully_shard replaces them with sharded ones when training starts.
        self.params = [p for p in self.trainer.model.parameters() if p.requires_grad]
        self._kl = None
        return self.measuring

    def swap_beta(self) -> None:
        """Replace ``trainer.beta`` with a tensor that records how the loss depends on it (this micro-batch)."""
        if not self.measuring or self._beta is not None or not torch.is_grad_enabled():
            return
        self._beta = float(self.trainer.beta)
        device = _local(self.params[0]).device if self.params else None
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
            if self.mode == "backward":
                grads = self._through_the_sharded_backward(k * b.detach())
            else:
                grads = torch.autograd.grad(k * b.detach(), self.params, retain_graph=True, allow_unused=True)
        except RuntimeError as err:  # reentrant checkpointing, a model the extra pass cannot go through
            self._disable(f"the extra backward pass failed ({str(err).splitlines()[0][:120]})")
            self.measuring = False
            return
        if self._kl is None:  # autograd.grad returns fresh tensors: kept as they are
            self._kl = [None if g is None else g.detach() for g in grads]
        else:
            self._kl = [a if g is None else (g.detach() if a is None else a.add_(g)) for a, g in zip(self._kl, grads)]

    def _through_the_sharded_backward(self, term: torch.Tensor) -> list:
        """``term``'s gradient as this rank's shards (FSDP2): backward through FSDP2's hooks into ``.grad`` (reduced
        over ranks as the training gradient is), read off as the difference, and ``.grad`` put back as it was."""
        before = [p.grad for p in self.params]
        kept = [None if g is None else g.detach().clone() for g in before]
        term.backward(retain_graph=True)
        grads = []
        for p, old in zip(self.params, kept):
            new = None if p.grad is None else _local(p.grad).detach()
            grads.append(None if new is None else (new.clone() if old is None else new - _local(old)))
            p.grad = old
        return grads

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
        nan = float("nan")
        from .nonfinite import trainer_verdict

        if trainer_verdict(trainer).nonfinite:  # the step is not applied; skip_nonfinite may have dropped .grad already
            return {"loss/kl_grad_share": nan, "grad/kl_norm": nan, "grad/policy_norm": nan, "grad/kl_policy_cos": nan}
        sharded = self.mode == "backward"
        if trainer.accelerator.num_processes > 1 and not sharded:
            # averaged over processes, as DDP averages the gradients in .grad (FSDP2's backward already reduced them)
            flat = torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1).float()
                              for p, g in zip(self.params, kl_grads)])
            flat = trainer.accelerator.reduce(flat, reduction="mean")
            kl_grads = list(torch.split(flat, [p.numel() for p in self.params]))
        max_norm = float(getattr(trainer.args, "max_grad_norm", 0) or 0)
        before = trainer.grad_norm_before_clip
        full = getattr(before, "full_tensor", None)
        if callable(full):
            before = full()
        scale = 1.0
        if max_norm > 0 and before is not None:
            coef = min(1.0, max_norm / (float(before) + 1e-6))  # torch.nn.utils.clip_grad_norm_'s factor
            if coef > 0 and math.isfinite(coef):
                scale = 1.0 / coef
        # Per parameter, no concatenated copies: |kl|^2, |policy|^2 and <policy, kl> with policy = total - kl.
        sums = torch.zeros(3, dtype=torch.float64, device=_local(self.params[0]).device)
        for p, g in zip(self.params, kl_grads):
            if p.grad is None and g is None:
                continue
            local = _local(p.detach())  # this rank's shard under FSDP2, the whole weight otherwise
            k = torch.zeros_like(local, dtype=torch.float32) if g is None else g.reshape(local.shape).float()
            total = torch.zeros_like(k) if p.grad is None else _local(p.grad).float() * scale
            policy = total - k
            sums += torch.stack([(k * k).sum(), (policy * policy).sum(), (policy * k).sum()]).double()
        if sharded and trainer.accelerator.num_processes > 1:  # every rank's shards: the sums of the whole
            sums = trainer.accelerator.reduce(sums, reduction="sum")
        kk, pp, pk = sums.tolist()  # one device sync
        kl_norm, policy_norm = math.sqrt(kk), math.sqrt(pp)  # NaN when a gradient is (math.sqrt(nan) is nan)
        # A share or cosine that cannot be computed (a NaN gradient, a zero one) is NaN, never a made-up 0.
        finite = math.isfinite(kl_norm) and math.isfinite(policy_norm)
        cos = pk / (kl_norm * policy_norm) if finite and kl_norm > 0 and policy_norm > 0 else nan
        share = kl_norm / (kl_norm + policy_norm) if finite and kl_norm + policy_norm > 0 else nan
        return {"loss/kl_grad_share": share, "grad/kl_norm": kl_norm, "grad/policy_norm": policy_norm,
                "grad/kl_policy_cos": cos}

