"""AdaptiveBeta: beta follows the KL error within bounds, is logged, survives checkpoint + resume, rejects beta 0."""

import json

import pytest

from conftest import tiny_grpo_args
from rookgrpo import ConfigError, RookGRPOTrainer
from rookgrpo.callbacks import AdaptiveBeta


def _train(tiny_model_dir, dataset, tmp_path, callback, **overrides):
    args = tiny_grpo_args(tmp_path, beta=0.05, **overrides)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=args,
                              train_dataset=dataset, callbacks=[callback])
    trainer.train()
    return trainer


def test_beta_rises_when_kl_is_above_target(tiny_model_dir, smoke_dataset, tmp_path):
    cb = AdaptiveBeta(target_kl=1e-12, horizon=5, warmup_steps=1, beta_max=0.06)
    trainer = _train(tiny_model_dir, smoke_dataset, tmp_path, cb, max_steps=6)
    logged = [h["beta"] for h in trainer.state.log_history if "beta" in h]
    assert len(logged) == 6 and logged[0] == 0.05  # warm-up step: unchanged
    assert all(b2 >= b1 for b1, b2 in zip(logged, logged[1:])) and logged[-1] > 0.05
    assert logged[-1] <= 0.06 and trainer.beta == cb.beta == logged[-1]  # the loss uses the controlled value
    assert cb.updates == 5


def test_beta_falls_when_kl_is_below_target_and_stops_at_the_floor(tiny_model_dir, smoke_dataset, tmp_path):
    cb = AdaptiveBeta(target_kl=1e3, horizon=2, beta_min=0.045)
    trainer = _train(tiny_model_dir, smoke_dataset, tmp_path, cb, max_steps=5)
    logged = [h["beta"] for h in trainer.state.log_history if "beta" in h]
    assert logged[0] == pytest.approx(0.05 * 0.9) and min(logged) == 0.045 == logged[-1]


def test_beta_resumes_from_the_checkpointed_value(tiny_model_dir, smoke_dataset, tmp_path):
    cb = AdaptiveBeta(target_kl=1e3, horizon=2, beta_min=1e-4)
    _train(tiny_model_dir, smoke_dataset, tmp_path, cb, max_steps=4, save_strategy="steps", save_steps=2)
    saved = json.loads((tmp_path / "checkpoint-2" / "rookgrpo_callbacks.json").read_text())["adaptive_beta"]
    assert saved["beta"] == pytest.approx(0.05 * 0.9 ** 2) and saved["updates"] == 2

    seen = {}

    class Probe(AdaptiveBeta):
        def on_train_begin(self, args, state, control, **kwargs):
            seen["beta_at_resume"] = self.trainer.beta

    resumed = Probe(target_kl=1e3, horizon=2, beta_min=1e-4)
    args = tiny_grpo_args(tmp_path, beta=0.05, max_steps=4, save_strategy="steps", save_steps=2)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=args,
                              train_dataset=smoke_dataset, callbacks=[resumed])
    trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert seen["beta_at_resume"] == pytest.approx(saved["beta"])  # not the recipe's 0.05
    assert resumed.updates == 4 and resumed.beta == pytest.approx(0.05 * 0.9 ** 4)


def test_beta_zero_is_rejected_before_training(tiny_model_dir, smoke_dataset, tmp_path):
    args = tiny_grpo_args(tmp_path, beta=0.0)
    with pytest.raises(ConfigError, match=r"beta: 0 with the adaptive_beta callback.*beta: 0.01"):
        RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=args,
                        train_dataset=smoke_dataset, callbacks=[{"name": "adaptive_beta", "target_kl": 0.05}])


def test_bad_controller_settings_are_config_errors():
    with pytest.raises(ConfigError, match="target_kl"):
        AdaptiveBeta(target_kl=0)
    with pytest.raises(ConfigError, match="beta_min <= beta_max"):
        AdaptiveBeta(beta_min=0.5, beta_max=0.1)


def test_controller_reads_each_training_kl_once_with_evaluation_logs_between(tiny_model_dir, smoke_dataset, tmp_path):
    """TRL clears only the logged mode's metrics: an evaluation log must not make the controller re-read training KL
    values it already used (eval_steps not a multiple of logging_steps)."""
    truth, reads = [], []

    class Recording(AdaptiveBeta):
        def _new_kl_values(self):
            values = super()._new_kl_values()
            reads.append(values)
            return values

    args = tiny_grpo_args(tmp_path, beta=0.05, max_steps=7, logging_steps=2, eval_strategy="steps", eval_steps=3,
                          per_device_eval_batch_size=8)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=args,
                              train_dataset=smoke_dataset, eval_dataset=smoke_dataset.select(range(8)),
                              callbacks=[Recording(target_kl=0.01, horizon=5)])
    compute = trainer._compute_loss

    def recorded(model, inputs):
        loss = compute(model, inputs)
        if trainer.model.training:
            truth.append(trainer._metrics["train"]["kl"][-1])
        return loss

    trainer._compute_loss = recorded
    trainer.train()
    assert any("eval_loss" in h for h in trainer.state.log_history)
    assert len(reads) == 7 and [len(r) for r in reads] == [1] * 7  # one fresh value per optimizer step
    assert [v for r in reads for v in r] == truth
