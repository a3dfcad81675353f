"""A NaN in one optimizer step of a 2-process run (gloo, CPU) is never applied, under DDP, FSDP2 and DeepSpeed ZeRO-2
and ZeRO-3, and it is counted; the doctor's ``halt_on: [nonfinite]`` stops such a run with the last finite weights.

Each run trains the tiny char model 5 steps with a constant learning rate; ``tests/assets/nan_probe.py`` makes step
3's gradient NaN on rank 0 only (a faulty kernel on one GPU: the reduction carries the NaN to the other rank), and
records the whole weights (and DeepSpeed's fp32 master weights) after every step on both ranks. Step 3's weights must
equal step 2's, step 4 must train, the run must end finite, ``skipped_updates`` must count the step, and the weights
at steps 2 and 5 must equal DDP's.

Two ways keep the update out under DeepSpeed, and both run here: DeepSpeed's own overflow check (0.19.8 skips a step
with a non-finite gradient norm in fp32 and bf16), and rookgrpo's veto inside the engine's step, which is what keeps
it out where DeepSpeed would apply it: bf16 with DeepSpeed's ``check_grad_overflow`` off
(``tests/assets/zero2-bf16-nocheck.json``; the DeepSpeed releases before 0.17 never check bf16 under ZeRO-1/2, those
before 0.19.5 never check fp32 or bf16 under ZeRO-3), and a NaN loss whose gradient stays finite, which no gradient
check can see.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml

from conftest import REPO, read_json, run_cli, venv_bin

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.distributed  # two processes each: `make test` runs these alone, after the rest

ASSETS = REPO / "tests" / "assets"
NAN_STEP = 3
RECIPE = {
    "model_name_or_path": "rookgrpo/tiny-random", "dataset_name": "rookgrpo/smoke-prompts",
    "reward_funcs": ["uci_charset"], "callbacks": ["nan_probe.NaNProbe"], "seed": 42, "use_cpu": True,
    "report_to": "none", "save_strategy": "no", "learning_rate": 1e-3, "lr_scheduler_type": "constant",
    "weight_decay": 0.1, "beta": 0.0, "max_steps": 5, "per_device_train_batch_size": 8, "num_generations": 4,
    "max_completion_length": 8, "logging_steps": 1, "disable_dropout": True,
}
#: name -> (layout, precision, what is made NaN, how DeepSpeed keeps the update out)
RUNS = {
    "ddp": ("ddp", "fp32", "gradient", None),
    "fsdp2": ("fsdp2", "fp32", "gradient", None),
    "zero2": ("zero2", "fp32", "gradient", "deepspeed"),
    "zero3": ("zero3", "fp32", "gradient", "deepspeed"),
    "zero3-bf16": ("zero3", "bf16", "gradient", "deepspeed"),
    "zero2-bf16-nocheck": ("zero2-bf16-nocheck", "bf16", "gradient", "vetoed"),
    "zero3-nan-loss": ("zero3", "fp32", "loss_only", "vetoed"),
}
HALTS = ("ddp", "fsdp2", "zero3", "zero2-bf16-nocheck")


def _launch(tmp_path, layout: str, precision: str, kind: str, **overrides) -> dict:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({**RECIPE, **overrides, "bf16": precision == "bf16"}))
    out, probe = tmp_path / "out", tmp_path / "probe"
    probe.mkdir()
    if layout == "ddp":
        cmd = [venv_bin("rookgrpo"), "train", str(recipe), "--accelerate_config", "cpu-ddp"]
    elif layout == "fsdp2":
        cmd = [venv_bin("accelerate"), "launch", "--config_file", str(ASSETS / "fsdp2-cpu.yaml"),
               str(ASSETS / "fsdp2_cpu.py"), str(recipe), "--use_cpu", "true"]
    else:  # the packaged zero2/zero3 configs as a user without a GPU launches them, or the test's own
        config = layout if layout.startswith("zero") and "-" not in layout else str(ASSETS / f"{layout}.yaml")
        cmd = [venv_bin("rookgrpo"), "train", str(recipe), "--accelerate_config", config, "--num_processes", "2"]
    env = {"PYTHONPATH": str(ASSETS), "ROOKGRPO_TEST_PROBE_DIR": str(probe), "ROOKGRPO_TEST_NAN_STEP": str(NAN_STEP),
           "ROOKGRPO_TEST_NAN_KIND": kind, "OMP_NUM_THREADS": "1"}
    proc = run_cli([*cmd, "--output_dir", str(out)], env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [torch.load(probe / f"rank-{r}.pt", weights_only=True) for r in (0, 1)]
    history = json.loads((probe / "rank-0.json").read_text())["log_history"]
    return {"weights": ranks, "logs": {e["step"]: e for e in history if "loss" in e}, "stderr": proc.stderr,
            "out": out, "info": read_json(out / "run_info.json")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {name: _launch(tmp_path_factory.mktemp(name), *spec[:3]) for name, spec in RUNS.items()}


def _model(weights: dict) -> dict:
    return {k: v for k, v in weights.items() if not k.startswith("master/")}


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _close(a: dict, b: dict, rel: float = 1e-4) -> bool:
    return a.keys() == b.keys() and all(float((a[k] - b[k]).abs().max()) <= rel * float(b[k].abs().max()) + 1e-7
                                        for k in a)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_a_nan_step_is_not_applied_on_any_rank_and_is_counted(runs, name):
    run = runs[name]
    for rank, w in enumerate(run["weights"]):
        assert _equal(w[NAN_STEP], w[NAN_STEP - 1]), (name, rank)  # master weights too, under DeepSpeed
        assert not _equal(_model(w[NAN_STEP + 1]), _model(w[NAN_STEP])), (name, rank)  # the next step trains
        assert all(bool(torch.isfinite(v).all()) for v in w["end"].values()), (name, rank)
    assert _equal(run["weights"][0]["end"], run["weights"][1]["end"])  # both ranks end with the same weights
    logs = run["logs"]
    assert [logs[s]["skipped_updates"] for s in sorted(logs)] == [0, 0, 1, 1, 1], name
    assert logs[5]["skipped_updates/nonfinite_loss"] == (1 if RUNS[name][2] == "loss_only" else 0), name
    assert run["info"]["world_size"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n, spec in RUNS.items() if spec[1] == "fp32" and n != "ddp"])
def test_the_weights_around_the_nan_step_are_ddps(runs, name):
    """fp32 runs: steps 2 and 5 equal DDP's under the same forced NaN (1e-4 relative), whatever kept the NaN out."""
    ddp = runs["ddp"]["weights"][0]
    for step in (NAN_STEP - 1, 5):
        assert _close(_model(runs[name]["weights"][0][step]), ddp[step]), (name, step)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n, spec in RUNS.items() if spec[3]])
