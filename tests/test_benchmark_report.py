"""docs/benchmarks.md says when a section's numbers describe a packaged chess model that has since been replaced."""

import json
import math
import statistics
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, load_script


def _run_all():
    return load_script(REPO / "benchmarks" / "run_all.py")


def test_a_result_measured_before_the_model_changed_is_flagged(tmp_path):
    run_all = _run_all()

    def git(*args):
        out = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                             capture_output=True, text=True, check=True)
        return out.stdout.strip()

    git("init", "-q")
    weights = tmp_path / run_all.PACKAGED_MODEL
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"v2")
    git("add", "-A")
    git("commit", "-qm", "v2")
    measured = git("rev-parse", "--short", "HEAD")
    (tmp_path / "other.txt").write_text("x")
    git("add", "-A")
    git("commit", "-qm", "unrelated")
    unrelated = git("rev-parse", "--short", "HEAD")
    # Only the weights count: a later commit that leaves them alone changes nothing.
    assert run_all.packaged_model_changed_since(measured, tmp_path) is None
    assert run_all.packaged_model_changed_since(unrelated + "+changes", tmp_path) is None
    weights.write_bytes(b"v3")
    git("add", "-A")
    git("commit", "-qm", "v3")
    v3 = git("rev-parse", "--short", "HEAD")
    assert run_all.packaged_model_changed_since(measured, tmp_path) == v3
    assert run_all.packaged_model_changed_since(unrelated + "+changes", tmp_path) == v3
    assert run_all.packaged_model_changed_since(v3, tmp_path) is None
    # A stamp git does not know (a result copied from another clone) is not guessed at.
    assert run_all.packaged_model_changed_since("0000000", tmp_path) is None
    # The same for a training result measured before the scoring correction was added.
    assert run_all.positions_fix(tmp_path) is None
    module = tmp_path / run_all.POSITIONS_MODULE
    module.parent.mkdir(parents=True, exist_ok=True)
    module.write_text("x")
    git("add", "-A")
    git("commit", "-qm", "positions")
    fix = git("rev-parse", "--short", "HEAD")
    assert run_all.positions_fix(tmp_path) == fix
    assert run_all.missing_from(v3, fix, tmp_path) == fix and run_all.missing_from(fix, fix, tmp_path) is None


