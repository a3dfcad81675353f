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

    def __init__(self, values: dict[int, float], every: int = 2, floor: dict[int, float] | None = None):
        self.values, self.every, self.weights, self.floor = values, every, {}, floor or {}

    def _copy(self):
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step == 0:
            self.weights[0] = self._copy()
            state.log_history.append({"step": 0, "heldout/probe": self.values[0],
                                      **({"heldout/floor": self.floor[0]} if self.floor else {})})

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every == 0:
            self.weights[state.global_step] = self._copy()
            self.trainer._metrics["train"]["heldout/probe"].append(self.values[state.global_step])
            if self.floor:
                self.trainer._metrics["train"]["heldout/floor"].append(self.floor[state.global_step])


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


@pytest.mark.parametrize("layout", ["default", "buffered-batches"])
def test_a_floor_rules_out_the_steps_below_the_starts_value(tiny_model_dir, smoke_dataset, tmp_path, layout, caplog):
    """The best score among the steps whose floor metric held the start's: step 2 scores best but lost the floor's
    metric, so step 4 is handed back; the ruled-out step is logged where it was evaluated and counted at the end."""
    probe = HeldoutProbe({0: 0.1, 2: 0.5, 4: 0.3, 6: 0.2}, floor={0: 0.9, 2: 0.85, 4: 0.9, 6: 0.95})
    guard = HeldoutGuard(metric="heldout/probe", floor="heldout/floor")
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset",
                              args=tiny_grpo_args(tmp_path, max_steps=6, **LAYOUTS[layout]),
                              train_dataset=smoke_dataset, callbacks=[probe, guard])
    with caplog.at_level(logging.WARNING, logger="rookgrpo.heldout_guard"):
        trainer.train()
    assert _same(_weights(trainer), probe.weights[4]) and not _same(probe.weights[4], probe.weights[2])
    end = trainer.state.log_history[-1]
    assert end["heldout_guard/best_step"] == 4 and end["heldout_guard/steps_below_floor"] == 1
    below = {h["step"]: h["heldout_guard/below_floor"] for h in trainer.state.log_history if "heldout_guard/below_floor" in h}
    assert below == {2: 1, 4: 0, 6: 0}
    assert "held to the floor (heldout/floor 0.9000), which ruled out step 2;" in caplog.text
    # Without the floor the same run hands back step 2.
    plain = HeldoutProbe(dict(probe.values), floor=dict(probe.floor))
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset",
                              args=tiny_grpo_args(tmp_path / "plain", max_steps=6, **LAYOUTS[layout]),
                              train_dataset=smoke_dataset, callbacks=[plain, HeldoutGuard(metric="heldout/probe")])
    trainer.train()
    assert trainer.state.log_history[-1]["heldout_guard/best_step"] == 2


def test_a_resumed_run_keeps_the_floor_of_its_start(tiny_model_dir, smoke_dataset, tmp_path):
    """The floor's reference is the start's value, saved with the guard's state: a run resumed at step 4 still rules
    out step 6 (below the start's 0.9), and keeps step 4 (step 2 was ruled out before the resume)."""
    values, floor = {0: 0.1, 2: 0.5, 4: 0.3, 6: 0.4}, {0: 0.9, 2: 0.85, 4: 0.9, 6: 0.88}
    args = dict(max_steps=6, save_strategy="steps", save_steps=4)
    first = HeldoutProbe(values, floor=floor)
    RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=tiny_grpo_args(tmp_path, **args),
                    train_dataset=smoke_dataset,
                    callbacks=[first, HeldoutGuard(metric="heldout/probe", floor="heldout/floor")]).train()
    second = HeldoutProbe(values, floor=floor)
    resumed = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset",
                              args=tiny_grpo_args(tmp_path, **args), train_dataset=smoke_dataset,
                              callbacks=[second, HeldoutGuard(metric="heldout/probe", floor="heldout/floor")])
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    assert _same(_weights(resumed), first.weights[4])
    assert resumed.state.log_history[-1]["heldout_guard/steps_below_floor"] == 2


def test_bad_settings_fail_before_training(tiny_model_dir, smoke_dataset, tmp_path):
    with pytest.raises(ConfigError, match="needs evaluations, but eval_strategy is 'no'"):
        RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=tiny_grpo_args(tmp_path),
                        train_dataset=smoke_dataset, callbacks=[HeldoutGuard(metric="eval_loss", mode="min")])
    with pytest.raises(ConfigError, match="is not a held-out metric"):
        HeldoutGuard(metric="reward")
    with pytest.raises(ConfigError, match="mode: expected 'max' or 'min'"):
        HeldoutGuard(metric="heldout/x", mode="best")
    with pytest.raises(ConfigError, match="floor: 'format_rate' is not a held-out metric.*floor: heldout/format_rate"):
        HeldoutGuard(metric="heldout/x", floor="format_rate")
    with pytest.raises(ConfigError, match="floor: expected a held-out metric's name or a list"):
        HeldoutGuard(metric="heldout/x", floor={"heldout/y": 1})
    with pytest.raises(ConfigError, match="needs evaluations, but eval_strategy is 'no'"):
        RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=tiny_grpo_args(tmp_path),
                        train_dataset=smoke_dataset, callbacks=[HeldoutGuard(metric="heldout/x", floor="eval_y")])


