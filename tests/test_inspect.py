"""`rookgrpo inspect`: one real step, whose numbers are the trainer's own (same recipe and seed)."""

import sys

import pytest

from conftest import run_cli, write_recipe
from rookgrpo.inspection import format_report, inspect_recipe
from rookgrpo.train import build_trainer


def test_inspect_numbers_are_the_training_numbers(tmp_path):
    recipe = str(write_recipe(tmp_path / "r.yaml", beta=0.04, callbacks=["diagnostics"]))
    report = inspect_recipe([recipe])
    trainer, _, _ = build_trainer([recipe, "--max_steps", "1", "--logging_steps", "1", "--output_dir",
                                   str(tmp_path / "train")])
    trainer.train()
    logged = [h for h in trainer.state.log_history if "loss" in h][0]
    step = report["step"]
    assert step["loss"] == pytest.approx(logged["loss"], rel=1e-6, abs=1e-9)
    assert step["grad_norm"] == pytest.approx(logged["grad_norm"], rel=1e-6)
    assert step["kl"] == pytest.approx(logged["kl"], rel=1e-6)
    batch = report["batch"]
    assert sum(batch["rewards"]) / len(batch["rewards"]) == pytest.approx(logged["reward"], rel=1e-6)
    G = report["num_generations"]
    assert len(batch["prompts"]) == len(batch["completions"]) == len(batch["advantages"]) == 8
    assert all(batch["prompts"][i] == batch["prompts"][i - i % G] for i in range(8))  # groups share a prompt
    text = format_report(report)
    for phase in ("1. prompts", "2. completions", "3. loss", "4. timing", "5. mean reward"):
        assert phase in text
    assert "policy term" in text and "beta·KL" in text


def test_inspect_cli_prints_the_phases_and_writes_json(tmp_path):
    recipe = write_recipe(tmp_path / "r.yaml")
    proc = run_cli([sys.executable, "-m", "rookgrpo.cli", "inspect", str(recipe), "--json", str(tmp_path / "i.json")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "3. loss" in proc.stdout and "(beta 0: no KL term)" in proc.stdout
    assert (tmp_path / "i.json").exists()
