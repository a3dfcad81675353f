"""Reward isolation (``reward_isolation``, on by default): a reward call that raises, hangs or returns a bad result
never ends or stalls a run; its rows are unscorable for the whole row (never a component counted as 0), counted and
named; a function failing every row stops the run with its name and traceback; ``None`` stays TRL's "does not apply".

Each run is the tiny char model on the smoke prompts, one reward call per step (per-device batch = generation batch),
so "one batch in five" is one call in five. Every test asserts on the batch as TRL scored it: the gathered rewards per
function and the advantages (captured around ``_generate_and_score_completions``).
"""

from __future__ import annotations

import asyncio
import json
import math
import time

import pytest
import torch
import yaml

from conftest import REPO, losses_and_rewards, run_cli, tiny_grpo_args, vanilla_args, venv_bin
from rookgrpo import FAILED, RookGRPOTrainer, RewardFunctionError
from rookgrpo.errors import ConfigError

ASSET = REPO / "tests" / "assets" / "faulty_rewards.py"


def varied(completions, **kwargs):
    """Pays completions by their vowels: varies within a group, so advantages are not all zero."""
    return [sum(ch in "aeiou" for ch in c) / max(len(c), 1) for c in completions]


def _run(tiny_model_dir, dataset, tmp_path, funcs, **overrides):
    values = dict(max_steps=5, per_device_train_batch_size=8, num_generations=4, max_completion_length=12,
                  temperature=1.0)
    values.update(overrides)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=funcs, args=tiny_grpo_args(tmp_path, **values),
                              train_dataset=dataset)
    scored = []
    score = trainer._generate_and_score_completions

    def capture(inputs):
        output = score(inputs)
        scored.append({"rewards": trainer._last_rewards_per_func.clone(), "advantages": output["advantages"].clone()})
        return output

    trainer._generate_and_score_completions = capture
    start = time.perf_counter()
    trainer.train()
    trainer.train_seconds = time.perf_counter() - start
    logs = {h["step"]: h for h in trainer.state.log_history if "loss" in h}
    return trainer, scored, logs


def _fails_on(calls: int):
    """A sync reward that raises on the given call numbers (1-based) and scores like ``varied`` otherwise."""
    count = {"n": 0}

    def flaky(completions, **kwargs):
        count["n"] += 1
        if count["n"] == calls:
            raise ConnectionError("judge returned 503\nretry later")
        return varied(completions)

    return flaky


def _assert_excluded(batch):
    assert torch.isnan(batch["rewards"]).all(), "every component of a failed call's rows is left out"
    assert (batch["advantages"] == 0).all()


def test_a_reward_that_raises_on_one_batch_in_five_finishes_with_those_rows_excluded_and_counted(
        tiny_model_dir, smoke_dataset, tmp_path, caplog):
    with caplog.at_level("WARNING", logger="rookgrpo.rewards.isolation"):
        trainer, scored, logs = _run(tiny_model_dir, smoke_dataset, tmp_path, [_fails_on(3), varied])
    assert trainer.state.global_step == 5
    _assert_excluded(scored[2])
    for i in (0, 1, 3, 4):
        assert not torch.isnan(scored[i]["rewards"]).any()
    assert [logs[s]["rewards/flaky/failed"] for s in range(1, 6)] == [0, 0, 1, 0, 0]
    assert all(logs[s]["rewards/varied/failed"] == 0 for s in logs)
    record = trainer._isolation.records["flaky"]
    assert (record.failed_calls, record.failed_rows, record.first_step) == (1, 8, 2)
    assert record.first_error == "ConnectionError: judge returned 503"
    said = [r.getMessage() for r in caplog.records if "flaky" in r.getMessage()]
    assert len(said) == 1 and "ConnectionError: judge returned 503" in said[0] and "rewards/flaky/failed" in said[0]


