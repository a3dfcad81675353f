"""rookgrpo doctor: detectors on real short runs built to fail each way (and healthy runs that must give no finding),
the KL-gradient measurement checked exactly where its answer is known (a constant reward leaves only the KL term's
gradient) in the layouts TRL supports and on two processes, the live callback (warnings, halt_on, doctor.json), and
the CLI on a vanilla TRL run."""

from __future__ import annotations

import json
import logging
import math
import time

import pytest

from conftest import REPO, launch_two_cpu_processes, load_script, run_cli, tiny_grpo_args, vanilla_args, venv_bin, write_recipe
from rookgrpo import ConfigError, RookGRPOTrainer
from rookgrpo.callbacks import Doctor, resolve_callback
from rookgrpo.doctor import History, Thresholds, diagnose, load_history

scenarios = load_script(REPO / "benchmarks" / "doctor_scenarios.py", "doctor_scenarios")


def kinds(entries) -> set[str]:
    findings, _ = diagnose(History([e for e in entries if "train_runtime" not in e]))
    return {f.kind for f in findings}


# ---- detectors on curves whose answer is known ------------------------------------------------------------------

def _curve(name, values, start=1):
    return [{"step": start + i, name: v} for i, v in enumerate(values)]


def _merge(*curves):
    by_step = {}
    for curve in curves:
        for e in curve:
            by_step.setdefault(e["step"], {"step": e["step"]}).update(e)
    return [by_step[s] for s in sorted(by_step)]


def test_kl_growing_steadily_is_not_a_runaway_but_accelerating_is():
    steady = _curve("kl", [0.004 * i for i in range(40)])
    runaway = _curve("kl", [0.002 * 1.15 ** i for i in range(40)])
    assert kinds(steady) == set()
    assert kinds(runaway) == {"kl_runaway"}


def test_a_sampler_apart_from_the_trainer_is_named_with_its_causes_and_a_clean_one_is_not():
    """vLLM's sampler against the trainer (TRL's sampling/* metrics), at the sizes the vLLM leg measured
    (benchmarks/bench_vllm.py): bf16 engine against fp32 trainer 0.044 nats/token and a ratio near 1 (clean);
    GPT-2 scored at shifted positions 0.078; top_p 0.9 a sequence ratio of 0.15; weights that stopped reaching vLLM."""
    def run(diff, ratio):
        return _merge(_curve("sampling/sampling_logp_difference/mean", diff),
                      _curve("sampling/importance_sampling_ratio/mean", ratio))

    clean = run([0.044 + 0.002 * (i % 3) for i in range(12)], [1.01] * 12)
    shifted = run([0.078] * 12, [0.90] * 12)
    truncated = run([0.105] * 12, [0.15] * 12)
    stale = run([0.01 * (1 + i) for i in range(12)], [1.0] * 12)
    assert kinds(clean) == set()
    assert kinds(shifted) == {"sampler_mismatch"}
    (finding,), _ = diagnose(History(truncated), only=["sampler"])
    assert finding.subject == "sampling/importance_sampling_ratio/mean" and "top_p" in finding.message
    assert kinds(stale) == {"sampler_mismatch", "sampler_drift"}
    _, skipped = diagnose(History(_curve("reward", [0.1] * 12)))
    assert "sampling/sampling_logp_difference/mean" in skipped["sampler"]  # a run without vLLM: skipped, named


def test_the_clipping_finding_does_not_blame_vllms_sampler():
    entries = _curve("clip_ratio/region_mean", [0.3] * 12)
    (finding,), _ = diagnose(History(entries), only=["clipping"])
    assert "cannot show here" in finding.message and "sampler_mismatch" in finding.message


def test_spikes_come_back_down_and_a_rising_start_is_no_spike():
    g = [1.0 + 0.05 * math.sin(i) for i in range(30)]
    g[20] = 9.0
    assert kinds(_curve("grad_norm", g)) == {"grad_spike"}
    kl = [0.001 * i for i in range(30)]
    kl[15] = 0.2
    assert kinds(_curve("kl", kl)) == {"kl_spike"}
    assert kinds(_curve("kl", [0.0, 1e-4, 3e-4, 1e-3, 2e-3] + [2e-3 + 1e-5 * i for i in range(25)])) == set()


def test_nonfinite_and_grad_growth():
    assert kinds(_curve("loss", [0.1] * 9 + [float("nan")])) == {"nonfinite"}
    assert kinds(_curve("grad_norm", [0.5 * 1.3 ** i for i in range(30)])) == {"grad_growth"}


def test_a_nan_gradient_with_a_finite_loss_is_named_as_a_kernel_fault_apart_from_a_nan_loss():
    nan = float("nan")
    grad = [0.5] * 12
    grad[2] = nan
    kernel = _merge(_curve("loss", [0.1] * 12), _curve("grad_norm", grad))
    (f,), _ = diagnose(History(kernel), only=["nonfinite"])
    assert (f.kind, f.subject, f.values["cause"]) == ("nonfinite", "grad_norm", "gradient")
    assert "finite loss" in f.title and "cuDNN" in f.message and "pytorch/pytorch#196678" in f.message
    assert "no_fully_masked_rows" in f.message and "enable_cudnn_sdp(False)" in f.message
    # the same NaN gradient with a NaN loss: the data, the step size or an overflow, not a kernel
    loss = [0.1] * 12
    loss[2] = nan
    found, _ = diagnose(History(_merge(_curve("loss", loss), _curve("grad_norm", grad))), only=["nonfinite"])
    assert {f.subject for f in found} == {"loss", "grad_norm"}
    assert all(f.values["cause"] == "loss" and "cuDNN" not in f.message for f in found)
    assert "learning_rate" in found[0].message
    # skipped by rookgrpo's guard (skipped_updates rose at that step) and finite after: a warning, the weights safe
    skipped = _merge(kernel, _curve("skipped_updates", [0, 0] + [1] * 10))
    (f,), _ = diagnose(History(skipped), only=["nonfinite"])
    assert f.severity == "warning" and f.values["skipped"] and "skipped those updates" in f.message
    # ... but a logged NaN loss the guard counted is not a kernel's
    counted = _merge(skipped, _curve("skipped_updates/nonfinite_loss", [0, 0] + [1] * 10))
    (f,), _ = diagnose(History(counted), only=["nonfinite"])
    assert f.values["cause"] == "loss" and "cuDNN" not in f.message