def test_grpo_grid_retables_a_saved_result_pairing_by_seed(tmp_path, monkeypatch):
    import json

    monkeypatch.syspath_prepend(str(REPO / "experiments"))  # the grids import each other
    bench = load_script(REPO / "experiments" / "grpo_grid.py")
    keys = [k for k, _ in bench.METRICS]

    def runs(values):  # one run per seed; every metric takes the seed's value
        return [{"seed": seed, "eval": dict.fromkeys(keys, v), "steps": 10, "generated": 320, "seconds": 60.0,
                 "a_flat_before": 0.5, "a_flat_after": 0.5, "flat_before": 0.1, "flat_after": 0.1}
                for seed, v in values.items()]

    # Listed in another seed order than vanilla's: the pairs must follow the seeds, not the list positions.
    arms = {"vanilla": runs({1: 0.10, 2: 0.20, 3: 0.30}), "rookgrpo": runs({3: 0.34, 1: 0.12, 2: 0.23}),
            "rookgrpo_one_temperature": runs({1: 0.10, 2: 0.21, 3: 0.29})}
    start = {"n_policy": 3, "n_env": 1, "engine_depth": 8, **dict.fromkeys(keys, 0.0)}
    measured = {"commit": "abc1234", "date": "2026-01-01", "machine": "m", "python": "3"}
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps({"command": "python experiments/grpo_grid.py --steps 10 --seeds 1 2 3 --arms "
                                 "vanilla rookgrpo rookgrpo_one_temperature", "start": start, "runs": arms,
                                 "measured": measured}))
    out = tmp_path / "out.json"
    bench.main(["--from_result", str(saved), "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["measured"] == measured  # the saved run's provenance, not the rewrite's
    assert result["command"] == json.loads(saved.read_text())["command"]
    paired = result["paired"]
    # rookgrpo - vanilla per seed: +0.02, +0.03, +0.04; rookgrpo - ablation: +0.02, +0.02, +0.05.
    assert abs(paired["rookgrpo/top5_accuracy"]["mean"] - 0.03) < 1e-9
    assert abs(paired["rookgrpo/top5_accuracy"]["se"] - 0.01 / 3 ** 0.5) < 1e-9
    assert abs(paired["rookgrpo-rookgrpo_one_temperature/top5_accuracy"]["mean"] - 0.03) < 1e-9
    assert abs(paired["rookgrpo_one_temperature/top5_accuracy"]["mean"] - 0.0) < 1e-9
    assert "| rookgrpo − rookgrpo_one_temperature | +0.030" in result["table"]

    # The positions arm pairs with vanilla and is what the recipe is compared with on the same scoring.
    arms["vanilla_positions"] = runs({2: 0.25, 1: 0.11, 3: 0.30})
    saved.write_text(json.dumps({"command": "python experiments/grpo_grid.py --steps 10 --seeds 1 2 3 --arms "
                                 "vanilla vanilla_positions rookgrpo", "start": start, "runs": arms,
                                 "measured": measured}))
    bench.main(["--from_result", str(saved), "--out", str(out)])
    result = json.loads(out.read_text())
    # vanilla_positions - vanilla per seed: +0.01, +0.05, 0.00; rookgrpo - vanilla_positions: +0.01, -0.02, +0.04.
    assert abs(result["paired"]["vanilla_positions/format_rate"]["mean"] - 0.02) < 1e-9
    assert abs(result["paired"]["rookgrpo-vanilla_positions/env_broken_rate"]["mean"] - 0.01) < 1e-9
    assert "`vanilla_positions`: vanilla with rookgrpo's `position_ids_from_mask` hook" in result["description"]



def test_grpo_grid_adds_an_arm_to_a_saved_result_at_its_steps_and_seeds(tmp_path, monkeypatch):
    import json

    import pytest

    import rookgrpo.chess.evaluate

    monkeypatch.syspath_prepend(str(REPO / "experiments"))  # the grids import each other
    bench = load_script(REPO / "experiments" / "grpo_grid.py")
    keys = [k for k, _ in bench.METRICS]
    start = {"n_policy": 3, "n_env": 1, "engine_depth": 8, **dict.fromkeys(keys, 0.0)}
    measured = {"commit": "abc1234", "date": "2026-01-01", "machine": "m", "python": "3"}
    vanilla = [{"seed": s, "eval": dict.fromkeys(keys, 0.1 * s), "steps": 7, "generated": 224, "seconds": 1.0,
                "a_flat_before": 0.5, "a_flat_after": 0.5, "flat_before": 0.1, "flat_after": 0.1} for s in (1, 2)]
    # The seeds are read from the saved command whatever flag follows them.
    command = "python experiments/grpo_grid.py --steps 7 --seeds 1 2 --train_panel --arms vanilla"
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps({"command": command, "start": start, "runs": {"vanilla": vanilla},
                                 "measured": measured}))
    trained, fresh_start = [], [0.0]

    def fake_run(arm, seed, steps, tmp):  # the new arm: vanilla's value + 0.05 on every metric
        trained.append((arm, seed, steps))
        return {"model": f"{arm}-{seed}", "steps": steps, "seconds": 1.0, "generated": 224, "a_flat_before": 0.4,
                "a_flat_after": 0.4, "flat_before": 0.1, "flat_after": 0.1}

    def fake_evaluate(model, data, **kwargs):
        value = fresh_start[0] if model == "rookgrpo/tiny-rookworld" else 0.1 * int(model.split("-")[-1]) + 0.05
        return {**start, **dict.fromkeys(keys, value)}

    monkeypatch.setattr(bench, "run", fake_run)
    monkeypatch.setattr(rookgrpo.chess.evaluate, "evaluate", fake_evaluate)
    out = tmp_path / "out.json"
    bench.main(["--add_to", str(saved), "--arms", "rookgrpo_one_temperature", "--train_panel", "--out", str(out)])
    assert trained == [("rookgrpo_one_temperature", 1, 7), ("rookgrpo_one_temperature", 2, 7)]
    result = json.loads(out.read_text())
    assert result["runs"]["vanilla"] == vanilla and len(result["runs"]["rookgrpo_one_temperature"]) == 2
    assert abs(result["paired"]["rookgrpo_one_temperature/top5_accuracy"]["mean"] - 0.05) < 1e-9
    assert result["command"] == command and result["measured"] == measured
    assert result["added"][0]["arms"] == ["rookgrpo_one_temperature"]
    assert result["added"][0]["command"].endswith("--arms rookgrpo_one_temperature --train_panel")
    # A retable keeps both parts' provenance.
    bench.main(["--from_result", str(out), "--out", str(tmp_path / "again.json")])
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["added"] == result["added"] and again["table"] == result["table"]
    # An arm the result already has, or a start that evaluates differently, is refused before any training.
    trained.clear()
    with pytest.raises(SystemExit):
        bench.main(["--add_to", str(out), "--arms", "vanilla"])
    fresh_start[0] = 0.01
    with pytest.raises(SystemExit):
        bench.main(["--add_to", str(saved), "--arms", "rookgrpo"])
    assert trained == []

def test_seed_table_pairs_each_run_by_position_and_gives_the_spread_over_runs(tmp_path):
    import json

    table = load_script(REPO / "experiments" / "seed_table.py")
    mean, half = table.spread([0.1, 0.3])  # two runs: ± half their difference
    assert abs(mean - 0.2) < 1e-12 and abs(half - 0.1) < 1e-12
    mean, se = table.spread([0.0, 0.1, 0.2])
    assert abs(mean - 0.1) < 1e-12 and abs(se - 0.1 / 3 ** 0.5) < 1e-12

    def evaluation(rows):  # best-move accuracy only, one value per position
        return {"best_move_accuracy": sum(rows) / len(rows), "best_move_accuracy_se": 0.1, "prompts_sha1": "x",
                "per_row": {"best_move_accuracy": rows}}

    before = evaluation([0, 0, 0, 0])
    paths = {}
    for name, rows in (("a", [1, 1, 0, 0]), ("b", [1, 0, 0, 0])):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(evaluation(rows)))
    (tmp_path / "before.json").write_text(json.dumps(before))
    text = table.table(before, {n: json.loads(p.read_text()) for n, p in paths.items()})
    # Run a: +0.5 with the paired standard error of (1, 1, 0, 0) = 0.289, z 1.7; the mean of +0.5 and +0.25.
    assert "| best-move accuracy (P:) | 0.000 | +0.500 (1.7) | +0.250 (1.0) | +0.375 ± 0.125 (t 3.0) |" in text
    saved = tmp_path / "changes.json"
    assert table.main(["--before", str(tmp_path / "before.json"), "--runs", f"a={paths['a']}", f"b={paths['b']}",
                       "--save", str(saved)]) == 0
    assert json.loads(saved.read_text())["changes"] == {"best_move_accuracy": {"a": 0.5, "b": 0.25}}
    # Against another recipe's runs on the same names: the difference paired by run.
    (tmp_path / "old.json").write_text(json.dumps({"label": "old", "changes": {"best_move_accuracy": {"a": 0.25,
                                                                                                      "b": 0.25}}}))
    assert table.main(["--before", str(tmp_path / "before.json"), "--runs", f"a={paths['a']}", f"b={paths['b']}",
                       "--against", str(tmp_path / "old.json")]) == 0
    assert "| best-move accuracy (P:) | +0.250 | +0.000 | +0.125 ± 0.125 (t 1.0) |" in table.against_table(
        json.loads(saved.read_text())["changes"], {"best_move_accuracy": {"a": 0.25, "b": 0.25}}, "old")


