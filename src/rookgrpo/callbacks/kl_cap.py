"""``kl_cap``: bound each token's KL term, so one rare token cannot dominate the KL a run logs, controls and trains on.

Why: TRL's KL term is the k3 estimator, per completion token ``exp(r) - r - 1`` with ``r = log p_ref - log p_policy``
at the sampled token. Its mean over tokens is an unbiased estimate of KL(policy || reference), but it is heavy-tailed:
a token the policy sampled although it had made it rare (say p = 1e-7 where the reference gave 0.1, r = 13.8) adds
about 1e6 to the sum. In `make train` runs on the packaged chess model the logged ``kl`` jumped from about 0.1 to
2,938 nats per token in one logging window (seed 44, near step 35), with the loss 99.95% KL. What that token does to
the update depends on TRL's ``use_bias_correction_kl``:

- on (TRL's default where it exists): the term is multiplied by the importance ratio, and the token's gradient is
  ``-r`` (-13.8 above): linear in ``r``, so the spike is mostly in the logged value, and in ``adaptive_beta``, which
  reads it (its error clip bounds one step's effect to 2% of beta);
- off, or a TRL without the option: the gradient is ``1 - exp(r)`` (about -1e6 above), and after gradient clipping
  the step is spent raising that one token.

``kl_cap`` clamps ``r`` per token to the interval where ``exp(r) - r - 1 <= max_token_kl`` (for the default 10:
-11.0 <= r <= 2.61), the same bound as verl's ``low_var_kl``. A capped token keeps its pull towards the reference,
at the cap's strength (gradient ``-r_cap`` with the correction, ``1 - exp(r_cap)`` without: at most 11.0 and 12.6 in
size for the default), where verl's clamp on the value leaves it none. Tokens inside the interval are untouched, so
runs without a heavy token are identical (tested).

How: after each loss's own forward pass the trainer hands this callback that loss's batch (a shallow copy, so the
buffered batch that ``steps_per_generation`` and ``num_iterations`` reuse is never changed) and the policy's
per-token log-probs; the callback replaces the copy's ``ref_per_token_logps`` by
``logp + clamp(ref - logp, r_low, r_high)`` (``logp`` detached), which TRL's loss then reads. Nothing of TRL's loss is
copied. TRL's ``kl`` metric is then the capped KL, which is what the loss used; the callback logs, for the same
batch (the optimised one, per loss call):

- ``kl_cap/raw_kl``: the per-token KL before capping (what ``kl`` would have been);
- ``kl_cap/capped_frac``: the share of completion tokens that were capped;
- ``kl_cap/max_log_ratio``: the largest ``r`` in the batch, before capping.

Example:
    >>> from rookgrpo.callbacks.kl_cap import log_ratio_bounds
    >>> [round(r, 2) for r in log_ratio_bounds(10.0)]
    [-11.0, 2.61]
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import ConfigError
from ..trl_compat import pending_metrics
from .base import RookCallback
from .registry import register_callback


def log_ratio_bounds(max_token_kl: float) -> tuple[float, float]:
    """The ``(r_low, r_high)`` with ``exp(r) - r - 1 == max_token_kl``, r_low < 0 < r_high (Newton's method)."""

    def solve(r: float) -> float:
        for _ in range(100):
            step = (math.exp(r) - r - 1 - max_token_kl) / (math.exp(r) - 1)
            r -= step
            if abs(step) < 1e-12:
                break
        return r

    # Start where the function is convex and monotone towards the root: r = -(K + 1) below, log(K + 1) + 1 above.
    return solve(-(max_token_kl + 1.0)), solve(math.log(max_token_kl + 1.0) + 1.0)


@register_callback("kl_cap")
class KLCap(RookCallback):
    """Clamp each completion token's KL term to at most ``max_token_kl`` nats (see the module docstring).

    Args:
        max_token_kl: the largest k3 KL term (``exp(r) - r - 1``) one token may contribute, in nats; > 0.

    Example::

        >>> from rookgrpo.callbacks import resolve_callback
        >>> cb = resolve_callback({"kl_cap": {"max_token_kl": 10.0}})
        >>> type(cb).__name__, round(cb.r_low, 2), round(cb.r_high, 2)
        ('KLCap', -11.0, 2.61)
    """

    state_key = "kl_cap"

    def __init__(self, max_token_kl: float = 10.0):
        if not float(max_token_kl) > 0:
            raise ConfigError(f"kl_cap.max_token_kl: got {max_token_kl}; it must be > 0 (nats per token, e.g. 10).")
        self.max_token_kl = float(max_token_kl)
        self.r_low, self.r_high = log_ratio_bounds(self.max_token_kl)

    def bind(self, trainer: Any) -> None:
        super().bind(trainer)
        if trainer.beta == 0.0:
            raise ConfigError("kl_cap with beta: 0. At beta 0 TRL computes no KL term, so there is nothing to cap. "
                              "Set beta > 0 or remove kl_cap.")
        if getattr(trainer.args, "use_liger_kernel", False):
            raise ConfigError("kl_cap with use_liger_kernel: true. Liger computes the loss, KL included, in its own "
                              "kernel, which this callback cannot reach. Set use_liger_kernel: false or remove kl_cap.")

    def on_loss_logps(self, trainer: Any, batch: dict, per_token_logps) -> None:
        """After the loss's policy forward pass: cap the reference log-probs the KL term will read from ``batch``,
        the trainer's copy of the batch for this loss."""
        import torch

        if batch.get("ref_per_token_logps") is None:
            return
        mask = batch["completion_mask"]
        if "tool_mask" in batch:
            mask = mask * batch["tool_mask"]
        mask = mask.bool()
        logp = per_token_logps.detach()
        ref = batch["ref_per_token_logps"]
        ratio = ref - logp
        batch["ref_per_token_logps"] = logp + ratio.clamp(self.r_low, self.r_high)
        raw = (torch.exp(ratio) - ratio - 1).masked_fill(~mask, 0.0)
        capped = ((ratio < self.r_low) | (ratio > self.r_high)) & mask
        stats = torch.stack([raw.sum(), capped.sum().float(), mask.sum().float()])
        stats = trainer.accelerator.reduce(stats, reduction="sum")
        top = trainer.accelerator.reduce(ratio.masked_fill(~mask, float("-inf")).max().reshape(1), reduction="max")
        count = stats[2].clamp(min=1.0)
        mode = "train" if trainer.model.training else "eval"
        metrics = pending_metrics(trainer, mode)
        metrics["kl_cap/raw_kl"].append((stats[0] / count).item())
        metrics["kl_cap/capped_frac"].append((stats[1] / count).item())
        metrics["kl_cap/max_log_ratio"].append(top.item())
