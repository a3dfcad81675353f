"""benchmarks/bench_gpu_check.py, the GPU check anyone with a GPU runs, runs here on CPU at a tiny shape: the SDPA
kernel probe, vanilla TRL and the recipe with LoRA, each in its own process, every loss left-padded to the cuDNN
fault's width 192, every step checked finite, step time and per-phase memory measured, the table and the per-arm
results written."""

import json

import pytest

from conftest import REPO, load_script


@pytest.mark.slow
def test_the_gpu_check_runs_on_cpu_at_a_tiny_shape(tmp_path):
    bench = load_script(REPO / "benchmarks" / "bench_gpu_check.py")
    out = tmp_path / "result.json"
    result = bench.main(["--tiny", "--arms", "probe", "vanilla", "recipe+lora", "--steps", "2", "--force-width", "192",
                         "--work", str(tmp_path / "w"), "--out", str(out)])
    rows = {r["arm"]: r for r in result["rows"]}
    assert set(rows) == {"probe", "vanilla", "recipe+lora"}
    probe = rows.pop("probe")["probe"]
    assert {(r["width"], r["case"]) for r in probe} == {(w, c) for w in (191, 192, 193, 320)
                                                         for c in ("default", "no_cudnn", "no_fully_masked_rows")}
    assert not any(r["dq_nan"] for r in probe)  # CPU kernels have no such fault: this is the dry run
    assert "| 192 | 64 | default |" in result["table"]
    for arm, row in rows.items():
        assert row["error"] is None, (arm, row["error"])
        assert (row["steps"], row["finite_steps"], row["first_nonfinite_step"], row["weights_finite"]) == (2, 2, None, True)
        assert row["device"] == "cpu" and row["step_s"] > 0
        assert all(row["phases"][p]["seconds"] > 0 and row["phases"][p]["peak_mib"] > 0 for p in ("generate", "loss"))
        assert 0 < row["phases"]["generate"]["rewards_seconds"] < row["phases"]["generate"]["seconds"]
        assert row["widths"] == [192] and row["losses"] >= 2  # every loss forward at the forced width
    assert rows["recipe+lora"]["skipped_updates"] == 0 and rows["vanilla"]["skipped_updates"] is None
    assert rows["recipe+lora"]["kl_norm"] and not rows["vanilla"]["kl_norm"]  # the doctor's meter: the recipe's
    assert json.loads(out.read_text())["table"] == (tmp_path / "w" / "table.md").read_text().strip()
    assert len((tmp_path / "w" / "results.jsonl").read_text().splitlines()) == 3  # written as each arm ended
    assert "--force-width 192" in result["command"]
    assert bench.arm_recipe("+adaptive_beta", tmp_path)[0]["callbacks"] == [
        c for c in bench.arm_recipe("recipe", tmp_path)[0]["callbacks"] if bench._name(c) == "adaptive_beta"]
    with pytest.raises(SystemExit, match="unknown arm"):
        bench.arm_recipe("nonsense", tmp_path)