def test_the_kl_gradient_meter_reports_nan_for_shares_it_cannot_compute(tiny_model_dir, smoke_dataset, tmp_path):
    """A NaN gradient (or a zero one) has no share or cosine: NaN, never 0."""
    import torch

    from rookgrpo.dynamics.kl_grad import KLGradMeter

    args = tiny_grpo_args(tmp_path, beta=0.05, max_steps=1, max_grad_norm=0.0)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=["uci_charset"], args=args,
                              train_dataset=smoke_dataset)
    meter = KLGradMeter(trainer)
    for fill in (float("nan"), 0.0):
        for p in meter.params:
            p.grad = torch.full_like(p, fill)
        meter.measuring, meter._kl = True, [torch.full_like(p, fill) for p in meter.params]
        values = meter.finish()
        assert math.isnan(values["loss/kl_grad_share"]) and math.isnan(values["grad/kl_policy_cos"]), fill


def test_an_fp16_runs_loss_scaler_overflows_are_routine_not_a_kernel_fault(tmp_path):
    """The GradScaler's first steps overflow (inf grad_norm, finite loss) while it finds its scale: in an fp16 run
    (run_info.json's precision, or the live callback's) that is an info finding, not the kernel fault, and halt_on
    ignores it; overflows that go on to the end are a warning; without the precision, the kernel finding stands."""
    inf = float("inf")
    grad = [inf, inf, inf] + [0.5] * 9
    entries = _merge(_curve("loss", [0.1] * 12), _curve("grad_norm", grad))
    (plain,), _ = diagnose(History(entries), only=["nonfinite"])
    assert plain.values["cause"] == "gradient" and "cuDNN" in plain.message
    (f,), _ = diagnose(History(entries), Thresholds(precision="fp16"), only=["nonfinite"])
    assert (f.severity, f.values["cause"]) == ("info", "loss_scale") and "cuDNN" not in f.message
    assert "loss scaler" in f.title and "routine" in f.message
    (f,), _ = diagnose(History(_merge(_curve("loss", [0.1] * 12), _curve("grad_norm", [0.5] * 9 + [inf] * 3))),
                       Thresholds(precision="fp16"), only=["nonfinite"])
    assert f.severity == "warning" and "use bf16 over fp16" in f.message
    run = tmp_path / "run"
    run.mkdir()
    (run / "trainer_state.json").write_text(json.dumps({"log_history": entries}))
    (run / "run_info.json").write_text(json.dumps({"precision": "fp16"}))
    assert load_history(run).precision == "fp16"
    (f,), _ = diagnose(load_history(run), only=["nonfinite"])
    assert f.severity == "info"


def test_components_dead_or_carrying_everything_with_the_recipes_weights():
    entries = _merge(*[_curve(f"rewards/{n}/std", [s] * 12) for n, s in (("a", 0.5), ("b", 0.4), ("c", 0.01))])
    findings, _ = diagnose(History(entries))
    assert [(f.kind, f.subject) for f in findings] == [("reward_dead", "c")]
    findings, _ = diagnose(History(entries), Thresholds(reward_weights={"a": 1.0, "b": 0.1, "c": 1.0}))
    assert {(f.kind, f.subject) for f in findings} == {("reward_dead", "b,c"), ("reward_dominant", "a")}


def test_heldout_drop_beyond_noise_only():
    noisy = _curve("heldout/acc", [0.30, 0.26, 0.31, 0.27, 0.30, 0.26, 0.29, 0.27], start=0)
    falling = _curve("heldout/acc", [0.30, 0.29, 0.27, 0.26, 0.24, 0.22, 0.21, 0.19], start=0)
    rising_loss = _curve("eval_loss", [1.0, 1.02, 1.05, 1.07, 1.1, 1.13, 1.15, 1.2], start=0)
    assert kinds(noisy) == set()
    assert kinds(falling) == {"heldout_drop"}
    assert kinds(rising_loss) == {"heldout_drop"}  # lower is better for a loss
    # an eval copy of a training diagnostic is not a held-out quality metric
    assert kinds(_curve("eval_entropy", [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3], start=0)) == set()


def test_kl_dominates_keyed_to_the_gradient_share_not_the_loss_share():
    share = _merge(_curve("loss/kl_grad_share", [0.7, 0.8, 0.75, 0.9]), _curve("loss/kl_share", [0.2] * 4))
    assert kinds(share) == {"kl_dominates"}
    assert kinds(_merge(_curve("loss/kl_grad_share", [0.1, 0.2, 0.1, 0.15]), _curve("loss/kl_share", [0.95] * 4))) == set()


def test_skipped_detectors_name_the_metric_they_needed():
    _, skipped = diagnose(History(_curve("reward", [0.1] * 5)))
    assert "needs loss/kl_grad_share" in skipped["kl_dominates"]
    assert "needs heldout/* or eval_*" in skipped["heldout"] and "rewards/*/std" in skipped["reward_components"]
    _, skipped = diagnose(History(_merge(_curve("reward", [0.1] * 5), _curve("eval_loss", [1.0] * 5),
                                         _curve("rewards/a/std", [0.1] * 5))))
    assert "heldout" not in skipped and "reward_components" not in skipped


# ---- real runs built to fail ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def scenario_runs(tiny_model_dir, tmp_path_factory):
    """Each scenario's log history (30 steps each), run once for the module."""
    out = tmp_path_factory.mktemp("doctor-scenarios")
    return {name: scenarios.run_scenario(name, tiny_model_dir, out / name, steps=30)
            for name in ("healthy", "constant", "constant-kl", "plateau-judge", "diverging", "length", "heldout-drop")}


@pytest.mark.parametrize("name", ["healthy", "constant", "constant-kl", "plateau-judge", "diverging", "length",
                                  "heldout-drop"])
def test_each_failure_is_named_and_a_healthy_run_gives_none(scenario_runs, name):
    import trl
    from packaging.version import Version

    if name == "length" and Version(trl.__version__) < Version("1.11"):
        pytest.skip("TRL 1.10 ends a completion at the tokenizer's eos only; the scenario stops at digits too")
    found = kinds(scenario_runs[name])
    expected = set(scenarios.LABELS[name])
    if not expected:
        assert found == set()
    else:
        assert expected <= found, f"{name}: expected {expected}, found {found}"


# ---- the KL gradient --------------------------------------------------------------------------------------------

def _constant_kl_trainer(tiny_model_dir, smoke_dataset, tmp_path, every=1, **overrides):
    from doctor_probe import PerturbPolicy, constant_reward

    lora = overrides.pop("lora", False)
    args = tiny_grpo_args(tmp_path, beta=0.05, max_steps=4, **overrides)
    kwargs = {}
    if lora:
        from peft import LoraConfig

        kwargs["peft_config"] = LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], task_type="CAUSAL_LM")
        kwargs["eval_dataset"] = smoke_dataset.select(range(8))
    doctor = Doctor(kl_grad_every=every, report=None)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=[scenarios.constant_reward], args=args,
                              train_dataset=smoke_dataset, callbacks=[doctor, PerturbPolicy()], **kwargs)
    return trainer


