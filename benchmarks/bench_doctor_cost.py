"""What the live ``doctor`` callback costs: a run with it against the same run without it, with a 95% interval.

Arms, same config, model, data, reward and seed: ``--setting tiny`` is ``bench_step_time``'s (char-level GPT-2, 4
layers, width 128, 16 completions of 32 tokens per step, beta 0.04, CPU: a model so small that one backward pass is a
large share of a step, the worst case); ``--setting recipe`` is ``make train``'s recipe (``recipes/rookworld-tiny.yaml``
on the packaged chess model, Stockfish rewards) without its held-out evaluation and guard, whose cost is the same in
both arms:

- ``diagnostics``: ``RookGRPOTrainer`` with ``diagnostics`` (what the shipped recipes ran before the doctor);
- ``doctor``: the same plus ``doctor`` at its defaults (detectors after every log, ``kl_grad_every: 10``).

The trainers are built once each and trained in interleaved blocks of 10 steps (each block's first step is a
measured one, so one step in ten pays the extra backward pass, as in a long run), the first block discarded. A
block's cost is its wall time, ``trainer.train()`` whole: the extra backward pass, the gradient comparison before the
optimizer step, and the detectors run after each log. Ratio of median block times, 95% paired bootstrap interval over
blocks; blocks are added until the interval lies wholly below or above 1.03, or ``--max-blocks``.

    python benchmarks/bench_doctor_cost.py [--setting tiny|recipe] [--min-blocks 6] [--max-blocks 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

from bench_step_time import build, ratio_interval
from common import finish

TARGET = 1.03
RECIPE = "recipes/rookworld-tiny.yaml"


def recipe_trainer(tmp: str, name: str, steps: int, doctor: bool):
    """``make train``'s recipe without chess_eval and heldout_guard; with or without the doctor."""
    import yaml

    from rookgrpo.train import build_trainer

    recipe = yaml.safe_load(open(RECIPE))
    drop = {"chess_eval", "heldout_guard"} | (set() if doctor else {"doctor"})
    recipe["callbacks"] = [c for c in recipe["callbacks"] if (c if isinstance(c, str) else c.get("name")) not in drop]
    path = f"{tmp}/{name}.yaml"
    with open(path, "w") as fh:
        yaml.safe_dump(recipe, fh)
    trainer, _, _ = build_trainer([path, "--max_steps", str(steps), "--output_dir", f"{tmp}/{name}", "--save_strategy",
                                   "no", "--logging_steps", "5", "--disable_tqdm", "true", "--seed", "1"])
    return trainer


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setting", choices=["tiny", "recipe"], default="tiny")
    ap.add_argument("--steps", type=int, default=10, help="optimizer steps per block (a multiple of kl_grad_every)")
    ap.add_argument("--min-blocks", type=int, default=6)
    ap.add_argument("--max-blocks", type=int, default=20)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from rookgrpo import RookGRPOTrainer
    from rookgrpo.callbacks import Diagnostics, Doctor
    from rookgrpo.data import load_recipe_dataset
    from rookgrpo.models.tiny_model import TinyGPT2Spec, build_tiny_gpt2

    blocks: dict[str, list[list[float]]] = {"diagnostics": [], "doctor": []}
    measured = []
    decided = None
    with tempfile.TemporaryDirectory() as tmp:
        if args.setting == "recipe":
            trainers = {"diagnostics": recipe_trainer(tmp, "d", args.steps, doctor=False),
                        "doctor": recipe_trainer(tmp, "x", args.steps, doctor=True)}
        else:
            model = build_tiny_gpt2(f"{tmp}/model", TinyGPT2Spec(n_layer=4, n_head=4, n_embd=128))
            dataset = load_recipe_dataset("rookgrpo/smoke-prompts")
            trainers = {"diagnostics": build(RookGRPOTrainer, model, dataset, f"{tmp}/d", args.steps, [Diagnostics()]),
                        "doctor": build(RookGRPOTrainer, model, dataset, f"{tmp}/x", args.steps,
                                        [Diagnostics(), Doctor(report=None)])}
        for block in range(args.max_blocks + 1):
            for name, trainer in trainers.items():
                trainer.state.log_history.clear()
                start = time.perf_counter()
                trainer.train()
                seconds = time.perf_counter() - start
                if block > 0:
                    blocks[name].append([seconds])
                if name == "doctor":
                    measured.append(sum("loss/kl_grad_share" in h for h in trainer.state.log_history))
            if block >= args.min_blocks:
                _, low, high = ratio_interval(blocks["diagnostics"], blocks["doctor"])
                if high <= TARGET or low > TARGET:
                    decided = "met" if high <= TARGET else "missed"
                    break
    ratio, low, high = ratio_interval(blocks["diagnostics"], blocks["doctor"])
    verdict = {"met": f"the interval lies below {TARGET}: target met",
               "missed": f"the interval lies above {TARGET}: target missed",
               None: f"undecided after {args.max_blocks} blocks: the interval still contains {TARGET}"}[decided]
    med = {n: statistics.median(t for b in v for t in b) for n, v in blocks.items()}
    base = "the recipe without doctor" if args.setting == "recipe" else "diagnostics"
    table = "\n".join([
        f"| run | median block time (s, {args.steps} steps) | blocks | ratio [95% interval] |",
        "| --- | --- | --- | --- |",
        f"| {base} | {med['diagnostics']:.2f} | {len(blocks['diagnostics'])} | 1 |",
        f"| {'the recipe' if args.setting == 'recipe' else 'diagnostics + doctor'} (`kl_grad_every: 10`) | {med['doctor']:.2f} | {len(blocks['doctor'])} | "
        f"**{ratio:.3f}** [{low:.3f}, {high:.3f}] |",
        "",
        f"Target <= {TARGET}: {verdict}. KL-gradient measurements per block: {statistics.median(measured):.0f}.",
    ])
    setting = ("make train's recipe (recipes/rookworld-tiny.yaml on the packaged chess model, Stockfish rewards, "
               "logging every 5 steps) without chess_eval and heldout_guard, against the same without doctor"
               if args.setting == "recipe" else
               "Char-level GPT-2 (4 layers, width 128), 16 completions per step (8 per prompt, 32 tokens), beta 0.04, "
               "CPU, logging every step: a model so small that a backward pass is a large share of a step")
    result = {
        "title": "What the live doctor callback costs" + (": make train's recipe" if args.setting == "recipe" else ""),
        "description": (
            f"{setting}. Interleaved blocks of {args.steps} steps per trainer (each block's first step measures the KL "
            "gradient: one extra backward pass per ten steps), first block discarded; a block's wall time, "
            "detectors after every log included. Ratio of median block times with a 95% paired bootstrap interval "
            "over blocks."),
        "table": table,
        "command": f"python benchmarks/bench_doctor_cost.py --setting {args.setting} --min-blocks {args.min_blocks} --max-blocks {args.max_blocks}",
        "ratio": ratio, "ci95": [low, high], "decided": decided, "blocks": blocks,
    }
    return finish(result, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
