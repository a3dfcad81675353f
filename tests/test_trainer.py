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


# ---- overrides that do not depend on __init__ having run ---------------------------------------------------------
# TRL's own tests build trainers with ``object.__new__`` and set the attributes a method reads by hand
# (TestGRPORolloutDispatch). Every method RookGRPOTrainer overrides must then call straight through to TRL's.

_PASSTHROUGH_CALLS = {
    "_generate": (["prompt"],),
    "_calculate_rewards": ([{"prompt": "p"}], ["p"], ["c"], [[1]]),
    "_generate_and_score_completions": ([{"prompt": "p"}],),
    "training_step": (None, {"x": 1}),
    "compute_loss": (None, {"x": 1}),
    "_get_per_token_logps_and_entropies": (None, None, None),
    "log": ({"loss": 1.0},),
    "_get_train_sampler": (),
}


@pytest.mark.parametrize("method", sorted(_PASSTHROUGH_CALLS))
def test_overrides_call_through_on_a_trainer_built_without_init(method, monkeypatch):
    sentinel = object()
    seen = []

    def trl_method(self, *args, **kwargs):
        seen.append(args)
        return sentinel

    monkeypatch.setattr(GRPOTrainer, method, trl_method)
    trainer = object.__new__(RookGRPOTrainer)  # no __init__: no rookgrpo attribute was set on the instance
    trainer.callback_handler = type("Handler", (), {"callbacks": []})()
    args = _PASSTHROUGH_CALLS[method]
    assert getattr(RookGRPOTrainer, method) is not trl_method  # the override itself runs, not a patched copy
    assert getattr(trainer, method)(*args) is sentinel
    assert seen == [args] if method not in ("compute_loss", "training_step") else len(seen) == 1


def test_rollout_dispatch_with_a_trainer_built_without_init():
    """TRL's TestGRPORolloutDispatch, run against RookGRPOTrainer: ``_generate`` with a ``rollout_func``."""
    import inspect

    import torch

    if "rollout_func" not in inspect.getsource(GRPOTrainer._generate):
        pytest.skip("this TRL's _generate has no rollout_func dispatch (the overrides' test above still runs)")
    from types import SimpleNamespace
    from unittest.mock import MagicMock

    def make(cls):
        trainer = object.__new__(cls)
        trainer.accelerator = SimpleNamespace(device=torch.device("cpu"), is_main_process=True, gather=lambda t: t)
        trainer.args = SimpleNamespace(report_to=[])
        trainer.model = SimpleNamespace(training=True)
        trainer.state = SimpleNamespace(global_step=2, num_input_tokens_seen=0)
        trainer._last_loaded_step = 1
        trainer.use_vllm = True
        trainer.vllm_generation = SimpleNamespace(sync_weights=MagicMock())
        trainer.tools = None
        trainer.eos_token_ids = [0]
        trainer._tokenizer = SimpleNamespace(pad_token_id=0, eos_token_id=1)  # TRL 1.10 reads eos from it
        trainer.processing_class = SimpleNamespace(batch_decode=lambda ids, **kw: ["c" * len(i) for i in ids])
        from collections import defaultdict
        trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        trainer.rollout_func = MagicMock(return_value={"prompt_ids": [[1]], "completion_ids": [[2, 0]],
                                                       "logprobs": [[-0.1, -0.2]], "env_mask": [[1, 1]]})
        return trainer

    vanilla, rook = make(GRPOTrainer), make(RookGRPOTrainer)
    expected, got = vanilla._generate(["prompt"]), rook._generate(["prompt"])
    assert got == expected and got[1] == [[2, 0]] and got[3] == ["cc"]
    rook.vllm_generation.sync_weights.assert_called_once()
    assert rook._last_loaded_step == 2 and rook._metrics["train"] == vanilla._metrics["train"]
