"""TRL's vLLM server mode (``vllm_mode: server``: vLLM in a process of its own, TRL's multi-GPU layout) on CPU, against
a real ``vllm serve`` process, every rookgrpo callback and default under it.

What is real: the ``vllm serve`` process (vLLM 0.31's CPU build, started and stopped here on a free loopback port, one
per model and test module), its HTTP API (generation, ``/v1/completions`` log-probs, the dev endpoints that start,
stream and finish a weight update), TRL's server branch (``VLLMGeneration`` with its ``VLLMClient`` interface: the
sync, its metadata, the prefix-cache reset, generation requests) and the engine's reload of the weights it receives
(vLLM's layerwise reload, as its NCCL engine runs it, then the CPU kernels rebuilt).

What is a stand-in: only the transport of the weight bytes. TRL's client and vLLM's weight-transfer engines need CUDA
(NCCL); here the trainer broadcasts each tensor over gloo to the server's worker (:mod:`rookgrpo.vllm_cpu_transport`,
registered in the server through ``--worker-extension-cls``, and TRL's client class replaced on the trainer's side).
On GPUs the same tests would run over NCCL with TRL's own client.

What each test checks: what the server samples, through its own log-probs of a fixed sequence over HTTP, against the
trainer's (tests/vllm_checks.py), never the parameters it keeps: a transport that sent nothing (vLLM's NCCL
communicator without libnccl) would leave the server's log-probs at the model's files, and the tests show the trainer
moved far more than the tolerance from there.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: make test-vllm runs these in .venv-vllm")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402

from conftest import tiny_grpo_args, write_flat_data  # noqa: E402
from rookgrpo import RookGRPOTrainer  # noqa: E402
from rookgrpo.trl_compat import replace_vllm_client, sync_vllm_weights  # noqa: E402
from vllm_checks import (  # noqa: E402
    flat_prompts,
    mostly_flat_reward,
    Server,
    SamplingRecorder,
    assert_sampled_current_weights,
    assert_samples_trainers_weights,
    engine_logprobs,
    free_port,
    gap,
    model_logprobs,
    policy,
    probe_ids,
    tolerance,
)

pytestmark = pytest.mark.vllm
ASSETS = Path(__file__).parent / "assets"


@pytest.fixture(scope="module", autouse=True)
def _cpu_transport():
    """TRL's server mode builds the CPU transport's client for this module's trainers; TRL's own afterwards."""
    from rookgrpo.vllm_cpu_transport import make_client_class

    previous = replace_vllm_client(make_client_class())
    yield
    replace_vllm_client(previous)


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory) -> Path:
    from rookgrpo.models.tiny_model import TinyGPT2Spec, build_tiny_gpt2

    return build_tiny_gpt2(tmp_path_factory.mktemp("server-gpt2") / "model", TinyGPT2Spec(n_embd=64, n_head=2))


@pytest.fixture(scope="module")
def gpt2_server(gpt2_dir, tmp_path_factory):
    server = Server(gpt2_dir, tmp_path_factory.mktemp("server-gpt2-log") / "serve.log")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def flat_data(tmp_path_factory) -> Dataset:
    return flat_prompts(tmp_path_factory.mktemp("server-data"))


def _mostly_flat():
    return mostly_flat_reward()


def server_args(out, server, **overrides):
    values = dict(use_vllm=True, vllm_mode="server", vllm_server_base_url=server.url, vllm_group_port=free_port(),
                  beta=0.0, max_steps=3, learning_rate=3e-2)
    values.update(overrides)
    return tiny_grpo_args(out, **values)


def _steps(trainer, key: str) -> list[float]:
    return [h[key] for h in trainer.state.log_history if key in h]


def _close(trainer) -> None:
    """Close the trainer's weight-transfer group, so the next trainer's rendezvous with the server is its own."""
    client = getattr(trainer.vllm_generation, "vllm_client", None)
    if client is not None:
        client.close_communicator()


# ---- the weights the server samples from --------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["trl", "rookgrpo"])
def test_the_server_samples_the_trainers_weights_at_every_step(gpt2_dir, gpt2_server, flat_data, tmp_path, which):
    """TRL's own GRPOTrainer and RookGRPOTrainer in server mode: every generation samples the weights of its step
    (TRL syncs before it generates), and after a last sync the server's log-probs are the trained model's, far from
    the model's files it started from (a transport that sent nothing would leave them there)."""
    from transformers import AutoModelForCausalLM
    from trl import GRPOTrainer

    from conftest import vanilla_args

    args = server_args(tmp_path, gpt2_server, max_steps=4)
    cls = RookGRPOTrainer
    if which == "trl":
        cls, args = GRPOTrainer, vanilla_args(args, tmp_path)
        for key in ("use_vllm", "vllm_mode", "vllm_server_base_url", "vllm_group_port"):
            setattr(args, key, getattr(server_args(tmp_path, gpt2_server), key))
    trainer = cls(model=str(gpt2_dir), reward_funcs=[_mostly_flat()], args=args, train_dataset=flat_data)
    recorder = SamplingRecorder(trainer)
    trainer.train()
    assert [c["step"] for c in recorder.calls] == [0, 1, 2, 3]
    assert_sampled_current_weights(recorder.calls)
    sync_vllm_weights(trainer)
    ids = probe_ids(trainer)
    engine, trained = engine_logprobs(trainer, ids), model_logprobs(policy(trainer), ids)
    start = model_logprobs(AutoModelForCausalLM.from_pretrained(str(gpt2_dir)), ids)
    tol = tolerance(policy(trainer), ids, trained)
    assert gap(engine, trained) < tol < 2 * tol < gap(engine, start), (gap(engine, trained), tol, gap(engine, start))
    _close(trainer)


