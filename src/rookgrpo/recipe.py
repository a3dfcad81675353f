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


#: The recipes and accelerate configs that ship inside the package (``rookgrpo recipes`` lists them).
RECIPES_DIR = Path(__file__).resolve().parent / "recipes"
ACCELERATE_DIR = RECIPES_DIR / "accelerate"


def packaged_recipes() -> dict[str, Path]:
    """Name -> file of every packaged recipe.

    >>> sorted(packaged_recipes())[:3]
    ['chess-smoke', 'code', 'judge']
    """
    return {p.stem: p for p in sorted(RECIPES_DIR.glob("*.yaml"))}


def packaged_accelerate_configs() -> dict[str, Path]:
    """Name -> file of every packaged accelerate config (``cpu-ddp``, ``ddp``, ``zero2``, ...)."""
    return {p.stem: p for p in sorted(ACCELERATE_DIR.glob("*.yaml"))}


def _stem(path: Path) -> str:
    return path.name[: -len(path.suffix)] if path.suffix in (".yaml", ".yml") else path.name


def find_packaged(name_or_path: str, known: dict[str, Path], folder: str) -> Path | None:
    """An existing file, else the packaged file named ``NAME``, ``NAME.yaml`` or ``FOLDER/NAME.yaml`` (as the docs
    write it, so a path from the repository works outside it), else ``None``."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    stem = _stem(path)
    if stem in known and (path.parent == Path(".") or path.parent.name == folder):
        return known[stem]
    return None


def resolve_recipe(name_or_path: str) -> Path:
    """A recipe file: an existing path, else a packaged recipe's name (``rookworld-tiny``, or ``recipes/<name>.yaml``
    as the docs write it, which then also works outside the repository).

    >>> resolve_recipe("smoke").name
    'smoke.yaml'
    >>> resolve_recipe("rookworld-tiy")
    Traceback (most recent call last):
    ...
    rookgrpo.errors.ConfigError: recipe 'rookworld-tiy' does not exist and is not a packaged recipe. Did you mean 'rookworld-tiny' or 'rookworld'? Packaged: chess-smoke, code, judge, rookworld-tiny, rookworld, smoke (`rookgrpo recipes` lists them; `rookgrpo recipes NAME --copy DIR` writes one out to edit).
    """
    found = find_packaged(name_or_path, packaged_recipes(), "recipes")
    if found is not None:
        return found
    known = packaged_recipes()
    stem = _stem(Path(name_or_path))
    close = difflib.get_close_matches(stem, list(known), n=2)
    hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
    raise ConfigError(f"recipe {name_or_path!r} does not exist and is not a packaged recipe.{hint} Packaged: "
                      f"{', '.join(known)} (`rookgrpo recipes` lists them; `rookgrpo recipes NAME --copy DIR` writes "
                      "one out to edit).")


def normalize_argv(argv: Sequence[str]) -> list[str]:
    """Accept ``RECIPE [flags]`` as well as TRL's ``--config RECIPE [flags]``; RECIPE is a YAML file or the name of a
    packaged recipe, resolved to its file here."""
    argv = list(argv)
    if argv and not argv[0].startswith("-"):
        argv = ["--config", argv[0], *argv[1:]]
    if "--config" in argv:
        i = argv.index("--config")
        if i + 1 >= len(argv):
            raise ConfigError("--config needs a recipe, e.g. `rookgrpo train rookworld-tiny` or a YAML file.")
        argv[i + 1] = str(resolve_recipe(argv[i + 1]))
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