def test_every_grid_arm_is_a_valid_recipe_that_differs_from_the_shipped_one_as_named(tmp_path, monkeypatch):
    """The arms of docs/experiments/2026-11-27-grpo-grid-plan.md parse as recipes, their callbacks resolve, none keeps
    the recipe's held-out guard (an arm that brings its own, the B:-only anchor grid's ``guard`` or the shipped
    ``guard-format-floor``, has exactly that one), and each changes what its spec says."""
    import yaml

    from rookgrpo.callbacks.registry import resolve_callbacks
    from rookgrpo.recipe import parse_recipe

    monkeypatch.syspath_prepend(str(REPO / "experiments"))  # the grids import each other
    bench = load_script(REPO / "experiments" / "grpo_grid.py")
    shipped = yaml.safe_load(bench.RECIPE.read_text())
    for arm in bench.ARMS:
        path = bench.arm_recipe(arm, str(tmp_path))
        recipe = yaml.safe_load(open(path).read())
        names = [bench._name(c) for c in recipe["callbacks"]]
        if "heldout" in bench.arm_spec(arm):
            assert recipe["callbacks"][-2:] == bench.arm_spec(arm)["heldout"], arm
            assert recipe["callbacks"][-2:] in (bench.FRESH_GUARD, bench.FLOOR_GUARD) and names.count("heldout_guard") == 1
        else:
            assert "heldout_guard" not in names and "chess_eval" not in names, arm
        resolve_callbacks(recipe["callbacks"])
        _, config, _ = parse_recipe([path, "--output_dir", str(tmp_path / arm)])
        spec = bench.ARM_SPECS[arm]
        for key, value in spec.get("set", {}).items():
            assert getattr(config, key) in (value, type(getattr(config, key))(value)), (arm, key)
        assert all(name in names for name in (c["name"] for c in spec.get("callbacks", ())))
        added = list(spec.get("rewards", {}))
        assert recipe["reward_funcs"] == shipped["reward_funcs"] + added, arm
        if "weights" in spec:
            assert set(recipe["reward_weights"]) == {spec["weights"]}
        else:
            weights = dict(zip(shipped["reward_funcs"], shipped["reward_weights"]))
            weights.update({**spec.get("reward_weights", {}), **spec.get("rewards", {})})
            assert recipe["reward_weights"] == [weights[n] for n in recipe["reward_funcs"]], arm
        for task, kwargs in spec.get("task_kwargs", {}).items():  # one task's sampling changed, the other's kept
            assert config.task_generation_kwargs[task] == {**shipped["task_generation_kwargs"][task], **kwargs}
            assert all(config.task_generation_kwargs[t] == v
                       for t, v in shipped["task_generation_kwargs"].items() if t != task)
        if added:  # a candidate reward named by file path resolves to an instance TRL can call
            from rookgrpo.rewards import resolve_reward_func

            assert all(not isinstance(resolve_reward_func(name), type) for name in added)


