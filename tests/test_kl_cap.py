"""kl_cap: one token's KL term is bounded, the buffered batch is never changed, runs without a heavy token are identical.

A probe callback adds 20 nats to the reference log-prob of one completion token (a token the policy made e^20 times
rarer than the reference): TRL's k3 term for it is e^20 - 21, about 4.9e8. With learning rate 0 and no dropout the
policy equals the reference on every other token, so the logged KL is that one token's term over the batch's tokens.
"""

import math
from types import SimpleNamespace

import pytest

from conftest import tiny_grpo_args
from rookgrpo import ConfigError, RookGRPOTrainer
from rookgrpo.callbacks import KLCap, RookCallback
from rookgrpo.callbacks.kl_cap import log_ratio_bounds

HEAVY = 20.0


class HeavyToken(RookCallback):
    """Raise the reference log-prob of the first completion token of row 0 of every scored batch by ``HEAVY``."""

    batch_stage = "change_rows"
    state_key = "heavy_token"

    def __init__(self):
        self.outputs = []

    def on_scored_batch(self, trainer, scored):
        ref = scored.output["ref_per_token_logps"].clone()
        ref[0, 0] += HEAVY
        scored.output["ref_per_token_logps"] = ref
        self.outputs.append((scored.output, float(ref[0, 0])))


def _args(tmp_path, **overrides):
    values = dict(max_steps=4, beta=0.05, learning_rate=0.0, disable_dropout=True)
    values.update(overrides)
    return tiny_grpo_args(tmp_path, **values)


def _run(tiny_model_dir, dataset, tmp_path, callbacks, peft_config=None, **overrides):
    evaluating = overrides.get("eval_strategy", "no") != "no"
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=_args(tmp_path, **overrides),
                              train_dataset=dataset, eval_dataset=dataset.select(range(8)) if evaluating else None,
                              callbacks=callbacks, peft_config=peft_config)
    trainer.train()
    return trainer, [h for h in trainer.state.log_history if "loss" in h]


@pytest.mark.parametrize("cap", [0.5, 10.0, 1000.0])
def test_the_bounds_are_where_the_k3_term_reaches_the_cap(cap):
    low, high = log_ratio_bounds(cap)
    assert low < 0 < high
    for r in (low, high):
        assert math.exp(r) - r - 1 == pytest.approx(cap, rel=1e-9)


@pytest.mark.parametrize("correction", [True, False])
def test_a_heavy_token_takes_over_the_uncapped_kl_and_is_bounded_when_capped(tiny_model_dir, smoke_dataset,
                                                                               tmp_path, correction):
    """TRL's ``use_bias_correction_kl`` (on by default) multiplies the term by the importance ratio, which makes the
    heavy token's gradient -r (20) instead of 1 - e^r (-4.9e8): the cap bounds the logged KL either way, and the
    gradient where the correction is off."""
    _, plain = _run(tiny_model_dir, smoke_dataset, tmp_path / "plain", [HeavyToken()],
                    use_bias_correction_kl=correction)
    _, capped = _run(tiny_model_dir, smoke_dataset, tmp_path / "capped", [HeavyToken(), KLCap(10.0)],
                     use_bias_correction_kl=correction)
    heavy = math.exp(HEAVY) - HEAVY - 1
    for p, c in zip(plain, capped, strict=True):
        # Every step's batch holds the heavy token (one loss per step here); n = the batch's completion tokens.
        n = heavy / p["kl"]
        assert 8 - 1e-3 <= n <= 8 * 8 + 1e-3  # 8 completions of 1 to 8 tokens
        assert c["kl"] == pytest.approx(10.0 / n, rel=1e-3)  # the cap's 10 nats over the same tokens
        assert c["kl_cap/raw_kl"] == pytest.approx(p["kl"], rel=1e-3)  # what the loss would have used
        assert c["kl_cap/capped_frac"] == pytest.approx(1 / n, rel=1e-3)
        assert c["kl_cap/max_log_ratio"] == pytest.approx(HEAVY, abs=1e-3)
        if correction:
            assert c["grad_norm"] == pytest.approx(p["grad_norm"], rel=0.5)  # -20 against -2.61: same order
        else:
            assert c["grad_norm"] < p["grad_norm"] / 1e3  # 4.9e8 against 12.6
    assert "kl_cap/raw_kl" not in plain[0]


@pytest.mark.parametrize("layout", [{"steps_per_generation": 2}, {"num_iterations": 2},
                                    {"gradient_accumulation_steps": 2}])
