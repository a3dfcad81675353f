"""Code rewards inside the trainer: known-good and known-bad completions through the trainer's reward path, and a
short GRPO run of the tiny model with code_exec."""

import json

import pytest
from datasets import Dataset

from conftest import tiny_grpo_args
from rookgrpo import ConfigError, RookGRPOTrainer
from rookgrpo.code.problems import builtin_rows
from rookgrpo.data import load_recipe_dataset


@pytest.fixture()
def code_dataset():
    return Dataset.from_list(builtin_rows() * 4)


def test_known_good_and_bad_completions_through_the_trainer_reward_path(tiny_model_dir, code_dataset, tmp_path):
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=["code_exec", "code_format"],
                              args=tiny_grpo_args(tmp_path), train_dataset=code_dataset)
    rows = builtin_rows()
    good = [f"```python\n{r['canonical_solution']}\n```" for r in rows]
    bad = ["```python\nimport sys\nsys.exit(0)\n```", "no code", "```python\ndef f(:\n```",
           "```python\nprint('wrong')\n```"]
    inputs = [dict(r) for r in rows + rows]
    rewards = trainer._calculate_rewards(inputs, [r["prompt"] for r in inputs], good + bad, [[0]] * 8)
    assert rewards[:4, 0].tolist() == [1.0] * 4 and rewards[:4, 1].tolist() == [1.0] * 4
    assert rewards[4:, 0].tolist() == [0.0] * 4
    assert rewards[4:, 1].tolist() == [1.0, 0.0, 1.0, 1.0]


def test_short_grpo_run_with_code_exec(tiny_model_dir, code_dataset, tmp_path):
    args = tiny_grpo_args(tmp_path, max_steps=2, max_completion_length=24)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=["code_exec", "code_format"], args=args,
                              train_dataset=code_dataset)
    trainer.train()
    history = [h for h in trainer.state.log_history if "loss" in h]
    assert len(history) == 2
    assert all(h["rewards/code_exec/mean"] == 0.0 for h in history)  # a random char model writes no code


def test_missing_tests_column_fails_before_training(tiny_model_dir, tmp_path):
    ds = Dataset.from_dict({"prompt": ["write code"] * 8})
    with pytest.raises(ConfigError, match=r"code_exec needs dataset column\(s\) \['tests'\]"):
        RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=["code_exec"], args=tiny_grpo_args(tmp_path),
                        train_dataset=ds)


def test_packaged_code_datasets_load_by_short_name():
    he = load_recipe_dataset("rookgrpo/humaneval")
    assert len(he) == 164 and {"prompt", "tests"} <= set(he.column_names)
    chat = load_recipe_dataset("rookgrpo/humaneval-chat")
    assert chat[0]["prompt"][0]["role"] == "user"
    assert json.loads(load_recipe_dataset("rookgrpo/code-builtin")[0]["tests"])["type"] == "calls"
