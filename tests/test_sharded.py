"""Several processes and sharded models: every callback under DDP, FSDP2 and DeepSpeed ZeRO-2 and ZeRO-3 on 2 CPU
processes (gloo), on the same seed, logs the same numbers and ends with the same weights.

DDP runs as a user launches it, ``rookgrpo train RECIPE --accelerate_config cpu-ddp`` (the packaged config must start
the two processes it names). FSDP2 runs through accelerate's, transformers' and TRL's own FSDP2 code path; accelerate
keeps ``MULTI_CPU`` whenever a process runs on CPU, so ``tests/assets/fsdp2_cpu.py`` (test-only, its docstring says why)
promotes the state to FSDP with the plugin accelerate built from ``tests/assets/fsdp2-cpu.yaml``. DeepSpeed runs as a
user without a GPU launches the packaged configs, ``rookgrpo train RECIPE --accelerate_config zero2 --num_processes 2``
(no shim: DeepSpeed's CPU accelerator over gloo; the configs' bf16 gives way to the recipe's fp32, said once).

The recipe has every callback at once: diagnostics, the doctor with its KL-gradient meter on every step, prompt
selection, zero-std resampling, adaptive beta, the KL cap, the SFT anchor, per-task sampling, the chess pack's held-out
evaluation, a held-out evaluation whose scores are scripted (best at step 0, so the guard must restore the start on
every rank: the case where ranks used to disagree), and the guard.
"""

from __future__ import annotations

import json
from pathlib import Path
import math
from types import SimpleNamespace

import pytest
import yaml

from conftest import REPO, read_json, run_cli, venv_bin

ASSETS = REPO / "tests" / "assets"
pytestmark = pytest.mark.distributed  # two processes each: `make test` runs these alone, after the rest
SCORES = "5,1,3,2,1"  # heldout/score at steps 0, 1, 2, 3, 4: the start is the best
RECIPE = {
    "model_name_or_path": "rookgrpo/tiny-rookworld",
    "dataset_name": "rookgrpo/tiny-rookworld-grpo",
    "dataset_format": "rookworld",
    "reward_funcs": ["chess_format", "chess_env"],
    "stockfish_depth": 2,
    "stockfish_workers": 1,
    "callbacks": [
        "diagnostics",
        {"doctor": {"kl_grad_every": 1}},
        {"prompt_selection": {"rule": "greso"}},
        {"zero_std_resampling": {"max_rounds": 1}},
        {"adaptive_beta": {"target_kl": 0.05, "horizon": 5, "beta_min": 0.005, "beta_max": 0.5}},
        "kl_cap",
        {"sft_anchor": {"data": "rookgrpo/tiny-rookworld-grpo", "tasks": ["A"], "batch_size": 4, "coef": 0.1}},
        {"chess_eval": {"data": "rookgrpo/tiny-rookworld-val", "every": 2, "n_policy": 4, "n_env": 4,
                        "batch_size": 8}},
        {"heldout_eval": {"data": "rookgrpo/tiny-rookworld-val", "format": "rookworld", "every": 1, "n": 2,
                          "evaluator": str(ASSETS / "sharded_probe.py") + ":scripted_score"}},
        {"heldout_guard": {"metric": "heldout/score"}},
        "sharded_probe.RankProbe",  # after the guard: it records what each rank holds once the guard restored
    ],
    "task_generation_kwargs": {"P": {"temperature": 0.8}, "A": {"temperature": 0.9}},
    "beta": 0.05, "seed": 42, "use_cpu": True, "bf16": False, "report_to": "none", "save_strategy": "no",
    "learning_rate": 1e-4, "max_steps": 4, "per_device_train_batch_size": 8, "num_generations": 4,
    "max_completion_length": 64, "logging_steps": 1, "disable_dropout": True,
}
#: Logged values that are not the run's numbers (clocks, memory).
UNTIMED = ("timing/", "memory/", "step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second")


#: The KL-gradient meter's numbers: measured under DDP and FSDP2; off, with the reason said, under DeepSpeed.
KL_METER = ("grad/kl_norm", "grad/policy_norm", "loss/kl_grad_share", "grad/kl_policy_cos")
KINDS = ("ddp", "fsdp2", "zero2", "zero3")
DEEPSPEED = ("zero2", "zero3")