KL_LAYOUTS = {
    "default": {},
    "clipped-dr_grpo": {"max_grad_norm": 1e-3, "loss_type": "dr_grpo"},
    "buffered-batches-grpo": {"steps_per_generation": 2, "num_iterations": 2, "gradient_accumulation_steps": 2,
                              "loss_type": "grpo"},
    "lora-with-evaluation": {"lora": True, "eval_strategy": "steps", "eval_steps": 1, "per_device_eval_batch_size": 8},
}


@pytest.mark.parametrize("layout", list(KL_LAYOUTS))
def test_kl_gradient_is_the_whole_gradient_when_every_advantage_is_zero(tiny_model_dir, smoke_dataset, tmp_path,
                                                                         layout, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "tests" / "assets"))
    trainer = _constant_kl_trainer(tiny_model_dir, smoke_dataset, tmp_path, **KL_LAYOUTS[layout])
    trainer.train()
    logs = [h for h in trainer.state.log_history if "grad/kl_norm" in h]
    assert len(logs) >= 3
    for h in logs:
        assert h["grad_norm"] > 1e-6  # the perturbed policy is off its reference: the KL term has a gradient
        # the KL term is the loss's only term with a gradient: the meter's part must be all of it, to float error
        assert h["grad/kl_norm"] == pytest.approx(h["grad_norm"], rel=1e-3)
        assert h["grad/policy_norm"] <= 1e-3 * h["grad/kl_norm"]
        assert h["loss/kl_grad_share"] == pytest.approx(1.0, abs=1e-3)
    assert isinstance(trainer.beta, float)


def test_measuring_changes_nothing_in_training(tiny_model_dir, smoke_dataset, tmp_path):
    from conftest import losses_and_rewards

    runs = []
    for callbacks in ([], [Doctor(kl_grad_every=1, report=None)]):
        args = tiny_grpo_args(tmp_path / str(len(runs)), beta=0.05, max_steps=3)
        trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=["uci_charset"], args=args,
                                  train_dataset=smoke_dataset, callbacks=callbacks)
        trainer.train()
        runs.append(trainer.state.log_history)
    assert losses_and_rewards(runs[0]) == losses_and_rewards(runs[1])
    measured = [h for h in runs[1] if "loss/kl_grad_share" in h]
    assert len(measured) == 3
    assert all(0 < h["loss/kl_grad_share"] < 1 and -1 <= h["grad/kl_policy_cos"] <= 1 for h in measured)


@pytest.mark.distributed
def test_kl_gradient_on_two_processes(tmp_path):
    recipe = write_recipe(tmp_path / "r.yaml", max_steps=3, beta=0.05,
                          reward_funcs=[str(REPO / "tests/assets/doctor_probe.py") + ":constant_reward"],
                          callbacks=[{"doctor": {"kl_grad_every": 1}}, "doctor_probe.PerturbPolicy",
                                     "doctor_probe.LogProbe"])
    ranks = launch_two_cpu_processes(recipe, tmp_path / "probe")
    per_rank = [[h for h in logs if "grad/kl_norm" in h] for logs in ranks]
    assert len(per_rank[0]) == 3
    for h in per_rank[0]:
        assert h["grad_norm"] > 1e-4
        assert h["grad/kl_norm"] == pytest.approx(h["grad_norm"], rel=1e-3)
        assert h["grad/policy_norm"] <= 1e-3 * h["grad/kl_norm"]
    keys = ("grad_norm", "grad/kl_norm", "grad/policy_norm", "loss/kl_grad_share")
    # the measured KL gradient is averaged over processes, as DDP averages .grad: every rank logs the same numbers
    assert [[h[k] for k in keys] for h in per_rank[0]] == [[h[k] for k in keys] for h in per_rank[1]]


@pytest.mark.distributed
@pytest.mark.slow
def test_a_finding_one_rank_sees_alone_halts_every_rank_at_the_same_step(tmp_path):
    """Rank 1 alone logs a recompile (compile/graphs is a rank's own count): with halt_on: [recompile] every rank
    stops at the same step. A rank stopping alone would leave the other waiting in the next step's collectives."""
    recipe = write_recipe(tmp_path / "r.yaml", max_steps=6,
                          callbacks=[{"doctor": {"halt_on": ["recompile"], "kl_grad_every": 0}},
                                     "doctor_probe.RecompileOnOneRank", "doctor_probe.LogProbe"])
    ranks = launch_two_cpu_processes(recipe, tmp_path / "probe", timeout=240)
    last = [max(h["step"] for h in logs) for logs in ranks]
    # rank 1 logs compile/graphs from step 2; the detector counts compiles after the first logged one: step 3
    assert last == [3, 3]
    assert not any("compile/graphs" in h for h in ranks[0])  # rank 0 never saw it itself


# ---- the live callback ------------------------------------------------------------------------------------------

def test_live_findings_warned_once_and_halt_on_saves_and_stops(tiny_model_dir, tmp_path, caplog):
    halt = Doctor(halt_on=["zero_gradient"], kl_grad_every=0)
    with caplog.at_level(logging.WARNING, logger="rookgrpo.doctor"):
        scenarios.run_scenario("constant", tiny_model_dir, tmp_path / "run", steps=30, callbacks=[halt])
    state = halt.trainer.state
    assert state.global_step < 30
    assert (tmp_path / "run" / f"checkpoint-{state.global_step}").is_dir()
    warned = [r.getMessage() for r in caplog.records if "zero_gradient" in r.getMessage() or "exactly-zero" in r.getMessage()]
    assert sum("exactly-zero gradient" in m and "stopping the run" not in m for m in warned) == 1
    assert any("stopping the run" in m for m in warned)
    report = json.loads((tmp_path / "run" / "doctor.json").read_text())
    assert report["halted_on"] == "zero_gradient:grad_norm"
    assert "zero_gradient" in {f["kind"] for f in report["findings"]}


def test_bad_config_is_refused_with_the_field_named():
    with pytest.raises(ConfigError, match="halt_on"):
        resolve_callback({"doctor": {"halt_on": ["exploding"]}})
    with pytest.raises(ConfigError, match="thresholds"):
        resolve_callback({"doctor": {"thresholds": {"entropy_fall": 0.3}}})


# ---- after the fact ---------------------------------------------------------------------------------------------

