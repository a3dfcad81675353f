"""A non-finite gradient or loss never reaches the weights, the optimizer state or a checkpoint."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import TrainerCallback

from conftest import tiny_grpo_args

NAN_STEP = 3  # the third optimizer step gets a NaN gradient


class NaNGradientAt(TrainerCallback):
    """During step ``step``'s backward, the gradient of one weight becomes NaN (as a faulty kernel would make it);
    after every step, a copy of the weights and of Adam's first moment is kept."""

    def __init__(self, step: int = NAN_STEP):
        self.step = step
        self.weights: dict[int, dict] = {}
        self.moments: dict[int, dict] = {}
        self.handle = None
        self.trainer = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        target = model.transformer.h[0].attn.c_attn.weight

        def poison(grad):
            return grad * float("nan") if state.global_step == self.step - 1 else grad

        self.handle = target.register_hook(poison)
        self.weights[0] = {n: p.detach().clone() for n, p in model.named_parameters()}

    def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.weights[state.global_step] = {n: p.detach().clone() for n, p in model.named_parameters()}
        self.moments[state.global_step] = {id(p): optimizer.state[p]["exp_avg"].clone()
                                           for g in optimizer.param_groups for p in g["params"] if p in optimizer.state}

    def on_train_end(self, args, state, control, **kwargs):
        self.handle.remove()


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _finite(weights: dict) -> bool:
    return all(bool(torch.isfinite(v).all()) for v in weights.values())


def _train(tiny_model_dir, smoke_dataset, out, callbacks, **overrides):
    from rookgrpo import RookGRPOTrainer

    probe = NaNGradientAt()
    args = tiny_grpo_args(out, max_steps=5, learning_rate=1e-3, weight_decay=0.1, **overrides)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=["uci_charset"], args=args,
                              train_dataset=smoke_dataset, callbacks=[probe, *callbacks])
    trainer.train()
    return trainer, probe


@pytest.mark.parametrize("max_grad_norm", [1.0, 0.0])  # the norm transformers computes, or the gradients inspected
def test_a_nan_gradient_skips_its_update_and_the_run_goes_on(tiny_model_dir, smoke_dataset, tmp_path, max_grad_norm):
    trainer, probe = _train(tiny_model_dir, smoke_dataset, tmp_path, [], max_grad_norm=max_grad_norm)
    w = probe.weights
    assert trainer.state.global_step == 5
    assert _equal(w[NAN_STEP], w[NAN_STEP - 1])  # no weight change, no weight decay
    assert _equal(probe.moments[NAN_STEP], probe.moments[NAN_STEP - 1])  # Adam's moments untouched
    assert not _equal(w[NAN_STEP + 1], w[NAN_STEP]) and _finite(w[5])  # later steps train, on finite weights
    logs = {h["step"]: h for h in trainer.state.log_history if "loss" in h}
    assert math.isfinite(logs[NAN_STEP]["loss"])
    if max_grad_norm:
        assert math.isnan(logs[NAN_STEP]["grad_norm"])  # what happened stays in the log
    assert [logs[s]["skipped_updates"] for s in sorted(logs)] == [0, 0, 1, 1, 1]
    assert logs[5]["skipped_updates/nonfinite_loss"] == 0


def test_without_the_guard_the_nan_reaches_the_weights(tiny_model_dir, smoke_dataset, tmp_path):
    """What the guard prevents (and what this test file would see without it)."""
    from rookgrpo import RookGRPOTrainer

    probe = NaNGradientAt()
    args = tiny_grpo_args(tmp_path, max_steps=5, learning_rate=1e-3, skip_nonfinite_updates=False)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=["uci_charset"], args=args,
                              train_dataset=smoke_dataset, callbacks=[probe])
    with pytest.raises(RuntimeError, match="probability tensor contains"):
        trainer.train()  # NaN weights: the next generation cannot even sample
    assert not _finite(probe.weights[NAN_STEP])
    assert not any("skipped_updates" in h for h in trainer.state.log_history)


def test_a_nan_loss_is_skipped_and_counted_as_a_loss(tiny_model_dir, smoke_dataset, tmp_path):
    from rookgrpo.callbacks import RookCallback

    class NaNLossAt(RookCallback):
        def extra_loss(self, trainer, model):
            if trainer.state.global_step == NAN_STEP:  # the step after the poisoned gradient's: step 4
                return next(model.parameters()).sum() * float("nan")
            return None

    trainer, probe = _train(tiny_model_dir, smoke_dataset, tmp_path, [NaNLossAt()])
    w = probe.weights
    assert _equal(w[NAN_STEP + 1], w[NAN_STEP]) and _equal(w[NAN_STEP], w[NAN_STEP - 1]) and _finite(w[5])
    last = [h for h in trainer.state.log_history if "loss" in h][-1]
    assert last["skipped_updates"] == 2 and last["skipped_updates/nonfinite_loss"] == 1  # the poisoned grad + NaN loss


def test_the_doctors_nonfinite_halt_saves_the_last_finite_weights(tiny_model_dir, smoke_dataset, tmp_path):
    """halt_on: [nonfinite] with skipping turned off: the doctor acts before the optimizer step, so the run stops at
    step 3 with step 2's weights, and the checkpoint it saves holds them."""
    from safetensors.torch import load_file

    from rookgrpo.callbacks import Doctor

    doctor = Doctor(halt_on=["nonfinite"], kl_grad_every=0, report=None)
    trainer, probe = _train(tiny_model_dir, smoke_dataset, tmp_path, [doctor], skip_nonfinite_updates=False)
    assert trainer.state.global_step == NAN_STEP and doctor.halted == "nonfinite:grad_norm"
    assert _equal(probe.weights[NAN_STEP], probe.weights[NAN_STEP - 1])
    saved = load_file(str(tmp_path / f"checkpoint-{NAN_STEP}" / "model.safetensors"))
    before = probe.weights[NAN_STEP - 1]
    assert saved and all(bool(torch.isfinite(v).all()) for v in saved.values())
    assert all(torch.equal(v, before[k]) for k, v in saved.items() if k in before)
