"""Held-out quality over a run: one score per evaluation, from the metrics a run logged, and the best of them.

Why: a rising training reward says the policy found more of what the rewards pay; only held-out numbers say whether
the model got better. :class:`HeldoutScore` reads them from the trainer's log history (``heldout_eval``'s or a task pack's
``heldout/*``,
or transformers' ``eval_*``) as one score per evaluated step, a weighted sum of the named metrics, and keeps the best.
The ``heldout_guard`` callback restores the best step's weights with it; the same record is what a detector of "the
reward rises while held-out quality falls" reads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import ConfigError


def parse_metric(metric: str | Mapping[str, float]) -> dict[str, float]:
    """A metric name, or a mapping of names to weights, as ``{name: weight}``.

    >>> parse_metric("heldout/env_exact_accuracy")
    {'heldout/env_exact_accuracy': 1.0}
    >>> parse_metric({"heldout/move_rank_reward": 1, "heldout/env_exact_accuracy": 0.5})
    {'heldout/move_rank_reward': 1.0, 'heldout/env_exact_accuracy': 0.5}
    """
    if isinstance(metric, str):
        metric = {metric: 1.0}
    if not isinstance(metric, Mapping) or not metric:
        raise ConfigError(f"metric: expected a logged metric's name or a mapping of names to weights, got {metric!r} "
                          "(e.g. heldout/env_exact_accuracy, or {heldout/move_rank_reward: 1, heldout/env_exact_accuracy: 1}).")
    out = {}
    for name, weight in metric.items():
        if not isinstance(name, str) or not (name.startswith("heldout/") or name.startswith("eval_")):
            raise ConfigError(f"metric: {name!r} is not a held-out metric; name one that chess_eval logs "
                              "(heldout/...) or an evaluation logs (eval_...).")
        out[name] = float(weight)
    return out


@dataclass
class HeldoutScore:
    """The score of each evaluated step and the best one.

    ``mode`` ``"max"`` (higher is better) or ``"min"``; a step is a new best only when it beats the best by more than
    ``min_delta``, so evaluation noise does not move the choice to a later step that is only as good.

    ``floor``: metrics a step must hold to be chosen at all, each not below its value at the first evaluation (the
    start's, where the evaluation runs before the first step); the first evaluation is always eligible. A step below
    a floor is scored and logged but never becomes the best: a weighted sum in which a format point is small cannot
    trade it away for a move-rank point.

    Example:
        >>> score = HeldoutScore({"heldout/a": 1.0, "heldout/b": 1.0})
        >>> history = [{"step": 0, "heldout/a": 0.2, "heldout/b": 0.3}, {"step": 5, "loss": 0.1},
        ...            {"step": 10, "heldout/a": 0.3, "heldout/b": 0.1}]
        >>> score.update(history)
        [(0, 0.5), (10, 0.4)]
        >>> for step, value in score.update(history + [{"step": 20, "heldout/a": 0.5, "heldout/b": 0.1}]):
        ...     if score.better(value):
        ...         score.take(step, value)
        >>> score.best_step, round(score.best, 3)
        (20, 0.6)
        >>> floored = HeldoutScore({"heldout/a": 1.0}, floor=("heldout/b",))
        >>> floored.update(history + [{"step": 20, "heldout/a": 0.5, "heldout/b": 0.3}])  # step 10 is below b's start
        [(0, 0.2), (20, 0.5)]
        >>> floored.scores, floored.below_floor
        ({0: 0.2, 10: 0.3, 20: 0.5}, [10])
    """

    metric: dict[str, float]
    mode: str = "max"
    min_delta: float = 0.0
    scores: dict[int, float] = field(default_factory=dict)
    best_step: int | None = None
    best: float | None = None
    floor: tuple[str, ...] = ()
    floor_start: dict[str, float] | None = None  # the floor metrics' values at the first evaluation
    below_floor: list[int] = field(default_factory=list)  # the evaluated steps a floor ruled out

    def __post_init__(self):
        self.floor = parse_floor(self.floor)
        if self.mode not in ("max", "min"):
            raise ConfigError(f"mode: expected 'max' or 'min', got {self.mode!r}.")
        if self.min_delta < 0:
            raise ConfigError(f"min_delta: expected a value >= 0, got {self.min_delta}.")

    def score_of(self, entry: Mapping) -> float | None:
        """The weighted sum of the metric in one log entry, or ``None`` when it lacks one of them (or one is NaN)."""
        values = [entry.get(name) for name in self.metric]
        if not all(map(_logged, values)):
            return None
        return sum(w * float(v) for w, v in zip(self.metric.values(), values))

    def eligible(self, step: int, entry: Mapping) -> bool:
        """Whether an evaluated step may be chosen: every ``floor`` metric in ``entry`` not below its value at the
        first evaluation, which sets those values (and is eligible). A step whose entry lacks a floor metric is not."""
        if not self.floor:
            return True
        values = {name: entry.get(name) for name in self.floor}
        if not all(map(_logged, values.values())):
            ok = False
        elif self.floor_start is None:
            self.floor_start, ok = {k: float(v) for k, v in values.items()}, True
        else:
            ok = all(float(v) >= self.floor_start[k] for k, v in values.items())
        if not ok:
            self.below_floor.append(step)
        return ok

    def better(self, value: float) -> bool:
        if self.best is None:
            return True
        return value > self.best + self.min_delta if self.mode == "max" else value < self.best - self.min_delta

    def take(self, step: int, value: float) -> None:
        """Make ``step`` the best (the caller holds its weights, or judged it after the fact)."""
        self.best_step, self.best = step, value

    def update(self, history: list[Mapping]) -> list[tuple[int, float]]:
        """Score the entries of a run's log ``history`` at steps not scored yet (a finished run's
        ``trainer_state.json``, read after the fact); return the new (step, score) pairs, in order. The best is the
        caller's to :meth:`take`: a live guard takes only a step whose weights it holds. A step below a ``floor`` is
        scored but not returned."""
        new = []
        for entry in history:
            step = entry.get("step")
            if step is None or step in self.scores:
                continue
            value = self.score_of(entry)
            if value is None:
                continue
            self.scores[step] = value
            if self.eligible(step, entry):
                new.append((step, value))
        return new

    def state_dict(self) -> dict:
        return {"scores": {str(k): v for k, v in self.scores.items()}, "best_step": self.best_step, "best": self.best,
                "floor_start": self.floor_start, "below_floor": list(self.below_floor)}

    def load_state_dict(self, state: dict) -> None:
        self.scores = {int(k): float(v) for k, v in state.get("scores", {}).items()}
        self.best_step, self.best = state.get("best_step"), state.get("best")
        self.floor_start, self.below_floor = state.get("floor_start"), list(state.get("below_floor", []))


def _logged(value) -> bool:
    """Whether a log entry's value is a number to score (not missing, not a string, not NaN)."""
    return value is not None and not isinstance(value, str) and not math.isnan(float(value))


def parse_floor(floor: str | list | tuple | None) -> tuple[str, ...]:
    """A floor's metric names as a tuple: one name, or a list of them, each a held-out metric.

    >>> parse_floor("heldout/format_rate"), parse_floor(None)
    (('heldout/format_rate',), ())
    """
    if floor is None:
        return ()
    names = (floor,) if isinstance(floor, str) else floor
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"floor: expected a held-out metric's name or a list of them, got {floor!r} "
                          "(e.g. floor: heldout/format_rate).")
    for name in names:
        if not (name.startswith("heldout/") or name.startswith("eval_")):
            raise ConfigError(f"floor: {name!r} is not a held-out metric; name one that chess_eval logs (heldout/...) "
                              "or an evaluation logs (eval_...), e.g. floor: heldout/format_rate.")
    return tuple(dict.fromkeys(names))
