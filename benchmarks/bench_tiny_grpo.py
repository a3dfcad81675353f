"""Held-out quality for the same generation budget: vanilla GRPOTrainer against RookGRPOTrainer's dynamics.

Both start from the packaged ``rookgrpo/tiny-rookworld`` and train on its shipped positions with the recipe's chess
rewards, for the same number of generated completions (vanilla: ``--steps`` steps; rookgrpo: until its generated
completions, resampling rounds included, reach the same count). Vanilla is TRL's ``GRPOTrainer`` with the recipe's
fixed beta and one temperature, no resampling. rookgrpo is ``RookGRPOTrainer`` with the recipe's callbacks
(zero-std resampling, adaptive beta, diagnostics) and per-task sampling. Each run is then evaluated greedily on the
held-out positions; 3 seeds each.

    python benchmarks/bench_tiny_grpo.py [--steps 100] [--seeds 1 2 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from transformers import TrainerCallback

from common import finish  # benchmarks/common.py

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "rookworld-tiny.yaml"


class CompletionBudget(TrainerCallback):
    """Stops training once the completions generated (extra resampling rounds included) reach ``budget``."""

    def __init__(self, budget: int):
        self.budget, self.generated, self.trainer = budget, 0, None

    def on_step_end(self, args, state, control, **kwargs):
        metrics = self.trainer._metrics["train"]
        extra = sum(metrics.get("resample/extra_completions", [])[self._seen_extra:])
        self._seen_extra = len(metrics.get("resample/extra_completions", []))
        self.generated += args.per_device_train_batch_size * args.world_size + int(extra)
        if self.generated >= self.budget:
            control.should_training_stop = True

    def on_log(self, args, state, control, **kwargs):
        self._seen_extra = 0  # TRL clears its metric lists after logging

    _seen_extra = 0


def run(variant: str, seed: int, steps: int, tmp: str):
    from trl import GRPOConfig, GRPOTrainer

    from rookgrpo.train import build_trainer

    out = f"{tmp}/{variant}-{seed}"
    argv = [str(RECIPE), "--seed", str(seed), "--max_steps", str(steps), "--output_dir", out, "--save_strategy", "no",
            "--logging_steps", "1", "--disable_tqdm", "true"]
    trainer, _, model_path = build_trainer(argv)
    budget = steps * trainer.args.per_device_train_batch_size * trainer.args.world_size
    if variant == "vanilla":
        fields = {k: getattr(trainer.args, k) for k, f in GRPOConfig.__dataclass_fields__.items()
                  if f.init and hasattr(trainer.args, k)}
        fields.update(output_dir=out)
        fields.pop("generation_batch_size", None)  # derived from steps_per_generation; TRL rejects both
        # Rewards already resolved by name (and configured with the recipe's Stockfish settings) by the recipe's
        # trainer; the vanilla trainer gets the same objects.
        trainer = GRPOTrainer(model=model_path, reward_funcs=trainer.reward_funcs, args=GRPOConfig(**fields),
                              train_dataset=trainer.train_dataset)
    else:
        budget_cb = CompletionBudget(budget)
        budget_cb.trainer = trainer
        trainer.add_callback(budget_cb)
    trainer.train()
    trainer.save_model(out)
    generated = budget if variant == "vanilla" else budget_cb.generated
    return out, trainer.state.global_step, generated


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--eval_depth", type=int, default=8)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from rookgrpo.chess.engine import EngineSettings
    from rookgrpo.evaluate import evaluate

    settings = EngineSettings(depth=args.eval_depth)
    rows, results = [], {"vanilla": [], "rookgrpo": []}
    with tempfile.TemporaryDirectory() as tmp:
        base = evaluate("rookgrpo/tiny-rookworld", "rookgrpo/tiny-rookworld-eval", settings=settings, progress=False)
        for seed in args.seeds:
            for variant in ("vanilla", "rookgrpo"):
                model_dir, steps, generated = run(variant, seed, args.steps, tmp)
                m = evaluate(model_dir, "rookgrpo/tiny-rookworld-eval", settings=settings, progress=False)
                results[variant].append(m)
                rows.append(f"| {seed} | {variant} | {steps} | {generated} | {m['best_move_reward']:.3f} ± "
                            f"{m['best_move_reward_se']:.3f} | {m['legal_move_rate']:.3f} | "
                            f"{m.get('env_reward', float('nan')):.3f} |")
    summary = []
    for variant, ms in results.items():
        bm = [m["best_move_reward"] for m in ms]
        lg = [m["legal_move_rate"] for m in ms]
        sd = statistics.stdev(bm) if len(bm) > 1 else 0.0
        summary.append(f"| mean over seeds | **{variant}** | | | **{statistics.mean(bm):.3f}** (sd {sd:.3f}) | "
                       f"{statistics.mean(lg):.3f} | {statistics.mean(m.get('env_reward', float('nan')) for m in ms):.3f} |")
    table = "\n".join([
        "| seed | trainer | steps | completions generated | held-out best-move reward (± se) | legal-move rate | A: env reward |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        f"| - | start (packaged model) | 0 | 0 | {base['best_move_reward']:.3f} ± {base['best_move_reward_se']:.3f} | "
        f"{base['legal_move_rate']:.3f} | {base.get('env_reward', float('nan')):.3f} |",
        *rows, *summary,
    ])
    result = {
        "title": "Held-out best-move reward for the same generation budget (tiny-rookworld, 3 seeds)",
        "description": f"`recipes/rookworld-tiny.yaml`, {args.steps} steps of vanilla `GRPOTrainer` (fixed beta, one "
                       "temperature, no resampling) against `RookGRPOTrainer` with the recipe's callbacks and per-task "
                       "sampling, stopped at the same number of generated completions. Greedy evaluation on the "
                       f"{base['n_policy'] + base['n_env']} held-out positions, Stockfish depth {args.eval_depth}.",
        "table": table,
        "command": f"python benchmarks/bench_tiny_grpo.py --steps {args.steps} --seeds {' '.join(map(str, args.seeds))}",
        "start": base, "vanilla": results["vanilla"], "rookgrpo": results["rookgrpo"],
    }
    return finish(result, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
