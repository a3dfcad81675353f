"""Generation on a real vLLM engine (TRL's ``use_vllm``, colocate mode), every rookgrpo callback and default under it.

``make test-vllm`` runs these in a venv of their own with vLLM's CPU build (constraints-vllm.txt); the main suite
deselects them. The models are tiny ones built here whose attention head size vLLM's CPU attention serves (32): a
GPT-2 (the chess recipes' architecture, learned absolute positions) and a Qwen2 with LoRA (the code recipe's, so TRL's
merged-adapter weight sync runs), both with left-padded prompts. One engine at a time, in this process: vLLM's
``external_launcher`` keeps its engine in the trainer's process, and a trainer's engine is freed with the trainer.

What each test compares with: what the engine samples, never the parameters it keeps (tests/vllm_checks.py): the
engine's own log-probs of a fixed sequence against the trainer model's, the whole model and the LM head included.
vLLM's CPU build lays out its linear layers by the CPU's kernels (packed with the weight dropped on AVX-512 / AMX, the
[out, in] weight kept on AVX2-only CPUs), so a parameter comparison checks different things on different machines;
the end-to-end test runs both layouts here (``kernels``). The engine is bf16, the trainer fp32: "the same weights" is
a gap under a tolerance measured each time (``vllm_checks.tolerance``), and each test shows its run moved more than
twice it between the weights it tells apart.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: make test-vllm runs these in .venv-vllm")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache per engine: plenty for tiny models

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402

from conftest import tiny_grpo_args, write_flat_data  # noqa: E402
from rookgrpo import ConfigError, RookGRPOTrainer  # noqa: E402
from rookgrpo.callbacks import RookCallback  # noqa: E402
from rookgrpo.trl_compat import sync_vllm_weights  # noqa: E402
from rookgrpo.vllm_compat import engine_model  # noqa: E402
from vllm_checks import (  # noqa: E402
    flat_prompts,
    mostly_flat_reward,
    SamplingRecorder,
    assert_sampled_current_weights,
    assert_samples_trainers_weights,
    engine_logprobs,
    gap,
    model_logprobs,
    policy,
    probe_ids,
    tolerance,
)

pytestmark = pytest.mark.vllm
ASSETS = Path(__file__).parent / "assets"


_BUILT: list = []  # the trainers the running test built


def Trainer(*args, **kwargs) -> RookGRPOTrainer:
    """``RookGRPOTrainer``, remembered so the test's teardown frees its engine."""
    trainer = RookGRPOTrainer(*args, **kwargs)
    _BUILT.append(trainer)
    return trainer


@pytest.fixture(autouse=True)
def _free_engines():
    """After each test, free the engines its trainers built. Each holds a GiB of KV cache, and one left to be
    collected with its trainer (a reference cycle) keeps that memory: released first, it is returned."""
    from rookgrpo.vllm_compat import release_engine

    yield
    while _BUILT:
        release_engine(_BUILT.pop())


# ---- models and data ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory) -> Path:
    """A tiny char-level GPT-2 with head size 32 (64 wide, 2 heads), which vLLM's CPU attention serves."""
    from rookgrpo.models.tiny_model import TinyGPT2Spec, build_tiny_gpt2

    return build_tiny_gpt2(tmp_path_factory.mktemp("vllm-gpt2") / "model", TinyGPT2Spec(n_embd=64, n_head=2))


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory) -> Path:
    """A tiny Qwen2 (head size 32, grouped-query attention, ChatML tokenizer) of the code recipe's architecture."""
    from rookgrpo.models.shapes import build_qwen2_shape

    texts = [f"def f{i}(x):\n    return x * {i} + {i % 7}\n" for i in range(200)]
    return build_qwen2_shape(tmp_path_factory.mktemp("vllm-qwen2") / "model", texts, hidden_size=64,
                             num_attention_heads=2, num_key_value_heads=1, intermediate_size=128, vocab_size=512)


@pytest.fixture(scope="module")
def flat_data(tmp_path_factory) -> Dataset:
    """32 smoke prompts of different lengths (so prompts are left-padded), half of them scoring a constant reward."""
    return flat_prompts(tmp_path_factory.mktemp("vllm-data"))