# ---- zero_std_resampling ------------------------------------------------------------------------------------------

def test_resampling_rounds_generate_through_the_server_from_the_current_weights(gpt2_dir, gpt2_server, flat_data,
                                                                                 tmp_path):
    """Each resampling round is one more generation request to the server, with the recipe's settings, sampling the
    weights of the step (no sync between rounds: the step has not moved)."""
    args = server_args(tmp_path, gpt2_server, max_completion_length=12, temperature=0.9,
                       vllm_importance_sampling_mode="sequence_mask", pad_to_multiple_of=8)
    trainer = RookGRPOTrainer(model=str(gpt2_dir), reward_funcs=[_mostly_flat()], args=args, train_dataset=flat_data,
                              callbacks=[{"name": "zero_std_resampling", "max_rounds": 2}])
    recorder = SamplingRecorder(trainer)
    trainer.train()
    rounds = sum(_steps(trainer, "resample/rounds"))
    assert rounds >= 1 and all(math.isfinite(v) for v in _steps(trainer, "loss"))
    assert len(recorder.calls) == 3 + rounds
    assert {(c["temperature"], c["max_tokens"]) for c in recorder.calls} == {(0.9, 12)}
    assert_sampled_current_weights(recorder.calls)
    _close(trainer)


# ---- heldout_guard ------------------------------------------------------------------------------------------------

def test_the_guard_restores_a_step_never_saved_and_the_server_samples_it(gpt2_dir, gpt2_server, flat_data, tmp_path):
    """The guard keeps step 2 of 5 in memory (no checkpoint is written; the server loaded step 0 from the model's
    files) and restores it after step 5; its restore pushes the weights to the server through TRL's sync, and the
    server's log-probs are then the restored weights', not step 5's."""
    from test_heldout_guard import HeldoutProbe
    from test_vllm import _logprobs_with

    probe = HeldoutProbe({0: 0.3, 1: 0.5, 2: 1.0, 3: 0.4, 4: 0.3, 5: 0.2}, every=1)
    args = server_args(tmp_path, gpt2_server, max_steps=5, max_completion_length=8)
    trainer = RookGRPOTrainer(model=str(gpt2_dir), reward_funcs=[_mostly_flat()], args=args, train_dataset=flat_data,
                              callbacks=[probe, {"name": "heldout_guard", "metric": "heldout/probe"}])
    trainer.train()
    assert _steps(trainer, "heldout_guard/restored") == [1] and _steps(trainer, "heldout_guard/best_step") == [2]
    assert not list(Path(args.output_dir).glob("checkpoint-*"))
    model = policy(trainer)
    ids = probe_ids(trainer)
    engine, restored = engine_logprobs(trainer, ids), model_logprobs(model, ids)
    last, start = _logprobs_with(model, probe.weights[5], ids), _logprobs_with(model, probe.weights[0], ids)
    tol = tolerance(model, ids, restored)
    print(f"server after the guard's restore: {gap(engine, restored):.4f} nats/token from the restored step 2, "
          f"{gap(engine, last):.4f} from step 5, {gap(engine, start):.4f} from the start (tolerance {tol:.4f})")
    assert gap(engine, restored) < tol
    assert gap(engine, last) > 2 * tol and gap(engine, start) > 2 * tol
    _close(trainer)


