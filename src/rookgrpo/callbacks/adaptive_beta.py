"""``AdaptiveBeta``: a proportional KL controller that tunes GRPO's ``beta`` to track a target KL.

Why: with a fixed beta the KL term can dominate the loss (published RookWorld runs saw ~95% of the loss from KL at
beta 0.1, and the policy got worse after a step), or be too weak to hold the policy near the reference. The
controller raises beta when the measured KL is above the target and lowers it when below:

    error = clip(KL / target_kl - 1, -clip, +clip)
    beta  = clip(beta * (1 + error * n / horizon), beta_min, beta_max)

with ``n`` the optimizer steps since the last update (1 per step) and KL TRL's per-token ``kl`` metric of that step.
TRL gathers that metric over all processes, so every rank computes the same beta. Beta must start above 0: at
beta 0 TRL does not load the reference model at all, so there would be no KL to control.
"""

from __future__ import annotations

import math

from ..errors import ConfigError
from ..trl_compat import log_metric, pending_metrics
from .base import RookCallback
from .registry import register_callback


@register_callback("adaptive_beta")
class AdaptiveBeta(RookCallback):
    """Tune ``trainer.beta`` towards ``target_kl`` (per-token KL, as TRL logs it). Logs ``beta`` every step.

    Args:
        target_kl: the per-token KL (TRL's ``kl`` metric) to track; > 0.
        horizon: optimizer steps over which a full ``clip``-sized error changes beta by ``clip``; larger is slower.
        beta_min: the lowest beta; > 0, because TRL drops the reference model at beta 0.
        beta_max: the highest beta.
        warmup_steps: optimizer steps before the first update (beta stays at the config's ``beta``).
        clip: bound on the relative error ``KL / target_kl - 1`` used in one update.

    Example (what the recipe entry ``callbacks: [{adaptive_beta: {target_kl: 0.02}}]`` resolves to)::

        >>> from rookgrpo.callbacks import resolve_callback
        >>> cb = resolve_callback({"adaptive_beta": {"target_kl": 0.02}})
        >>> type(cb).__name__, cb.target_kl, cb.horizon
        ('AdaptiveBeta', 0.02, 10.0)
    """

    state_key = "adaptive_beta"

    def __init__(self, target_kl: float = 0.05, horizon: float = 10.0, beta_min: float = 1e-4, beta_max: float = 1.0,
                 warmup_steps: int = 0, clip: float = 0.2):
        if target_kl <= 0:
            raise ConfigError(f"adaptive_beta.target_kl: got {target_kl}; it must be > 0 (e.g. 0.05).")
        if not 0 < beta_min <= beta_max:
            raise ConfigError(f"adaptive_beta: need 0 < beta_min <= beta_max, got {beta_min}, {beta_max}.")
        if horizon <= 0:
            raise ConfigError(f"adaptive_beta.horizon: got {horizon}; it must be > 0 (steps to adapt over).")
        self.target_kl, self.horizon, self.clip = target_kl, horizon, clip
        self.beta_min, self.beta_max, self.warmup_steps = beta_min, beta_max, warmup_steps
        self.beta: float | None = None
        self.updates = 0
        self._kl_list: list | None = None  # TRL's list of training KL values, as last read
        self._kl_seen = 0  # how many of its values were read

    def bind(self, trainer) -> None:
        super().bind(trainer)
        if trainer.beta == 0.0:
            raise ConfigError(
                "beta: 0 with the adaptive_beta callback. At beta 0 TRL loads no reference model, so there is no KL to "
                "control. Set beta to a small positive start value (e.g. beta: 0.01) or remove adaptive_beta."
            )
        if self.beta is None:
            self.beta = float(min(max(trainer.beta, self.beta_min), self.beta_max))
        trainer.beta = self.beta

    def _new_kl_values(self) -> list[float]:
        """The training KL values TRL appended since the last read, each read once.

        TRL clears a mode's metrics when it logs that mode (a training log replaces the train lists; an evaluation
        log leaves them alone), so the list object tells whether the values seen before are still there.
        """
        kl_values = pending_metrics(self.trainer).get("kl")
        if kl_values is None:
            return []
        if kl_values is not self._kl_list:
            self._kl_list, self._kl_seen = kl_values, 0
        new = list(kl_values[self._kl_seen:])
        self._kl_seen = len(kl_values)
        return new

    def on_step_end(self, args, state, control, **kwargs):
        trainer = self.trainer
        new = self._new_kl_values()
        kl = sum(new) / len(new) if new else None
        if kl is not None and math.isfinite(kl) and state.global_step > self.warmup_steps:
            error = max(-self.clip, min(self.clip, kl / self.target_kl - 1.0))
            self.beta = min(self.beta_max, max(self.beta_min, self.beta * (1.0 + error / self.horizon)))
            self.updates += 1
        trainer.beta = self.beta
        log_metric(trainer, "beta", self.beta)

    def state_dict(self) -> dict:
        return {"beta": self.beta, "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.beta, self.updates = float(state["beta"]), int(state["updates"])
        if getattr(self, "trainer", None) is not None:
            self.trainer.beta = self.beta
