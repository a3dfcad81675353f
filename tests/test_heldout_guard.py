"""heldout_guard: a run whose held-out metric falls ends with the best evaluated step's weights and says so, in the
layouts TRL supports (batches reused over steps and iterations with accumulation, a LoRA policy with evaluations
between steps) and across a resume; a run whose last step is its best keeps it.

The held-out metric here is logged as ``chess_eval`` logs its own (the start's at step 0 straight into the log
history, later ones into the step's metrics every ``every`` steps), with values fixed per step, so which step is best
is known in advance; the probe keeps a copy of the weights at each evaluated step to compare with.
"""

from __future__ import annotations

import logging

import pytest
import torch

from conftest import tiny_grpo_args
from rookgrpo import ConfigError, RookGRPOTrainer
from rookgrpo.callbacks import HeldoutGuard, RookCallback


class HeldoutProbe(RookCallback):
    """Logs ``heldout/probe`` = ``values[step]`` at step 0 and every ``every`` steps, and copies the trainable
    weights at each of those steps."""

    state_key = "heldout_probe"

    def __init__(self, values: dict[int, float], every: int = 2):
        self.values, self.every, self.weights = values, every, {}

    def _copy(self):
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step == 0:
            self.weights[0] = self._copy()
            state.log_history.append({"step": 0, "heldout/probe": self.values[0]})

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every == 0:
            self.weights[state.global_step] = self._copy()
            self.trainer._metrics["train"]["heldout/probe"].append(self.values[state.global_step])


def _weights(trainer):
    model = trainer.accelerator.unwrap_model(trainer.model)
    return {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}


def _same(a, b) -> bool:
    return all(torch.equal(a[n], b[n]) for n in a)


LAYOUTS = {
    "default": {},
    "buffered-batches": {"steps_per_generation": 2, "num_iterations": 2, "gradient_accumulation_steps": 2},
    "lora-with-evaluation": {"lora": True, "eval_strategy": "steps", "eval_steps": 1, "per_device_eval_batch_size": 8},
}


@pytest.mark.parametrize("layout", list(LAYOUTS), ids=list(LAYOUTS))
def test_a_run_whose_heldout_metric_falls_ends_with_the_best_steps_weights(tiny_model_dir, smoke_dataset, tmp_path,
                                                                           layout, caplog):
    from peft import LoraConfig

    options = dict(LAYOUTS[layout])
    peft = LoraConfig(r=4, target_modules=["c_attn"], task_type="CAUSAL_LM") if options.pop("lora", False) else None
    evaluation = smoke_dataset.select(range(8)) if options.get("eval_strategy") else None
    probe = HeldoutProbe({0: 0.1, 2: 0.5, 4: 0.2, 6: 0.3})
    guard = HeldoutGuard(metric="heldout/probe")
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset",
                              args=tiny_grpo_args(tmp_path, max_steps=6, beta=0.0, **options),
                              train_dataset=smoke_dataset, eval_dataset=evaluation, peft_config=peft,
                              callbacks=[guard, probe])  # the guard listed first: the order does not matter
    with caplog.at_level(logging.WARNING, logger="rookgrpo.heldout_guard"):
        trainer.train()
    assert not _same(probe.weights[6], probe.weights[2])  # the run moved the weights after step 2
    assert _same(_weights(trainer), probe.weights[2])
    assert "the final weights are step 2's, not step 6's" in caplog.text and "scored 0.3000" in caplog.text
    end = trainer.state.log_history[-1]
    assert end["heldout_guard/best_step"] == 2 and end["heldout_guard/restored"] == 1
    scored = [h["heldout_guard/score"] for h in trainer.state.log_history if "heldout_guard/score" in h]
    assert scored == [0.5, 0.2, 0.3]  # in the entries of the steps they describe


def test_the_start_is_restored_when_no_step_beats_it(tiny_model_dir, smoke_dataset, tmp_path):
    probe = HeldoutProbe({0: 0.9, 2: 0.5, 4: 0.2})
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset",
                              args=tiny_grpo_args(tmp_path, max_steps=4), train_dataset=smoke_dataset,
                              callbacks=[probe, HeldoutGuard(metric="heldout/probe")])
    trainer.train()
    assert _same(_weights(trainer), probe.weights[0])
    assert trainer.state.log_history[-1]["heldout_guard/best_step"] == 0


def test_a_run_whose_last_step_is_best_keeps_it(tiny_model_dir, smoke_dataset, tmp_path, caplog):
    probe = HeldoutProbe({0: 0.1, 2: 0.2, 4: 0.3})
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset",
                              args=tiny_grpo_args(tmp_path, max_steps=4), train_dataset=smoke_dataset,
                              callbacks=[probe, HeldoutGuard(metric="heldout/probe", mode="max")])
    with caplog.at_level(logging.WARNING, logger="rookgrpo.heldout_guard"):
        trainer.train()
    assert _same(_weights(trainer), probe.weights[4]) and not _same(probe.weights[4], probe.weights[0])
    assert trainer.state.log_history[-1]["heldout_guard/restored"] == 0 and "final weights are" not in caplog.text


def test_min_delta_keeps_the_earlier_step_when_a_later_one_is_only_as_good(tiny_model_dir, smoke_dataset, tmp_path):
    probe = HeldoutProbe({0: 0.1, 2: 0.5, 4: 0.52})
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset",
                              args=tiny_grpo_args(tmp_path, max_steps=4), train_dataset=smoke_dataset,
                              callbacks=[probe, HeldoutGuard(metric="heldout/probe", min_delta=0.05)])
    trainer.train()
    assert _same(_weights(trainer), probe.weights[2])


def test_a_resumed_run_keeps_the_best_from_before_the_resume(tiny_model_dir, smoke_dataset, tmp_path):
    values = {0: 0.1, 2: 0.5, 4: 0.2, 6: 0.3}
    args = dict(max_steps=6, save_strategy="steps", save_steps=4)
    first = HeldoutProbe(values)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset",
                              args=tiny_grpo_args(tmp_path, **args), train_dataset=smoke_dataset,
                              callbacks=[first, HeldoutGuard(metric="heldout/probe")])
    trainer.train()
    assert (tmp_path / "checkpoint-4" / "heldout_guard_best.pt").exists()
    second = HeldoutProbe(values)
    resumed = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset",
                              args=tiny_grpo_args(tmp_path, **args), train_dataset=smoke_dataset,
                              callbacks=[second, HeldoutGuard(metric="heldout/probe")])
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    assert 2 not in second.weights and 6 in second.weights  # the resumed run did not see step 2 itself
    assert _same(_weights(resumed), first.weights[2])


def test_bad_settings_fail_before_training(tiny_model_dir, smoke_dataset, tmp_path):
    with pytest.raises(ConfigError, match="needs evaluations, but eval_strategy is 'no'"):
        RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=tiny_grpo_args(tmp_path),
                        train_dataset=smoke_dataset, callbacks=[HeldoutGuard(metric="eval_loss", mode="min")])
    with pytest.raises(ConfigError, match="is not a held-out metric"):
        HeldoutGuard(metric="reward")
    with pytest.raises(ConfigError, match="mode: expected 'max' or 'min'"):
        HeldoutGuard(metric="heldout/x", mode="best")