def test_trls_evaluation_between_steps_and_the_guard_on_its_reward_in_server_mode(gpt2_dir, gpt2_server, flat_data,
                                                                                   tmp_path):
    """TRL's evaluation generates through the server between steps; the guard on eval_reward keeps step 2 and restores
    it after step 4, and the server then samples step 2's weights."""
    from test_vllm import EvalFavoursStep2

    args = server_args(tmp_path, gpt2_server, max_steps=4, max_completion_length=8, eval_strategy="steps",
                       eval_steps=2, per_device_eval_batch_size=8)
    reward = EvalFavoursStep2()
    trainer = RookGRPOTrainer(model=str(gpt2_dir), reward_funcs=[reward], args=args, train_dataset=flat_data,
                              eval_dataset=flat_data.select(range(8)), callbacks=[{"name": "heldout_guard"}])
    reward.trainer = trainer
    recorder = SamplingRecorder(trainer)
    trainer.train()
    evaluations = [c for c in recorder.calls if not c["training"]]
    assert sorted({c["step"] for c in evaluations}) == [2, 4]
    assert_sampled_current_weights(recorder.calls)
    assert _steps(trainer, "heldout_guard/best_step") == [2] and _steps(trainer, "heldout_guard/restored") == [1]
    tol = assert_samples_trainers_weights(trainer, recorder.ids)
    assert gap(engine_logprobs(trainer, recorder.ids), evaluations[-1]["logprobs"]) > 2 * tol
    _close(trainer)


# ---- skip_nonfinite and resume ------------------------------------------------------------------------------------

def test_a_skipped_nan_step_leaves_the_server_sampling_finite_current_weights(gpt2_dir, gpt2_server, flat_data,
                                                                              tmp_path):
    from test_nonfinite import NaNGradientAt

    probe = NaNGradientAt(step=2)
    args = server_args(tmp_path, gpt2_server, max_steps=4, max_completion_length=8)
    trainer = RookGRPOTrainer(model=str(gpt2_dir), reward_funcs=[_mostly_flat()], args=args, train_dataset=flat_data,
                              callbacks=[probe])
    recorder = SamplingRecorder(trainer)
    trainer.train()
    assert _steps(trainer, "skipped_updates") == [0, 1, 1, 1]
    assert all(torch.equal(probe.weights[2][n], probe.weights[1][n]) for n in probe.weights[1])
    assert [c["step"] for c in recorder.calls] == [0, 1, 2, 3]
    assert all(math.isfinite(c["gap"]) and c["gap"] < c["tol"] for c in recorder.calls)
    _close(trainer)