def _mostly_flat():
    return mostly_flat_reward()


def vllm_args(out, **overrides):
    values = dict(use_vllm=True, vllm_mode="colocate", beta=0.0, max_steps=3, learning_rate=1e-2)
    values.update(overrides)
    return tiny_grpo_args(out, **values)


# ---- what the engine samples (tests/vllm_checks.py) --------------------------------------------------------------

@pytest.fixture(params=["as-built", "unpacked"])
def kernels(request, monkeypatch):
    """Both layouts vLLM's CPU build gives its linear layers: as this machine builds them (AVX-512 / AMX: packed for
    oneDNN or the SGL kernel, the weight dropped) and unpacked (torch's linear on the [out, in] weight, what an
    AVX2-only CPU gets), forced here by switching off vLLM's oneDNN path. Yields whether the engine keeps weights."""
    if request.param == "unpacked":
        from vllm import _custom_ops

        monkeypatch.setattr(_custom_ops, "_supports_onednn", False)
    return request.param


def kept_linear_weights(trainer) -> bool:
    """Whether the engine's linear layers keep their weight (the unpacked layout)."""
    return any(name.endswith("c_attn.weight") and p.numel() > 0 for name, p in engine_model(trainer).named_parameters())


def _steps(trainer, key: str) -> list[float]:
    return [h[key] for h in trainer.state.log_history if key in h]


# ---- zero_std_resampling -----------------------------------------------------------------------------------------

MODES = ["sequence_mask", "sequence_truncate", "token_mask", "token_truncate"]


@pytest.mark.parametrize("pad", [None, 8], ids=["no-pad", "pad8"])
@pytest.mark.parametrize("mode", MODES)
def test_resampling_trains_under_every_importance_sampling_mode(gpt2_dir, flat_data, tmp_path, mode, pad):
    """Resampled batches keep TRL's importance-sampling ratio in its shape (one per sequence under sequence_*, one per
    token otherwise), with and without pad_to_multiple_of; every round samples with the recipe's SamplingParams from
    the weights the trainer holds. Before the fix, sequence_* with pad_to_multiple_of 8 stopped in TRL's loss."""
    args = vllm_args(tmp_path, max_completion_length=16, pad_to_multiple_of=pad, vllm_importance_sampling_mode=mode,
                     temperature=0.9, top_p=1.0, learning_rate=3e-2)
    trainer = Trainer(model=str(gpt2_dir), reward_funcs=[_mostly_flat()], args=args, train_dataset=flat_data,
                              callbacks=[{"name": "zero_std_resampling", "max_rounds": 2}])
    recorder = SamplingRecorder(trainer)
    trainer.train()
    assert trainer.state.global_step == 3
    assert all(math.isfinite(v) for v in _steps(trainer, "loss"))
    assert sum(_steps(trainer, "resample/rounds")) >= 1, "no batch was resampled: the test data should make flat groups"
    assert _steps(trainer, "sampling/importance_sampling_ratio/mean"), "TRL's vLLM importance sampling did not run"
    rounds = [c for c in recorder.calls if c["training"]]
    assert len(rounds) == 3 + sum(_steps(trainer, "resample/rounds"))  # one call per round, resampling's included
    assert {(c["temperature"], c["top_p"], c["max_tokens"]) for c in rounds} == {(0.9, 1.0, 16)}
    assert_sampled_current_weights(rounds)  # every round sampled the trainer's current weights


def test_resampling_under_vllm_with_buffered_batches(gpt2_dir, flat_data, tmp_path):
    """A generation batch optimised over two steps and two iterations: TRL computes the old policy's log-probs, and
    the rows resampling re-pads get them (and the importance-sampling ratio) recomputed on the final padding."""
    args = vllm_args(tmp_path, max_steps=8, max_completion_length=16, pad_to_multiple_of=8, steps_per_generation=2,
                     num_iterations=2, vllm_importance_sampling_mode="sequence_mask", learning_rate=3e-2)
    trainer = Trainer(model=str(gpt2_dir), reward_funcs=[_mostly_flat()], args=args, train_dataset=flat_data,
                      callbacks=[{"name": "zero_std_resampling", "max_rounds": 2}])
    recorder = SamplingRecorder(trainer)
    trainer.train()
    assert trainer.state.global_step == 8 and all(math.isfinite(v) for v in _steps(trainer, "loss"))
    assert sum(_steps(trainer, "resample/rounds")) >= 1
    assert sorted({c["step"] for c in recorder.calls}) == [0, 4]  # a generation batch per 4 steps, with its rounds
    assert_sampled_current_weights(recorder.calls)


