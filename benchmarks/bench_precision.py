"""`make train`'s recipe in variants of numerics: fp32, bf16 autocast, and the packaged model's GELU kernel.

Every arm runs the shipped recipe (``recipes/rookworld-tiny.yaml``: the packaged chess model, its chess rewards on local
Stockfish, resampling, adaptive beta, per-task sampling, diagnostics; without the held-out ``chess_eval``):

- ``fp32``: the recipe as shipped (fp32, the packaged config's fused tanh GELU, ``gelu_pytorch_tanh``);
- ``bf16``: ``bf16: true``, torch autocast on CPU, weights and optimizer in fp32;
- ``gelu_new``: fp32 with the model's GELU computed as transformers' GPT-2 default writes it (``gelu_new``: the same
  tanh approximation from seven tensor ops, which the packaged config named before), set through
  ``model_init_kwargs`` for the policy and the reference alike.

Each trainer is built once and trained in interleaved blocks (fp32, bf16, gelu_new, fp32, ...), so load on the
machine hits every arm alike; the first block of each is a warm-up. Reported: each arm's ratio of median step times
(TRL's ``step_time``) to the first arm's, with a 95% paired bootstrap interval over blocks, and the median of each
phase the ``diagnostics`` callback times.

The second table is what each arm costs in precision: the packaged model's per-token log-probs of the reference
completions of the held-out lines (the answers a trained model should give), computed as the loss computes them, under
each arm and under the first. The gap is the noise the arm adds to every log-prob the loss and the KL term read; the
k3 column is the KL the estimator would report between a model and itself from that noise alone.

    python benchmarks/bench_precision.py [--steps 10] [--blocks 6] [--arms fp32 bf16 gelu_new] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))  # the grids' recipes (arm_recipe)
from bench_step_time import ratio_interval  # benchmarks/bench_step_time.py
from grpo_grid import arm_recipe  # experiments/grpo_grid.py
from common import finish  # benchmarks/common.py

PHASES = ("timing/generation", "timing/rewards", "timing/reference", "timing/loss")


# Arm -> (bf16 autocast, GELU kernel or None for the packaged config's); the recipe overrides follow from them.
ARMS = {"fp32": (False, None), "bf16": (True, None), "gelu_new": (False, "gelu_new")}


def overrides(arm: str) -> list[str]:
    bf16, activation = ARMS[arm]
    return ["--bf16", str(bf16).lower()] + (
        ["--model_init_kwargs", json.dumps({"activation_function": activation})] if activation else [])


def build(recipe: str, arm: str, steps: int, out: str):
    from rookgrpo.train import build_trainer

    argv = [recipe, *overrides(arm), "--max_steps", str(steps), "--output_dir", out,
            "--save_strategy", "no", "--logging_steps", "1", "--disable_tqdm", "true"]
    return build_trainer(argv)[0]


def block(trainer) -> tuple[list[float], dict[str, list[float]]]:
    trainer.state.log_history.clear()
    trainer.train()
    history = [h for h in trainer.state.log_history if "step_time" in h]
    return [h["step_time"] for h in history], {p: [h[p] for h in history if p in h] for p in PHASES}


def reference_logps(n_lines: int, arm: str) -> list:
    """Per-token log-probs of the first ``n_lines`` held-out reference completions under ``arm`` (packaged model),
    computed as the loss computes them: one tensor per line."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rookgrpo.assets import resolve_model
    from rookgrpo.chess.data import load_rookworld

    bf16, activation = ARMS[arm]
    path = resolve_model("rookgrpo/tiny-rookworld")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(
        path, **({"activation_function": activation} if activation else {})).eval()
    rows = load_rookworld("rookgrpo/tiny-rookworld-eval")
    out = []
    for i in range(min(n_lines, len(rows))):
        prompt = tok(rows[i]["prompt"], add_special_tokens=False)["input_ids"]
        ids = torch.tensor([prompt + tok(rows[i]["completion"], add_special_tokens=False)["input_ids"]])
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(ids).logits[0, len(prompt) - 1:-1].float()
        out.append(torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt):, None])[:, 0])
    return out


