"""TRL's async GRPO (``trl.experimental.async_grpo.AsyncGRPOTrainer``, TRL 1.16) on CPU against a real ``vllm serve``
process, with rookgrpo's chess pack as its rewards; rookgrpo's callbacks there.

``AsyncGRPOTrainer`` is not a ``GRPOTrainer``: a worker process generates rollouts from a vLLM server and scores them
with the reward functions, and the trainer trains on samples up to ``max_staleness`` weight versions old, pushing its
weights to the server every ``weight_sync_steps``. What is real here: the server process and its HTTP API, TRL's
rollout worker (its own process, its reward calls: the chess rewards with real Stockfish, in that process), TRL's
trainer, its weight-sync protocol calls (pause, start, update, finish, resume) and vLLM's reload. What is a stand-in
(:mod:`rookgrpo.async_grpo_cpu`): the weight bytes go over gloo, not NCCL
(:class:`rookgrpo.vllm_cpu_transport.AsyncCPUWeightTransfer`); the packed loss forward's attention is plain torch, not
the FlashAttention-3 kernel TRL fetches from the hub; MFU metrics are off; and the server runs without chunked prefill
(vLLM 0.31's CPU runner fails on seeded requests otherwise).

The model is a tiny Qwen2 (head size 32) whose tokenizer carries Qwen2.5's own chat template (TRL's copy): TRL 1.16's
async trainer takes conversational prompts only, and recognises a chat template to parse responses. Its server is the
session's (tests/conftest.py), shared with the server-mode LoRA test.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: make test-vllm runs these in .venv-vllm")

from vllm_checks import gap, model_logprobs, server_logprobs, tolerance  # noqa: E402

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def chess_data():
    from rookgrpo.chess.data import prepare_rookworld
    from rookgrpo.data import load_recipe_dataset

    return prepare_rookworld(load_recipe_dataset("rookgrpo/tiny-rookworld-grpo"))


def conversational(rows):
    """RookWorld rows as TRL's async trainer takes them: the prompt as one user message; ``signal`` on even rows."""
    return rows.map(lambda r, i: {"prompt": [{"role": "user", "content": r["prompt"]}], "signal": i % 2 == 0},
                    with_indices=True, remove_columns=["completion", "text"])


def async_args(out, server, **overrides):
    from trl.experimental.async_grpo import AsyncGRPOConfig

    values = dict(output_dir=str(out), vllm_server_base_url=server.url, max_steps=4, per_device_train_batch_size=8,
                  num_generations=4, max_completion_length=24, report_to="none", logging_steps=1, use_cpu=True,
                  learning_rate=3e-2, save_strategy="no", bf16=False, seed=7)
    values.update(overrides)
    return AsyncGRPOConfig(**values)


def chess_rewards():
    """The chess pack's rewards for both tasks (Stockfish at depth 4 for the move's rank), and ``mostly_flat``
    (tests/assets/flat_reward.py): graded on the rows whose ``signal`` is true, a constant on the others, so a random
    model's groups have spread to learn from on half the prompts (the chess rewards give it 0 nearly everywhere) and
    none on the other half."""
    from rookgrpo.chess.engine import EngineSettings
    from rookgrpo.chess.rewards import ChessEnv, ChessFormat, ChessLegality, ChessMoveRank
    from vllm_checks import mostly_flat_reward

    mostly_flat = mostly_flat_reward()
    engine = EngineSettings(depth=4, workers=1)
    return [ChessFormat(engine), ChessLegality(engine), ChessMoveRank(engine), ChessEnv(engine), mostly_flat]