# ---- the weights vLLM samples from --------------------------------------------------------------------------------

def test_after_training_the_engine_samples_the_trainers_weights_not_the_starts(gpt2_dir, flat_data, tmp_path,
                                                                               kernels):
    """End to end, through the engine's log-probs, on both layouts of vLLM's CPU linear layers (packed and dropped,
    or kept unpacked as on AVX2-only CPUs): every layer reloads, the tied LM head's kernel included (before the fix
    the engine's logits stayed the start's: 0.95 nats/token from the trainer's after 6 steps)."""
    from transformers import AutoModelForCausalLM

    args = vllm_args(tmp_path, max_steps=6, max_completion_length=8, learning_rate=5e-2)
    trainer = Trainer(model=str(gpt2_dir), reward_funcs=["uci_charset"], args=args, train_dataset=flat_data)
    if kernels == "unpacked":
        assert kept_linear_weights(trainer)  # the AVX2-only layout: the helper must not compare these as parameters
    trainer.train()
    sync_vllm_weights(trainer)
    ids = probe_ids(trainer)
    engine = engine_logprobs(trainer, ids)
    trained = model_logprobs(policy(trainer), ids)
    start = model_logprobs(AutoModelForCausalLM.from_pretrained(str(gpt2_dir)), ids)
    moved = gap(trained, start)
    assert moved > 1.0, moved  # training moved the log-probs far beyond bf16 rounding
    tol = tolerance(policy(trainer), ids, trained)
    assert gap(engine, trained) < tol < 2 * tol < gap(engine, start), (gap(engine, trained), tol, gap(engine, start))


# ---- heldout_guard ------------------------------------------------------------------------------------------------

def test_after_the_guard_restores_a_step_never_saved_vllm_samples_the_restored_weights(gpt2_dir, flat_data, tmp_path):
    """The guard restores step 2's weights after step 5 (kept in memory, never on disk: no checkpoint is saved, and
    the engine loaded step 0 from the model's files, so no reload from disk can give them); the engine must then
    sample the restored weights, not step 5's it was last synced with (before the fix it kept the last step's, and
    trainer.evaluate() or any later generation sampled them). Measured through the engine's log-probs."""
    from test_heldout_guard import HeldoutProbe

    probe = HeldoutProbe({0: 0.3, 1: 0.5, 2: 1.0, 3: 0.4, 4: 0.3, 5: 0.2}, every=1)
    args = vllm_args(tmp_path, max_steps=5, max_completion_length=8, learning_rate=3e-2)
    trainer = Trainer(model=str(gpt2_dir), reward_funcs=[_mostly_flat()], args=args, train_dataset=flat_data,
                      callbacks=[probe, {"name": "heldout_guard", "metric": "heldout/probe"}])
    trainer.train()
    assert _steps(trainer, "heldout_guard/restored") == [1] and _steps(trainer, "heldout_guard/best_step") == [2]
    assert not list(Path(args.output_dir).glob("checkpoint-*"))
    model = policy(trainer)
    assert all(torch.equal(p, probe.weights[2][n]) for n, p in model.named_parameters())
    ids = probe_ids(trainer)
    engine, restored = engine_logprobs(trainer, ids), model_logprobs(model, ids)
    last, start = _logprobs_with(model, probe.weights[5], ids), _logprobs_with(model, probe.weights[0], ids)
    tol = tolerance(model, ids, restored)
    assert gap(engine, restored) < tol, (gap(engine, restored), tol)
    assert gap(engine, last) > 2 * tol and gap(engine, start) > 2 * tol, (gap(engine, last), gap(engine, start), tol)


def _logprobs_with(model, weights: dict, ids: list[int]) -> torch.Tensor:
    """The model's log-probs of ``ids`` with ``weights`` loaded, its own weights put back after."""
    own = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(weights[n])
        try:
            return model_logprobs(model, ids)
        finally:
            for n, p in model.named_parameters():
                p.copy_(own[n])