def test_best_move_grid_decides_by_its_plans_rule(tmp_path, monkeypatch):
    """docs/experiments/2026-11-27-best-move-grid-plan.md: an arm meets the rule with best move up at t >= 2 and
    format, move-rank reward and A: exact each above t -1; the supervised control never ships; with no arm meeting
    it, the arm that best holds format is kept. A ``.partial`` tables as unfinished."""
    import json

    monkeypatch.syspath_prepend(str(REPO / "experiments"))  # the grids import each other
    bench = load_script(REPO / "experiments" / "best_move_grid.py")
    keys = [k for k, _ in bench.METRICS]
    base = {**dict.fromkeys(keys, 0.5), "n_policy": 192, "n_env": 64}

    def runs(best, fmt, rank=0.5):  # per seed; other metrics at the start's value
        return [{"seed": s, "eval": {**dict.fromkeys(keys, 0.5), "best_move_accuracy": b, "format_rate": f,
                                     "move_rank_reward": rank}, "p_format_flat": 0.9, "measured": {"commit": "c"}}
                for s, (b, f) in enumerate(zip(best, fmt), 1)]

    control, anchor = bench.CONTROL, bench.ARMS[1]
    up, flat = [0.52, 0.53, 0.52, 0.53, 0.52], [0.5, 0.5, 0.5, 0.5, 0.5]
    arms = {control: runs(flat, [0.49, 0.48, 0.49, 0.48, 0.49]),  # format down: kept only if nothing meets the rule
            anchor: runs([0.51, 0.52, 0.51, 0.52, 0.51], flat),
            "sft-only-PA": runs([0.6] * 5, flat),  # the largest gain, but a control
            bench.ARMS[4]: runs(up, [0.5, 0.49, 0.5, 0.5, 0.5])}  # format t -1.0: not above -1
    decision = bench.decide(base, arms)
    assert decision["rules"][anchor]["meets_rule"] and decision["rules"]["sft-only-PA"]["meets_rule"]
    assert not decision["rules"][bench.ARMS[4]]["meets_rule"] and not decision["rules"][control]["meets_rule"]
    assert decision["pick"] == anchor
    del arms[anchor]
    assert bench.decide(base, arms)["pick"] == bench.ARMS[4]  # no arm meets it: the one that best holds format
    partial = tmp_path / "grid.json.partial"
    partial.write_text(json.dumps({"start": base, "runs": arms}))
    result = bench.main(["--from_result", str(partial)])
    assert result["table"].startswith("Unfinished grid") and "no arm meets the rule" in result["table"]
    assert f"| {bench.ARMS[4]} − {control} |" in result["table"]
    # More seeds of some arms (the extension), tabled with the first grid as one; --arms keeps only those named.
    start = {**base, **dict.fromkeys([k for k, _ in bench.grid.METRICS], 0.5), "engine_depth": 8}
    partial.write_text(json.dumps({"start": start, "runs": arms}))
    more = tmp_path / "more.json.partial"
    more.write_text(json.dumps({"start": start, "runs": {control: [{**r, "seed": r["seed"] + 41} for r in arms[control]]}}))
    joined = bench.main(["--from_result", str(partial), str(more), "--arms", control, bench.ARMS[4]])
    assert f"| {control} | 10 |" in joined["table"] and f"| {bench.ARMS[4]} | 5 |" in joined["table"]
    assert "sft-only-PA" not in joined["table"]
    assert joined["title"].endswith("seeds 1-5, 42-46)")  # the seeds it tables, and the command that tabled them
    assert joined["command"] == (f"python experiments/best_move_grid.py --from_result {partial} {more} "
                                 f"--arms {control} {bench.ARMS[4]}")
    with pytest.raises(SystemExit):  # one seed of one arm twice
        bench.main(["--from_result", str(partial), str(partial)])
    # Panel sizing from per-position outcomes, paired against the start: 4 of 100 positions gained the best move, 2
    # lost it (mean +0.02); a panel needs (2 sd(d) / 0.02)^2 positions for that to stand 2 standard errors out.
    start, after = [0] * 100, [1] * 4 + [0] * 96
    start[50] = start[60] = 1
    size = bench.panel_size({"per_row": {"best_move_accuracy": start}}, [{"per_row": {"best_move_accuracy": after}}])
    d = [1] * 4 + [-1] * 2 + [0] * 94
    sd = statistics.pstdev(d)
    assert size["mean"] == pytest.approx(0.02) and size["flipped"] == pytest.approx(0.06)
    assert size["sd"] == pytest.approx(sd) and size["se_at_panel"] == pytest.approx(sd / math.sqrt(96))
    assert size["positions_needed"] == math.ceil((2 * sd / 0.02) ** 2) == 596
    assert bench.panel_size({"per_row": {}}, [{"per_row": {"best_move_accuracy": after}}]) is None