def _launch(kind: str, tmp_path) -> dict:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(RECIPE))
    out, probe = tmp_path / "out", tmp_path / "probe"
    probe.mkdir()
    if kind == "ddp":
        cmd = [venv_bin("rookgrpo"), "train", str(recipe), "--accelerate_config", "cpu-ddp", "--output_dir", str(out)]
    elif kind in DEEPSPEED:
        cmd = [venv_bin("rookgrpo"), "train", str(recipe), "--accelerate_config", kind, "--num_processes", "2",
               "--output_dir", str(out)]
    else:
        cmd = [venv_bin("accelerate"), "launch", "--config_file", str(ASSETS / "fsdp2-cpu.yaml"),
               str(ASSETS / "fsdp2_cpu.py"), str(recipe), "--use_cpu", "true", "--output_dir", str(out)]
    env = {"PYTHONPATH": str(ASSETS), "ROOKGRPO_TEST_PROBE_DIR": str(probe), "ROOKGRPO_TEST_SCORES": SCORES,
           "OMP_NUM_THREADS": "1"}  # both layouts reduce floats with the same thread count
    proc = run_cli(cmd, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {"info": read_json(out / "run_info.json"), "out": out, "stderr": proc.stderr, "stdout": proc.stdout,
            "ranks": [read_json(probe / f"rank-{r}.json") for r in (0, 1)]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {kind: _launch(kind, tmp_path_factory.mktemp(kind)) for kind in KINDS}


def _steps(history: list[dict]) -> dict[int, dict]:
    """The log entries of a history by step (several entries of one step merged, in order)."""
    by_step: dict[int, dict] = {}
    for entry in history:
        by_step.setdefault(entry["step"], {}).update(
            {k: v for k, v in entry.items() if not k.startswith(UNTIMED)})
    return by_step


@pytest.mark.slow
def test_the_packaged_configs_start_two_processes_and_the_sharded_ones_shard(runs):
    ddp, fsdp = runs["ddp"], runs["fsdp2"]
    assert ddp["info"]["world_size"] == 2 and "MULTI_CPU" in ddp["info"]["distributed_type"]
    assert "--use_cpu true" in ddp["stderr"]  # rookgrpo train passed the config's use_cpu on to the run
    assert fsdp["info"]["world_size"] == 2 and "FSDP" in fsdp["info"]["distributed_type"]
    assert not any(r["sharded"] for r in ddp["ranks"]) and all(r["sharded"] for r in fsdp["ranks"])
    for kind in DEEPSPEED:  # the packaged GPU configs, unchanged, on a machine without a GPU
        run = runs[kind]
        assert run["info"]["world_size"] == 2 and "DEEPSPEED" in run["info"]["distributed_type"], kind
        assert "the accelerate config's mixed_precision is bf16, the trainer's is no" in run["stderr"], kind
        # DeepSpeed's shared-memory inference kernel (tensor-parallel inference only) is neither compiled nor loaded
        assert "shm_comm" not in run["stdout"] + run["stderr"], kind
    assert not any(r["sharded"] for r in runs["zero2"]["ranks"]) and all(r["sharded"] for r in runs["zero3"]["ranks"])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fsdp2", *DEEPSPEED])
def test_every_callback_logs_the_same_numbers_as_under_ddp(runs, kind):
    ddp, other = (_steps(runs[k]["ranks"][0]["log_history"]) for k in ("ddp", kind))
    assert ddp.keys() == other.keys() == {0, 1, 2, 3, 4}
    names = set().union(*(e.keys() for e in ddp.values()))
    for family in ("grad/kl_norm", "loss/kl_grad_share", "beta", "kl_cap/raw_kl", "sft_anchor/nll", "resample/rounds",
                   "select/kept", "groups/identical_frac", "heldout/format_rate", "heldout/score",
                   "heldout_guard/score", "heldout_guard/best_step", "skipped_updates"):
        assert family in names, family
    assert "heldout/format_rate" in other[0] and "heldout/score" in other[0]  # evaluated from step 0, sharded too
    for step, entry in ddp.items():
        if kind in DEEPSPEED:  # the KL-gradient meter is off there (test_the_kl_gradient_meter_...): the rest matches
            entry = {k: v for k, v in entry.items() if k not in KL_METER}
            assert not set(KL_METER) & other[step].keys(), step
        assert entry.keys() == other[step].keys(), step
        for name, value in entry.items():
            theirs = other[step][name]
            if isinstance(value, float) and math.isnan(value):
                assert math.isnan(theirs), (step, name)  # e.g. the KL/policy cosine before the policy moved: NaN
            elif isinstance(value, float):
                assert theirs == pytest.approx(value, rel=2e-5, abs=1e-7), (step, name)
            else:
                assert theirs == value, (step, name)


@pytest.mark.slow
def test_the_kl_gradient_meter_under_fsdp2_is_ddps_and_deepspeed_says_why_it_is_off(runs):
    """Norms reduced over every rank's shards, equal to DDP's whole-weight numbers within 1e-6; under DeepSpeed the
    meter is off and says why, per stage."""
    ddp, fsdp = (_steps(runs[k]["ranks"][0]["log_history"]) for k in ("ddp", "fsdp2"))
    measured = [s for s, e in ddp.items() if e.get("grad/kl_norm")]
    assert len(measured) >= 3
    for step in measured:
        for name in KL_METER:
            assert fsdp[step][name] == pytest.approx(ddp[step][name], rel=1e-6), (step, name)
    for kind in DEEPSPEED:
        stage = kind[-1]
        said = [line for line in runs[kind]["stderr"].splitlines() if "loss/kl_grad_share is not measured" in line]
        assert len(said) == 1 and f"under DeepSpeed ZeRO-{stage} the engine reduces the gradients" in said[0], kind


@pytest.mark.slow
def test_the_guard_restores_the_same_step_on_every_rank_and_each_ranks_share(runs):
    """Every layout ends with the start's weights (the best held-out step), on both ranks; FSDP2 restores each rank's
    shards, DeepSpeed each rank's share of the optimizer's fp32 master weights and the module's from them, so the
    master copy (what a later step or a DeepSpeed checkpoint starts from) is the start's too; the saved model is."""
    from safetensors.torch import load_file

    from rookgrpo.assets import resolve_model

    for kind in KINDS:
        ends = [_steps(r["log_history"])[4] for r in runs[kind]["ranks"]]
        assert [(e["heldout_guard/best_step"], e["heldout_guard/restored"]) for e in ends] == [(0, 1), (0, 1)], kind
    reference = runs["ddp"]["ranks"][0]["checksum"]
    for kind in ("ddp", *DEEPSPEED):
        for rank in runs[kind]["ranks"]:
            assert rank["checksum"] == pytest.approx(reference, rel=1e-12), kind  # the same weights on both ranks
            if kind in DEEPSPEED:
                assert rank["master_checksum"] == pytest.approx(reference, rel=1e-12), kind
    start = load_file(str(Path(resolve_model("rookgrpo/tiny-rookworld")) / "model.safetensors"))
    ddp = load_file(str(runs["ddp"]["out"] / "model.safetensors"))
    for kind in ("fsdp2", *DEEPSPEED):
        other = load_file(str(runs[kind]["out"] / "model.safetensors"))
        for name, weight in ddp.items():
            assert (other[name] - weight).abs().max() <= 1e-6, (kind, name)
    for name, weight in ddp.items():
        assert (start[name] - weight).abs().max() <= 1e-6, name  # the start's weights, which trained and came back


# ---- what cannot run here: refused or switched off with a message that names what to use ---------------------------

def _fake_trainer(deepspeed_stage=None, fsdp_version=None, accumulation=1):
    state = SimpleNamespace(deepspeed_plugin=SimpleNamespace(zero_stage=deepspeed_stage),
                            fsdp_plugin=SimpleNamespace(fsdp_version=fsdp_version))
    return SimpleNamespace(is_deepspeed_enabled=deepspeed_stage is not None, is_fsdp_enabled=fsdp_version is not None,
                           accelerator=SimpleNamespace(state=state, is_main_process=True, num_processes=2),
                           args=SimpleNamespace(gradient_accumulation_steps=accumulation, eval_strategy="no"),
                           model=SimpleNamespace(parameters=lambda: iter(())),
                           callback_handler=SimpleNamespace(callbacks=[]))


def test_the_guard_refuses_fsdp1_and_names_what_to_use():
    from rookgrpo import ConfigError
    from rookgrpo.callbacks import HeldoutGuard

    with pytest.raises(ConfigError, match="FSDP1.*Use FSDP2"):
        HeldoutGuard(metric="heldout/score").bind(_fake_trainer(fsdp_version=1))
    for stage in (2, 3):  # DeepSpeed: each rank's share of the master weights (test_the_guard_restores_...)
        HeldoutGuard(metric="heldout/score").bind(_fake_trainer(deepspeed_stage=stage))


@pytest.mark.parametrize("trainer_kwargs, said", [
    ({"deepspeed_stage": 2}, "under DeepSpeed ZeRO-2 the engine reduces the gradients into its own partitioned"),
    ({"deepspeed_stage": 3}, "the weights themselves are partitioned"),
    ({"fsdp_version": 1}, "FSDP1"),
    ({"fsdp_version": 2, "accumulation": 4}, "gradient accumulation"),
])
def test_the_kl_gradient_meter_says_once_at_warning_level_where_it_is_off(trainer_kwargs, said, caplog):
    from rookgrpo.dynamics.kl_grad import KLGradMeter

    with caplog.at_level("WARNING", logger="rookgrpo.doctor"):
        meter = KLGradMeter(_fake_trainer(**trainer_kwargs))
        meter._disable("again")
    assert not meter.enabled
    lines = [r for r in caplog.records if "not measured" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelname == "WARNING" and said in lines[0].getMessage()
    assert KLGradMeter(_fake_trainer(fsdp_version=2)).mode == "backward"