class EvalFavoursStep2:
    """``mostly_flat`` in training; in TRL's evaluation, 1.0 more at step 2 than at any other step, so the guard on
    ``eval_reward`` must keep step 2 and restore it after step 4, whatever the sampled completions."""

    __name__ = "eval_favours_step_2"

    def __init__(self):
        self.trainer = None

    def __call__(self, completions, signal, **kwargs):
        base = _mostly_flat()(completions, signal)
        if self.trainer is not None and not self.trainer.model.training and self.trainer.state.global_step == 2:
            return [b + 1.0 for b in base]
        return base


def test_trls_evaluation_between_steps_and_the_guard_on_its_reward_under_vllm(gpt2_dir, flat_data, tmp_path):
    """TRL's own evaluation (an eval_dataset, eval_strategy steps) generates through vLLM between training steps; the
    guard selects on its eval_reward, keeps step 2 and restores it after step 4. Every evaluation samples the weights
    of the step it evaluates, and after the restore the engine samples step 2's weights, not step 4's."""
    args = vllm_args(tmp_path, max_steps=4, max_completion_length=8, eval_strategy="steps", eval_steps=2,
                     per_device_eval_batch_size=8, learning_rate=3e-2)
    reward = EvalFavoursStep2()
    trainer = Trainer(model=str(gpt2_dir), reward_funcs=[reward], args=args, train_dataset=flat_data,
                      eval_dataset=flat_data.select(range(8)), callbacks=[{"name": "heldout_guard"}])
    reward.trainer = trainer
    recorder = SamplingRecorder(trainer)
    trainer.train()
    evaluations = [c for c in recorder.calls if not c["training"]]
    assert sorted({c["step"] for c in evaluations}) == [2, 4]
    assert_sampled_current_weights(recorder.calls)
    assert len(_steps(trainer, "eval_reward")) == 2
    assert _steps(trainer, "heldout_guard/best_step") == [2] and _steps(trainer, "heldout_guard/restored") == [1]
    ids = recorder.ids
    tol = assert_samples_trainers_weights(trainer, ids)  # the restored step 2
    assert gap(engine_logprobs(trainer, ids), evaluations[-1]["logprobs"]) > 2 * tol  # not step 4's, last synced


def test_load_best_model_at_end_leaves_vllm_sampling_the_loaded_best(gpt2_dir, flat_data, tmp_path):
    """transformers' load_best_model_at_end loads step 2's checkpoint after step 4; TRL's sync never runs again, so
    without rookgrpo's sync after the load the engine kept step 4's weights."""
    args = vllm_args(tmp_path, max_steps=4, max_completion_length=8, eval_strategy="steps", eval_steps=2,
                     save_strategy="steps", save_steps=2, per_device_eval_batch_size=8, learning_rate=3e-2,
                     load_best_model_at_end=True, metric_for_best_model="eval_reward", greater_is_better=True)
    reward = EvalFavoursStep2()
    trainer = Trainer(model=str(gpt2_dir), reward_funcs=[reward], args=args, train_dataset=flat_data,
                      eval_dataset=flat_data.select(range(8)))
    reward.trainer = trainer
    recorder = SamplingRecorder(trainer)
    trainer.train()
    assert trainer.state.best_model_checkpoint.endswith("checkpoint-2")
    step4 = [c for c in recorder.calls if c["step"] == 4][-1]["logprobs"]
    tol = assert_samples_trainers_weights(trainer, recorder.ids)  # the loaded best, step 2
    assert gap(engine_logprobs(trainer, recorder.ids), step4) > 2 * tol


