"""``advantage_weights``: scale negative and positive advantages apart, per task.

Why: GRPO's update is the sum of two different forces. Completions above their group's mean (positive advantage) are
pulled up, which sharpens the policy onto answers it already gives; completions below (negative advantage) are pushed
down, and the push spreads over every token of the answer, right ones included, which can displace what the model
knew (the "lazy likelihood displacement" of arXiv 2505.18830, the squeezing effect of arXiv 2407.10490;
W-REINFORCE, arXiv 2506.01347, weights the two sides apart). This callback multiplies each completion's advantage by
``negative`` where it is below 0 and by ``positive`` where it is above, with a value per task, after TRL computed the
advantages and after any hook that replaces rows (resampling), so the loss reads the weighted ones. Token-level
advantages (``(B, T)``, as ``reference_credit`` may leave them) are scaled token by token by their own sign.

Training batches only: an evaluation's loss reads TRL's advantages unchanged. Logged per generation batch, over this
process's rows of the optimised batch: ``advantage_weights/negative_share`` (the share of completions with a
negative advantage) and ``advantage_weights/scale_mean`` (the mean factor applied).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import ConfigError
from .base import RookCallback
from .registry import register_callback


def _per_task(value: float | Mapping[str, float], name: str) -> tuple[float, dict[str, float]]:
    """(default factor, factor by task) of one argument; tasks a mapping does not name keep 1.0."""
    if isinstance(value, Mapping):
        out = {str(k): float(v) for k, v in value.items()}
        default = 1.0
    else:
        out, default = {}, float(value)
    for task, factor in [("*", default), *out.items()]:
        if not factor >= 0:
            raise ConfigError(f"advantage_weights.{name}: factor for {task!r} must be >= 0, got {factor}.")
    return default, out


@register_callback("advantage_weights")
class AdvantageWeights(RookCallback):
    """Multiply negative advantages by ``negative`` and positive ones by ``positive``, per task (module docstring).

    Args:
        negative: factor on advantages below 0: one number for every task, or a mapping ``{task: factor}`` (tasks it
            does not name keep 1.0). 0 trains on the above-mean completions only.
        positive: factor on advantages above 0, in the same form.
        task_column: the dataset column naming each row's task (RookWorld: ``task``, ``P`` or ``A``).

    Example::

        >>> from rookgrpo.callbacks import resolve_callback
        >>> cb = resolve_callback({"advantage_weights": {"negative": {"A": 0.25}, "positive": 1.0}})
        >>> cb.factor("A", -0.5), cb.factor("P", -0.5), cb.factor("A", 0.5)
        (0.25, 1.0, 1.0)
    """

    state_key = "advantage_weights"
    changes_mask = True  # on the final rows (after resampling), before the observers

    def __init__(self, negative: float | Mapping[str, float] = 1.0, positive: float | Mapping[str, float] = 1.0,
                 task_column: str = "task"):
        self.negative, self.negative_by_task = _per_task(negative, "negative")
        self.positive, self.positive_by_task = _per_task(positive, "positive")
        self.task_column = task_column

    def factor(self, task: str | None, advantage: float) -> float:
        """The factor on one advantage of a row of ``task``."""
        if advantage < 0:
            return self.negative_by_task.get(str(task), self.negative)
        if advantage > 0:
            return self.positive_by_task.get(str(task), self.positive)
        return 1.0

    def on_scored_batch(self, trainer, scored) -> None:
        import torch

        if not trainer.model.training:
            return
        adv = scored.output["advantages"]
        tasks = [row.get(self.task_column) for row in scored.inputs]
        if len(tasks) != adv.shape[0]:
            raise RuntimeError(f"advantage_weights: {len(tasks)} rows but {adv.shape[0]} advantages")
        neg = torch.tensor([self.negative_by_task.get(str(t), self.negative) for t in tasks], dtype=adv.dtype,
                           device=adv.device)
        pos = torch.tensor([self.positive_by_task.get(str(t), self.positive) for t in tasks], dtype=adv.dtype,
                           device=adv.device)
        if adv.dim() == 2:
            neg, pos = neg[:, None], pos[:, None]
        scale = torch.where(adv < 0, neg, torch.where(adv > 0, pos, torch.ones_like(adv)))
        scored.output["advantages"] = adv * scale
        row_sign = adv.sum(dim=1) if adv.dim() == 2 else adv
        metrics = trainer._metrics["train"]
        metrics["advantage_weights/negative_share"].append(float((row_sign < 0).float().mean()))
        metrics["advantage_weights/scale_mean"].append(float(scale.float().mean()))