def test_a_resumed_run_generates_from_the_checkpoints_weights_in_server_mode(gpt2_dir, gpt2_server, flat_data,
                                                                             tmp_path):
    """The server holds whatever it was last sent (here: another run's weights); a run resumed from a checkpoint
    samples the checkpoint's weights from its first generation on."""
    from transformers import AutoModelForCausalLM

    args = server_args(tmp_path, gpt2_server, max_steps=2, max_completion_length=8, save_strategy="steps",
                       save_steps=2)
    first = RookGRPOTrainer(model=str(gpt2_dir), reward_funcs=[_mostly_flat()], args=args, train_dataset=flat_data)
    first.train()
    _close(first)
    args = server_args(tmp_path, gpt2_server, max_steps=4, max_completion_length=8)
    trainer = RookGRPOTrainer(model=str(gpt2_dir), reward_funcs=[_mostly_flat()], args=args, train_dataset=flat_data)
    recorder = SamplingRecorder(trainer)
    trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert [c["step"] for c in recorder.calls] == [2, 3]
    assert_sampled_current_weights(recorder.calls, shown_stale_at_least=0)  # the power is shown below
    ids = probe_ids(trainer)
    start = model_logprobs(AutoModelForCausalLM.from_pretrained(str(gpt2_dir)), ids)
    checkpoint = model_logprobs(AutoModelForCausalLM.from_pretrained(str(tmp_path / "checkpoint-2")), ids)
    assert gap(start, checkpoint) > 2 * recorder.calls[0]["tol"] > 2 * recorder.calls[0]["gap"]
    _close(trainer)


# ---- Qwen2 + LoRA: TRL's merged-adapter sync over the server -----------------------------------------------------

def test_a_lora_policy_pushes_its_merged_weights_to_the_server(chat_qwen2_server, tmp_path):
    """The code recipe's shape: TRL merges the adapter into the base weights to stream them, then unmerges. After
    training and a sync, the server's log-probs are the trained (merged) model's, not the base model's."""
    from peft import LoraConfig

    data = Dataset.from_list([{"prompt": [{"role": "user", "content": f"write f{i}"}]} for i in range(16)])
    args = server_args(tmp_path, chat_qwen2_server, max_steps=6, max_completion_length=12, learning_rate=1e-1)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = RookGRPOTrainer(model=str(chat_qwen2_server.model), reward_funcs=["uci_charset"], args=args,
                              train_dataset=data, peft_config=lora)
    # a chess line: what uci_charset's reward moves the policy toward, so LoRA's change shows in its log-probs
    recorder = SamplingRecorder(trainer, ids=probe_ids(trainer))
    trainer.train()
    assert all(c["gap"] < c["tol"] for c in recorder.calls)
    sync_vllm_weights(trainer)
    ids = recorder.ids
    engine, trained = engine_logprobs(trainer, ids), model_logprobs(policy(trainer), ids)
    with policy(trainer).disable_adapter():
        base = model_logprobs(policy(trainer), ids)
    tol = tolerance(policy(trainer), ids, trained)
    assert gap(engine, trained) < tol < 2 * tol < gap(engine, base), (gap(engine, trained), tol, gap(engine, base))
    _close(trainer)


# ---- two trainer processes, one server ------------------------------------------------------------------------------

