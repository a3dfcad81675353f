"""The judge task pack: judge-scored GRPO with no hub and no GPU (a frozen sequence-classification judge grades
fill-ins of chess-flavoured sentences). Registered by import path:

- reward ``fill_in_grade`` (:mod:`rookgrpo.judge.reward`); the judge itself is a reward model TRL loads, named
  ``rookgrpo/fill-in-judge`` in ``reward_funcs``;
- packaged: the model ``rookgrpo/fill-in-judge`` (built on first use) and the prompts ``rookgrpo/fill-in-prompts``.
"""

from ..assets import register_dataset, register_model
from ..registry import register

register("reward", "fill_in_grade", "rookgrpo.judge.reward:fill_in_grade")
register_model("fill-in-judge", "rookgrpo.judge.assets:fill_in_judge")
register_dataset("fill-in-prompts", "rookgrpo.judge.assets:fill_in_prompts_dataset")