def test_b_anchor_grid_decides_by_its_plans_rule(tmp_path, monkeypatch):
    """docs/experiments/2026-11-29-b-anchor-grid-plan.md: best move and move-rank reward up at t >= 2, format and A:
    exact above t -1; the supervised control never ships; with none meeting it, the arm that best holds format among
    those whose best move rises."""
    monkeypatch.syspath_prepend(str(REPO / "experiments"))  # the grids import each other
    bench = load_script(REPO / "experiments" / "b_anchor_grid.py")
    bm = bench.bm
    keys = [k for k, _ in bench.METRICS]
    base = {**dict.fromkeys(keys, 0.5), "n_policy": 192, "n_env": 64}

    def runs(best, fmt, rank):
        return [{"seed": s, "eval": {**dict.fromkeys(keys, 0.5), "best_move_accuracy": b, "format_rate": f,
                                     "move_rank_reward": r}, "p_format_flat": 0.8, "guard_step": 20 * s,
                 "measured": {"commit": "c"}} for s, (b, f, r) in enumerate(zip(best, fmt, rank), 1)]

    up, flat, down = [0.52, 0.53, 0.52, 0.53, 0.52], [0.5] * 5, [0.49, 0.48, 0.49, 0.48, 0.49]
    control, b2e6, b1e5 = bench.ARMS[:3]
    arms = {control: runs(up, down, up),  # format down
            b2e6: runs(up, flat, flat),  # move-rank not up: misses this grid's rule (the last grid's would pass it)
            b1e5: runs([0.51, 0.52, 0.51, 0.52, 0.51], flat, up),
            "sft-only-PB": runs([0.6] * 5, flat, up)}  # the largest gain, but a control
    decision = bm.decide(base, arms, bench.B_ANCHOR)
    assert [a for a, r in decision["rules"].items() if r["meets_rule"]] == [b1e5, "sft-only-PB"]
    assert decision["pick"] == b1e5
    del arms[b1e5]
    fallback = bm.decide(base, arms, bench.B_ANCHOR)  # none meets it: format held best, best move up
    assert fallback["pick"] == b2e6 and fallback["why"].endswith("with best move up")
    result = bench.main(["--from_result", str(_partial(tmp_path, base, arms))])
    assert f"| {b2e6} − sft-only-PB |" in result["table"] and "guard's step" in result["table"]
    assert result["command"].startswith("python experiments/b_anchor_grid.py --from_result")
    assert "2026-11-29-b-anchor-grid-plan.md" in result["description"]


def test_format_gate_grid_decides_by_its_plans_rule(tmp_path, monkeypatch):
    """docs/experiments/2026-12-01-format-gate-grid-plan.md: best move up at t >= 2, format above t -1, move-rank
    reward and A: exact above t -1.5 and broken A: boards below t 1.5 (a rise is the bad direction); vanilla never
    ships; with none meeting it, the closest by the rule's order ships, naming what it misses; the floor arms are
    tabled beside the trained ones."""
    monkeypatch.syspath_prepend(str(REPO / "experiments"))  # the grids import each other
    bench = load_script(REPO / "experiments" / "format_gate_grid.py")
    bm = bench.bm
    keys = [k for k, _ in bench.METRICS]
    base = {**dict.fromkeys(keys, 0.5), "n_policy": 192, "n_env": 64}

    def runs(best, fmt, broken=(0.5,) * 5):
        return [{"seed": s, "eval": {**dict.fromkeys(keys, 0.5), "best_move_accuracy": b, "format_rate": f,
                                     "env_broken_rate": x}, "p_format_flat": 0.8, "guard_step": 20 * s,
                 "measured": {"commit": "c"}} for s, (b, f, x) in enumerate(zip(best, fmt, broken), 1)]

    up, flat, down = [0.52, 0.53, 0.52, 0.53, 0.52], [0.5] * 5, [0.49, 0.48, 0.49, 0.48, 0.49]
    floor_control, floor_charged = bench.DERIVED
    arms = {bench.CONTROL: runs(up, down), bench.CHARGED: runs(up, flat, broken=[0.52, 0.53, 0.52, 0.53, 0.52]),
            floor_charged: runs([0.51, 0.52, 0.51, 0.52, 0.51], flat), "vanilla-shipped": runs([0.6] * 5, flat),
            floor_control: runs(flat, flat)}
    decision = bm.decide(base, arms, bench.FORMAT_GATE)
    rules = decision["rules"]
    assert not rules[bench.CHARGED]["meets_rule"]  # more broken A: boards (t 7.4 the bad way)
    assert rules["vanilla-shipped"]["meets_rule"] and decision["pick"] == floor_charged  # vanilla: a reference
    del arms[floor_charged]
    fallback = bm.decide(base, arms, bench.FORMAT_GATE)
    assert fallback["pick"] == bench.CHARGED  # best move up and format held beat the control's format loss
    assert "missing env_broken_rate held (t > -1.5)" in fallback["why"]
    result = bench.main(["--from_result", str(_partial(tmp_path, base, arms))])
    assert f"| {floor_control} − {bench.CONTROL} |" in result["table"]
    assert "judged by the weights its guard picks with `heldout/format_rate` as a floor" in result["description"]