# ---- TRL's own evaluation: eval_reward and eval_rewards/NAME/mean, live and at step 0 -------------------------------

class EvalProbe(RookCallback):
    """Copies the trainable weights at each evaluation TRL runs (on_evaluate: the weights it just scored)."""

    state_key = "eval_probe"

    def __init__(self):
        self.weights, self.trainer = {}, None

    def on_evaluate(self, args, state, control, **kwargs):
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        self.weights[state.global_step] = {n: p.detach().clone() for n, p in model.named_parameters()
                                           if p.requires_grad}


@pytest.mark.parametrize("metric", ["eval_reward", "eval_rewards/uci_charset/mean", None])
@pytest.mark.parametrize("on_start", [True, False])
def test_the_guard_selects_on_trls_own_evaluation(tiny_model_dir, smoke_dataset, tmp_path, metric, on_start):
    """TRL merges eval_reward into the entry inside its log(): the guard scores every evaluation, at step 0 too with
    eval_on_start, keeps the best one's weights (not the start's by default, not the last step's), and without a
    metric selects on eval_reward, TRL's held-out reward."""
    probe = EvalProbe()
    guard = HeldoutGuard(metric=metric)
    args = tiny_grpo_args(tmp_path, max_steps=4, eval_strategy="steps", eval_steps=1, eval_on_start=on_start,
                          per_device_eval_batch_size=8, learning_rate=5e-2)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=args,
                              train_dataset=smoke_dataset, eval_dataset=smoke_dataset.select(range(8)),
                              callbacks=[probe, guard])
    trainer.train()
    name = metric or "eval_reward"
    assert guard.score.metric == {name: 1.0}
    evaluated = {h["step"]: h[name] for h in trainer.state.log_history if name in h}
    assert sorted(evaluated) == ([0] if on_start else []) + [1, 2, 3, 4]
    assert guard.score.scores == pytest.approx(evaluated)  # every evaluation scored, with TRL's own numbers
    best = max(evaluated, key=evaluated.get)
    assert guard.score.best_step == best
    assert _same(_weights(trainer), probe.weights[best])
    assert trainer.state.log_history[-1]["heldout_guard/best_step"] == best


def test_without_a_metric_the_guard_asks_the_runs_evaluation_or_refuses(tiny_model_dir, smoke_dataset, tmp_path):
    """No chess default in the core: heldout_eval's default is the held-out version of the run's reward; with
    nothing evaluated the guard refuses before training, naming the field."""
    from rookgrpo.callbacks import HeldoutEval

    evaluation = tmp_path / "val.jsonl"
    evaluation.write_text("".join(f'{{"prompt": "{r["prompt"]}"}}\n' for r in smoke_dataset.select(range(4))))
    guard = HeldoutGuard()
    RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=["uci_charset"], args=tiny_grpo_args(tmp_path),
                    train_dataset=smoke_dataset, callbacks=[HeldoutEval(data=str(evaluation), every=1), guard])
    assert guard.score.metric == {"heldout/uci_charset": 1.0}
    with pytest.raises(ConfigError, match="metric is not set, and this run logs no held-out evaluation"):
        RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=["uci_charset"], args=tiny_grpo_args(tmp_path),
                        train_dataset=smoke_dataset, callbacks=[HeldoutGuard()])


def test_the_start_is_dropped_once_a_later_step_beats_it(tiny_model_dir, smoke_dataset, tmp_path):
    """One copy per rank from then on: the start's copy is kept only while it is the best (or not yet scored)."""
    class Watch(RookCallback):
        state_key = "watch"

        def __init__(self, guard):
            self.guard, self.copies = guard, {}

        def on_log(self, args, state, control, **kwargs):
            self.copies[state.global_step] = (self.guard.start is not None, self.guard.best_weights is self.guard.start)

    guard = HeldoutGuard(metric="heldout/probe")
    watch = Watch(guard)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset",
                              args=tiny_grpo_args(tmp_path, max_steps=6), train_dataset=smoke_dataset,
                              callbacks=[HeldoutProbe({0: 0.3, 2: 0.1, 4: 0.5, 6: 0.2}), guard, watch])
    trainer.train()
    assert watch.copies[2] == (True, True)  # step 2 scored below the start: the start is the best, one copy
    assert watch.copies[4][0] is False and watch.copies[6][0] is False  # step 4 beat it: dropped
    assert guard.score.best_step == 4