def test_a_resumed_run_generates_from_the_checkpoints_weights(gpt2_dir, flat_data, tmp_path):
    """The engine starts from the model's files; a run resumed from a checkpoint must sample the checkpoint's weights
    from its first generation on (TRL syncs when the step differs from the last synced one)."""
    args = vllm_args(tmp_path, max_steps=2, max_completion_length=8, save_strategy="steps", save_steps=2,
                     learning_rate=3e-2)
    Trainer(model=str(gpt2_dir), reward_funcs=[_mostly_flat()], args=args, train_dataset=flat_data).train()
    args = vllm_args(tmp_path, max_steps=4, max_completion_length=8, save_strategy="no", learning_rate=3e-2)
    trainer = Trainer(model=str(gpt2_dir), reward_funcs=[_mostly_flat()], args=args, train_dataset=flat_data)
    recorder = SamplingRecorder(trainer)
    trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert [c["step"] for c in recorder.calls] == [2, 3]
    assert_sampled_current_weights(recorder.calls, shown_stale_at_least=0)  # the power is shown below
    # the first generation sampled the checkpoint's weights, which the engine's start (the model's files) is not
    from transformers import AutoModelForCausalLM

    ids = probe_ids(trainer)
    start = model_logprobs(AutoModelForCausalLM.from_pretrained(str(gpt2_dir)), ids)
    checkpoint = model_logprobs(AutoModelForCausalLM.from_pretrained(str(tmp_path / "checkpoint-2")), ids)
    assert gap(start, checkpoint) > 2 * recorder.calls[0]["tol"] > 2 * recorder.calls[0]["gap"]


# ---- skip_nonfinite -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("skip", [True, False], ids=["skip_nonfinite", "off"])
def test_a_nan_gradient_never_reaches_what_vllm_samples(gpt2_dir, flat_data, tmp_path, skip):
    """A NaN gradient at step 2: with rookgrpo's skip_nonfinite_updates (on by default) the step is skipped, TRL's
    sync after it pushes the kept finite weights and the engine samples them; with it off, the NaN reaches the weights
    and TRL pushes it into the engine, whose log-probs turn NaN (what the default prevents)."""
    from test_nonfinite import NaNGradientAt

    probe = NaNGradientAt(step=2)
    args = vllm_args(tmp_path, max_steps=4, max_completion_length=8, learning_rate=3e-2, skip_nonfinite_updates=skip)
    trainer = Trainer(model=str(gpt2_dir), reward_funcs=[_mostly_flat()], args=args, train_dataset=flat_data,
                      callbacks=[probe])
    recorder = SamplingRecorder(trainer)
    trainer.train()
    assert [c["step"] for c in recorder.calls] == [0, 1, 2, 3]
    if not skip:
        assert not math.isfinite(recorder.calls[2]["gap"])  # the engine sampled the NaN weights
        return
    assert _steps(trainer, "skipped_updates") == [0, 1, 1, 1]
    assert all(torch.equal(probe.weights[2][n], probe.weights[1][n]) for n in probe.weights[1])  # kept out
    assert all(math.isfinite(c["gap"]) and c["gap"] < c["tol"] for c in recorder.calls)
    assert_samples_trainers_weights(trainer)


# ---- per-task sampling --------------------------------------------------------------------------------------------

def test_each_tasks_sampling_settings_reach_vllm(gpt2_dir, tmp_path):
    rows = [{"prompt": f"P: {'8/' * (i % 5)}k w {i}", "task": "P"} for i in range(16)]
    rows += [{"prompt": f"A: {'8/' * (i % 3)}K b {i}+", "task": "A"} for i in range(16)]
    data = Dataset.from_list(rows)
    per_task = {"P": {"temperature": 0.5, "top_p": 0.9}, "A": {"temperature": 1.3}}
    args = vllm_args(tmp_path, max_steps=4, max_completion_length=8, task_generation_kwargs=per_task, temperature=1.0)
    trainer = Trainer(model=str(gpt2_dir), reward_funcs=["uci_charset"], args=args, train_dataset=data)
    tokenizer = trainer.processing_class
    recorder = SamplingRecorder(trainer, {tuple(tokenizer(r["prompt"])["input_ids"]): r["task"] for r in rows})
    trainer.train()
    settings = {frozenset(c["tasks"]): (c["temperature"], c["top_p"]) for c in recorder.calls}
    assert settings == {frozenset({"P"}): (0.5, 0.9), frozenset({"A"}): (1.3, 1.0)}, recorder.calls


def test_generation_kwargs_that_set_a_per_task_setting_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"generation_kwargs sets \['temperature'\]"):
        vllm_args(tmp_path, task_generation_kwargs={"P": {"temperature": 0.5}}, generation_kwargs={"temperature": 1.0})