def _partial(tmp_path, base, runs):
    import json

    path = tmp_path / "grid.json.partial"
    path.write_text(json.dumps({"start": base, "runs": runs}))
    return path


def test_grpo_grid_decides_by_the_plans_rule_and_tables_an_unfinished_grid(tmp_path, monkeypatch):
    """The decision table applies the pre-registered rule (a primary metric up with t >= 2 against the start,
    neither down with t < -1); an unfinished grid's ``.partial`` tables as a look, marked unfinished."""
    import json

    monkeypatch.syspath_prepend(str(REPO / "experiments"))  # the grids import each other
    bench = load_script(REPO / "experiments" / "grpo_grid.py")
    keys = [k for k, _ in bench.METRICS]

    def runs(rank, exact):  # per seed: (move-rank reward, A: exact); other metrics 0
        return [{"seed": s, "eval": {**dict.fromkeys(keys, 0.0), "move_rank_reward": r, "env_exact_accuracy": e},
                 "steps": 10, "generated": 320, "seconds": 60.0, "a_flat_before": 0.5, "a_flat_after": 0.5,
                 "flat_before": 0.1, "flat_after": 0.1, "measured": {"commit": f"c{s}"}}
                for s, r, e in zip((1, 2, 3), rank, exact)]

    start = {"n_policy": 3, "n_env": 1, "engine_depth": 8, **dict.fromkeys(keys, 0.0),
             "move_rank_reward": 0.20, "env_exact_accuracy": 0.28}
    arms = {"vanilla": runs((0.22, 0.23, 0.21), (0.22, 0.20, 0.24)),  # rank up (t 3.5), A: down (t -5.2)
            "rookgrpo": runs((0.24, 0.25, 0.26), (0.28, 0.29, 0.27)),  # rank up (t 8.7), A: flat: meets it
            "anchor-0.1": runs((0.20, 0.21, 0.22), (0.27, 0.28, 0.26)),  # rank up (t 1.7), A: t -1.7: does not
            "dr-grpo": runs((0.25,), (0.30,)),  # one seed: no spread, no decision
            "negative-A-0.25": runs((0.25, 0.26, 0.27), (0.17, 0.17, 0.17))}  # A: down alike on every seed: t -inf
    partial = tmp_path / "grid.json.partial"
    partial.write_text(json.dumps({"steps": 10, "start": start, "runs": {**arms, "sft-only": []}}))
    out = tmp_path / "table.json"
    bench.main(["--from_result", str(partial), "--out", str(out)])
    result = json.loads(out.read_text())
    decision = result["decision"]
    assert [arm for arm, d in decision.items() if d["meets_rule"]] == ["rookgrpo"]
    assert "dr-grpo" not in decision and set(decision) == {"vanilla", "rookgrpo", "anchor-0.1", "negative-A-0.25"}
    assert decision["negative-A-0.25"]["env_exact_accuracy"]["t"] == float("-inf")
    assert abs(decision["vanilla"]["env_exact_accuracy"]["mean"] + 0.06) < 1e-9
    assert decision["rookgrpo"]["move_rank_reward"]["t_vanilla"] > 2
    assert decision["vanilla"]["move_rank_reward"].get("t_vanilla") is None
    assert "| rookgrpo | +0.050 ± 0.006 (t 8.7) |" in result["table"]
    assert result["table"].startswith("Unfinished grid, 13 runs (vanilla 3, rookgrpo 3, anchor-0.1 3, dr-grpo 1, "
                                       "negative-A-0.25 3)")
    assert "unfinished" in result["title"] and result["run_commits"] == ["c1", "c2", "c3"]
    # Against the supervised control (read, not ruled on): anchor-0.1's move-rank gain is sft-only's plus 0.01.
    control = runs((0.19, 0.20, 0.21), (0.28, 0.28, 0.28))
    ruled = bench.decide(start, {**arms, "sft-only": control})
    assert ruled["anchor-0.1"]["move_rank_reward"]["t_sft"] == float("inf")
    assert "t_sft" not in ruled["sft-only"]["move_rank_reward"]
    assert [arm for arm, d in ruled.items() if d["meets_rule"]] == ["rookgrpo"]