def test_a_hung_reward_holds_the_run_up_for_its_timeout_only(tiny_model_dir, smoke_dataset, tmp_path):
    def slow(completions, trainer_state=None, **kwargs):
        if trainer_state.global_step == 1:
            time.sleep(60)
        return varied(completions)

    trainer, scored, logs = _run(tiny_model_dir, smoke_dataset, tmp_path, [slow, varied], reward_timeout=1.0,
                                 max_steps=3)
    assert trainer.train_seconds < 12, trainer.train_seconds  # 3 tiny steps and one 1 s timeout, not 60 s
    _assert_excluded(scored[1])
    assert [logs[s]["rewards/slow/failed"] for s in (1, 2, 3)] == [0, 1, 0]
    assert trainer._isolation.records["slow"].first_error.startswith("timed out")


@pytest.mark.parametrize("bad", ["short", "string", "inf", "object"])
def test_a_result_of_the_wrong_length_or_not_a_number_fails_that_call(tiny_model_dir, smoke_dataset, tmp_path, bad):
    count = {"n": 0}

    def odd(completions, **kwargs):
        count["n"] += 1
        rewards = varied(completions)
        if count["n"] == 2:
            return {"short": rewards[:-1], "string": ["0.5"] * len(rewards), "inf": [math.inf] * len(rewards),
                    "object": 0.5}[bad]
        return rewards

    trainer, scored, logs = _run(tiny_model_dir, smoke_dataset, tmp_path, [odd, varied], max_steps=3)
    _assert_excluded(scored[1])
    assert [logs[s]["rewards/odd/failed"] for s in (1, 2, 3)] == [0, 1, 0]


def test_none_for_rows_a_reward_does_not_apply_to_is_unchanged_from_trl(tiny_model_dir, smoke_dataset, tmp_path):
    from trl import GRPOTrainer

    def half(completions, **kwargs):  # "not my task" for every other row
        return [None if i % 2 else r for i, r in enumerate(varied(completions))]

    # TRL's own scoring: positions from the mask (on by default, tests/test_positions.py) off
    trainer, _, logs = _run(tiny_model_dir, smoke_dataset, tmp_path / "rook", [half, varied], max_steps=3,
                            position_ids_from_mask=False)
    assert all(logs[s]["rewards/half/none"] == 0.5 and logs[s]["rewards/half/failed"] == 0 for s in logs)
    vanilla = GRPOTrainer(model=str(tiny_model_dir), reward_funcs=[half, varied],
                          args=vanilla_args(trainer.args, tmp_path / "trl"), train_dataset=smoke_dataset)
    vanilla.train()
    assert losses_and_rewards(trainer.state.log_history) == losses_and_rewards(vanilla.state.log_history)


def test_a_reward_that_always_raises_stops_the_run_at_the_configured_batch_with_its_name_and_traceback(
        tiny_model_dir, smoke_dataset, tmp_path):
    def broken(completions, **kwargs):
        return [len(c) / undefined_scale for c in completions]  # noqa: F821 - the bug

    with pytest.raises(RewardFunctionError) as info:
        _run(tiny_model_dir, smoke_dataset, tmp_path, [varied, broken], reward_failure_patience=2)
    message = str(info.value)
    assert "'broken' failed on every row of 2 consecutive training batch(es) (from step 0" in message
    assert "NameError: name 'undefined_scale' is not defined" in message
    assert "undefined_scale" in message.split("Traceback")[1]  # the traceback, down to the faulty line
    assert isinstance(info.value.__cause__, NameError)


def test_failing_on_every_row_of_fewer_consecutive_batches_than_the_patience_does_not_stop(
        tiny_model_dir, smoke_dataset, tmp_path):
    count = {"n": 0}

    def outage(completions, **kwargs):  # down for two batches, then back
        count["n"] += 1
        if count["n"] in (2, 3):
            raise TimeoutError("judge unreachable")
        return varied(completions)

    trainer, _, logs = _run(tiny_model_dir, smoke_dataset, tmp_path, [outage], max_steps=5)
    assert trainer.state.global_step == 5
    assert [logs[s]["rewards/outage/failed"] for s in range(1, 6)] == [0, 1, 1, 0, 0]


