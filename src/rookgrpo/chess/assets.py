"""The chess pack's packaged model and the split of its positions (registered in :mod:`rookgrpo.chess.pack`)."""

from __future__ import annotations

from pathlib import Path

from ..assets import TINY_ROOKWORLD
from ..errors import ConfigError
from .data import split_by_position

# The guard's validation panel: whole positions taken from the end of the GRPO positions (96 P: and 32 A: lines, the
# held-out panels' A: share), so a checkpoint is chosen on positions that are neither trained on nor reported.
VAL_POLICY, VAL_ENV = 96, 32
CARVED_POLICY, CARVED_ENV = VAL_POLICY, VAL_ENV  # what the GRPO split leaves out, whichever panel the guard uses
# A fresh validation panel, in none of the packaged files (val_positions.txt, made by scripts/build_val_panel.py):
# 288 P: lines, enough for the shipped recipe's best-move gain to stand 2 standard errors out, and 32 A: lines
# (``rookgrpo/tiny-rookworld-val-fresh``; docs/experiments/2026-11-29-b-anchor-grid-plan.md).
FRESH_VAL_POLICY, FRESH_VAL_ENV = 288, 32


def tiny_rookworld() -> Path:
    """The packaged SFT chess model (made by scripts/build_tiny_model.py; see its README.md model card)."""
    if not (TINY_ROOKWORLD / "model.safetensors").exists():
        raise ConfigError(
            f"model_name_or_path: rookgrpo/tiny-rookworld is not in this installation ({TINY_ROOKWORLD} has no "
            "model.safetensors). Rebuild it with `python scripts/build_tiny_model.py` from a source checkout."
        )
    return TINY_ROOKWORLD


def _split(part: str):
    from datasets import Dataset

    lines = (TINY_ROOKWORLD / "train_positions.txt").read_text().splitlines()
    rest, val = split_by_position(lines, CARVED_POLICY, CARVED_ENV)
    return Dataset.from_dict({"text": val if part == "val" else rest})


def grpo_positions():
    """``rookgrpo/tiny-rookworld-grpo``: the packaged GRPO positions less the validation panel carved from them."""
    return _split("grpo")


def val_positions():
    """``rookgrpo/tiny-rookworld-val``: the validation panel the guard selects on."""
    return _split("val")


def fresh_val_positions():
    """``rookgrpo/tiny-rookworld-val-fresh``: a validation panel of fresh positions in none of the packaged files
    (``val_positions.txt``, ``scripts/build_val_panel.py``), sized to see the shipped recipe's best-move gain."""
    from datasets import Dataset

    return Dataset.from_dict({"text": (TINY_ROOKWORLD / "val_positions.txt").read_text().splitlines()})