def test_grpo_grid_resumes_a_grid_without_losing_or_mixing_runs(tmp_path, monkeypatch):
    """Resuming keeps the runs of seeds and arms the command does not name, and refuses a .partial measured at other
    steps or from a start that evaluates differently, instead of overwriting it."""
    import json

    import pytest

    import rookgrpo.chess.evaluate

    monkeypatch.syspath_prepend(str(REPO / "experiments"))  # the grids import each other
    bench = load_script(REPO / "experiments" / "grpo_grid.py")
    keys = [k for k, _ in bench.METRICS]
    start = {"n_policy": 3, "n_env": 1, "engine_depth": 8, **dict.fromkeys(keys, 0.0)}

    def held(arm, seed):
        return {"seed": seed, "arm": arm, "eval": dict.fromkeys(keys, 0.1), "steps": 7, "generated": 224,
                "seconds": 1.0, "a_flat_before": 0.5, "a_flat_after": 0.5, "flat_before": 0.1, "flat_after": 0.1}

    out = tmp_path / "grid.json"
    partial = tmp_path / "grid.json.partial"
    before = {"steps": 7, "start": start, "runs": {"vanilla": [held("vanilla", 1), held("vanilla", 3)],
                                                  "dr-grpo": [held("dr-grpo", 1)]}}
    partial.write_text(json.dumps(before))
    trained = []

    def fake_run(arm, seed, steps, tmp):
        trained.append((arm, seed))
        return {"model": f"{arm}-{seed}", "steps": steps, "seconds": 1.0, "generated": 224, "a_flat_before": 0.4,
                "a_flat_after": 0.4, "flat_before": 0.1, "flat_after": 0.1}

    fresh = [0.0]
    monkeypatch.setattr(bench, "run", fake_run)
    monkeypatch.setattr(rookgrpo.chess.evaluate, "evaluate",
                        lambda model, data, **kw: {**start, **dict.fromkeys(keys, fresh[0] if model ==
                                                                             "rookgrpo/tiny-rookworld" else 0.2)})
    bench.main(["--steps", "7", "--seeds", "1", "2", "--arms", "vanilla", "rookgrpo", "--out", str(out)])
    assert trained == [("rookgrpo", 1), ("vanilla", 2), ("rookgrpo", 2)]
    kept = json.loads(partial.read_text())["runs"]
    assert [r["seed"] for r in kept["vanilla"]] == [1, 2, 3]  # seed 3 not named, still there
    assert kept["dr-grpo"] == before["runs"]["dr-grpo"]  # an arm not named, still there
    assert [r["seed"] for r in kept["rookgrpo"]] == [1, 2]
    # Other steps, or another start: refused before anything trains, the file untouched.
    text, trained[:] = partial.read_text(), []
    with pytest.raises(SystemExit):
        bench.main(["--steps", "8", "--seeds", "1", "--arms", "vanilla", "--out", str(out)])
    fresh[0] = 0.01
    with pytest.raises(SystemExit):
        bench.main(["--steps", "7", "--seeds", "4", "--arms", "vanilla", "--out", str(out)])
    assert trained == [] and partial.read_text() == text


