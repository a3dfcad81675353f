"""Loading recipe datasets from every supported local form, and the errors for missing data or columns."""

import json

import pytest
from datasets import Dataset

from rookgrpo import ConfigError
from rookgrpo.data import load_recipe_dataset, prepare_prompt_column

ROWS = [{"text": f"P: 8/8/8/8/8/8/8/K6k w - - 0 {i} ", "task": "P"} for i in range(1, 6)]


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet", ".txt"])
def test_local_files_load_by_suffix(tmp_path, suffix):
    path = tmp_path / f"data{suffix}"
    ds = Dataset.from_list(ROWS)
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    elif suffix == ".csv":
        ds.to_csv(str(path))
    elif suffix == ".parquet":
        ds.to_parquet(str(path))
    else:
        path.write_text("".join(r["text"] + "\n" for r in ROWS))
    loaded = load_recipe_dataset(str(path))
    assert loaded["text"] == [r["text"] for r in ROWS]  # trailing spaces survive every format


def test_save_to_disk_directory_and_splits(tmp_path):
    from datasets import DatasetDict

    DatasetDict({"train": Dataset.from_list(ROWS), "test": Dataset.from_list(ROWS[:2])}).save_to_disk(tmp_path / "d")
    assert len(load_recipe_dataset(str(tmp_path / "d"), split="test")) == 2
    with pytest.raises(ConfigError, match="split 'validation' not in"):
        load_recipe_dataset(str(tmp_path / "d"), split="validation")


def test_packaged_short_name_and_unknown_short_name():
    ds = load_recipe_dataset("rookgrpo/smoke-prompts")
    assert len(ds) == 128 and all(p.startswith("P: ") for p in ds["prompt"])
    with pytest.raises(ConfigError, match="not a packaged rookgrpo dataset"):
        load_recipe_dataset("rookgrpo/nope")


def test_missing_local_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_recipe_dataset(str(tmp_path / "missing.jsonl"))


def test_prompt_column_is_renamed_or_reported():
    ds = Dataset.from_list(ROWS)
    assert prepare_prompt_column(ds, "text").column_names == ["prompt", "task"]
    with pytest.raises(ConfigError, match="dataset_prompt_column: column 'query' not in the dataset"):
        prepare_prompt_column(ds, "query")