def test_async_grpo_trains_on_cpu_with_the_chess_packs_rewards(chat_qwen2, chat_qwen2_server, chess_data,
                                                               tmp_path):
    """Four steps of AsyncGRPOTrainer: the chess rewards score its rollouts in TRL's worker process (both tasks,
    Stockfish included), the loss is finite, the weights move, every sync reaches the server (its log-probs after the
    run are the trained model's, far from the start's), and the doctor reads the run's logs there.

    And a measurement for zero_std_resampling's idea: TRL's async worker does not drop a group whose rewards are all
    equal; it gives its samples advantage 0 and the trainer forwards and backpropagates them for no gradient. Here the
    constant half of the prompts' groups are trained on: the share of trained tokens at advantage 0 is printed."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.experimental.async_grpo import AsyncGRPOTrainer

    from rookgrpo.callbacks.doctor import Doctor
    from rookgrpo.trl_compat import async_grpo_on_cpu
    from rookgrpo.vllm_cpu_transport import AsyncCPUWeightTransfer

    async_grpo_on_cpu()
    transfer = AsyncCPUWeightTransfer(chat_qwen2_server.url)
    trainer = AsyncGRPOTrainer(model=str(chat_qwen2), reward_funcs=chess_rewards(),
                               args=async_args(tmp_path, chat_qwen2_server), train_dataset=conversational(
                                   chess_data.select(range(32))), weight_transfer=transfer,
                               callbacks=[Doctor(report=str(tmp_path / "doctor.json"))])
    advantages = []
    compute_loss = trainer.compute_loss

    def recording(model, inputs, *args, **kwargs):
        advantages.append(inputs["advantages"][inputs["token_index"] >= 0].detach().clone())
        return compute_loss(model, inputs, *args, **kwargs)

    trainer.compute_loss = recording
    trainer.train()
    history = trainer.state.log_history
    assert trainer.state.global_step == 4
    losses = [h["loss"] for h in history if "loss" in h]
    assert len(losses) == 4 and all(math.isfinite(v) for v in losses)
    logged = {k for h in history for k, v in h.items() if v is not None}
    for name in ("chess_format", "chess_legality", "chess_move_rank", "chess_env", "mostly_flat"):
        assert f"rewards/{name}" in logged, (name, sorted(logged))  # every chess reward scored some row
    assert transfer.syncs >= 4  # the start's push and one per step (weight_sync_steps 1)
    # the server samples the weights of the last sync, which are the trained model's
    tokenizer = AutoTokenizer.from_pretrained(str(chat_qwen2))
    ids = tokenizer(chess_data[0]["text"])["input_ids"][:120]
    model = AutoModelForCausalLM.from_pretrained(str(chat_qwen2))  # the trainer's runs TRL's packed attention
    model.load_state_dict(trainer.accelerator.unwrap_model(trainer.model).state_dict())
    trained, served = model_logprobs(model, ids), server_logprobs_async(chat_qwen2_server, ids)
    start = model_logprobs(AutoModelForCausalLM.from_pretrained(str(chat_qwen2)), ids)
    tol = tolerance(model, ids, trained)
    assert gap(served, trained) < tol < 2 * tol < gap(trained, start), (gap(served, trained), tol, gap(trained, start))
    report = json.loads((tmp_path / "doctor.json").read_text())
    assert "findings" in report
    total = sum(a.numel() for a in advantages)
    zero = float(sum((a == 0).sum() for a in advantages)) / total
    print(f"async GRPO: {zero:.2f} of {total} trained completion tokens carried advantage 0 (flat groups kept)")
    assert zero >= 0.3  # the constant half is trained on, not dropped


def server_logprobs_async(server, ids):
    from trl.generation.vllm_client import VLLMClient

    return server_logprobs(VLLMClient(base_url=server.url), ids)


@pytest.mark.parametrize("name", ["zero_std_resampling", "heldout_guard", "adaptive_beta", "sft_anchor",
                                  "prompt_selection", "diagnostics"])
def test_a_rookgrpo_callback_that_cannot_apply_is_refused_by_name(chat_qwen2, chess_data, tmp_path, name):
    """Passed to AsyncGRPOTrainer, a rookgrpo callback that needs RookGRPOTrainer's hooks stops the trainer's
    construction with its name and what it needs, instead of an AttributeError mid-run or silently doing nothing."""
    from trl.experimental.async_grpo import AsyncGRPOTrainer

    from rookgrpo import ConfigError
    from rookgrpo.callbacks import resolve_callback
    from rookgrpo.trl_compat import async_grpo_on_cpu

    specs = {"sft_anchor": {"name": "sft_anchor", "data": str(_anchor_data(tmp_path)), "tasks": None},
             "heldout_guard": {"name": "heldout_guard", "metric": "heldout/score"},
             "adaptive_beta": {"name": "adaptive_beta", "target_kl": 0.05}}
    callback = resolve_callback(specs.get(name, name))
    async_grpo_on_cpu()

    class Unused:  # the refusal comes first: no server, no transfer is reached
        def __getattr__(self, item):
            raise AssertionError(f"reached the weight transfer ({item})")

    with pytest.raises(ConfigError, match=rf"callbacks: {name} does not apply under TRL's AsyncGRPOTrainer: it needs "
                                          r"RookGRPOTrainer's"):
        AsyncGRPOTrainer(model=str(chat_qwen2), reward_funcs=chess_rewards()[:1],
                         args=async_args(tmp_path, _NoServer()),
                         train_dataset=conversational(chess_data.select(range(8))),
                         weight_transfer=Unused(), callbacks=[callback])


class _NoServer:
    url = "http://127.0.0.1:9"  # nothing listens: the trainer must not reach it before refusing


def _anchor_data(tmp_path) -> Path:
    from datasets import Dataset

    path = tmp_path / "anchor.jsonl"
    Dataset.from_list([{"prompt": f"anchor {i}:", "completion": " a1a2"} for i in range(8)]).to_json(str(path))
    return path