def test_the_buffered_batch_keeps_its_reference_log_probs(tiny_model_dir, smoke_dataset, tmp_path, layout):
    """Buffered chunks are optimised again (num_iterations) or later (steps_per_generation): capping one loss must not
    change the batch the next loss reads, or the second pass would see an already capped ratio."""
    probe = HeavyToken()
    trainer, logged = _run(tiny_model_dir, smoke_dataset, tmp_path, [probe, KLCap(10.0)], **layout)
    for output, value in probe.outputs:
        assert float(output["ref_per_token_logps"][0, 0]) == value
    # Per loss, the largest log-ratio is the heavy token's 20 or the others' 0, never the cap's 2.61 (nor, with two
    # losses per logged step, a mean that includes it).
    _, high = log_ratio_bounds(10.0)
    for h in logged:
        r = h["kl_cap/max_log_ratio"]
        assert min(abs(r - x) for x in (0.0, HEAVY / 2, HEAVY)) < 1e-3, r
        assert min(abs(r - x) for x in (high, high / 2, (high + HEAVY) / 2)) > 0.1, r
        assert h["kl"] < 1.0
    assert any(h["kl_cap/max_log_ratio"] > HEAVY / 2 - 1e-3 for h in logged)


def test_without_a_heavy_token_the_run_is_unchanged(tiny_model_dir, smoke_dataset, tmp_path):
    def numbers(logged):
        return [(h["loss"], h["kl"], h["grad_norm"], h["reward"]) for h in logged]

    _, plain = _run(tiny_model_dir, smoke_dataset, tmp_path / "plain", None, learning_rate=1e-2)
    _, capped = _run(tiny_model_dir, smoke_dataset, tmp_path / "capped", [KLCap(10.0)], learning_rate=1e-2)
    assert numbers(plain) == numbers(capped)
    assert all(h["kl_cap/capped_frac"] == 0 for h in capped)
    assert [h["kl_cap/raw_kl"] for h in capped] == pytest.approx([h["kl"] for h in capped], rel=1e-5, abs=1e-9)
    assert any(h["kl"] > 0 for h in capped)  # the policy moved, so the comparison is not between two zeros


def test_an_evaluation_loss_is_capped_and_logged_as_eval(tiny_model_dir, smoke_dataset, tmp_path):
    trainer, _ = _run(tiny_model_dir, smoke_dataset, tmp_path, [HeavyToken(), KLCap(10.0)], max_steps=2,
                      eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=8)
    evals = [h for h in trainer.state.log_history if "eval_loss" in h]
    assert evals and all(h["eval_kl_cap/max_log_ratio"] == pytest.approx(HEAVY, abs=1e-3) for h in evals)
    assert all(h["eval_kl"] < 1.0 for h in evals)


def test_a_lora_wrapped_policy_with_evaluation_between_buffered_steps(tiny_model_dir, smoke_dataset, tmp_path):
    """A PEFT policy (the reference is the policy with its adapter off), a generation batch optimised over two steps
    and an evaluation between them: every loss, training and evaluation, is capped, and the buffer keeps the heavy
    token for the second step."""
    from peft import LoraConfig

    probe = HeavyToken()
    trainer, logged = _run(tiny_model_dir, smoke_dataset, tmp_path, [probe, KLCap(10.0)],
                           peft_config=LoraConfig(r=4, target_modules=["c_attn"], task_type="CAUSAL_LM"),
                           steps_per_generation=2, eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=8)
    evals = [h for h in trainer.state.log_history if "eval_loss" in h]
    assert len(evals) == 4 and all(h["eval_kl_cap/max_log_ratio"] == pytest.approx(HEAVY, abs=1e-3) for h in evals)
    assert all(h["kl"] < 1.0 for h in logged) and all(h["eval_kl"] < 1.0 for h in evals)
    assert all(min(abs(h["kl_cap/max_log_ratio"] - x) for x in (0.0, HEAVY)) < 1e-3 for h in logged)
    assert any(h["kl_cap/max_log_ratio"] > HEAVY - 1e-3 for h in logged)
    for output, value in probe.outputs:
        assert float(output["ref_per_token_logps"][0, 0]) == value


def test_bad_settings_are_refused_before_training(tiny_model_dir, smoke_dataset, tmp_path):
    with pytest.raises(ConfigError, match="kl_cap.max_token_kl"):
        KLCap(0)
    with pytest.raises(ConfigError, match="beta: 0"):
        RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=_args(tmp_path, beta=0.0),
                        train_dataset=smoke_dataset, callbacks=[KLCap()])
    liger = SimpleNamespace(beta=0.05, args=SimpleNamespace(use_liger_kernel=True))
    with pytest.raises(ConfigError, match="use_liger_kernel"):
        KLCap().bind(liger)
