"""RookGRPOTrainer trains exactly like GRPOTrainer with no feature on, and user rewards reach the training signal."""

import sys

import pytest
from trl import GRPOTrainer

from conftest import REPO, losses_and_rewards, tiny_grpo_args, vanilla_args
from rookgrpo import RookGRPOTrainer
from rookgrpo.rewards.basic import uci_charset


def _train(trainer_cls, args, model_dir, dataset, reward):
    trainer = trainer_cls(model=str(model_dir), reward_funcs=reward, args=args, train_dataset=dataset)
    trainer.train()
    return trainer


def test_same_losses_and_rewards_as_vanilla_trl(tiny_model_dir, smoke_dataset, tmp_path):
    # TRL's own scoring: the one correction on by default, positions from the mask, is off (tests/test_positions.py)
    rook_args = tiny_grpo_args(tmp_path / "rook", max_steps=4, beta=0.04, position_ids_from_mask=False)
    vanilla = vanilla_args(rook_args, tmp_path / "vanilla")
    rook = _train(RookGRPOTrainer, rook_args, tiny_model_dir, smoke_dataset, "uci_charset")
    vanilla = _train(GRPOTrainer, vanilla, tiny_model_dir, smoke_dataset, uci_charset)
    rook_logs = losses_and_rewards(rook.state.log_history)
    vanilla_logs = losses_and_rewards(vanilla.state.log_history)
    assert len(rook_logs) == 4 and "kl" not in rook_logs[0]
    assert rook_logs == vanilla_logs
    # The runs trained (non-trivial numbers), so equality is not two empty logs agreeing.
    assert any(abs(h["loss"]) > 0 for h in rook_logs) and all(h["grad_norm"] > 0 for h in rook_logs)


def test_reward_named_by_file_path_drives_training(tiny_model_dir, smoke_dataset, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    args = tiny_grpo_args(tmp_path, max_steps=2)
    trainer = _train(RookGRPOTrainer, args, tiny_model_dir, smoke_dataset, ["rewards/example_reward.py:prompt_charset"])
    assert trainer.reward_func_names == ["prompt_charset"]
    # The logged rewards are exactly the file's function applied to the logged prompts and completions.
    sys.path.insert(0, str(REPO / "rewards"))
    try:
        from example_reward import prompt_charset
    finally:
        sys.path.remove(str(REPO / "rewards"))
    logs = trainer._logs
    expected = prompt_charset(list(logs["prompt"]), list(logs["completion"]))
    assert list(logs["rewards"]["prompt_charset"]) == pytest.approx(expected)
    assert len(expected) >= 8 and len(set(expected)) > 1  # graded values, not a constant that matches anything
    history = [h for h in trainer.state.log_history if "loss" in h]
    assert all("rewards/prompt_charset/mean" in h for h in history)
