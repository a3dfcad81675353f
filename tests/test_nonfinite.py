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


# ---- fp16: a loss scaler's routine overflow is the scaler's, a NaN that survives it is a skipped update ------------
# torch trains fp16 on CPU without a GradScaler (accelerate makes one only on accelerators), so these drive a real
# CPU GradScaler and the callback's own hook directly, the way transformers' loop calls them: scale, backward, unscale
# and clip (transformers' grad norm), on_pre_optimizer_step, then the scaler's step and update.

def _scaled_step(scale: float, nan_loss: bool = False):
    from types import SimpleNamespace

    from transformers import TrainerControl, TrainerState

    from rookgrpo.callbacks import SkipNonfinite
    from rookgrpo.dynamics.nonfinite import step_check

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=scale)
    loss = model(torch.full((2, 4), 3.0)).sum()
    if nan_loss:  # a NaN the gradient does not see: only the loss check can
        loss = loss + torch.tensor(float("nan"))
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    state = TrainerState()
    trainer = SimpleNamespace(state=state, optimizer=optimizer, model=model, grad_norm_before_clip=norm,
                              accelerator=SimpleNamespace(scaler=scaler, num_processes=1), is_deepspeed_enabled=False)
    callback = SkipNonfinite()
    callback.trainer = trainer
    step_check(trainer).observe_loss(loss)
    before = [p.detach().clone() for p in model.parameters()]
    callback.on_pre_optimizer_step(None, state, TrainerControl(), model=model, optimizer=optimizer)
    scaler.step(optimizer)  # raises "No inf checks were recorded" if the gradients were dropped before unscaling
    scaler.update()
    applied = not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    return callback, step_check(trainer)._verdict, applied, scaler.get_scale()


def test_an_fp16_overflow_the_scaler_handles_is_not_a_skipped_update(caplog):
    with caplog.at_level("WARNING", logger="rookgrpo.nonfinite"):
        callback, verdict, applied, scale = _scaled_step(scale=2.0 ** 127)  # 3 x 2^127 overflows: inf gradients
    assert verdict.scaler_overflow and not verdict.nonfinite and verdict.cause == ""
    assert callback.skipped == 0 and not caplog.records  # not counted, not warned as a kernel's fault
    assert not applied and scale == 2.0 ** 126  # the scaler skipped it and halved its scale


def test_an_fp16_step_with_a_finite_gradient_trains():
    callback, verdict, applied, _ = _scaled_step(scale=2.0 ** 8)
    assert not verdict.nonfinite and not verdict.scaler_overflow and callback.skipped == 0 and applied


def test_a_nan_that_survives_the_scaler_is_a_skipped_update(caplog):
    """A NaN loss whose gradient is finite: the scaler would apply the step; the callback drops it (after the
    gradients were unscaled, so the scaler's step does not fail) and counts it."""
    with caplog.at_level("WARNING", logger="rookgrpo.nonfinite"):
        callback, verdict, applied, scale = _scaled_step(scale=2.0 ** 8, nan_loss=True)
    assert verdict.nonfinite and verdict.cause == "loss" and verdict.kept_out == "dropped"
    assert callback.skipped == 1 and callback.skipped_loss == 1 and not applied
    assert "the loss was NaN/inf" in caplog.text


def test_an_overflow_at_a_loss_scale_of_one_is_the_gradients_own():
    """At a scale of 1 the scaler scaled nothing: the gradient itself is non-finite, a fault like any other."""
    from rookgrpo.dynamics.nonfinite import StepCheck

    verdict = StepCheck().verdict(0, [], grad_norm=torch.tensor(float("inf")), scale=1.0)
    assert verdict.nonfinite and verdict.cause == "gradient" and not verdict.scaler_overflow
    ds_fp16 = StepCheck().verdict(0, [], grad_norm=torch.tensor(float("inf")), scale=float("inf"))
    assert not ds_fp16.nonfinite and ds_fp16.scaler_overflow  # DeepSpeed's fp16 scaler judges every overflow


@pytest.mark.parametrize("doctor_first", [True, False])
def test_the_kl_meter_reports_nan_on_a_skipped_step_whatever_the_callback_order(tiny_model_dir, smoke_dataset,
                                                                                tmp_path, doctor_first):
    """The skipped step's KL-gradient numbers are NaN, not made up from the dropped gradients (share 0.5, cosine -1),
    whether skip_nonfinite dropped them before the doctor's meter read them or after; the steps around it measure."""
    from rookgrpo.callbacks import Doctor, SkipNonfinite

    doctor = Doctor(kl_grad_every=1, report=None)
    callbacks = [doctor, SkipNonfinite()] if doctor_first else [SkipNonfinite(), doctor]
    trainer, _ = _train(tiny_model_dir, smoke_dataset, tmp_path, callbacks, beta=0.05)
    logs = {h["step"]: h for h in trainer.state.log_history if "loss" in h}
    for name in ("loss/kl_grad_share", "grad/kl_policy_cos", "grad/kl_norm", "grad/policy_norm"):
        assert math.isnan(logs[NAN_STEP][name]), name
        assert math.isfinite(logs[NAN_STEP - 1][name]) and math.isfinite(logs[NAN_STEP + 1][name]), name
    assert logs[5]["skipped_updates"] == 1