# ---- async reward functions (TRL runs them concurrently on its event loop) ---------------------------------------

def test_async_rewards_raising_hanging_and_always_raising(tiny_model_dir, smoke_dataset, tmp_path):
    count = {"raises": 0, "hangs": 0}

    async def araises(completions, **kwargs):
        count["raises"] += 1
        await asyncio.sleep(0)
        if count["raises"] == 2:
            raise ValueError("bad judge reply")
        return varied(completions)

    async def ahangs(completions, **kwargs):
        count["hangs"] += 1
        if count["hangs"] == 3:
            await asyncio.sleep(60)
        return varied(completions)

    trainer, scored, logs = _run(tiny_model_dir, smoke_dataset, tmp_path / "a", [araises, ahangs, varied],
                                 reward_timeout=1.0, max_steps=4)
    assert trainer.train_seconds < 15, trainer.train_seconds
    _assert_excluded(scored[1])
    _assert_excluded(scored[2])
    assert [logs[s]["rewards/araises/failed"] for s in range(1, 5)] == [0, 1, 0, 0]
    assert [logs[s]["rewards/ahangs/failed"] for s in range(1, 5)] == [0, 0, 1, 0]
    assert trainer._isolation.records["ahangs"].first_error.startswith("timed out")

    async def abroken(completions, **kwargs):
        raise KeyError("score")

    with pytest.raises(RewardFunctionError, match=r"'abroken' failed on every row of 3 consecutive"):
        _run(tiny_model_dir, smoke_dataset, tmp_path / "b", [varied, abroken])


# ---- a row with one failed component: excluded, not scored with that component at 0 -----------------------------

class OnEveryThirdRow:
    """``chess_move_rank`` that gives up on every third row: returns :data:`FAILED` (the isolation's per-row
    failure) or ``None`` (TRL's "does not apply", the common workaround), as ``marker`` says."""

    def __init__(self, marker):
        from rookgrpo.rewards import get_reward

        self.inner, self.marker, self.__name__ = get_reward("chess_move_rank"), marker, "flaky_move_rank"

    def setup(self, args):
        self.inner = self.inner.setup(args)
        return self

    def __call__(self, prompts, completions, **kwargs):
        out = self.inner(prompts=prompts, completions=completions, **kwargs)
        return [self.marker if i % 3 == 0 else r for i, r in enumerate(out)]