def test_cli_reads_a_vanilla_trl_run(tiny_model_dir, smoke_dataset, tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir=str(tmp_path / "vanilla"), use_cpu=True, bf16=False, report_to="none",
                      learning_rate=1e-2, max_steps=12, per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=8, logging_steps=1, save_strategy="steps", save_steps=12,
                      disable_tqdm=True, beta=0.0)
    GRPOTrainer(model=str(tiny_model_dir), reward_funcs=[scenarios.constant_reward], args=args, train_dataset=smoke_dataset,
                callbacks=[Doctor()]).train()
    # live on a plain TRL trainer too: its findings in doctor.json
    live = json.loads((tmp_path / "vanilla" / "doctor.json").read_text())
    assert "zero_gradient" in {f["kind"] for f in live["findings"]}
    start = time.perf_counter()
    proc = run_cli([venv_bin("rookgrpo"), "doctor", str(tmp_path / "vanilla"), "--plot", str(tmp_path / "d.png")])
    seconds = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr
    assert "zero_gradient" in proc.stdout and "checkpoint-12/trainer_state.json" in proc.stdout
    assert (tmp_path / "d.png").stat().st_size > 10_000
    assert seconds < 5
    proc = run_cli([venv_bin("rookgrpo"), "doctor", str(tmp_path / "vanilla"), "--json", "--strict"])
    assert proc.returncode == 1
    assert "zero_std" in {f["kind"] for f in json.loads(proc.stdout)["findings"]}
    assert load_history(tmp_path / "vanilla" / "checkpoint-12" / "trainer_state.json").last_step == 12


def test_cli_names_what_it_looked_for(tmp_path):
    proc = run_cli([venv_bin("rookgrpo"), "doctor", str(tmp_path)])
    assert proc.returncode == 2
    assert "no training log in" in proc.stderr and "trainer_state.json" in proc.stderr
    (tmp_path / "notes.txt").write_text("hello\n")  # a file that is no log: one line naming what it looked for
    proc = run_cli([venv_bin("rookgrpo"), "doctor", str(tmp_path / "notes.txt")])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "no training log found in it" in proc.stderr and "CSV export" in proc.stderr


def test_every_kind_is_declared_and_documented():
    import re

    from rookgrpo.doctor.detectors import KINDS

    source = "".join(p.read_text() for p in sorted((REPO / "src/rookgrpo/doctor/detectors").glob("*.py")))
    emitted = set(re.findall(r'Finding\(\s*"([a-z_]+)"', source))
    assert emitted == set(KINDS)
    doc = (REPO / "docs" / "doctor.md").read_text()
    assert [k for k in KINDS if f"| `{k}` |" not in doc] == []


def test_tensorboard_logs_are_read_or_the_missing_package_is_named(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "events.out.tfevents.1.host").write_bytes(b"")
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="pip install tensorboard"):
            load_history(tmp_path)
    else:
        assert load_history(tmp_path).entries == []


def test_tensorboard_runs_under_one_folder_are_read_one_by_one_newest_last(tmp_path):
    """transformers writes each run's events to runs/%b%d_%H-%M-%S_host: two runs under one folder are two histories,
    ordered by when they ran (the folder names sort 'Dec' before 'Nov'), never one log merged by step."""
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    from rookgrpo.doctor.history import load_histories

    for folder, rewards, wall in (("Nov30_10-00-00_host", [0.1, 0.2, 0.3], 1_700_000_000),
                                  ("Dec01_10-00-00_host", [0.9, 0.8, 0.7, 0.6], 1_700_100_000)):
        writer = SummaryWriter(str(tmp_path / "runs" / folder))
        for step, value in enumerate(rewards, 1):
            writer.add_scalar("train/reward", value, step, walltime=wall + step)
        writer.close()
    older, newer = load_histories(tmp_path)
    assert older.curve("reward") == ([1, 2, 3], pytest.approx([0.1, 0.2, 0.3]))
    assert newer.curve("reward") == ([1, 2, 3, 4], pytest.approx([0.9, 0.8, 0.7, 0.6]))
    assert "Dec01" in newer.source and "TensorBoard run 2 of 2" in newer.source
    assert load_history(tmp_path).curve("reward")[1] == pytest.approx([0.9, 0.8, 0.7, 0.6])  # the newest run


def test_flat_groups_split_into_all_pass_and_all_fail(tiny_model_dir, tmp_path):
    """Prompts of even rows earn 1 whatever the completion, odd rows 0: every group is flat, at the best reward seen
    (all pass) or at the worst (all fail), so the two shares add up to 1 in every batch."""
    from conftest import write_flat_data
    from rookgrpo.callbacks import Diagnostics
    from rookgrpo.data import load_recipe_dataset

    def by_row(completions, signal, **kwargs):
        return [1.0 if s else 0.0 for s in signal]

    dataset = load_recipe_dataset(str(write_flat_data(tmp_path / "flat.jsonl", 32)))
    args = tiny_grpo_args(tmp_path / "out", max_steps=6, beta=0.0)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=[by_row], args=args, train_dataset=dataset,
                              callbacks=[Diagnostics()])
    trainer.train()
    logs = [h for h in trainer.state.log_history if "groups/flat_best_frac" in h]
    assert logs
    assert all(h["groups/flat_best_frac"] + h["groups/flat_worst_frac"] == pytest.approx(1.0) for h in logs)
    assert any(h["groups/flat_best_frac"] > 0 for h in logs) and any(h["groups/flat_worst_frac"] > 0 for h in logs)


def test_older_trl_names_and_wandb_exports_are_read(tmp_path, monkeypatch):
    """TRL before 0.17 logged completion_length, one clip_ratio and rewards/<name> without /mean; a W&B export
    prefixes train/ and eval/. The doctor reads them as today's names (docs/doctor.md's table), so the length and
    component detectors run on such a log instead of saying the metric was not logged."""
    lengths = [20.0 * 1.08 ** s for s in range(30)]  # lengthening: 20 -> 186 tokens
    old = [{"step": s + 1, "completion_length": v, "rewards/fmt": 0.5, "rewards/acc": 0.1 * (s % 3),
            "reward": 0.3 + 0.01 * s, "reward_std": 0.1, "clip_ratio": 0.0} for s, v in enumerate(lengths)]
    findings, skipped = diagnose(History(old))
    assert "length" not in skipped and "clipping" not in skipped
    assert "length_hacking" in {f.kind for f in findings}
    assert History(old).curve("rewards/acc/mean")[1][:3] == [0.0, 0.1, 0.2]
    log = tmp_path / "wandb.jsonl"
    log.write_text("\n".join(json.dumps({"train/global_step": e["step"], "train/completion_length":
                                         e["completion_length"], "train/reward": 0.6, "eval/loss": 1.0})
                             for e in old) + "\n")
    history = load_history(log)
    assert history.curve("completions/mean_length") == ([e["step"] for e in old], lengths)
    assert history.curve("eval_loss")[1] == [1.0] * 30 and history.curve("reward")[1] == [0.6] * 30


def test_plot_without_matplotlib_is_a_one_line_error(tmp_path, monkeypatch):
    import builtins

    from rookgrpo.doctor.report import plot_findings

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(ConfigError, match=r"rookgrpo doctor --plot draws with matplotlib.*pip install matplotlib"):
        plot_findings(History(_curve("reward", [0.1] * 10)), [], tmp_path / "x.png")


def _severities(entries) -> dict[str, str]:
    findings, _ = diagnose(History(entries))
    return {f.kind: f.severity for f in findings}


