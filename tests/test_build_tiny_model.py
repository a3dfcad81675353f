"""scripts/build_tiny_model.py: a rebuild with the same seed is identical, and stages run out of order say what to do.

Run at toy size (a few dozen lines, a one-layer model, three SFT steps): the claim that a rebuild reproduces the
shipped model rests on every stage being seeded and deterministic, which this checks end to end.
"""

import json

from conftest import REPO, run_cli, venv_bin

SCRIPT = str(REPO / "scripts" / "build_tiny_model.py")
TOY = ["--n_lines", "40", "--n_games", "8", "--n_eval", "4", "--n_grpo", "6", "--label_depth", "4", "--eval_depth", "4",
       "--workers", "2", "--n_layer", "1", "--n_head", "2", "--n_embd", "16", "--batch_size", "8", "--max_steps", "3"]


def build(tmp_path, name, *extra):
    return run_cli([venv_bin("python"), SCRIPT, *TOY, "--work", str(tmp_path / name / "work"),
                    "--out", str(tmp_path / name / "out"), *extra])


def test_a_rebuild_with_the_same_seed_is_identical(tmp_path):
    for name in ("first", "second"):
        proc = build(tmp_path, name)
        assert proc.returncode == 0, proc.stderr[-3000:]
    first, second = tmp_path / "first" / "out", tmp_path / "second" / "out"
    for f in ("train_positions.txt", "eval_positions.txt", "model.safetensors", "tokenizer.json"):
        assert (first / f).read_bytes() == (second / f).read_bytes(), f
    info = [json.loads((d / "build_info.json").read_text()) for d in (first, second)]
    assert info[0]["eval"] == info[1]["eval"]
    assert info[0]["splits"]["sft"] > 0 and info[0]["parameters"] > 0
    # The held-out splits keep a fixed A: share (a quarter) whatever the generated mix (here 70% A:), and the SFT mix
    # is every P: line of the SFT split with as many A: lines (sft_a_share 0.5).
    for name, n in (("eval_positions.txt", 4), ("train_positions.txt", 6)):
        lines = (first / name).read_text().splitlines()
        a_quota = round(n * 0.25)
        assert sum(l.startswith("A:") for l in lines) <= a_quota and sum(l.startswith("P:") for l in lines) <= n - a_quota
    sft_p = sum(l.startswith("P:") for l in (tmp_path / "first" / "work" / "sft.txt").read_text().splitlines())
    assert info[0]["stages"]["sft"]["train_lines"] == 2 * sft_p > 0
    card = (first / "README.md").read_text()
    assert card.startswith("# rookgrpo/tiny-rookworld") and "3 steps" in card and "--stage" not in card


def test_stages_out_of_order_say_which_stage_to_run(tmp_path):
    proc = build(tmp_path, "early", "--stage", "sft")
    assert proc.returncode != 0 and "run `--stage data` first" in proc.stderr
    assert build(tmp_path, "early", "--stage", "data").returncode == 0
    proc = build(tmp_path, "early", "--stage", "finish")
    assert proc.returncode != 0 and "run `--stage sft` first" in proc.stderr
    assert build(tmp_path, "early", "--stage", "sft").returncode == 0
    # The finish stage writes the model card, so it refuses arguments that differ from what the SFT stage used.
    proc = run_cli([venv_bin("python"), SCRIPT, *TOY, "--n_embd", "32", "--stage", "finish",
                    "--work", str(tmp_path / "early" / "work"), "--out", str(tmp_path / "early" / "out")])
    assert proc.returncode != 0 and "--n_embd 32 (the SFT stage used 16)" in proc.stderr
    proc = run_cli([venv_bin("python"), SCRIPT, *TOY, "--m_order", "rank", "--stage", "finish",
                    "--work", str(tmp_path / "early" / "work"), "--out", str(tmp_path / "early" / "out")])
    assert proc.returncode != 0 and "--m_order rank (the SFT stage used random)" in proc.stderr
