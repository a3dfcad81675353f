"""The embedded default: the packaged chess model and positions load by short name, and the recipe trains."""

from pathlib import Path

import pytest

from conftest import REPO, load_script, read_json, run_cli, venv_bin
from rookgrpo.assets import TINY_ROOKWORLD, resolve_model

pytestmark = pytest.mark.skipif(not (TINY_ROOKWORLD / "model.safetensors").exists(),
                                reason="tiny-rookworld not built (python scripts/build_tiny_model.py)")


def test_packaged_assets_are_small_and_load_by_short_name():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    total = sum(f.stat().st_size for f in TINY_ROOKWORLD.rglob("*") if f.is_file())
    assert total < 20e6
    path = resolve_model("rookgrpo/tiny-rookworld")
    assert Path(path) == TINY_ROOKWORLD
    AutoModelForCausalLM.from_pretrained(path)
    AutoTokenizer.from_pretrained(path)
    assert (TINY_ROOKWORLD / "README.md").read_text().startswith("# rookgrpo/tiny-rookworld")


def test_train_and_eval_positions_are_disjoint_and_cover_both_tasks():
    from rookgrpo.chess.data import load_rookworld

    train = load_rookworld("rookgrpo/tiny-rookworld-train")
    held_out = load_rookworld("rookgrpo/tiny-rookworld-eval")
    assert set(train["task"]) == set(held_out["task"]) == {"P", "A"}

    def positions(rows):
        return {p[3:].split("+")[0].strip() for p in rows["prompt"]}

    assert not positions(train) & positions(held_out)


def test_the_guard_panel_is_carved_from_the_grpo_positions_by_whole_positions():
    """rookgrpo/tiny-rookworld-val (what chess_eval and heldout_guard select on) and -grpo (what the recipe trains on)
    split the GRPO positions: together all of them, no position in both, none in the reported panel (-eval)."""
    from collections import Counter

    from rookgrpo.chess.data import load_rookworld, position_key

    train, val, grpo, held_out = (load_rookworld(f"rookgrpo/tiny-rookworld-{name}")
                                  for name in ("train", "val", "grpo", "eval"))
    assert Counter(val["task"]) == {"P": 96, "A": 32}
    assert sorted(list(val["prompt"]) + list(grpo["prompt"])) == sorted(train["prompt"])

    def positions(rows):
        return {position_key(p) for p in rows["prompt"]}

    assert not positions(val) & positions(grpo) and not positions(val) & positions(held_out)


def test_the_fresh_validation_panel_is_in_no_packaged_file():
    """rookgrpo/tiny-rookworld-val-fresh: 288 P: and 32 A: positions, one line each, in none of the packaged files (the
    GRPO positions, the reported panel, the SFT sample); scripts/build_val_panel.py rebuilds it line for line."""
    from collections import Counter

    from rookgrpo.chess.assets import FRESH_VAL_ENV, FRESH_VAL_POLICY
    from rookgrpo.chess.data import load_rookworld, position_key

    fresh, train, held_out, sft = (load_rookworld(f"rookgrpo/tiny-rookworld-{name}")
                                   for name in ("val-fresh", "train", "eval", "sft-sample"))
    assert Counter(fresh["task"]) == {"P": FRESH_VAL_POLICY, "A": FRESH_VAL_ENV} == {"P": 288, "A": 32}

    def positions(rows):
        return {position_key(p) for p in rows["prompt"]}

    assert len(positions(fresh)) == len(fresh)
    assert not positions(fresh) & (positions(train) | positions(held_out) | positions(sft))
    build = load_script(REPO / "scripts" / "build_val_panel.py")
    lines, info = build.build(288, 32, seed=20261129, label_depth=8, max_plies=24, workers=2, progress=False)
    assert lines == (TINY_ROOKWORLD / "val_positions.txt").read_text().splitlines()  # Stockfish at a fixed depth


def test_the_packaged_model_knows_the_format(engine_settings):
    from rookgrpo.chess.evaluate import evaluate

    # Sampled, as GRPO sees it. On the first 128 held-out rows (64 P:, 64 A:) at T=0.6, v3 writes 95% of its P:
    # answers fully well-formed (v2, whose greedy lists repeated one move: 44%), with about 62% of its B: moves legal,
    # and gets 25% of the next states exactly right: far from solved, and far from nothing, so both tasks' groups
    # have reward spread.
    metrics = evaluate("rookgrpo/tiny-rookworld", "rookgrpo/tiny-rookworld-eval", n=128, settings=engine_settings,
                       progress=False, temperature=0.6, seed=0)
    assert metrics["format_rate"] > 0.8
    assert 0.3 < metrics["legal_move_rate"] < 0.9
    assert 0.03 < metrics["env_exact_accuracy"] < 0.6 and metrics["env_reward"] > metrics["env_exact_accuracy"] * 0.9
    assert metrics["best_move_reward"] < 0.9


CARD = REPO / "scripts" / "check_model_card.py"


def test_the_model_card_says_how_each_table_was_made():
    """Every panel of the card has its section and its `rookgrpo evaluate` command; a missing one is named."""
    check = load_script(CARD)
    assert [data for _, data in check.PANELS] == ["tiny-rookworld-eval", "tiny-rookworld-train",
                                                  "tiny-rookworld-sft-sample"]
    for _, data in check.PANELS:
        assert check.card_table(data).startswith("metric ")
    card = check.CARD.read_text()
    with pytest.raises(ValueError, match="does not say `rookgrpo evaluate"):
        check.card_table("tiny-rookworld-train", card.replace("--data rookgrpo/tiny-rookworld-train", "--data x"))


def test_the_model_card_numbers_are_what_evaluate_prints():
    """The card's held-out table must be its command's output at today's code (the two larger panels, about 4 minutes:
    ``python scripts/check_model_card.py``, which this runs for the held-out one)."""
    check = load_script(CARD)
    assert check.main(["--panel", "tiny-rookworld-eval"]) == 0  # 1, with both tables printed, where they differ


@pytest.mark.slow
def test_recipe_trains_two_steps_with_all_dynamics(tmp_path):
    out = tmp_path / "run"
    proc = run_cli([venv_bin("accelerate"), "launch", "--num_processes", "1", "-m", "rookgrpo",
                    str(REPO / "recipes" / "rookworld-tiny.yaml"), "--max_steps", "2", "--logging_steps", "1",
                    "--per_device_train_batch_size", "16", "--output_dir", str(out), "--save_strategy", "no"])
    assert proc.returncode == 0, proc.stderr[-4000:]
    history = read_json(out / "trainer_state.json")["log_history"]
    logged = [h for h in history if "loss" in h]
    assert len(logged) == 2
    for key in ("rewards/chess_move_rank/mean", "beta", "resample/rounds", "timing/generation", "groups/identical_frac"):
        assert any(key in h for h in logged), key