def test_severity_says_whether_the_run_is_broken_now():
    """critical: the run is not learning or is broken (a NaN that persists, a gradient of 0 at every step, no group
    ever with a reward spread); warning: an isolated NaN gradient norm in a run that carried on (the loss stayed finite
    after it: the step was skipped), some zero-gradient steps, most groups flat."""
    nan = float("nan")
    carried_on = _merge(_curve("grad_norm", [0.5] * 10 + [nan] + [0.5] * 19), _curve("loss", [0.1] * 30))
    assert _severities(carried_on) == {"nonfinite": "warning"}
    persists = _merge(_curve("grad_norm", [0.5] * 10 + [nan] * 20), _curve("loss", [0.1] * 10 + [nan] * 20))
    assert _severities(persists) == {"nonfinite": "critical"}
    last = _merge(_curve("grad_norm", [0.5] * 29 + [nan]), _curve("loss", [0.1] * 30))  # nothing after it to judge
    assert _severities(last) == {"nonfinite": "critical"}
    assert _severities(_curve("grad_norm", [0.0] * 10))["zero_gradient"] == "critical"
    assert _severities(_curve("grad_norm", [0.0, 0.3] * 5))["zero_gradient"] == "warning"
    assert _severities(_curve("frac_reward_zero_std", [1.0] * 10))["zero_std"] == "critical"
    assert _severities(_curve("frac_reward_zero_std", [1.0, 0.75] * 5))["zero_std"] == "warning"


def test_components_logged_but_weighted_zero_are_not_dead(tmp_path):
    """TRL logs every reward function, weighted 0 or not. Where the logged reward is exactly one component (the
    others weighted 0), the weights are read off the log and the zero-weight component is not 'dead'; without that,
    `rookgrpo doctor --reward-weights` takes them."""
    import random

    rng = random.Random(0)
    entries = []
    for s in range(1, 21):
        a, b = rng.random(), 0.5 + 0.001 * rng.random()
        entries.append({"step": s, "reward": a, "reward_std": 0.2, "rewards/acc/mean": a, "rewards/acc/std": 0.3,
                        "rewards/fmt/mean": b, "rewards/fmt/std": 0.0001, "rewards/len/mean": 2 * a,
                        "rewards/len/std": 0.6})
    from rookgrpo.doctor.detectors import infer_reward_weights

    assert infer_reward_weights(History(entries)) == {}  # len = 2 acc on every step: the log does not tell them apart
    assert infer_reward_weights(History([{k: v for k, v in e.items() if not k.startswith("rewards/len")}
                                         for e in entries])) == {"acc": 1.0, "fmt": 0.0}
    two = [{k: v for k, v in e.items() if not k.startswith("rewards/len")} for e in entries]
    assert "reward_dead" not in kinds(two)  # fmt is logged, weighted 0: not in the reward at all
    noisy = [{**e, "reward": e["reward"] + 0.01 * (e["step"] % 3)} for e in two]  # weights not determined by the log
    assert "reward_dead" in kinds(noisy)
    state = tmp_path / "trainer_state.json"
    state.write_text(json.dumps({"log_history": noisy}))
    proc = run_cli([venv_bin("rookgrpo"), "doctor", str(state), "--json", "--reward-weights", "acc=1", "fmt=0"])
    assert "reward_dead" not in {f["kind"] for f in json.loads(proc.stdout)["findings"]}
    proc = run_cli([venv_bin("rookgrpo"), "doctor", str(state), "--reward-weights", "acc"])
    assert proc.returncode == 2 and "--reward-weights: expected NAME=W" in proc.stderr


def _finding(entries, kind):
    findings, _ = diagnose(History(entries))
    return next((f for f in findings if f.kind == kind), None)


def test_held_out_changes_are_judged_by_size_as_well_as_noise():
    """A steady drift beyond noise but under the size that matters is info; a symptom (NLL, one move's share) that
    moves a lot is a warning; a quality rate that falls by more than 0.03 is critical."""
    drift = _curve("heldout/nll_P", [1.250 + 0.0012 * i for i in range(11)], start=0)  # +0.8% over the run
    f = _finding(drift, "heldout_drop")
    assert f is not None and f.severity == "info" and "under the 0.05 (relative) that matters" in f.message
    share = _curve("heldout/top_move_share", [0.104, 0.12, 0.14, 0.15, 0.17, 0.19, 0.2, 0.208], start=0)
    assert _finding(share, "heldout_drop").severity == "warning"
    accuracy = _curve("heldout/best_move_accuracy", [0.30, 0.29, 0.27, 0.26, 0.24, 0.22, 0.21, 0.19], start=0)
    assert _finding(accuracy, "heldout_drop").severity == "critical"


def test_a_guarded_grpo_run_is_not_told_to_add_the_guard():
    """A GRPO run whose held-out format falls: without rookgrpo's guard the fix names it; with the guard logged, the
    fix says the run already ends with its best score's weights, and which step's."""
    reward = _curve("reward", [0.5 + 0.01 * math.sin(i) for i in range(1, 41)])
    flat = _curve("frac_reward_zero_std", [0.2] * 40)
    fmt = [0.92, 0.89, 0.83, 0.75, 0.60, 0.54, 0.55, 0.49, 0.49]
    evals = [{"step": 5 * i, "heldout/format_rate": v} for i, v in enumerate(fmt)]
    plain = _finding(_merge(reward, flat, evals), "heldout_drop")
    assert plain.severity == "critical" and "add heldout_guard (ends the run" in plain.message
    guard = [{"step": 5 * i, "heldout_guard/score": v} for i, v in enumerate(fmt)]
    end = [{"step": 40, "heldout_guard/best_step": 0, "heldout_guard/restored": 1}]
    guarded = _finding(_merge(reward, flat, evals, guard, end), "heldout_drop")
    assert guarded.severity == "critical" and "add heldout_guard" not in guarded.message
    assert "already ends it with the weights of its best held-out score (step 0's)" in guarded.message


@pytest.mark.parametrize("kind, reward", [
    ("reward_decline", [0.8 - 0.015 * max(i - 10, 0) + 0.01 * (-1) ** i for i in range(40)]),
    ("reward_peak_fall", [0.2 + 0.5 * math.sin(math.pi * min(i, 18) / 18) + 0.02 * (-1) ** i for i in range(40)]),
])
def test_the_training_reward_findings_say_what_a_guarded_run_already_does(kind, reward):
    """The training reward's fall names heldout_guard as a fix only where the run does not log one; a guarded run is
    told which step's weights its guard ends with."""
    base = _merge(_curve("reward", reward), _curve("reward_std", [0.2] * 40))
    plain = _finding(base, kind)
    assert plain is not None and "add heldout_guard (ends the run" in plain.message
    guard = [{"step": 10 * i, "heldout_guard/score": 0.9 - 0.01 * i} for i in range(1, 4)]
    guarded = _finding(_merge(base, guard, [{"step": 40, "heldout_guard/best_step": 10}]), kind)
    assert guarded is not None and "add heldout_guard" not in guarded.message
    assert "heldout_guard already ends it with the weights of its best held-out score (step 10's)" in guarded.message


