"""Short names for the models and datasets rookgrpo ships or builds, so recipes work with no network.

``rookgrpo/<name>`` in ``model_name_or_path`` or ``dataset_name`` resolves here first; any other string is left for
transformers/datasets to load (hub id or local path). Packaged files live next to this module.
"""

from __future__ import annotations

import os
from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent
PREFIX = "rookgrpo/"


def cache_dir() -> Path:
    """Where built-on-demand assets go: ``$ROOKGRPO_CACHE`` or ``~/.cache/rookgrpo``."""
    return Path(os.environ.get("ROOKGRPO_CACHE", Path.home() / ".cache" / "rookgrpo"))


def _tiny_random() -> Path:
    from ..models.tiny_model import TinyGPT2Spec, build_tiny_gpt2

    return build_tiny_gpt2(cache_dir() / "models" / "tiny-random-v2", TinyGPT2Spec())


TINY_ROOKWORLD = ASSETS_DIR / "tiny-rookworld"


def _tiny_rookworld() -> Path:
    """The packaged SFT chess model (made by scripts/build_tiny_model.py; see its README.md model card)."""
    if not (TINY_ROOKWORLD / "model.safetensors").exists():
        from ..errors import ConfigError

        raise ConfigError(
            f"model_name_or_path: rookgrpo/tiny-rookworld is not in this installation ({TINY_ROOKWORLD} has no "
            "model.safetensors). Rebuild it with `python scripts/build_tiny_model.py` from a source checkout."
        )
    return TINY_ROOKWORLD


def _fill_in_judge() -> Path:
    from ..models.judge import build_fill_in_judge

    return build_fill_in_judge(cache_dir() / "models" / "fill-in-judge-v1")


# name → callable returning a local directory (packaged, or built on first use).
MODELS = {
    "tiny-random": _tiny_random,
    "tiny-rookworld": _tiny_rookworld,
    "fill-in-judge": _fill_in_judge,  # a sequence-classification judge for judge-scored GRPO (rookgrpo/judge.py)
}
def _code_rows(source: str, chat: bool):
    def build():
        from datasets import Dataset

        from ..code.problems import builtin_rows, humaneval_rows

        rows = humaneval_rows() if source == "humaneval" else builtin_rows()
        if chat:  # conversational prompts, for instruct models (TRL applies the chat template)
            rows = [{**r, "prompt": [{"role": "user", "content": r["prompt"]}]} for r in rows]
        return Dataset.from_list(rows)

    return build


# name → packaged data file.
DATASETS = {
    "smoke-prompts": ASSETS_DIR / "smoke_prompts.jsonl",
    # RookWorld lines (compact layout) shipped with the tiny model: GRPO positions, held-out evaluation positions and a
    # sample of the lines its SFT stage trained on (to set its held-out numbers against).
    "tiny-rookworld-train": TINY_ROOKWORLD / "train_positions.txt",
    "tiny-rookworld-eval": TINY_ROOKWORLD / "eval_positions.txt",
    "tiny-rookworld-sft-sample": TINY_ROOKWORLD / "sft_sample.txt",
}


# The guard's validation panel: whole positions taken from the end of the GRPO positions (96 P: and 32 A: lines, the
# held-out panels' A: share), so a checkpoint is chosen on positions that are neither trained on nor reported.
VAL_POLICY, VAL_ENV = 96, 32


def _grpo_positions(part: str):
    def build():
        from datasets import Dataset

        from ..chess.data import split_by_position

        lines = DATASETS["tiny-rookworld-train"].read_text().splitlines()
        rest, val = split_by_position(lines, VAL_POLICY, VAL_ENV)
        return Dataset.from_dict({"text": val if part == "val" else rest})

    return build


def _fill_in_rows():
    from datasets import Dataset

    from ..models.judge import fill_in_prompts

    return Dataset.from_dict({"prompt": fill_in_prompts(1024, seed=0)})


# name → builder returning a datasets.Dataset (data that ships inside a dependency, e.g. HumanEval, or generated).
DATASET_BUILDERS = {
    "fill-in-prompts": _fill_in_rows,
    # The GRPO positions split for a run with a held-out guard: it trains on -grpo and selects checkpoints on -val;
    # -eval, the reported panel, is disjoint from both.
    "tiny-rookworld-grpo": _grpo_positions("grpo"),
    "tiny-rookworld-val": _grpo_positions("val"),
    "humaneval": _code_rows("humaneval", chat=False),
    "humaneval-chat": _code_rows("humaneval", chat=True),
    "code-builtin": _code_rows("builtin", chat=False),
    "code-builtin-chat": _code_rows("builtin", chat=True),
}


def resolve_model(name_or_path: str) -> str:
    """Map ``rookgrpo/<name>`` to a local model directory; return anything else unchanged."""
    if isinstance(name_or_path, str) and name_or_path.startswith(PREFIX) and not Path(name_or_path).exists():
        key = name_or_path[len(PREFIX):]
        if key in MODELS:
            return str(_on_local_main_process_first(MODELS[key]))
        from ..errors import ConfigError

        raise ConfigError(
            f"model_name_or_path: {name_or_path!r} is not a packaged rookgrpo model. Packaged: "
            f"{', '.join(PREFIX + k for k in MODELS)}. For a hub model use its id, for a local one its directory."
        )
    return name_or_path


def _on_local_main_process_first(build):
    """Run ``build`` on each node's main process before the other ranks, which then find the result on disk."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return build()
    from accelerate import PartialState

    with PartialState().local_main_process_first():
        return build()


def packaged_dataset_builder(name: str):
    """The builder for a built-on-demand packaged dataset (``rookgrpo/humaneval``, ...), or ``None``."""
    if isinstance(name, str) and name.startswith(PREFIX) and not Path(name).exists():
        return DATASET_BUILDERS.get(name[len(PREFIX):])
    return None


def resolve_dataset(name_or_path: str) -> str:
    """Map ``rookgrpo/<name>`` to a packaged data file; return anything else unchanged."""
    if isinstance(name_or_path, str) and name_or_path.startswith(PREFIX) and not Path(name_or_path).exists():
        key = name_or_path[len(PREFIX):]
        if key in DATASETS:
            return str(DATASETS[key])
        from ..errors import ConfigError

        raise ConfigError(
            f"dataset_name: {name_or_path!r} is not a packaged rookgrpo dataset. Packaged: "
            f"{', '.join(PREFIX + k for k in [*DATASETS, *DATASET_BUILDERS])}. For a hub dataset use its id, for "
            "local data a path."
        )
    return name_or_path
