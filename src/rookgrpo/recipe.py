"""Parse a recipe (TRL-style YAML) plus command-line overrides into rookgrpo's argument dataclasses.

Recipes are read with TRL's ``TrlParser``, so every ``RookGRPOConfig`` / ``ModelConfig`` field and every
``RookScriptArguments`` key works, and a flag on the command line (``--learning_rate 1e-6``) overrides the recipe.
Unknown keys are an error that names the key and the closest real field, before anything is loaded.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

from trl import ModelConfig, TrlParser

from .config import RookGRPOConfig, RookScriptArguments
from .errors import ConfigError

DATACLASSES = (RookScriptArguments, RookGRPOConfig, ModelConfig)


def normalize_argv(argv: Sequence[str]) -> list[str]:
    """Accept ``RECIPE.yaml [flags]`` as well as TRL's ``--config RECIPE.yaml [flags]``."""
    argv = list(argv)
    if argv and not argv[0].startswith("-") and argv[0].endswith((".yaml", ".yml")):
        argv = ["--config", argv[0], *argv[1:]]
    if "--config" in argv:
        i = argv.index("--config")
        if i + 1 >= len(argv):
            raise ConfigError("--config needs a recipe path, e.g. `rookgrpo train recipes/rookworld-tiny.yaml`.")
        if not Path(argv[i + 1]).is_file():
            raise ConfigError(f"recipe {argv[i + 1]!r} does not exist.")
    return argv


def make_parser() -> TrlParser:
    return TrlParser(DATACLASSES, prog="python -m rookgrpo", allow_abbrev=False)  # `--max_step` must not mean --max_steps


def parse_recipe(argv: Sequence[str]) -> tuple[RookScriptArguments, RookGRPOConfig, ModelConfig]:
    """Parse ``argv`` (recipe path and flags) into ``(script_args, training_args, model_args)``."""
    argv = normalize_argv(argv)
    parser = make_parser()
    _check_recipe_keys(argv)
    script_args, training_args, model_args, remaining = parser.parse_args_and_config(
        argv, return_remaining_strings=True
    )
    unknown = [s for s in remaining if s.startswith("--")]
    if unknown:
        raise ConfigError(_unknown_keys_message([u[2:].split("=")[0] for u in unknown], "command-line flag"))
    return script_args, training_args, model_args


def known_keys() -> set[str]:
    keys = {f.name for dc in DATACLASSES for f in fields(dc)}
    return keys | {"env"}  # TrlParser sets `env:` mappings as environment variables


def _check_recipe_keys(argv: list[str]) -> None:
    """Reject recipe keys that are no field, before the config objects are built (their checks come second)."""
    if "--config" not in argv:
        return
    import yaml

    path = argv[argv.index("--config") + 1]
    with open(path) as fh:
        recipe = yaml.safe_load(fh) or {}
    if not isinstance(recipe, dict):
        raise ConfigError(f"recipe {path!r} must be a YAML mapping of field: value, got {type(recipe).__name__}.")
    unknown = sorted(set(recipe) - known_keys())
    if unknown:
        raise ConfigError(_unknown_keys_message(unknown, f"key in recipe {path!r}"))


def _unknown_keys_message(unknown: list[str], where: str) -> str:
    keys = sorted(known_keys())
    parts = []
    for key in unknown:
        close = difflib.get_close_matches(key, keys, n=2)
        parts.append(f"{key!r}" + (f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""))
    return (
        f"unknown {where}: {', '.join(parts)}. It is not a field of RookGRPOConfig, ModelConfig or the recipe "
        "arguments; fix the spelling or remove it (`python -m rookgrpo --help` lists every field)."
    )
