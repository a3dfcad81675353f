"""RookWorld-LM-124M's shape on CPU: step time and peak memory of ``recipes/rookworld.yaml``, and a per-GPU estimate.

Builds GPT-2 124M with random weights and a GPT-2-pretokenized byte-level BPE (``rookgrpo.models.shapes``), writes generated
RookWorld lines in the hub layout, and runs the shipped recipe with local paths and CPU overrides, in process, at two
per-device batch sizes (completions per step). The recipe's ``zero_std_resampling`` is left out: with random weights
every group is flat, so it would always run its maximum rounds, which no trained model does. Random weights never
write an end token, so every completion runs to the recipe's ``max_completion_length`` (144): the longest step the
recipe can take. The first step of each run is a warm-up and is excluded.

Memory: each phase's peak resident set (``memory/<phase>`` from ``diagnostics``). The loss phase's peak at the two
batch sizes gives the activation memory per completion (the slope) and everything else (the intercept: weights,
reference, Adam state, runtime). The per-GPU table for the recipe's GPU settings (32 completions per device, bf16) is
an estimate, not a GPU measurement: model states from the usual mixed-precision Adam accounting (16 bytes per
parameter: DDP holds all, ZeRO-2 shards gradients and optimizer state, ZeRO-3 shards everything; the reference model
at 4 bytes per parameter in DDP, 2 under DeepSpeed bf16, sharded by ZeRO-3), plus activations scaled from the
CPU slope at float32 (an upper bound: bf16 autocast keeps most activations in 16 bits).

It also runs ``rookgrpo inspect`` and ``rookgrpo evaluate`` on the built model and counts LoRA's trainable share on
Qwen2.5-Coder-0.5B's real config (meta device).

    python benchmarks/bench_shapes.py [--batches 8 16] [--steps 3] [--gpus 8]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import finish  # benchmarks/common.py

REPO = Path(__file__).resolve().parents[1]
GIB = 1024 ** 3


def _recipe_without_resampling(path: Path) -> Path:
    import yaml

    recipe = yaml.safe_load((REPO / "recipes" / "rookworld.yaml").read_text())
    recipe["callbacks"] = [c for c in recipe["callbacks"]
                           if (c if isinstance(c, str) else c["name"]) != "zero_std_resampling"]
    path.write_text(yaml.safe_dump(recipe))
    return path


def run_recipe(recipe: Path, model_dir: Path, data_dir: Path, out: Path, batch: int, steps: int) -> dict:
    from rookgrpo.train import build_trainer

    trainer, _, _ = build_trainer([
        str(recipe), "--model_name_or_path", str(model_dir), "--dataset_name", str(data_dir), "--output_dir", str(out),
        "--max_steps", str(steps), "--per_device_train_batch_size", str(batch), "--logging_steps", "1",
        "--save_strategy", "no", "--disable_tqdm", "true", "--warmup_steps", "0"])
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h][1:]  # first step: warm-up
    phases = ("generation", "rewards", "reference", "loss", "optimizer")
    result = {"batch": batch, "steps": len(logs),
              "step_s": statistics.median(h["timing/step"] for h in logs),
              "time": {p: statistics.median(h[f"timing/{p}"] for h in logs) for p in phases},
              "peak_mib": {p: max(h[f"memory/{p}"] for h in logs) for p in phases},
              "process_peak_mib": max(h["memory/process_peak"] for h in logs),
              "params": sum(p.numel() for p in trainer.model.parameters()),
              "memory_kind": trainer._phases.memory_kind,
              "completion_tokens": statistics.mean(h["completions/mean_length"] for h in logs)}
    del trainer
    return result


def gpu_estimate(params: int, act_bytes_per_completion: float, completions: int, gpus: int) -> list[dict]:
    """Per-GPU GiB by strategy: (model states, reference, activations) for the recipe's GPU settings."""
    acts = act_bytes_per_completion * completions
    p = params
    rows = [("DDP (bf16 autocast)", 16 * p, 4 * p),
            ("DeepSpeed ZeRO-2 (bf16)", 2 * p + 14 * p / gpus, 2 * p),
            ("DeepSpeed ZeRO-3 (bf16)", 16 * p / gpus, 2 * p / gpus)]
    return [{"strategy": name, "states_gib": s / GIB, "reference_gib": r / GIB, "activations_gib": acts / GIB,
             "total_gib": (s + r + acts) / GIB} for name, s, r in rows]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs=2, default=[8, 16])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--lines", type=int, default=300)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import torch

    from rookgrpo.chess.data import generate
    from rookgrpo.chess.engine import EngineSettings
    from rookgrpo.models.shapes import build_rookworld_lm_shape, real_size_lora_count, write_hub_layout

    tmp = Path(tempfile.mkdtemp(prefix="bench_shapes_"))
    lines = generate(args.lines, seed=5, settings=EngineSettings(depth=6, workers=2), progress=False)
    val = REPO.parent / "shared" / "data" / "rook_val_500.txt"
    started = time.perf_counter()
    model_dir = build_rookworld_lm_shape(tmp / "rookworld-lm-124m", lines + (val.read_text().splitlines() if val.exists() else []))
    build_s = time.perf_counter() - started
    data_dir = write_hub_layout(lines, tmp / "rookworld-hub")
    recipe = _recipe_without_resampling(tmp / "rookworld-no-resampling.yaml")

    runs = [run_recipe(recipe, model_dir, data_dir, tmp / f"out{b}", b, args.steps + 1) for b in args.batches]
    small, large = runs
    slope = (large["peak_mib"]["loss"] - small["peak_mib"]["loss"]) / (large["batch"] - small["batch"])
    intercept = small["peak_mib"]["loss"] - slope * small["batch"]
    estimate = gpu_estimate(small["params"], slope * 1024 * 1024, 32, args.gpus)

    cli = str(Path(sys.executable).with_name("rookgrpo"))
    checks = {}
    for name, cmd in {
        "inspect": [cli, "inspect", str(recipe), "--model_name_or_path", str(model_dir), "--dataset_name",
                    str(data_dir), "--per_device_train_batch_size", "8", "--output_dir",
                    str(tmp / "inspect")],
        "evaluate": [cli, "evaluate", "--model", str(model_dir), "--data",
                     str(data_dir / "data" / "test-00000-of-00001.parquet"), "--n", "16", "--depth", "10",
                     "--out", str(tmp / "eval.json")],
    }.items():
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        checks[name] = {"returncode": proc.returncode, "seconds": time.perf_counter() - t0,
                        "tail": (proc.stdout + proc.stderr)[-600:]}
    lora_trainable, lora_total = real_size_lora_count(r=16)

    table = ["| per-device completions | median step (s) | generation | rewards | reference | loss (fwd+bwd) | "
             "optimizer | peak memory: generation / reference / loss / optimizer (MiB) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in runs:
        t, m = r["time"], r["peak_mib"]
        table.append(f"| {r['batch']} | {r['step_s']:.1f} | {t['generation']:.1f} | {t['rewards']:.2f} | "
                     f"{t['reference']:.1f} | {t['loss']:.1f} | {t['optimizer']:.2f} | {m['generation']:.0f} / "
                     f"{m['reference']:.0f} / {m['loss']:.0f} / {m['optimizer']:.0f} |")
    table += ["", f"Loss-phase peak = {intercept:.0f} MiB + {slope:.0f} MiB per completion of {small['completion_tokens']:.0f} "
              "tokens (float32, CPU). Estimated per-GPU memory for the recipe's settings (32 completions per device, "
              f"{args.gpus} GPUs; not measured on a GPU):", "",
              "| strategy | model states (GiB) | reference (GiB) | activations, fp32 upper bound (GiB) | total (GiB) |",
              "| --- | --- | --- | --- | --- |"]
    for e in estimate:
        table.append(f"| {e['strategy']} | {e['states_gib']:.2f} | {e['reference_gib']:.2f} | "
                     f"{e['activations_gib']:.2f} | {e['total_gib']:.2f} |")
    table += ["", f"`rookgrpo inspect` on the shape: exit {checks['inspect']['returncode']} in "
              f"{checks['inspect']['seconds']:.0f} s; `rookgrpo evaluate` (16 rows): exit "
              f"{checks['evaluate']['returncode']} in {checks['evaluate']['seconds']:.0f} s. LoRA r=16 on all linear "
              f"layers of Qwen2.5-Coder-0.5B: {lora_trainable:,} of {lora_total:,} parameters train "
              f"({100 * lora_trainable / lora_total:.2f}%)."]
    result = {
        "title": "RookWorld-LM-124M shape on CPU: step time, peak memory, and a per-GPU estimate",
        "description": (f"GPT-2 124M ({small['params'] / 1e6:.1f}M parameters, random weights, a 50257-id GPT-2-style "
                        "BPE) running `recipes/rookworld.yaml` (without resampling, see the script) with local paths "
                        f"on CPU ({torch.get_num_threads()} threads, float32); built in {build_s:.0f} s. Median of "
                        f"{args.steps} steps after a warm-up step; every completion runs to 144 tokens. Peak memory "
                        f"is the process's peak resident set per phase ({small['memory_kind']})."),
        "runs": runs, "estimate": estimate, "checks": checks, "activation_mib_per_completion": slope,
        "fixed_mib": intercept, "lora": {"trainable": lora_trainable, "total": lora_total},
        "command": "python benchmarks/bench_shapes.py", "table": "\n".join(table),
    }
    return finish(result, args.out)


if __name__ == "__main__":
    main()
    sys.exit(0)