def test_a_resume_in_another_layout_is_refused_naming_both(tmp_path):
    """A copy saved as N ranks' parts cannot be restored by M ranks (or whole weights by a sharded run): refused at
    resume, naming both layouts, never a mix of steps' shards or a failure at the end of the run."""
    from types import SimpleNamespace

    from rookgrpo.callbacks.heldout_guard import FILE

    def guard_on(ranks: int, per_rank: bool):
        guard = HeldoutGuard(metric="heldout/x")
        accelerator = SimpleNamespace(num_processes=ranks, process_index=0, unwrap_model=lambda model: model)
        guard.trainer = SimpleNamespace(accelerator=accelerator, model=torch.nn.Linear(1, 1),
                                        is_deepspeed_enabled=per_rank, args=SimpleNamespace(should_save=True))
        guard.score.best_step, guard.best_weights = 2, {"w": torch.ones(2)}
        return guard

    for saved_ranks, resumed_ranks in ((2, 1), (1, 2)):
        folder = tmp_path / f"{saved_ranks}-{resumed_ranks}"
        for rank in range(saved_ranks):
            guard = guard_on(saved_ranks, True)
            guard.trainer.accelerator.process_index = rank
            guard.save_files(str(folder / "checkpoint-2"))  # the folder made by the rank that gets there first
        with pytest.raises(ConfigError, match=rf"as {saved_ranks} ranks' parts .* this run has {resumed_ranks} rank\(s\)"):
            guard_on(resumed_ranks, True).load_files(str(folder / "checkpoint-2"))
        guard = guard_on(saved_ranks, True)
        guard.load_files(str(folder / "checkpoint-2"))  # the same layout: restored
        assert torch.equal(guard.best_weights["w"], torch.ones(2))
    whole = tmp_path / "whole"
    guard_on(2, False).save_files(str(whole))
    assert (whole / FILE).exists()
    with pytest.raises(ConfigError, match="best weights whole"):
        guard_on(2, True).load_files(str(whole))


@pytest.mark.distributed
@pytest.mark.slow
def test_an_fsdp2_run_resumed_on_fewer_ranks_is_refused_at_resume(tmp_path):
    """Under FSDP2 the guard saves a file per rank: a run saved by 2 CPU processes and resumed by 1 stops at the
    resume with the message naming both, before the optimizer's state is loaded and before any step, not at the end
    of the run where the restore would fail before the model is saved."""
    import yaml

    from conftest import REPO, run_cli, venv_bin

    assets = REPO / "tests" / "assets"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "model_name_or_path": "rookgrpo/tiny-random", "dataset_name": "rookgrpo/smoke-prompts",
        "reward_funcs": ["uci_charset"], "seed": 42, "use_cpu": True, "report_to": "none", "beta": 0.0,
        "save_strategy": "steps", "save_steps": 2, "max_steps": 2, "per_device_train_batch_size": 8,
        "num_generations": 4, "max_completion_length": 8, "logging_steps": 1,
        "callbacks": [{"heldout_eval": {"data": "rookgrpo/smoke-prompts", "every": 1, "n": 2,
                                        "evaluator": str(assets / "sharded_probe.py") + ":scripted_score"}},
                      {"heldout_guard": {"metric": "heldout/score"}}]}))
    env = {"PYTHONPATH": str(assets), "ROOKGRPO_TEST_SCORES": "1,3,2", "OMP_NUM_THREADS": "1"}

    def launch(processes: int, *flags: str):
        return run_cli([venv_bin("accelerate"), "launch", "--config_file", str(assets / "fsdp2-cpu.yaml"),
                        "--num_processes", str(processes), str(assets / "fsdp2_cpu.py"), str(recipe), "--use_cpu",
                        "true", "--output_dir", str(tmp_path / "out"), *flags], env=env, timeout=600)

    first = launch(2)
    assert first.returncode == 0, first.stderr[-4000:]
    checkpoint = tmp_path / "out" / "checkpoint-2"
    assert sorted(p.name for p in checkpoint.glob("heldout_guard_best*")) == [
        "heldout_guard_best.rank0.pt", "heldout_guard_best.rank1.pt"]
    resumed = launch(1, "--resume_from_checkpoint", str(checkpoint), "--max_steps", "4")
    assert resumed.returncode != 0
    assert "rookgrpo: error: heldout_guard: the checkpoint" in resumed.stderr
    assert "as 2 ranks' parts (a file per rank), and this run has 1 rank(s)" in resumed.stderr
    assert not (tmp_path / "out" / "checkpoint-4").exists()  # stopped at the resume, not at the end