def _chess_batch(tmp_path, marker, isolation):
    from rookgrpo.chess.data import prepare_rookworld
    from rookgrpo.data import load_recipe_dataset

    # The embedded recipe's model on its own positions: completions it writes well enough to earn different rewards
    dataset = prepare_rookworld(load_recipe_dataset("rookgrpo/tiny-rookworld-grpo"), tasks=["P"]).select(range(16))
    rewards = ["chess_format", "chess_legality", OnEveryThirdRow(marker)]
    values = dict(max_steps=1, per_device_train_batch_size=16, num_generations=4, max_completion_length=48,
                  temperature=1.0, stockfish_depth=4, stockfish_workers=2, reward_isolation=isolation)
    trainer = RookGRPOTrainer(model="rookgrpo/tiny-rookworld", reward_funcs=rewards,
                              args=tiny_grpo_args(tmp_path, **values), train_dataset=dataset)
    inputs = [dataset[i // 4] for i in range(16)]  # 4 prompts, 4 completions each, as TRL's sampler repeats them
    trainer.model.eval()
    torch.manual_seed(3)
    with torch.no_grad():
        output = trainer._generate_and_score_completions(inputs)
    return trainer._last_rewards_per_func, output["advantages"]


def test_a_chess_row_with_one_failed_component_is_excluded_not_scored_with_it_at_zero(tmp_path):
    rewards, advantages = _chess_batch(tmp_path / "on", FAILED, True)
    failed = torch.arange(16) % 3 == 0
    assert torch.isnan(rewards[failed]).all(), "the other components' rewards of a failed row are not used"
    assert (advantages[failed] == 0).all()
    # The rest: TRL's advantages of the rows that were scored, their group's baseline over those rows alone.
    total = rewards.nansum(dim=1)
    total[failed] = torch.nan
    grouped = total.view(4, 4)
    mean = torch.nanmean(grouped, dim=1, keepdim=True)
    std = torch.tensor([torch.std(g[~torch.isnan(g)]).item() if (~torch.isnan(g)).sum() > 1 else 0.0 for g in grouped])
    expected = ((grouped - mean) / (std.view(4, 1) + 1e-4)).view(-1)
    assert torch.allclose(advantages[~failed], expected[~failed], atol=1e-5)
    assert expected[~failed].abs().max() > 0, "the batch has signal: the check above can tell the rules apart"

    # The workaround under TRL's rule (None, isolation off): nansum scores a failed row with move rank at 0, and it
    # takes an advantage; the assertions above fail on that.
    rewards_trl, advantages_trl = _chess_batch(tmp_path / "off", None, False)
    assert not torch.isnan(rewards_trl[failed][:, :2]).any()
    assert advantages_trl[failed].abs().max() > 0


# ---- two processes: a reward that times out on one rank -------------------------------------------------------

@pytest.mark.distributed  # two processes: `make test` runs these alone, after the rest
def test_a_timeout_on_one_rank_excludes_its_rows_on_every_rank_without_desynchronising(tmp_path):
    probe = tmp_path / "probe"
    probe.mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "model_name_or_path": "rookgrpo/tiny-random", "dataset_name": "rookgrpo/smoke-prompts",
        "reward_funcs": [f"{ASSET}:rank1_hangs_once", f"{ASSET}:length_reward"],
        "callbacks": ["faulty_rewards.ScoreProbe"], "reward_timeout": 3, "seed": 42, "use_cpu": True,
        "report_to": "none", "save_strategy": "no", "max_steps": 3, "per_device_train_batch_size": 4,
        "num_generations": 8, "max_completion_length": 8, "logging_steps": 1, "temperature": 1.0,
        "output_dir": str(tmp_path / "out")}))
    start = time.time()
    proc = run_cli([venv_bin("accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "-m", "rookgrpo",
                    str(recipe), "--use_cpu", "true"],
                   env={"ROOKGRPO_TEST_PROBE_DIR": str(probe), "PYTHONPATH": str(REPO / "tests" / "assets"),
                        "ROOKGRPO_TEST_HANG_STEP": "1", "OMP_NUM_THREADS": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert time.time() - start < 240  # the hung call (600 s) was abandoned at its 3 s timeout
    ranks = [[json.loads(line) for line in (probe / f"rank-{r}.jsonl").read_text().splitlines()] for r in (0, 1)]
    assert [b["step"] for b in ranks[0]] == [b["step"] for b in ranks[1]] == [0, 1, 2]
    for b0, b1 in zip(*ranks):
        assert b0["rewards"] == b1["rewards"], "every rank holds the same gathered rewards"
    hung = ranks[0][1]["rewards"]
    assert all(all(v is None for v in row) for row in hung[4:]), "rank 1's rows: every component left out"
    assert all(all(v is not None for v in row) for row in hung[:4]), "rank 0's rows scored"
    assert all(a == 0 for a in ranks[1][1]["advantages"])
    # One group of 8 spans both ranks: rank 0's four rows make its baseline alone.
    totals = [sum(row) for row in hung[:4]]
    mean = sum(totals) / 4
    std = (sum((t - mean) ** 2 for t in totals) / 3) ** 0.5
    assert ranks[0][1]["advantages"] == pytest.approx([(t - mean) / (std + 1e-4) for t in totals], abs=1e-4)
    assert ranks[1][1]["time"] - ranks[1][0]["time"] < 60
    history = json.loads((tmp_path / "out" / "trainer_state.json").read_text())["log_history"]
    assert [h["rewards/rank1_hangs_once/failed"] for h in history if "loss" in h] == [0, 0.5, 0]
    info = json.loads((tmp_path / "out" / "run_info.json").read_text())
    assert info["reward_failures"]["rank1_hangs_once"]["first_error"].startswith("timed out")


# ---- settings -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value, says", [
    ("reward_timeout", 0, "reward_timeout: 0.0 is not a number of seconds above 0"),
    ("reward_timeout", "soon", "reward_timeout: 'soon' is not a number"),
    ("reward_failure_patience", -1, "reward_failure_patience: -1 is negative"),
])
def test_bad_isolation_settings_are_refused_naming_the_field(tmp_path, field, value, says):
    with pytest.raises(ConfigError, match=says):
        tiny_grpo_args(tmp_path, **{field: value})


def test_isolation_off_lets_the_exception_end_the_run_as_trl_does(tiny_model_dir, smoke_dataset, tmp_path):
    with pytest.raises(ConnectionError, match="judge returned 503"):
        _run(tiny_model_dir, smoke_dataset, tmp_path, [_fails_on(1)], reward_isolation=False)


# ---- the doctor names reward failures, live and after the fact ---------------------------------------------------

def test_the_doctor_names_a_failing_reward_with_its_rate_and_first_error_live_and_after_the_fact(
        tiny_model_dir, smoke_dataset, tmp_path):
    from types import SimpleNamespace

    from rookgrpo.callbacks.doctor import Doctor
    from rookgrpo.doctor import diagnose, load_history
    from rookgrpo.train import write_run_info

    doctor = Doctor(check_every=1)
    values = dict(max_steps=5, per_device_train_batch_size=8, num_generations=4, max_completion_length=12)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=[_fails_on(3), varied],
                              args=tiny_grpo_args(tmp_path, **values), train_dataset=smoke_dataset,
                              callbacks=[doctor])
    trainer.train()
    live = doctor.reported["reward_failing:flaky"]
    assert live["values"]["first_error"] == "ConnectionError: judge returned 503"
    assert (live["first_step"], live["last_step"]) == (3, 3)
    trainer.save_state()
    write_run_info(trainer, str(tiny_model_dir), SimpleNamespace(dataset_name="smoke"))
    findings, _ = diagnose(load_history(tmp_path))
    found = {f.key: f for f in findings}
    after = found["reward_failing:flaky"]
    assert "ConnectionError: judge returned 503" in after.message and "1 of 5 logged step(s), 20.0% of all rows" in after.message
    assert after.severity == "warning"
    assert "reward_failing:varied" not in found