def logp_gap(arm_logps: list, base_logps: list) -> dict:
    """How far one arm's per-token log-probs lie from the base arm's (same lines, same tokens)."""
    import torch

    gap = torch.cat([a - b for a, b in zip(arm_logps, base_logps)])
    k3 = torch.exp(gap) - gap - 1
    return {"lines": len(arm_logps), "tokens": gap.numel(), "mean_abs": gap.abs().mean().item(),
            "p99_abs": gap.abs().quantile(0.99).item(), "max_abs": gap.abs().max().item(), "k3_mean": k3.mean().item()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10, help="optimizer steps per block")
    ap.add_argument("--blocks", type=int, default=6, help="measured blocks per arm (after one warm-up block)")
    ap.add_argument("--lines", type=int, default=256, help="held-out lines for the log-prob gap")
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS),
                    help="arms to compare; the ratios and gaps are against the first")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.steps < 1 or args.blocks < 2:
        ap.error("--steps must be at least 1 and --blocks at least 2")
    if len(set(args.arms)) < 2 or len(set(args.arms)) != len(args.arms):
        ap.error(f"--arms: give at least two different arms, got {args.arms}")
    base, others = args.arms[0], args.arms[1:]

    with tempfile.TemporaryDirectory() as tmp:
        # The shipped recipe without the held-out check, which runs every 20 steps and would land in some blocks only.
        recipe = arm_recipe("rookgrpo", tmp)
        trainers = {arm: build(recipe, arm, args.steps, f"{tmp}/{arm}") for arm in args.arms}
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
    ratios = {arm: ratio_interval(times[base], times[arm]) for arm in others}
    # The phases an arm can speed up (the policy's forward and backward, the reference's forward) run on batches of the
    # arms' own samples, so their ratio has its own interval; generation's depends on what each arm sampled.
    phase_ratios = {arm: {p: ratio_interval(phases[base][p], phases[arm][p]) for p in PHASES
                          if all(phases[name][p] and all(phases[name][p]) for name in (base, arm))}
                    for arm in others}
    logps = {arm: reference_logps(args.lines, arm) for arm in args.arms}  # each arm's once
    gaps = {arm: logp_gap(logps[arm], logps[base]) for arm in others}
    med = {name: {p: statistics.median([t for blk in v for t in blk]) for p, v in phases[name].items() if v}
           for name in phases}
    steps = {name: statistics.median([t for blk in times[name] for t in blk]) for name in times}
    rows = [f"| {name} | {steps[name]:.2f} | " + " | ".join(f"{med[name].get(p, float('nan')):.2f}" for p in PHASES)
            + f" | {sum(len(blk) for blk in times[name])} |" for name in times]
    ratio_rows = [
        f"| **{arm} / {base}** | **{ratios[arm][0]:.3f}** [{ratios[arm][1]:.3f}, {ratios[arm][2]:.3f}] | " + " | ".join(
            "{:.3f} [{:.3f}, {:.3f}]".format(*phase_ratios[arm][p]) if p in phase_ratios[arm] else "–"
            for p in PHASES) + " | |"
        for arm in others]
    gap_rows = [f"| {label} | " + " | ".join(fmt.format(gaps[arm][key]) for arm in others) + " |"
                for label, key, fmt in (("tokens", "tokens", "{}"), ("mean abs gap (nats)", "mean_abs", "{:.2e}"),
                                        ("99th percentile abs gap", "p99_abs", "{:.2e}"),
                                        ("max abs gap", "max_abs", "{:.2e}"),
                                        ("k3 KL from the gap alone (nats per token)", "k3_mean", "{:.2e}"))]
    table = "\n".join([
        "| arm | median step (s) | generation | rewards | reference | loss | steps measured |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *rows,
        *ratio_rows,
        "",
        "Ratios of medians, with 95% paired bootstrap intervals over blocks in brackets.",
        "",
        f"| log-prob gap against {base} (packaged model, {gaps[others[0]]['lines']} held-out reference completions) | "
        + " | ".join(others) + " |",
        "| --- |" + " --- |" * len(others),
        *gap_rows,
    ])
    result = {
        "title": "make train's recipe in fp32, bf16 autocast and with the unfused GELU (CPU): step time and log-prob "
                 "precision",
        "description": (
            f"The shipped recipe without chess_eval, {args.steps}-step blocks per arm, interleaved, first block "
            f"discarded; arms {', '.join(args.arms)} (bench_precision.py's docstring). TRL's step_time and the "
            "diagnostics phase timings (medians, seconds). Ratio of median step times to the first arm's, with a 95% "
            "paired bootstrap interval over blocks. Second table: per-token log-probs of the held-out reference "
            "completions under the packaged model, each arm against the first."
        ),
        "table": table,
        "command": f"python benchmarks/bench_precision.py --steps {args.steps} --blocks {args.blocks} "
                   f"--lines {args.lines} --arms {' '.join(args.arms)}",
        "ratios": {arm: {"ratio": r, "ci95": [lo, hi]} for arm, (r, lo, hi) in ratios.items()},
        "step_time": steps, "phases": med,
        "phase_ratios": {arm: {p: {"ratio": r, "ci95": [lo, hi]} for p, (r, lo, hi) in v.items()}
                         for arm, v in phase_ratios.items()},
        "logp_gap": gaps,
        "blocks": times,
    }
    return finish(result, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