def test_an_sft_log_gets_no_grpo_advice_and_overfitting_is_judged_from_the_best_evaluation():
    """An SFT log: loss and token accuracy, an eval loss that falls, bottoms out and rises (still below its first
    value, so a first-against-last rule misses it); a gradient spike gets generic advice."""
    loss = _curve("loss", [2.0 - 0.05 * i for i in range(30)])
    acc = _curve("mean_token_accuracy", [0.4 + 0.01 * i for i in range(30)])
    g = [1.0 + 0.05 * math.sin(i) for i in range(30)]
    g[20] = 9.0
    evals = [{"step": s, "eval_loss": v} for s, v in zip(range(3, 31, 3), [1.9, 1.7, 1.55, 1.5, 1.48, 1.5, 1.56,
                                                                           1.62, 1.68, 1.75])]
    entries = _merge(loss, acc, _curve("grad_norm", g), evals)
    history = History(entries)
    assert history.kind == "sft"
    findings, skipped = diagnose(history)
    assert {f.kind for f in findings} == {"grad_spike", "heldout_drop"}
    assert "this log is sft" in skipped["reward_trend"]
    spike = next(f for f in findings if f.kind == "grad_spike")
    assert "advantage" not in spike.message and "scale_rewards" not in spike.message
    drop = next(f for f in findings if f.kind == "heldout_drop")
    assert drop.severity == "critical" and drop.values["reference_step"] == 15 and "after its best" in drop.message
    assert "overfitting" in drop.message and "heldout_guard" not in drop.message


def test_a_kl_spike_must_be_large_enough_to_matter():
    small = [0.002 + 1e-5 * i for i in range(30)]
    small[15] = 0.08  # 40x the median, harmless in size
    assert kinds(_curve("kl", small)) == set()
    large = list(small)
    large[15] = 0.4
    assert kinds(_curve("kl", large)) == {"kl_spike"}


def test_gradient_spikes_at_the_steps_with_signal_are_read_against_the_flat_share():
    g = [1.0 + 0.05 * math.sin(i) for i in range(30)]
    flat = [1.0] * 30
    for i in (8, 20):
        g[i], flat[i] = 9.0, 0.5  # the only steps with a non-flat group
    f = _finding(_merge(_curve("grad_norm", g), _curve("frac_reward_zero_std", flat)), "grad_spike")
    assert f.severity == "info" and "Not a learning-rate problem" in f.message
    f = _finding(_curve("grad_norm", g), "grad_spike")
    assert f.severity == "warning" and "lower learning_rate" in f.message


def test_a_reward_that_rose_and_fell_back_and_a_plateau_after_an_early_gain():
    # Up to 0.7 by a quarter of the run, back to its start by the half, then flat: the second half does not fall
    # (no decline) and there is no net trend (the plateau rule alone would call it flat).
    rise_fall = [0.2 + 0.5 * math.sin(math.pi * min(i, 18) / 18) + 0.02 * (-1) ** i for i in range(40)]
    entries = _merge(_curve("reward", rise_fall), _curve("reward_std", [0.2] * 40))
    assert kinds(entries) == {"reward_peak_fall"}
    early_gain = [min(0.2 + 0.03 * i, 0.8) + 0.01 * (-1) ** i for i in range(60)]
    f = _finding(_merge(_curve("reward", early_gain), _curve("reward_std", [0.2] * 60)), "reward_plateau")
    assert f is not None and f.title == "training reward flat after an early gain"
    steady = [0.2 + 0.01 * i + 0.01 * (-1) ** i for i in range(60)]
    assert not {"reward_plateau", "reward_peak_fall"} & kinds(_merge(_curve("reward", steady),
                                                                      _curve("reward_std", [0.2] * 60)))


def test_an_info_finding_never_halts_a_run():
    from types import SimpleNamespace

    cb = Doctor(halt_on=["heldout_drop"])
    drift = _merge(_curve("loss", [0.5] * 11, start=0), _curve("heldout/nll_P", [1.25 + 0.0012 * i for i in range(11)],
                                                                start=0))
    state = SimpleNamespace(log_history=drift, is_world_process_zero=True, global_step=10)
    control = SimpleNamespace(should_training_stop=False, should_save=False)
    cb.on_log(None, state, control, logs={"loss": 0.5})
    assert cb.reported["heldout_drop:heldout/nll_P"]["severity"] == "info"
    assert not control.should_training_stop and cb.halted is None


def test_one_high_evaluation_is_not_a_best_to_fall_from():
    """make train's validation top-5 (96 rows, steps of 1/96): one evaluation 3 rows above the rest, then back where
    it started. The maximum of noisy values is optimistic; the mean around it is what the run fell from: nothing."""
    top5 = [0.3333, 0.3333, 0.3646, 0.3333, 0.3229, 0.3333, 0.3229, 0.3333, 0.3333, 0.3333, 0.3333]
    assert _finding([{"step": 20 * i, "heldout/top5_accuracy": v} for i, v in enumerate(top5)], "heldout_drop") is None


def test_what_diagnostics_measures_is_judged_here_one_finding_each():
    """One layer judges: the numbers diagnostics logs (identical groups, tokens in the loss, recompiles) and TRL's
    per-reward spread are findings of the doctor, with the severity the run's state calls for."""
    assert _severities(_curve("groups/identical_frac", [1.0] * 6)) == {"identical_groups": "critical"}
    assert _severities(_curve("groups/identical_frac", [0.75, 0.5] * 3)) == {"identical_groups": "warning"}
    assert _severities(_curve("groups/identical_frac", [0.25] * 6)) == {}
    assert _severities(_curve("completions/loss_tokens", [40.0, 0.0, 40.0])) == {"no_loss_tokens": "warning"}
    assert _severities(_curve("completions/loss_tokens", [0.0] * 4)) == {"no_loss_tokens": "critical"}
    assert _severities(_curve("compile/graphs", [3.0, 0.0, 0.0, 2.0])) == {"recompile": "warning"}
    assert _severities(_curve("compile/graphs", [3.0, 0.0, 0.0, 0.0])) == {}  # the first step's compile is warm-up