def test_two_trainer_processes_with_one_server(gpt2_dir, gpt2_server, tmp_path, monkeypatch):
    """DDP on two CPU processes (gloo) generating through one server (TRL gathers the prompts to the main process,
    which asks the server and pushes weights; every rank takes part in the sync): resampling's extra rounds and the
    guard's restore of step 2 of 4 (scripted held-out scores, the same on both ranks; never on disk) happen in step on
    both ranks, and the server ends sampling the restored weights: the ones the run saved, not step 4's."""
    import json

    import yaml
    from transformers import AutoModelForCausalLM

    from conftest import REPO, run_cli, venv_bin

    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    data = write_flat_data(tmp_path / "flat.jsonl", 32)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "model_name_or_path": str(gpt2_dir), "dataset_name": str(data),
        "reward_funcs": [str(ASSETS / "flat_reward.py") + ":mostly_flat"],
        "callbacks": [{"name": "zero_std_resampling", "max_rounds": 2},
                      {"heldout_eval": {"data": str(data), "every": 1, "n": 2,
                                        "evaluator": str(ASSETS / "sharded_probe.py") + ":scripted_score"}},
                      {"heldout_guard": {"metric": "heldout/score"}}],
        "num_generations": 4, "per_device_train_batch_size": 8, "max_completion_length": 8, "max_steps": 4,
        "logging_steps": 1, "beta": 0.0, "learning_rate": 3e-2, "use_cpu": True, "use_vllm": True,
        "vllm_mode": "server", "vllm_server_base_url": gpt2_server.url, "vllm_group_port": free_port(),
        "report_to": "none", "save_strategy": "steps", "save_steps": 4, "output_dir": str(tmp_path / "out")}))
    proc = run_cli([venv_bin("accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                    "--mixed_precision", "no", "--dynamo_backend", "no", str(ASSETS / "cpu_transport_launch.py"),
                    str(recipe)], cwd=REPO, timeout=600,
                   env={"PYTHONPATH": str(ASSETS), "ROOKGRPO_TEST_SCORES": "1,2,5,3,2", "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = tmp_path / "out"
    info = json.loads((out / "run_info.json").read_text())
    assert info["world_size"] == 2 and info["global_step"] == 4
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert sum(h.get("resample/rounds", 0) for h in history) >= 1
    assert all(math.isfinite(h["loss"]) for h in history if "loss" in h)
    ends = [h for h in history if "heldout_guard/best_step" in h]
    assert len(ends) == 1 and ends[0]["heldout_guard/best_step"] == 2 and ends[0]["heldout_guard/restored"] == 1
    # what the server samples is what the run handed back (the restored step's weights when the guard restored)
    from trl.generation.vllm_client import VLLMClient

    from transformers import AutoTokenizer

    from vllm_checks import PROBE_TEXT, server_logprobs

    client = VLLMClient(base_url=gpt2_server.url)
    final = AutoModelForCausalLM.from_pretrained(str(out))
    ids = AutoTokenizer.from_pretrained(str(out))(PROBE_TEXT)["input_ids"]

    served, handed_back = server_logprobs(client, ids), model_logprobs(final, ids)
    last = model_logprobs(AutoModelForCausalLM.from_pretrained(str(out / "checkpoint-4")), ids)
    start = model_logprobs(AutoModelForCausalLM.from_pretrained(str(gpt2_dir)), ids)
    tol = tolerance(final, ids, handed_back)
    assert gap(served, handed_back) < tol, (gap(served, handed_back), tol)
    assert gap(served, last) > 2 * tol and gap(served, start) > 2 * tol, (gap(served, last), gap(served, start), tol)


# ---- the transport's version check ----------------------------------------------------------------------------------

def test_the_cpu_transport_names_the_vllm_version_when_an_internal_it_needs_is_gone(monkeypatch):
    from vllm.distributed.weight_transfer import nccl_engine

    from rookgrpo import vllm_cpu_transport

    vllm_cpu_transport.check_vllm_internals()  # the installed vLLM has them
    monkeypatch.delattr(nccl_engine, "NCCLWeightTransferEngine")
    with pytest.raises(RuntimeError, match=r"written against vLLM 0\.31\.0; the installed vLLM .* has no "
                                           r"vllm\.distributed\.weight_transfer\.nccl_engine\.NCCLWeightTransferEngine"):
        vllm_cpu_transport.check_vllm_internals()


def test_a_tied_head_kernel_vllm_renamed_is_refused_not_left_stale():
    """repack_kept_weights rebuilds the kernels vLLM's CPU layers hold as cpu_linear; if vLLM renamed it, the tied LM
    head would keep its start kernel silently: refused instead, naming the version checked."""
    from rookgrpo.vllm_compat import repack_kept_weights

    class UnquantizedEmbeddingMethod:
        def process_weights_after_loading(self, layer):
            raise AssertionError("not reached")

    head = torch.nn.Module()
    head.quant_method, head.weight = UnquantizedEmbeddingMethod(), torch.nn.Parameter(torch.ones(4, 2))
    model = torch.nn.Sequential(head)
    with pytest.raises(RuntimeError, match=r"no cpu_linear kernel.*checked against vLLM 0\.31\.0"):
        repack_kept_weights(model)
    calls = []
    UnquantizedEmbeddingMethod.process_weights_after_loading = lambda self, layer: calls.append(layer)
    head.cpu_linear = object()
    assert repack_kept_weights(model) == 1 and calls == [head]
