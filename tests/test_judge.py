"""Judge-scored GRPO: a frozen sequence-classification model, named by its directory, scores the completions.

TRL accepts a reward-model id or directory in ``reward_funcs``; rookgrpo passes it through unchanged. These tests build
a small GPT-2 judge locally, train with it (resampling on), and check that the diagnostics name a judge whose scores
have collapsed to one value, the failure that makes a judge-scored run's loss exactly 0.
"""

import logging

import pytest
import torch

from conftest import tiny_grpo_args
from rookgrpo import Diagnostics, RookGRPOTrainer, ZeroStdResampling


def build_judge(base_dir, out_dir, constant: bool = False):
    """A ``GPT2ForSequenceClassification`` judge (one score) with the tiny model's config and tokenizer.

    ``constant``: its score head is zeroed, so it gives every text the same score (0), as a collapsed judge does.
    """
    from transformers import AutoTokenizer, GPT2Config, GPT2ForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    config = GPT2Config.from_pretrained(base_dir, num_labels=1)
    config.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(0)
    judge = GPT2ForSequenceClassification(config)
    if constant:
        with torch.no_grad():
            judge.score.weight.zero_()
    judge.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def test_judge_scored_grpo_trains_with_resampling(tiny_model_dir, smoke_dataset, tmp_path):
    judge = build_judge(tiny_model_dir, tmp_path / "judge")
    resampler = ZeroStdResampling(max_rounds=2)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=str(judge), args=tiny_grpo_args(tmp_path / "out"),
                              train_dataset=smoke_dataset, callbacks=[resampler, Diagnostics()])
    assert trainer.reward_func_names == ["judge"]
    trainer.train()
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logged) == 3
    assert all(h["rewards/judge/std"] > 0 for h in logged)  # a random judge still tells completions apart
    assert all(h["optimised/frac_reward_zero_std"] == 0.0 for h in logged)


def test_collapsed_judge_is_named_with_cause_and_fix(tiny_model_dir, smoke_dataset, tmp_path, caplog):
    judge = build_judge(tiny_model_dir, tmp_path / "flat-judge", constant=True)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=str(judge),
                              args=tiny_grpo_args(tmp_path / "out", max_steps=2), train_dataset=smoke_dataset,
                              callbacks=[Diagnostics()])
    with caplog.at_level(logging.WARNING, logger="rookgrpo.diagnostics"):
        trainer.train()
    warnings = [r.getMessage() for r in caplog.records if "same score" in r.getMessage()]
    assert warnings and "reward 'flat-judge' gave all 8 scored completions" in warnings[0]
    assert "judge" in warnings[0] and "Fix:" in warnings[0]
    assert all(h["loss"] == pytest.approx(0.0, abs=1e-6) for h in trainer.state.log_history if "loss" in h)