def test_a_reward_that_scores_every_completion_alike_is_named_as_a_judge_or_a_rule():
    """rewards/<name>/std exactly 0 at half the logged points or more: a rule's causes, a judge's, or both where the
    log does not say which rewards are judges; the only reward flat everywhere is critical. The collapsed component
    is not named a second time as dead."""
    flat = [{"step": s, "rewards/judge/mean": 0.5, "rewards/judge/std": 0.0} for s in range(1, 7)]
    as_judge, _ = diagnose(History(flat), Thresholds(judges=("judge",)))
    as_rule, _ = diagnose(History(flat), Thresholds(judges=()))
    unknown, _ = diagnose(History(flat))
    assert [(f.kind, f.severity) for f in as_judge] == [("reward_collapsed", "critical")]
    assert "a judge (reward model)" in as_judge[0].message and "It is a rule" not in as_judge[0].message
    assert "It is a rule" in as_rule[0].message and "reward model" not in as_rule[0].message
    assert "for a rule" in unknown[0].message and "for a judge" in unknown[0].message
    two = [{**e, "rewards/acc/mean": 0.1 * (s % 3), "rewards/acc/std": 0.3 + 0.01 * s} for s, e in enumerate(flat * 2, 1)]
    two = [{**e, "step": s} for s, e in enumerate(two, 1)]
    found = {f.kind: f for f in diagnose(History(two), Thresholds(judges=()))[0]}
    assert found["reward_collapsed"].severity == "warning" and found["reward_collapsed"].subject == "judge"
    assert "reward_dead" not in found
    sometimes = [{**e, "rewards/judge/std": 0.0 if e["step"] % 3 == 0 else 0.2} for e in flat]  # 2 of 6: a rule's verdict now and then
    assert not diagnose(History(sometimes))[0]


def test_a_saturated_reward_is_named_where_it_is_the_whole_reward():
    """Scores spread by under 1/1000 of their magnitude: the only reward, or the combined reward; a saturated
    component beside others that vary is not (it carries no variance: reward_dead's)."""
    plateau = [{"step": s, "rewards/judge/mean": 50.0, "rewards/judge/std": 0.001, "reward": 50.0, "reward_std": 0.001}
               for s in range(1, 7)]
    found = diagnose(History(plateau))[0]
    assert [(f.kind, f.subject) for f in found] == [("reward_saturated", "judge")]
    assert "scale_rewards: none" in found[0].message
    beside = [{**e, "rewards/acc/mean": 0.1 * (e["step"] % 3), "rewards/acc/std": 0.3, "reward_std": 0.3,
               "reward": 50.0 + 0.1 * (e["step"] % 3)} for e in plateau]
    assert "reward_saturated" not in {f.kind for f in diagnose(History(beside))[0]}


def test_run_on_collapse_is_named_as_it_happens():
    """The selection benchmark's collapsed run (docs/dynamics.md): 0% cut off over 20 steps, 26% over 5, 73% over the
    last 2. The median of the last quarter is still under 50%, but the last two points are over it after a start of
    0: critical, named at the 27th step; a limit too short from the start is a warning."""
    cut = [0.0] * 20 + [0.26] * 5 + [0.73] * 2
    found = _finding(_curve("completions/clipped_ratio", cut), "truncation")
    assert found is not None and found.severity == "critical" and found.last_step == 27
    assert "never ends" in found.message and "step 26 is the first over 50%" in found.message
    assert _finding(_curve("completions/clipped_ratio", cut[:-1]), "truncation") is None  # one point over: not yet
    short = _finding(_curve("completions/clipped_ratio", [0.9] * 8), "truncation")
    assert short.severity == "warning" and "raise max_completion_length" in short.message


def test_the_cli_takes_which_rewards_are_judges_and_run_info_records_them(tmp_path):
    state = tmp_path / "trainer_state.json"
    state.write_text(json.dumps({"log_history": [{"step": s, "rewards/j/mean": 1.0, "rewards/j/std": 0.0}
                                                 for s in range(1, 7)]}))
    proc = run_cli([venv_bin("rookgrpo"), "doctor", str(state), "--json", "--judges", "j"])
    assert "a judge (reward model)" in json.loads(proc.stdout)["findings"][0]["message"]
    (tmp_path / "run_info.json").write_text(json.dumps({"reward_funcs": ["j"], "reward_weights": [1.0], "judges": []}))
    assert load_history(tmp_path).judges == ()
    assert "It is a rule" in diagnose(load_history(tmp_path), Thresholds(judges=load_history(tmp_path).judges))[0][0].message


# ---- every log form a user keeps ----------------------------------------------------------------------------------

def _grpo_log(n=12, start=1):
    return [{"step": s, "loss": 0.1, "reward": 0.2 + 0.01 * s, "grad_norm": 0.5, "frac_reward_zero_std": 0.0,
             "rewards/fmt/mean": 1.0, "rewards/fmt/std": 0.0, "rewards/acc/mean": 0.1 * (s % 3),
             "rewards/acc/std": 0.2} for s in range(start, start + n)]


def test_a_bare_json_list_of_logged_dicts_is_read(tmp_path):
    """What `json.dump(trainer.state.log_history, f)` writes, under any file name, and the run folder it sits in."""
    path = tmp_path / "my_run_log.json"
    path.write_text(json.dumps(_grpo_log() + [{"train_runtime": 10.0, "step": 12}]))
    history = load_history(path)
    assert len(history.entries) == 12 and history.curve("reward")[0] == list(range(1, 13))
    assert len(load_history(tmp_path).entries) == 12  # found in its folder by content, not name
    assert "reward_collapsed" in kinds(history.entries)  # and judged: fmt is the same at every step


def test_a_dict_holding_log_history_under_any_name_is_read(tmp_path):
    path = tmp_path / "training_log.json"
    path.write_text(json.dumps({"train_result": {"global_step": 12}, "log_history": _grpo_log()}))
    assert len(load_history(path).entries) == 12
    (tmp_path / "other.json").write_text(json.dumps({"config": {"lr": 1}}))
    with pytest.raises(ConfigError, match="without a log_history list"):
        load_history(tmp_path / "other.json")


def test_restarted_steps_are_phases_and_a_resume_is_stitched(tmp_path):
    from rookgrpo.doctor import load_histories

    two_runs = tmp_path / "two.json"
    two_runs.write_text(json.dumps(_grpo_log(12) + _grpo_log(8)))  # steps 1-12, then 1-8: a second run
    phases = load_histories(two_runs)
    assert [len(h.entries) for h in phases] == [12, 8]
    assert "2 phases, each judged on its own" in phases[0].note and "phase 2 of 2" in phases[1].source
    resumed = tmp_path / "resumed.json"
    resumed.write_text(json.dumps(_grpo_log(12) + _grpo_log(10, start=7)))  # resumed from step 6's checkpoint
    (history,) = load_histories(resumed)
    assert [e["step"] for e in history.entries] == list(range(1, 17))
    assert history.note.startswith("resumed at step 7: stitched")
    proc = run_cli([venv_bin("rookgrpo"), "doctor", str(two_runs)])
    assert proc.returncode == 0 and proc.stdout.count("rookgrpo doctor:") == 2 and "How the log was read" in proc.stdout