def test_the_doctor_names_a_jump_in_a_rewards_none_rate():
    from rookgrpo.doctor import History, diagnose

    entries = [{"step": s, "rewards/judge/none": 0.0 if s < 9 else 0.6, "rewards/judge/failed": 0.0}
               for s in range(1, 17)]
    findings, _ = diagnose(History(entries), only=["reward_failures"])
    assert [f.key for f in findings] == ["reward_none_jump:judge"]
    steady = [{**e, "rewards/judge/none": 0.27} for e in entries]  # a multi-task mix: a steady share is no finding
    assert diagnose(History(steady), only=["reward_failures"])[0] == []


def test_a_reward_failing_in_a_held_out_evaluation_costs_that_metric_not_the_run(
        tiny_model_dir, smoke_dataset, tmp_path, caplog):
    from rookgrpo.callbacks import HeldoutEval

    calls = {"n": 0}

    def judge_down_at_step_2(completions, **kwargs):  # scored in evaluations only
        calls["n"] += 1
        if calls["n"] == 2:
            raise ConnectionError("judge down")
        return varied(completions)

    heldout = HeldoutEval(data="rookgrpo/smoke-prompts", n=8, every=2, rewards=[judge_down_at_step_2, varied])
    args = tiny_grpo_args(tmp_path, max_steps=4, per_device_train_batch_size=8, num_generations=4,
                          max_completion_length=8)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=[varied], args=args,
                              train_dataset=smoke_dataset, callbacks=[heldout])
    with caplog.at_level("WARNING"):
        trainer.train()
    evals = {h["step"]: h for h in trainer.state.log_history if "heldout/varied" in h}
    assert sorted(evals) == [0, 2, 4]
    assert "heldout/judge_down_at_step_2" in evals[0] and "heldout/judge_down_at_step_2" in evals[4]
    assert "heldout/judge_down_at_step_2" not in evals[2]
    assert any("'judge_down_at_step_2' failed on the held-out rows (ConnectionError: judge down)" in r.getMessage()
               for r in caplog.records)