# ---- a model vLLM cannot serve ------------------------------------------------------------------------------------

def test_a_head_size_vllms_cpu_attention_cannot_serve_stops_before_the_engine_starts(tmp_path, flat_data):
    from rookgrpo.models.tiny_model import TinyGPT2Spec, build_tiny_gpt2

    model = build_tiny_gpt2(tmp_path / "h56", TinyGPT2Spec(n_embd=112, n_head=2))  # head size 56, as tiny-rookworld's
    with pytest.raises(ConfigError, match=r"attention head size 56.*use_vllm: false"):
        Trainer(model=str(model), reward_funcs=[_mostly_flat()], args=vllm_args(tmp_path / "out"),
                        train_dataset=flat_data)


# ---- the other callbacks --------------------------------------------------------------------------------------------

def test_every_other_callback_trains_under_vllm(gpt2_dir, flat_data, tmp_path):
    """prompt_selection, heldout_eval, sft_anchor, adaptive_beta, kl_cap, diagnostics and doctor in one vLLM run: each
    logs its numbers, and the doctor reads TRL's sampling/* metrics."""
    ref, anchor = tmp_path / "ref.jsonl", tmp_path / "anchor.jsonl"
    Dataset.from_list([{"prompt": r["prompt"], "completion": " e2e4 e7e5", "signal": True}
                       for r in flat_data]).to_json(str(ref))
    Dataset.from_list([{"prompt": f"anchor {i}:", "completion": " a1a2"} for i in range(8)]).to_json(str(anchor))
    callbacks = [
        {"name": "prompt_selection", "rule": "greso"},
        {"name": "zero_std_resampling", "max_rounds": 1},
        {"name": "heldout_eval", "data": str(ref), "every": 2, "n": 4},
        {"name": "sft_anchor", "data": str(anchor), "tasks": None, "coef": 0.1, "batch_size": 4},
        {"name": "adaptive_beta", "target_kl": 0.05, "horizon": 10, "beta_min": 0.001, "beta_max": 0.5},
        {"name": "kl_cap", "max_token_kl": 5.0},
        "diagnostics",
        {"name": "doctor", "report": None},
    ]
    args = vllm_args(tmp_path, max_steps=4, max_completion_length=8, beta=0.05, logging_steps=2)
    trainer = Trainer(model=str(gpt2_dir), reward_funcs=[_mostly_flat()], args=args, train_dataset=flat_data,
                              callbacks=callbacks)
    recorder = SamplingRecorder(trainer)
    trainer.train()
    logged = {k for h in trainer.state.log_history for k in h}
    for key in ("select/skipped", "heldout/mostly_flat", "heldout/nll", "sft_anchor/nll", "beta", "kl_cap/capped_frac",
                "timing/generation", "sampling/sampling_logp_difference/mean"):
        assert any(k.startswith(key) for k in logged), (key, sorted(logged))
    assert_sampled_current_weights([c for c in recorder.calls if c["training"]])


# ---- Qwen2 + LoRA: TRL's merged-adapter sync ---------------------------------------------------------------------

def test_a_lora_policy_syncs_its_merged_weights_into_vllm(qwen2_dir, tmp_path):
    """The code recipe's shape: TRL merges the adapter into the base weights to push them, then unmerges. After
    training, the engine's log-probs are the trained (merged) model's, not the base model's."""
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM

    data = Dataset.from_list([{"prompt": [{"role": "user", "content": f"write f{i}"}]} for i in range(16)])
    args = vllm_args(tmp_path, max_steps=3, max_completion_length=12, learning_rate=5e-2)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = Trainer(model=str(qwen2_dir), reward_funcs=["uci_charset"], args=args, train_dataset=data,
                              peft_config=lora)
    trainer.train()
    sync_vllm_weights(trainer)  # TRL's own sync (merge, push, unmerge), as before the next generation
    ids = trainer.processing_class("def f3(x):\n    return x * 3 + 3\n")["input_ids"]
    policy = trainer.accelerator.unwrap_model(trainer.model)
    engine = engine_logprobs(trainer, ids)
    with policy.disable_adapter():
        base_gap = (engine - model_logprobs(policy, ids)).abs().max().item()
    trained_gap = (engine - model_logprobs(policy, ids)).abs().max().item()
    fresh = AutoModelForCausalLM.from_pretrained(str(qwen2_dir))
    assert (model_logprobs(fresh, ids) - model_logprobs(policy, ids)).abs().max().item() > 0.2  # LoRA moved it
    assert trained_gap < 0.1 < base_gap, (trained_gap, base_gap)