def test_grpo_grid_combines_levers_into_one_arm_and_pairs_it_with_its_parts(tmp_path, monkeypatch):
    """``a+b`` runs the recipe with both levers' changes (the grid's ``best`` arm), refuses levers that set the same
    field, is kept in a resumed grid's file, and is compared with vanilla, the recipe and each part."""
    import json

    import pytest
    import yaml

    import rookgrpo.chess.evaluate
    from rookgrpo.recipe import parse_recipe

    monkeypatch.syspath_prepend(str(REPO / "experiments"))  # the grids import each other
    bench = load_script(REPO / "experiments" / "grpo_grid.py")
    arm = "lr1e-5-cosine+anchor-0.1"
    path = bench.arm_recipe(arm, str(tmp_path))
    recipe = yaml.safe_load(open(path).read())
    _, config, _ = parse_recipe([path, "--output_dir", str(tmp_path / "combo")])
    assert config.learning_rate == 1e-5 and config.lr_scheduler_type == "cosine"
    anchors = [c for c in recipe["callbacks"] if isinstance(c, dict) and c["name"] == "sft_anchor"]
    assert [c["coef"] for c in anchors] == [0.1]
    assert "heldout_guard" not in [bench._name(c) for c in recipe["callbacks"]]
    for bad in ("lr1e-5-cosine+lr2e-6-cosine", "anchor-0.1+anchor-0.3", "lr1e-5-cosine+sft-only",
                "vanilla+anchor-0.1", "lr1e-5-cosine+nope", "lr1e-5-cosine+lr1e-5-cosine",
                "reference-credit", "lr1e-5-cosine+negative-A-0.25", "lr2e-6-cosine+format-gate"):  # retired levers
        with pytest.raises(ValueError):
            bench.arm_spec(bad)
    trained = []
    monkeypatch.setattr(bench, "run", lambda arm, seed, steps, tmp: trained.append(arm) or {
        "model": f"{arm}-{seed}", "steps": steps, "seconds": 1.0, "generated": 224, "a_flat_before": 0.4,
        "a_flat_after": 0.4, "flat_before": 0.1, "flat_after": 0.1})
    with pytest.raises(SystemExit):  # refused by --arms before the start is evaluated or anything trains
        bench.main(["--steps", "7", "--seeds", "1", "--arms", "vanilla", "anchor-0.1+anchor-0.3"])
    assert trained == []
    keys = [k for k, _ in bench.METRICS]
    start = {"n_policy": 3, "n_env": 1, "engine_depth": 8, **dict.fromkeys(keys, 0.0)}
    value = {"vanilla": 0.1, "rookgrpo": 0.1, "lr1e-5-cosine": 0.2, "anchor-0.1": 0.2, arm: 0.3}
    monkeypatch.setattr(rookgrpo.chess.evaluate, "evaluate", lambda model, data, **kw: {**start, **dict.fromkeys(
        keys, 0.0 if model == "rookgrpo/tiny-rookworld" else value[model.rsplit("-", 1)[0]] + 0.01 * int(
            model.rsplit("-", 1)[1]) ** 2)})
    out = tmp_path / "grid.json"
    arms = ["vanilla", "rookgrpo", "lr1e-5-cosine", "anchor-0.1", arm]
    bench.main(["--steps", "7", "--seeds", "1", "2", "--arms", *arms, "--out", str(out)])
    assert json.loads(Path(f"{out}.partial").read_text())["runs"][arm][1]["seed"] == 2
    result = json.loads(out.read_text())
    for against in ("vanilla", "rookgrpo", "lr1e-5-cosine", "anchor-0.1"):
        gain = result["paired"][f"{arm}/top5_accuracy" if against == "vanilla" else f"{arm}-{against}/top5_accuracy"]
        assert abs(gain["mean"] - (0.2 if against in ("vanilla", "rookgrpo") else 0.1)) < 1e-9 and gain["se"] < 1e-9
    assert f"| {arm} − anchor-0.1 | +0.100 ± 0.000 (t inf) |" in result["table"]
    assert "every change of `lr1e-5-cosine` and `anchor-0.1`" in result["description"]


def test_the_shipped_recipe_is_the_grids_winning_arm(tmp_path, monkeypatch):
    """recipes/rookworld-tiny.yaml is what the last grid measured for the arm it picked, held-out evaluation and guard
    included (docs/experiments/2026-11-29-b-anchor-grid-plan.md); the grids' arms keep changing the recipe as it was
    when they ran."""
    import yaml

    monkeypatch.syspath_prepend(str(REPO / "experiments"))  # the grids import each other
    bench = load_script(REPO / "experiments" / "grpo_grid.py")
    shipped = yaml.safe_load(bench.RECIPE.read_text())
    assert bench.arm_spec(bench.SHIPPED_ARM)["heldout"] == [c for c in shipped["callbacks"]
                                                           if bench._name(c) in bench.HELDOUT_CALLBACKS]
    assert yaml.safe_load(open(bench.arm_recipe(bench.SHIPPED_ARM, str(tmp_path))).read()) == shipped
    base = bench.grid_base()
    spec = bench.arm_spec(bench.SHIPPED_ARM)  # every field the shipped arm changes has its value from before the grids
    assert set(spec["set"]) | ({"task_generation_kwargs"} if spec.get("task_kwargs") else set()) == set(bench.BEFORE_GRID)
    assert base["learning_rate"] == 5e-5 and base["lr_scheduler_type"] == "constant_with_warmup"
    assert "sft_anchor" not in [bench._name(c) for c in base["callbacks"]]


def test_benchmarks_holds_only_measurements_each_with_its_section_in_docs_benchmarks():
    """benchmarks/ is what docs/benchmarks.md cites: every script there is run by make bench (run_all's BENCHMARKS),
    every stored result is one of them, and each has its section in the generated report; the grids are in
    experiments/ (tests/test_experiments.py)."""
    run_all = _run_all()
    assert {p.stem for p in (REPO / "benchmarks").glob("bench_*.py")} == {s for _, s, _ in run_all.BENCHMARKS}
    names = {n for n, _, _ in run_all.BENCHMARKS}
    assert {p.stem for p in (REPO / "benchmarks" / "results").glob("*.json")} == names
    report = (REPO / "docs" / "benchmarks.md").read_text()
    for name in names:
        title = json.loads((REPO / "benchmarks" / "results" / f"{name}.json").read_text())["title"]
        assert f"# {title}\n" in report, name
