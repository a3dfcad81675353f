"""The judge pack's packaged model and prompts (registered in :mod:`rookgrpo.judge.pack`)."""

from __future__ import annotations

from pathlib import Path

from ..assets import cache_dir
from . import model


def fill_in_judge() -> Path:
    return model.build_fill_in_judge(cache_dir() / "models" / "fill-in-judge-v1")


def fill_in_prompts_dataset():
    from datasets import Dataset

    return Dataset.from_dict({"prompt": model.fill_in_prompts(1024, seed=0)})