# ---- the doctor on vLLM runs --------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["clean", "top_p", "stale"])
def test_the_doctor_names_a_sampler_off_the_trainer_and_not_a_clean_one(gpt2_dir, flat_data, tmp_path, case,
                                                                           caplog):
    """Logged runs of the vLLM leg: a clean one (no sampler finding), one sampling at top_p 0.9 (the ratio is biased,
    and the trainer warned at start), and one whose weights stop reaching vLLM after the first step."""
    from rookgrpo.doctor import History, diagnose

    # The stale run learns fast, so the engine's start falls far behind; the others at the benchmark's rate, where the
    # bf16 engine and the fp32 trainer stay 0.044 nats/token apart (benchmarks/bench_vllm.py).
    args = vllm_args(tmp_path, max_steps=12, max_completion_length=16,
                     learning_rate=5e-2 if case == "stale" else 1e-3, top_p=0.9 if case == "top_p" else 1.0)
    with caplog.at_level("WARNING", logger="rookgrpo.vllm_compat"):
        trainer = Trainer(model=str(gpt2_dir), reward_funcs=["uci_charset"], args=args,
                                  train_dataset=flat_data)
    assert ("truncated sampling (the recipe: top_p 0.9)" in caplog.text) == (case == "top_p")
    if case == "stale":
        sync, calls = trainer.vllm_generation.sync_weights, []

        def first_only():
            calls.append(1)
            if len(calls) == 1:
                sync()

        trainer.vllm_generation.sync_weights = first_only
    trainer.train()
    findings, _ = diagnose(History([h for h in trainer.state.log_history if "train_runtime" not in h]),
                           only=["sampler"])
    found = {f.kind for f in findings}
    expected = {"clean": set(), "top_p": {"sampler_mismatch"}, "stale": {"sampler_drift", "sampler_mismatch"}}[case]
    assert found == expected


# ---- the GPU check's vLLM stage, dry run ---------------------------------------------------------------------------

def test_the_gpu_checks_vllm_stage_runs_the_chess_recipe_on_cpu(tmp_path, monkeypatch):
    """benchmarks/bench_gpu_check.py's vLLM arms at the tiny shape, vLLM colocated: vanilla TRL, and
    recipes/rookworld.yaml as shipped (its per-task top_p 0.9 and every callback) with the chess pack's held-out
    evaluation, the anchor and the guard: what a GPU owner's run does, minus the GPU."""
    from conftest import REPO, load_script

    # The engines this process ran set the rendezvous variables (TRL's colocate mode) and hold that port: each arm's
    # process picks its own, as a fresh launch does.
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)

    bench = load_script(REPO / "benchmarks" / "bench_gpu_check.py")
    result = bench.main(["--tiny", "--arms", "vanilla/vllm", "recipe+heldout/vllm", "--steps", "2", "--work",
                         str(tmp_path / "w"), "--out", str(tmp_path / "result.json")])
    rows = {r["arm"]: r for r in result["rows"]}
    assert set(rows) == {"vanilla/vllm", "recipe+heldout/vllm"}
    for arm, row in rows.items():
        assert row["error"] is None, (arm, row["error"])
        assert (row["steps"], row["finite_steps"], row["weights_finite"]) == (2, 2, True)


# ---- two processes ------------------------------------------------------------------------------------------------