# ---- TRL's layouts: its evaluation between steps, a batch reused over steps and iterations -------------------------

def test_buffered_batches_and_trls_evaluation_between_steps(tiny_model_dir, smoke_dataset, tmp_path):
    """steps_per_generation 2 x num_iterations 2 (each generation batch is optimised over 4 steps) and TRL's own
    evaluation every 2 steps. The reward fails on the second training generation: its rows are left out over all 4
    steps that reuse it. It fails on every evaluation call: logged as eval_rewards/<name>/failed, and not counted
    towards the stop rule (reward_failure_patience 2 would otherwise stop the run at the second evaluation)."""
    train = smoke_dataset.add_column("split", ["train"] * len(smoke_dataset))
    evaluation = smoke_dataset.select(range(8)).add_column("split", ["eval"] * 8)
    count = {"train": 0}

    def judge(completions, split, **kwargs):
        if split[0] == "eval":
            raise ConnectionError("eval judge down")
        count["train"] += 1
        if count["train"] == 2:
            raise ConnectionError("judge down once")
        return varied(completions)

    args = tiny_grpo_args(tmp_path, max_steps=8, per_device_train_batch_size=4, num_generations=4,
                          steps_per_generation=2, num_iterations=2, max_completion_length=8, temperature=1.0,
                          eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=4,
                          reward_failure_patience=2)
    trainer = RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs=[judge, varied], args=args,
                              train_dataset=train, eval_dataset=evaluation)
    scored = []
    score = trainer._generate_and_score_completions

    def capture(inputs):
        output = score(inputs)
        if trainer.model.training:
            scored.append({"rewards": trainer._last_rewards_per_func.clone(), "advantages": output["advantages"]})
        return output

    trainer._generate_and_score_completions = capture
    trainer.train()
    assert trainer.state.global_step == 8 and len(scored) == 2
    assert not torch.isnan(scored[0]["rewards"]).any()
    _assert_excluded(scored[1])  # the batch steps 5-8 optimise: every row left out, advantage 0
    train_logs = [h for h in trainer.state.log_history if "rewards/judge/failed" in h]
    assert [h["rewards/judge/failed"] for h in train_logs] == [0, 1]
    eval_logs = [h for h in trainer.state.log_history if "eval_rewards/judge/failed" in h]
    assert len(eval_logs) == 4 and all(h["eval_rewards/judge/failed"] == 1 for h in eval_logs)
    assert trainer._isolation.records["judge"].streak == 1  # the failed training batch; the evaluations never count


def test_a_function_that_fails_only_single_rows_is_recorded_with_its_first_error():
    from rookgrpo.rewards.isolation import RewardIsolation

    isolation = RewardIsolation(["judge"], timeout=None, patience=3)

    def judge(prompts, completions, **kwargs):
        return [FAILED, 1.0, 0.5, 0.0]

    funcs = isolation.wrap([judge])
    rewards = torch.tensor([funcs[0](prompts=["p"] * 4, completions=["c"] * 4)], dtype=torch.float32).T
    rewards, metrics = isolation.apply(rewards, 4, lambda t: t, lambda x: x, 0, 7, training=True)
    assert torch.isnan(rewards[0]).all() and not torch.isnan(rewards[1:]).any()
    assert metrics["rewards/judge/failed"] == 0.25
    assert isolation.summary() == {"judge": {"calls": 1, "failed_calls": 0, "failed_rows": 1,
                                             "first_error": "returned FAILED for 1 of 4 rows", "first_step": 7}}
