"""Load a recipe's training data from the hub, a local file or directory, or a packaged short name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .assets import packaged_dataset_builder, resolve_dataset
from .errors import ConfigError

# File suffix → the `datasets` builder that reads it.
_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text", ".arrow": "arrow"}


def load_recipe_dataset(
    name_or_path: str | None,
    config_name: str | None = None,
    split: str = "train",
    streaming: bool = False,
) -> Any:
    """Return one split of a dataset.

    - packaged short name (``rookgrpo/...``): the packaged file;
    - local file: read with the builder for its suffix (a single file is the ``train`` split);
    - local directory: ``load_from_disk`` output if it is one, else a data directory for ``load_dataset``;
    - anything else: a hub id for ``datasets.load_dataset``.
    """
    import datasets

    if not name_or_path:
        raise ConfigError("dataset_name: not set. Give a hub id, a local file or directory, or rookgrpo/smoke-prompts.")
    builder = packaged_dataset_builder(name_or_path)
    if builder is not None:
        return builder()
    name_or_path = resolve_dataset(name_or_path)
    path = Path(name_or_path).expanduser()
    if path.is_file():
        builder = _BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise ConfigError(
                f"dataset_name: cannot read {path.name!r}: unknown suffix. Supported: {', '.join(sorted(_BUILDERS))}."
            )
        loaded = datasets.load_dataset(builder, data_files={split: str(path)}, streaming=streaming)
    elif path.is_dir():
        if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
            loaded = datasets.load_from_disk(str(path))
        else:
            loaded = datasets.load_dataset(str(path), name=config_name, streaming=streaming)
    else:
        looks_local = name_or_path.startswith((".", "/", "~")) or Path(name_or_path).suffix.lower() in _BUILDERS
        if looks_local:
            raise ConfigError(f"dataset_name: {name_or_path!r} does not exist (looked for {path.resolve()}).")
        loaded = datasets.load_dataset(name_or_path, name=config_name, streaming=streaming)
    if isinstance(loaded, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        if split not in loaded:
            raise ConfigError(
                f"dataset_train_split/dataset_test_split: split {split!r} not in {name_or_path!r} "
                f"(splits: {', '.join(loaded)})."
            )
        return loaded[split]
    return loaded


def prepare_prompt_column(dataset: Any, prompt_column: str) -> Any:
    """Rename ``prompt_column`` to ``prompt`` (the column TRL generates from), with a clear error if it is missing."""
    columns = dataset.column_names or []
    if prompt_column == "prompt" and "prompt" in columns:
        return dataset
    if prompt_column not in columns:
        raise ConfigError(
            f"dataset_prompt_column: column {prompt_column!r} not in the dataset (columns: {', '.join(columns)}). "
            "Set dataset_prompt_column to the column that holds the prompts."
        )
    if "prompt" in columns:
        dataset = dataset.remove_columns("prompt")
    return dataset.rename_column(prompt_column, "prompt")


def prepare_dataset(dataset: Any, script_args: Any) -> Any:
    """Apply the recipe's ``dataset_format``: RookWorld lines become prompt/completion rows; else rename the prompt."""
    fmt = script_args.dataset_format
    columns = dataset.column_names or []
    if fmt == "auto":
        fmt = "rookworld" if "text" in columns and script_args.dataset_prompt_column not in columns else "prompt"
    if fmt == "rookworld":
        from .chess.data import prepare_rookworld

        return prepare_rookworld(dataset, script_args.dataset_tasks)
    if fmt == "open-r1":
        from .code.problems import prepare_verification_dataset

        return prepare_verification_dataset(dataset, script_args.dataset_prompt_column)
    if fmt != "prompt":
        raise ConfigError(f"dataset_format: expected auto, prompt, rookworld or open-r1, got {fmt!r}.")
    return prepare_prompt_column(dataset, script_args.dataset_prompt_column)