def test_resampling_under_vllm_on_two_cpu_processes(gpt2_dir, tmp_path, monkeypatch):
    """DDP on two CPU processes (gloo), each with its own colocated engine: resampling decides from the rewards TRL
    gathers over both ranks and each rank generates its own replacement groups through its engine."""
    import json

    import yaml

    from conftest import REPO, run_cli, venv_bin

    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE"):  # set by this process's engines
        monkeypatch.delenv(name, raising=False)
    data = write_flat_data(tmp_path / "flat.jsonl", 32)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "model_name_or_path": str(gpt2_dir), "dataset_name": str(data),
        "reward_funcs": [str(ASSETS / "flat_reward.py") + ":mostly_flat"],
        "callbacks": [{"name": "zero_std_resampling", "max_rounds": 2}],
        "num_generations": 4, "per_device_train_batch_size": 8, "max_completion_length": 8, "max_steps": 3,
        "logging_steps": 1, "beta": 0.0, "use_cpu": True, "use_vllm": True, "vllm_mode": "colocate",
        "report_to": "none", "save_strategy": "steps", "save_steps": 3, "output_dir": str(tmp_path / "out")}))
    proc = run_cli([venv_bin("accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                    "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "rookgrpo", str(recipe)],
                   cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    info = json.loads((tmp_path / "out" / "run_info.json").read_text())
    assert info["world_size"] == 2 and info["global_step"] == 3
    history = json.loads((tmp_path / "out" / "checkpoint-3" / "trainer_state.json").read_text())["log_history"]
    assert sum(h.get("resample/rounds", 0) for h in history) >= 1
    assert all(math.isfinite(h["loss"]) for h in history if "loss" in h)
    assert any("sampling/sampling_logp_difference/mean" in h for h in history)


# ---- preflight ------------------------------------------------------------------------------------------------------

def test_preflights_worst_case_generates_through_vllm_at_the_full_length(gpt2_dir, tmp_path, monkeypatch):
    """``rookgrpo preflight`` on a colocated-vLLM recipe: the worst case's completions are all max_completion_length
    tokens (vLLM's ``min_tokens``), both of its trainers build and free their engines in one process, and it reports."""
    import json
    import sys

    import yaml

    from conftest import REPO, run_cli

    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE"):  # set by this process's engines
        monkeypatch.delenv(name, raising=False)
    data = write_flat_data(tmp_path / "flat.jsonl", 32)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "model_name_or_path": str(gpt2_dir), "dataset_name": str(data), "reward_funcs": ["uci_charset"],
        "num_generations": 4, "per_device_train_batch_size": 8, "max_completion_length": 12, "max_steps": 10,
        "logging_steps": 1, "beta": 0.0, "use_cpu": True, "use_vllm": True, "vllm_mode": "colocate",
        "report_to": "none", "save_strategy": "no", "output_dir": str(tmp_path / "out")}))
    proc = run_cli([sys.executable, "-m", "rookgrpo", str(recipe), "--preflight", "only"], cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads((tmp_path / "out" / "preflight.json").read_text())
    assert report["fits"] and report["shape"]["completion_tokens_min"] == 12
    assert report["run_steps"] == 10 and report["estimate_seconds"] > 0 and report["peak_mib"] > 0


# ---- reward isolation --------------------------------------------------------------------------------------------

def test_a_failing_reward_under_vllm_leaves_its_rows_out_and_the_run_goes_on(gpt2_dir, flat_data, tmp_path):
    """reward_isolation with vLLM generating: a reward that raises on the second batch; that batch's rows are left
    out whole (advantage 0), TRL's importance-sampling fields stay, and the run trains on."""
    count = {"n": 0}

    def flaky(completions, **kwargs):
        count["n"] += 1
        if count["n"] == 2:
            raise ConnectionError("judge down")
        return [len(set(c)) / max(len(c), 1) for c in completions]

    trainer = Trainer(model=str(gpt2_dir), reward_funcs=[flaky, _mostly_flat()],
                      args=vllm_args(tmp_path, max_steps=3), train_dataset=flat_data)
    seen = []
    score = trainer._generate_and_score_completions

    def capture(inputs):
        output = score(inputs)
        seen.append((trainer._last_rewards_per_func.clone(), output))
        return output

    trainer._generate_and_score_completions = capture
    trainer.train()
    assert trainer.state.global_step == 3
    rewards, output = seen[1]
    assert torch.isnan(rewards).all() and (output["advantages"] == 0).all()
    assert "importance_sampling_ratio" in output or "sampling_per_token_logps" in output
    assert [h["rewards/flaky/failed"] for h in trainer.state.log_history if "rewards/flaky/failed" in h] == [0, 1, 0]
