"""`make train` in fp32 against bf16 autocast on CPU: step time side by side, and what bf16 does to the log-probs.

Both arms run the shipped recipe (``recipes/rookworld-tiny.yaml``: the packaged chess model, its chess rewards on local
Stockfish, resampling, adaptive beta, per-task sampling, diagnostics; without the held-out ``chess_eval``), once with
``bf16: false`` (the recipe before) and once with ``bf16: true``: torch autocast on CPU, weights and optimizer in fp32.
Each trainer is built once and trained in interleaved blocks (fp32, bf16, fp32, ...), so load on the machine hits both
alike; the first block of each is a warm-up. Reported: the ratio of median step times (TRL's ``step_time``) with a 95%
paired bootstrap interval over blocks, and the median of each phase the ``diagnostics`` callback times.

The second table is what bf16 costs in precision: the packaged model's per-token log-probs of the reference
completions of the held-out lines (the answers a trained model should give), computed as the loss computes them, in
fp32 and under bf16 autocast. The gap is the noise bf16 adds to every log-prob the loss and the KL term read; the
k3 column is the KL the estimator would report between a model and itself from that noise alone.

    python benchmarks/bench_precision.py [--steps 10] [--blocks 6] [--out result.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile

from bench_step_time import ratio_interval  # benchmarks/bench_step_time.py
from bench_tiny_grpo import arm_recipe  # benchmarks/bench_tiny_grpo.py
from common import finish  # benchmarks/common.py

PHASES = ("timing/generation", "timing/rewards", "timing/reference", "timing/loss")


def build(recipe: str, bf16: bool, steps: int, out: str):
    from rookgrpo.train import build_trainer

    argv = [recipe, "--bf16", str(bf16).lower(), "--max_steps", str(steps), "--output_dir", out,
            "--save_strategy", "no", "--logging_steps", "1", "--disable_tqdm", "true"]
    return build_trainer(argv)[0]


def block(trainer) -> tuple[list[float], dict[str, list[float]]]:
    trainer.state.log_history.clear()
    trainer.train()
    history = [h for h in trainer.state.log_history if "step_time" in h]
    return [h["step_time"] for h in history], {p: [h[p] for h in history if p in h] for p in PHASES}


def logp_gap(n_lines: int) -> dict:
    """Per-token log-probs of the held-out reference completions, fp32 against bf16 autocast (the packaged model)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rookgrpo.assets import resolve_model
    from rookgrpo.chess.data import load_rookworld

    path = resolve_model("rookgrpo/tiny-rookworld")
    model, tok = AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
    rows = load_rookworld("rookgrpo/tiny-rookworld-eval")
    rows = [rows[i] for i in range(min(n_lines, len(rows)))]
    gaps = []
    for row in rows:
        prompt = tok(row["prompt"], add_special_tokens=False)["input_ids"]
        ids = torch.tensor([prompt + tok(row["completion"], add_special_tokens=False)["input_ids"]])
        logps = []
        for bf16 in (False, True):
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                logits = model(ids).logits[0, len(prompt) - 1:-1].float()
            logps.append(torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt):, None])[:, 0])
        gaps.append(logps[1] - logps[0])
    gap = torch.cat(gaps)
    k3 = torch.exp(gap) - gap - 1
    return {"lines": len(rows), "tokens": gap.numel(), "mean_abs": gap.abs().mean().item(),
            "p99_abs": gap.abs().quantile(0.99).item(), "max_abs": gap.abs().max().item(), "k3_mean": k3.mean().item()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10, help="optimizer steps per block")
    ap.add_argument("--blocks", type=int, default=6, help="measured blocks per arm (after one warm-up block)")
    ap.add_argument("--lines", type=int, default=256, help="held-out lines for the log-prob gap")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.steps < 1 or args.blocks < 2:
        ap.error("--steps must be at least 1 and --blocks at least 2")

    with tempfile.TemporaryDirectory() as tmp:
        # The shipped recipe without the held-out check, which runs every 20 steps and would land in some blocks only.
        recipe = arm_recipe("rookgrpo", tmp)
        trainers = {"fp32": build(recipe, False, args.steps, f"{tmp}/fp32"),
                    "bf16": build(recipe, True, args.steps, f"{tmp}/bf16")}
        times = {name: [] for name in trainers}
        phases = {name: {p: [] for p in PHASES} for name in trainers}  # per phase, a list of blocks
        for b in range(args.blocks + 1):
            for name, trainer in trainers.items():
                measured, by_phase = block(trainer)
                print(f"block {b} {name}: median step {statistics.median(measured):.2f} s", flush=True)
                if b > 0:
                    times[name].append(measured)
                    for p in PHASES:
                        phases[name][p].append(by_phase[p])
    ratio, low, high = ratio_interval(times["fp32"], times["bf16"])
    # The phases bf16 can speed up (the policy's forward and backward, the reference's forward) run on batches of the
    # arms' own samples, so their ratio has its own interval; generation's depends on what each arm sampled.
    phase_ratios = {p: ratio_interval(phases["fp32"][p], phases["bf16"][p]) for p in PHASES
                    if all(phases[name][p] and all(phases[name][p]) for name in phases)}
    gap = logp_gap(args.lines)
    med = {name: {p: statistics.median([t for blk in v for t in blk]) for p, v in phases[name].items() if v}
           for name in phases}
    steps = {name: statistics.median([t for blk in times[name] for t in blk]) for name in times}
    rows = [f"| {name} | {steps[name]:.2f} | " + " | ".join(f"{med[name].get(p, float('nan')):.2f}" for p in PHASES)
            + f" | {sum(len(blk) for blk in times[name])} |" for name in times]
    ratio_row = f"| **bf16 / fp32** | **{ratio:.3f}** [{low:.3f}, {high:.3f}] | " + " | ".join(
        f"{phase_ratios[p][0]:.3f} [{phase_ratios[p][1]:.3f}, {phase_ratios[p][2]:.3f}]" if p in phase_ratios else "–"
        for p in PHASES) + " | |"
    table = "\n".join([
        "| precision | median step (s) | generation | rewards | reference | loss | steps measured |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *rows,
        ratio_row,
        "",
        "Ratios of medians, with 95% paired bootstrap intervals over blocks in brackets.",
        "",
        "| log-prob gap, bf16 autocast minus fp32 (packaged model, held-out reference completions) | value |",
        "| --- | --- |",
        f"| tokens ({gap['lines']} lines) | {gap['tokens']} |",
        f"| mean abs gap (nats) | {gap['mean_abs']:.4f} |",
        f"| 99th percentile abs gap | {gap['p99_abs']:.4f} |",
        f"| max abs gap | {gap['max_abs']:.4f} |",
        f"| k3 KL from the gap alone (nats per token) | {gap['k3_mean']:.6f} |",
    ])
    result = {
        "title": "make train's recipe in fp32 and in bf16 autocast (CPU): step time and log-prob precision",
        "description": (
            f"The shipped recipe without chess_eval, {args.steps}-step blocks per arm, interleaved, first block "
            "discarded; TRL's step_time and the diagnostics phase timings (medians, seconds). Ratio of median step "
            "times with a 95% paired bootstrap interval over blocks. Second table: per-token log-probs of the "
            "held-out reference completions under the packaged model, bf16 autocast against fp32."
        ),
        "table": table,
        "command": f"python benchmarks/bench_precision.py --steps {args.steps} --blocks {args.blocks} "
                   f"--lines {args.lines}",
        "ratio": ratio, "ci95": [low, high], "step_time": steps, "phases": med,
        "phase_ratios": {p: {"ratio": r, "ci95": [lo, hi]} for p, (r, lo, hi) in phase_ratios.items()},
        "logp_gap": gap,
        "blocks": times,
    }
    return finish(result, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
