"""Step-time overhead: ``RookGRPOTrainer`` with every rookgrpo feature off against vanilla TRL ``GRPOTrainer``.

Same config, model, data, reward and seed; the two trainers are built once each and then trained in interleaved
blocks (vanilla, rookgrpo, vanilla, ...), so load on the machine hits both alike. The metric is the median of TRL's
own per-step ``step_time`` over the measured blocks (the first block of each is a warm-up). Target: ratio <= 1.03.

    python benchmarks/bench_step_time.py [--steps 10] [--blocks 6]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile

from common import finish  # benchmarks/common.py


def build(cls, model_dir, dataset, out, steps):
    from trl import GRPOConfig

    from rookgrpo import RookGRPOConfig
    from rookgrpo.rewards.basic import uci_charset

    settings = dict(output_dir=out, seed=3, use_cpu=True, bf16=False, report_to="none", save_strategy="no",
                    learning_rate=1e-3, max_steps=steps, per_device_train_batch_size=16, num_generations=8,
                    max_completion_length=32, logging_steps=1, disable_tqdm=True, beta=0.04)
    args = (GRPOConfig if cls.__name__ == "GRPOTrainer" else RookGRPOConfig)(**settings)
    return cls(model=str(model_dir), reward_funcs=uci_charset, args=args, train_dataset=dataset)


def step_times(trainer) -> list[float]:
    trainer.state.log_history.clear()
    trainer.train()
    return [h["step_time"] for h in trainer.state.log_history if "step_time" in h]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10, help="optimizer steps per block")
    ap.add_argument("--blocks", type=int, default=6, help="blocks per trainer (the first is a warm-up)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from trl import GRPOTrainer

    from rookgrpo import RookGRPOTrainer
    from rookgrpo.data import load_recipe_dataset
    from rookgrpo.tiny_model import TinyGPT2Spec, build_tiny_gpt2

    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_gpt2(f"{tmp}/model", TinyGPT2Spec(n_layer=4, n_head=4, n_embd=128))
        dataset = load_recipe_dataset("rookgrpo/smoke-prompts")
        trainers = {"vanilla": build(GRPOTrainer, model, dataset, f"{tmp}/v", args.steps),
                    "rookgrpo": build(RookGRPOTrainer, model, dataset, f"{tmp}/r", args.steps)}
        times = {name: [] for name in trainers}
        for block in range(args.blocks):
            for name, trainer in trainers.items():
                measured = step_times(trainer)
                if block > 0:
                    times[name] += measured
    v, r = statistics.median(times["vanilla"]), statistics.median(times["rookgrpo"])
    ratio = r / v
    table = "\n".join([
        "| trainer | median step time (s) | steps measured | min-max (s) |",
        "| --- | --- | --- | --- |",
        f"| TRL `GRPOTrainer` | {v:.4f} | {len(times['vanilla'])} | {min(times['vanilla']):.4f}-{max(times['vanilla']):.4f} |",
        f"| `RookGRPOTrainer`, features off | {r:.4f} | {len(times['rookgrpo'])} | "
        f"{min(times['rookgrpo']):.4f}-{max(times['rookgrpo']):.4f} |",
        f"| **ratio rookgrpo / vanilla** (target <= 1.03) | **{ratio:.3f}** | | |",
    ])
    result = {
        "title": "Step time: RookGRPOTrainer (features off) vs GRPOTrainer",
        "description": f"Char-level GPT-2 (4 layers, width 128), 16 completions per step (8 per prompt, 32 tokens), "
                       f"beta 0.04, CPU. {args.blocks} interleaved blocks of {args.steps} steps per trainer, first "
                       "block discarded; TRL's own `step_time` per step.",
        "table": table,
        "command": f"python benchmarks/bench_step_time.py --steps {args.steps} --blocks {args.blocks}",
        "ratio": ratio, "vanilla_step_times": times["vanilla"], "rookgrpo_step_times": times["rookgrpo"],
    }
    return finish(result, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
