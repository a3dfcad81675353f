"""The fill-in task's rule as a reward: what the fill-in judge imitates (``rookgrpo.judge.model``).

Logged beside the judge with weight 0 in ``recipes/judge.yaml``: GRPO is paid by the judge, and the rule shows whether
what the judge pays for is the task.
"""

from __future__ import annotations

from ..judge.model import grade
from ..rewards.registry import register_reward
from ..rewards.utils import completion_text


@register_reward()
def fill_in_grade(prompts: list, completions: list, **kwargs) -> list[float]:
    """:func:`rookgrpo.judge.model.grade` of each completion: 1.0 for a square the named piece reaches, partial credit below.

    >>> fill_in_grade(["rook on a1 moves to"] * 3, [" a8", " b2", "zz"])
    [1.0, 0.6, 0.0]
    """
    return [grade(completion_text(p), completion_text(c)) for p, c in zip(prompts, completions)]