def test_deepspeed_says_what_kept_the_update_out(runs, name):
    """Where DeepSpeed's check skipped the step, the log says so; where it would have applied it, rookgrpo vetoed it
    inside the engine's step; and the optimizer's fp32 master weights never moved."""
    run, how = runs[name], RUNS[name][3]
    said = {"deepspeed": "DeepSpeed's overflow check skipped this update",
            "vetoed": "vetoed inside DeepSpeed's optimizer step"}[how]
    lines = [line for line in run["stderr"].splitlines() if f"step {NAN_STEP}:" in line]
    assert len(lines) == 1 and said in lines[0], lines
    assert "DEEPSPEED" in run["info"]["distributed_type"]
    w = run["weights"][0]
    assert any(k.startswith("master/") for k in w[NAN_STEP])


@pytest.mark.slow
def test_without_the_veto_deepspeed_applies_the_nan(tmp_path):
    """What the veto prevents: the same bf16 ZeRO-2 run with skip_nonfinite_updates off dies of NaN weights."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({**RECIPE, "bf16": True, "skip_nonfinite_updates": False}))
    (tmp_path / "probe").mkdir()
    proc = run_cli([venv_bin("rookgrpo"), "train", str(recipe), "--accelerate_config",
                    str(ASSETS / "zero2-bf16-nocheck.yaml"), "--num_processes", "2", "--output_dir", str(tmp_path / "o")],
                   env={"PYTHONPATH": str(ASSETS), "ROOKGRPO_TEST_PROBE_DIR": str(tmp_path / "probe"),
                        "ROOKGRPO_TEST_NAN_STEP": str(NAN_STEP), "OMP_NUM_THREADS": "1"}, timeout=600)
    assert proc.returncode != 0 and "probability tensor contains" in proc.stderr


# ---- the doctor's halt, with skipping off -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def halts(tmp_path_factory):
    return {name: _launch(tmp_path_factory.mktemp(f"halt-{name}"), *RUNS[name][:3], skip_nonfinite_updates=False,
                          callbacks=["nan_probe.NaNProbe", {"doctor": {"halt_on": ["nonfinite"], "kl_grad_every": 0}}])
            for name in HALTS}


@pytest.mark.slow
@pytest.mark.parametrize("name", HALTS)
def test_the_doctors_halt_stops_before_the_nan_update_and_saves_the_last_finite_weights(halts, name):
    from safetensors.torch import load_file

    run = halts[name]
    assert max(run["logs"]) == NAN_STEP
    assert read_json(run["out"] / "doctor.json")["halted_on"] == "nonfinite:grad_norm"
    for w in run["weights"]:
        assert _equal(w[NAN_STEP], w[NAN_STEP - 1]) and _equal(w["end"], w[NAN_STEP - 1])
    saved = load_file(str(run["out"] / f"checkpoint-{NAN_STEP}" / "model.safetensors"))
    before = _model(run["weights"][0][NAN_STEP - 1])
    assert saved and all(torch.equal(v.float(), before[k]) for k, v in saved.items() if k in before)
    line = next(line for line in run["stderr"].splitlines() if "halt_on: nonfinite" in line)
    assert f"holds step {NAN_STEP - 1}'s weights" in line
    assert not math.isnan(run["logs"][NAN_STEP - 1]["grad_norm"])