def test_csv_exports_of_wandb_and_tensorboard_are_read(tmp_path):
    wandb = tmp_path / "wandb_export.csv"
    rows = ["Step,run-7 - train/reward,run-7 - train/reward__MIN,run-7 - train/reward__MAX,run-7 - train/grad_norm"]
    rows += [f"{s},{0.1 * s},{0.0},{1.0},{0.5}" for s in range(1, 11)]
    wandb.write_text("\n".join(rows) + "\n")
    history = load_history(wandb)
    assert history.curve("reward") == (list(range(1, 11)), [pytest.approx(0.1 * s) for s in range(1, 11)])
    assert not any("__MIN" in k for k in history.names())
    tb = tmp_path / "run-.-tag-train_reward.csv"
    tb.write_text("Wall time,Step,Value\n" + "".join(f"1700000000.{s},{s},{0.2 * s}\n" for s in range(1, 9)))
    assert load_history(tb).curve("reward")[0] == list(range(1, 9))
    (tmp_path / "table.csv").write_text("name,value\na,1\n")
    with pytest.raises(ConfigError, match="no training log found"):
        load_history(tmp_path / "table.csv")


def test_a_log_too_short_to_judge_says_so_with_its_own_status(tmp_path):
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"log_history": _grpo_log(2)}))
    proc = run_cli([venv_bin("rookgrpo"), "doctor", str(tmp_path)])
    assert proc.returncode == 3, proc.stdout + proc.stderr  # not 0: "judged, no finding" is another answer
    assert "too few to judge: 2 log entries over 2 logged step(s)" in proc.stdout and "No finding" not in proc.stdout
    proc = run_cli([venv_bin("rookgrpo"), "doctor", str(tmp_path), "--json"])
    assert proc.returncode == 3 and json.loads(proc.stdout)["judged"] is False


# ---- constant components, spikes in context, eval loss from its best, advice against measured settings ------------

def test_a_component_constant_at_every_step_is_named_whatever_its_weight_and_key_names():
    old_names = [{"step": s, "reward": 0.3 + 0.01 * (s % 4), "rewards/format": 0.0, "rewards/correct": 0.1 * (s % 4)}
                 for s in range(1, 30)]  # TRL before 0.17: means only, no per-batch spread
    (f,), _ = diagnose(History(old_names), only=["reward_spread"])
    assert (f.kind, f.subject) == ("reward_collapsed", "format") and "never moved" in f.message
    weighted_zero = _merge(_curve("rewards/a/mean", [1.0] * 12), _curve("rewards/a/std", [0.0] * 12),
                           _curve("rewards/b/mean", [0.1 * (i % 3) for i in range(12)]),
                           _curve("rewards/b/std", [0.3] * 12))
    found, _ = diagnose(History(weighted_zero), Thresholds(reward_weights={"a": 0.0, "b": 1.0}), only=["reward_spread"])
    assert [(f.subject, f.values["weight"]) for f in found] == [("a", 0.0)] and "dead whatever its weight" in found[0].message
    found, _ = diagnose(History(weighted_zero), Thresholds(judges=("a",)), only=["reward_spread"])
    assert "judge" in found[0].message and "rule" not in found[0].message.split("Likely cause")[-1][:40]


def test_gradient_spikes_in_a_run_of_flat_groups_or_one_sft_step_are_no_alarm():
    g = [0.002 * (1 + 0.1 * math.sin(i)) for i in range(60)]
    g[20], g[40] = 0.09, 0.02
    flat = _merge(_curve("grad_norm", g), _curve("frac_reward_zero_std", [1.0] * 60), _curve("reward", [0.9] * 60))
    (f,), _ = diagnose(History(flat), only=["gradients"])
    assert f.kind == "grad_spike" and f.severity == "info" and "flat" in f.title
    sft = [1.0 + 0.05 * math.sin(i) for i in range(40)]
    sft[25] = 9.0
    sft_log = _merge(_curve("grad_norm", sft), _curve("loss", [2.0 - 0.01 * i for i in range(40)]))
    (f,), _ = diagnose(History(sft_log))
    assert History(sft_log).kind == "sft" and f.severity == "info" and f.title == "one gradient-norm spike"
    sft[10] = 9.0  # two spikes in an SFT run: a warning again
    (f,), _ = diagnose(History(_merge(_curve("grad_norm", sft), _curve("loss", [1.0] * 40))))
    assert f.severity == "warning"


def test_an_eval_loss_worse_at_every_evaluation_after_its_best_is_named_and_noise_is_not():
    import random

    def sft(evals):
        return [{"step": 10 * (i + 1), "loss": 1.0 - 0.01 * i, "eval_loss": v} for i, v in enumerate(evals)]

    r = random.Random(0)
    early_best = [1.5] + [1.6 + r.gauss(0, 0.01) for _ in range(20)]  # best first, then worse ever after
    (f,), _ = diagnose(History(sft(early_best)))
    assert (f.kind, f.severity, f.values["reference_step"]) == ("heldout_drop", "critical", 10)
    assert "overfitting" in f.message
    alarms = 0
    for seed in range(400):  # pure noise: the rule adds no finding (how its margin was chosen)
        r = random.Random(seed)
        found, _ = diagnose(History(sft([1.5 + r.gauss(0, 0.01) for _ in range(25)])))
        alarms += any(f.severity != "info" for f in found)
    assert alarms == 0


def test_a_fix_never_advises_changing_a_setting_the_recipe_measured(tmp_path):
    flat = [{"step": s, "reward": 0.5 + 0.01 * math.sin(s), "reward_std": 0.2} for s in range(1, 41)]
    (f,), _ = diagnose(History(flat))
    assert f.kind == "reward_plateau" and "raise learning_rate" in f.message
    grid = "docs/experiments/2026-11-27-best-move-grid-plan.md"
    (f,), _ = diagnose(History(flat), Thresholds(measured={"learning_rate": grid}))
    assert "raise learning_rate" not in f.message and f"keep learning_rate (the recipe's value was measured: {grid})" \
        in f.message and f.values["kept_measured"] == ["learning_rate"]
    # after the fact: from run_info.json, which rookgrpo train writes from the recipe's measured_settings
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": flat}))
    (tmp_path / "run_info.json").write_text(json.dumps({"measured_settings": {"learning_rate": grid}}))
    proc = run_cli([venv_bin("rookgrpo"), "doctor", str(tmp_path)])
    assert "keep learning_rate" in proc.stdout and "raise learning_rate" not in proc.stdout


def test_measured_settings_must_name_config_fields():
    from rookgrpo import RookGRPOConfig

    with pytest.raises(ConfigError, match="not config fields"):
        RookGRPOConfig(output_dir="x", use_cpu=True, measured_settings={"learning_rat": "grid.md"})
    args = RookGRPOConfig(output_dir="x", use_cpu=True, measured_settings='{"beta": "grid.md"}')
    assert args.measured_settings == {"beta": "grid.md"}
