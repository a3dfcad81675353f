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


def prompt_format(dataset: Any, prompt_column: str = "prompt", tasks: Any = None) -> Any:
    """The ``prompt`` dataset format: rows as they are, the prompt column renamed to ``prompt``."""
    return prepare_prompt_column(dataset, prompt_column)


def apply_format(dataset: Any, fmt: Any = "auto", prompt_column: str = "prompt", tasks: Any = None) -> Any:
    """Turn ``dataset`` into rows TRL trains on, with the dataset format ``fmt``: ``auto``, ``prompt``, a format a
    task pack registered (``rookworld``, ``open-r1``), or one of your own in the registry's grammar
    (``my_task.py:my_format``, a function ``(dataset, prompt_column, tasks) -> dataset``).

    ``auto`` keeps data that has the prompt column as it is, and otherwise asks the registered formats' detectors
    (``rookworld``: a ``text`` column of RookWorld lines).
    """
    from .registry import bind, detect_format, load, split_spec

    name, kwargs = split_spec(fmt, "format")
    if name == "auto":
        columns = list(dataset.column_names or [])
        name = "prompt" if prompt_column in columns else (detect_format(columns, prompt_column) or "prompt")
    func = load("format", name) if isinstance(name, str) else name
    if not callable(func):
        raise ConfigError(f"dataset_format: {name!r} is not a function (dataset, prompt_column, tasks) -> dataset.")
    func = bind(func, kwargs, "format", str(name))
    return func(dataset, prompt_column=prompt_column, tasks=tasks)


def prepare_dataset(dataset: Any, script_args: Any) -> Any:
    """Apply the recipe's ``dataset_format`` (:func:`apply_format`) with its prompt column and tasks."""
    return apply_format(dataset, script_args.dataset_format, script_args.dataset_prompt_column,
                        script_args.dataset_tasks)
