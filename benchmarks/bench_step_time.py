"""Step-time overhead of ``RookGRPOTrainer`` against vanilla TRL ``GRPOTrainer``, with a confidence interval.

Same config, model, data, reward and seed. Arms:

- ``vanilla``: TRL's ``GRPOTrainer``;
- ``rookgrpo``: ``RookGRPOTrainer`` as it ships with no callback named: its defaults on, position scoring
  (``position_ids_from_mask``), the mask guard (``no_fully_masked_rows``) and ``skip_nonfinite`` (target: ratio
  <= 1.03);
- ``diagnostics``: ``RookGRPOTrainer`` with the ``diagnostics`` callback (what every shipped recipe turns on).

The trainers are built once each and trained in interleaved blocks (vanilla, rookgrpo, diagnostics, vanilla, ...), so
load on the machine hits all alike; the first block of each is a warm-up. The ratio is of median step times (TRL's own
``step_time``); its 95% interval comes from a paired bootstrap over blocks (blocks resampled together, so drift in
machine load between blocks widens the interval instead of hiding in it). Blocks are added until the interval lies
wholly below or above 1.03 for the features-off arm, or ``--max-blocks`` is reached.

A second table measures what a resampled batch costs against a plain one: ``zero_std_resampling`` on a reward
where half the prompts give flat groups, against the same trainer without it: step time, completions generated and
no-grad log-prob rows (reference and old-policy passes outside the loss) per optimizer step.

    python benchmarks/bench_step_time.py [--steps 10] [--min-blocks 6] [--max-blocks 30]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile

from common import finish  # benchmarks/common.py

TARGET = 1.03


def build(cls, model_dir, dataset, out, steps, callbacks=None, reward=None, **overrides):
    from trl import GRPOConfig

    from rookgrpo import RookGRPOConfig
    from rookgrpo.rewards.basic import uci_charset

    settings = dict(output_dir=out, seed=3, use_cpu=True, bf16=False, report_to="none", save_strategy="no",
                    learning_rate=1e-3, max_steps=steps, per_device_train_batch_size=16, num_generations=8,
                    max_completion_length=32, logging_steps=1, disable_tqdm=True, beta=0.04,
                    # every completion 32 tokens: the trainers' trajectories part (position scoring changes what the
                    # rookgrpo arms learn), and a step's work must not part with them
                    generation_kwargs={"min_new_tokens": 32}, **overrides)
    args = (GRPOConfig if cls.__name__ == "GRPOTrainer" else RookGRPOConfig)(**settings)
    kwargs = {"callbacks": callbacks} if callbacks else {}
    return cls(model=str(model_dir), reward_funcs=reward or uci_charset, args=args, train_dataset=dataset, **kwargs)


def step_times(trainer) -> list[float]:
    trainer.state.log_history.clear()
    trainer.train()
    return [h["step_time"] for h in trainer.state.log_history if "step_time" in h]


def ratio_interval(blocks_a: list[list[float]], blocks_b: list[list[float]], n_boot: int = 2000,
                   seed: int = 0) -> tuple[float, float, float]:
    """Ratio of median step times (b / a) and its 95% paired-bootstrap interval over blocks."""
    rng = random.Random(seed)
    pooled = lambda blocks: [t for block in blocks for t in block]  # noqa: E731
    ratio = statistics.median(pooled(blocks_b)) / statistics.median(pooled(blocks_a))
    n = len(blocks_a)
    samples = []
    for _ in range(n_boot):
        picks = [rng.randrange(n) for _ in range(n)]
        samples.append(statistics.median(pooled([blocks_b[i] for i in picks]))
                       / statistics.median(pooled([blocks_a[i] for i in picks])))
    samples.sort()
    return ratio, samples[int(0.025 * n_boot)], samples[int(0.975 * n_boot) - 1]


def interleaved_blocks(trainers: dict, min_blocks: int, max_blocks: int, reference: str = "vanilla",
                       arm: str = "rookgrpo", target: float = TARGET) -> tuple[dict, str | None]:
    """Train every trainer a block at a time, in turn (the first block of each a warm-up), until the interval of
    ``arm``'s ratio to ``reference`` lies wholly below or above ``target`` (``"met"``, ``"missed"``) or
    ``max_blocks`` blocks are measured (``None``); returns the step times per block of each, and that decision."""
    blocks = {name: [] for name in trainers}
    for block in range(max_blocks + 1):
        for name, trainer in trainers.items():
            measured = step_times(trainer)
            if block > 0:
                blocks[name].append(measured)
        if block >= min_blocks:
            _, low, high = ratio_interval(blocks[reference], blocks[arm])
            if high <= target or low > target:
                return blocks, "met" if high <= target else "missed"
    return blocks, None


def verdict_text(decided: str | None, max_blocks: int, target: float = TARGET) -> str:
    return {"met": f"the interval lies below {target}: target met",
            "missed": f"the interval lies above {target}: target missed",
            None: f"undecided after {max_blocks} blocks: the interval still contains {target}"}[decided]


def overhead(model, dataset, tmp, args) -> tuple[str, dict]:
    from trl import GRPOTrainer

    from rookgrpo import RookGRPOTrainer
    from rookgrpo.callbacks import Diagnostics

    trainers = {"vanilla": build(GRPOTrainer, model, dataset, f"{tmp}/v", args.steps),
                "rookgrpo": build(RookGRPOTrainer, model, dataset, f"{tmp}/r", args.steps),
                "diagnostics": build(RookGRPOTrainer, model, dataset, f"{tmp}/d", args.steps, [Diagnostics()])}
    blocks, decided = interleaved_blocks(trainers, args.min_blocks, args.max_blocks)
    rows, stats = [], {}
    for name in trainers:
        steps = [t for b in blocks[name] for t in b]
        line = f"| {name} | {statistics.median(steps):.4f} | {len(steps)} |"
        if name != "vanilla":
            ratio, low, high = ratio_interval(blocks["vanilla"], blocks[name])
            stats[name] = {"ratio": ratio, "ci95": [low, high]}
            line += f" **{ratio:.3f}** [{low:.3f}, {high:.3f}] |"
        else:
            line += " 1 |"
        rows.append(line)
    verdict = verdict_text(decided, args.max_blocks)
    table = "\n".join([
        "| trainer | median step time (s) | steps measured | ratio to vanilla [95% interval] |",
        "| --- | --- | --- | --- |",
        *rows,
        "",
        f"RookGRPOTrainer with its defaults against vanilla (target <= {TARGET}): {verdict}.",
    ])
    return table, {"blocks": blocks, "stats": stats, "decided": decided}


def resampled_cost(model, dataset, tmp, args) -> tuple[str, dict]:
    """A plain batch against a resampled one, same trainer settings and reward, in step time and no-grad rows."""
    import torch

    from rookgrpo import RookGRPOTrainer
    from rookgrpo.callbacks import ZeroStdResampling

    allowed = set("abcdefgh12345678qrbn ")

    def half_flat(completions, signal, **kwargs):
        return [(sum(c in allowed for c in x) / len(x) if x else 0.0) if s else 0.5 for x, s in zip(completions, signal)]

    flat = dataset.map(lambda row, i: {"signal": i % 2 == 0}, with_indices=True)
    arms = {"plain": None, "resampled": [ZeroStdResampling(max_rounds=2)]}
    out = {}
    for name, callbacks in arms.items():
        trainer = build(RookGRPOTrainer, model, flat, f"{tmp}/c-{name}", args.cost_steps, callbacks, half_flat)
        counted = {"rows": 0}
        original = trainer._get_per_token_logps_and_entropies

        def counting(model_, input_ids, *a, _original=original, _counted=counted, **k):
            if not torch.is_grad_enabled():
                _counted["rows"] += input_ids.size(0)
            return _original(model_, input_ids, *a, **k)

        trainer._get_per_token_logps_and_entropies = counting
        times = step_times(trainer)
        history = trainer.state.log_history
        extra = sum(h.get("resample/extra_completions", 0) for h in history)
        rescored = sum(h.get("resample/rescored_rows", 0) for h in history)
        out[name] = {"step_time": statistics.median(times), "no_grad_rows": counted["rows"] / args.cost_steps,
                     "completions": 16 + extra / args.cost_steps, "rescored_rows": rescored / args.cost_steps}
    p, r = out["plain"], out["resampled"]
    table = "\n".join([
        "| batch | median step time (s) | completions generated / step | no-grad log-prob rows / step | of which "
        "recomputed after splicing |",
        "| --- | --- | --- | --- | --- |",
        f"| plain | {p['step_time']:.3f} | {p['completions']:.1f} | {p['no_grad_rows']:.1f} | 0 |",
        f"| resampled (`max_rounds: 2`) | {r['step_time']:.3f} | {r['completions']:.1f} | {r['no_grad_rows']:.1f} | "
        f"{r['rescored_rows']:.1f} |",
        f"| **ratio** | **{r['step_time'] / p['step_time']:.2f}x** | {r['completions'] / p['completions']:.2f}x | "
        f"{r['no_grad_rows'] / p['no_grad_rows']:.2f}x | |",
    ])
    return table, out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10, help="optimizer steps per block")
    ap.add_argument("--min-blocks", type=int, default=6, help="measured blocks before the interval is checked")
    ap.add_argument("--max-blocks", type=int, default=30, help="measured blocks at most per trainer")
    ap.add_argument("--cost-steps", type=int, default=20, help="steps of the plain/resampled comparison")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from rookgrpo.data import load_recipe_dataset
    from rookgrpo.models.tiny_model import TinyGPT2Spec, build_tiny_gpt2

    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_gpt2(f"{tmp}/model", TinyGPT2Spec(n_layer=4, n_head=4, n_embd=128))
        dataset = load_recipe_dataset("rookgrpo/smoke-prompts")
        overhead_table, overhead_stats = overhead(model, dataset, tmp, args)
        cost_table, cost_stats = resampled_cost(model, dataset, tmp, args)
    result = {
        "title": "Step time: RookGRPOTrainer vs GRPOTrainer, and what a resampled batch costs",
        "description": (
            "Char-level GPT-2 (4 layers, width 128), 16 completions per step (8 per prompt, every one 32 tokens: "
            "`min_new_tokens`, so a step's work does not depend on what each trainer has learned), beta 0.04, "
            f"CPU. Interleaved blocks of {args.steps} steps per trainer, first block discarded; TRL's own `step_time`. "
            "`rookgrpo` is RookGRPOTrainer as it ships with no callback: position scoring, the mask guard and "
            "skip_nonfinite on. Ratios of median step times with a 95% paired bootstrap interval over blocks. Second table: "
            "`zero_std_resampling` on a reward that makes half the groups flat, against the same trainer without it "
            f"({args.cost_steps} steps each)."
        ),
        "table": overhead_table + "\n\n" + cost_table,
        "command": f"python benchmarks/bench_step_time.py --steps {args.steps} --min-blocks {args.min_blocks} "
                   f"--max-blocks {args.max_blocks} --cost-steps {args.cost_steps}",
        "ratio": overhead_stats["stats"]["rookgrpo"]["ratio"],
        "ci95": overhead_stats["stats"]["rookgrpo"]["ci95"],
        "overhead": overhead_stats,
        "resampled_cost": cost_stats,
    }
    return finish(result, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
