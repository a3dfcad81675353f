"""Resampling cost: completions generated per signal-bearing group, rookgrpo against DAPO-style batch oversampling.

Same model (fixed: no optimizer step, so both sample one policy), prompts and reward. The reward gives a graded
score on a share ``--signal`` of the prompts and a constant on the rest, so the rest always form zero-std groups.

- rookgrpo: ``ZeroStdResampling(max_rounds)``: after a batch is scored, only its zero-std groups are replaced, by
  groups of fresh prompts, for up to ``max_rounds`` extra rounds (``resample/extra_completions`` counts them).
- DAPO (verl's ``filter_groups``): generate another full batch, keep its signal-bearing groups, until the batch
  has as many signal groups as it needs (extra signal groups are dropped), up to ``max_num_gen_batches``.

Both fill batches of ``--groups`` groups of ``--G`` completions; the metric is total completions generated divided
by signal-bearing groups delivered for training, over ``--batches`` batches (lower is better).

    python benchmarks/bench_resampling.py [--signal 0.3] [--batches 12]
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import torch

from common import finish  # benchmarks/common.py


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--signal", type=float, default=0.3, help="share of prompts whose groups can have signal")
    ap.add_argument("--groups", type=int, default=8, help="groups per batch")
    ap.add_argument("--G", type=int, default=4, help="completions per group")
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument("--max_rounds", type=int, default=8, help="cap for both methods (extra rounds/extra batches)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from trl import GRPOTrainer

    from rookgrpo import RookGRPOConfig, RookGRPOTrainer
    from rookgrpo.batch import zero_std_groups
    from rookgrpo.callbacks import ZeroStdResampling
    from rookgrpo.data import load_recipe_dataset
    from rookgrpo.tiny_model import build_tiny_gpt2

    allowed = set("abcdefgh12345678qrbn ")

    def partly_flat(completions, signal, **kwargs):
        return [(sum(c in allowed for c in x) / len(x) if x else 0.0) if s else 0.5 for x, s in zip(completions, signal)]

    n_signal_every = round(1 / args.signal)
    dataset = load_recipe_dataset("rookgrpo/smoke-prompts").map(
        lambda row, i: {"signal": i % n_signal_every == 0}, with_indices=True)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_gpt2(f"{tmp}/model")
        config = RookGRPOConfig(output_dir=tmp, seed=5, use_cpu=True, bf16=False, report_to="none",
                                per_device_train_batch_size=args.groups * args.G, num_generations=args.G,
                                max_completion_length=8, max_steps=args.batches, disable_tqdm=True)
        resampler = ZeroStdResampling(max_rounds=args.max_rounds)
        trainer = RookGRPOTrainer(model=str(model), reward_funcs=partly_flat, args=config, train_dataset=dataset,
                                  callbacks=[resampler])
        trainer.model.train()
        loader = iter(trainer.get_train_dataloader())
        weights = trainer.reward_weights
        batches = [next(loader) for _ in range(args.batches)]

        # rookgrpo: the trainer's own hook, batch by batch.
        rook_generated = rook_signal = 0
        for batch in batches:
            trainer.state.global_step += 1
            trainer._generate_and_score_completions(batch)
            metrics = trainer._metrics["train"]
            rook_generated += len(batch) + int(metrics["resample/extra_completions"][-1])
            rook_signal += round((1 - metrics["resample/frac_zero_std_after"][-1]) * args.groups)

        # DAPO-style: whole fresh batches until the batch has `groups` signal groups.
        dapo_generated = dapo_signal = 0
        fresh = iter(trainer.get_train_dataloader())
        for batch in batches:
            kept, extra_batches, candidate = 0, 0, batch
            while True:
                GRPOTrainer._generate_and_score_completions(trainer, candidate)
                dapo_generated += len(candidate)
                kept += int((~zero_std_groups(trainer._last_rewards_per_func, weights, args.G)).sum())
                if kept >= args.groups or extra_batches >= args.max_rounds:
                    break
                extra_batches += 1
                try:
                    candidate = next(fresh)
                except StopIteration:
                    fresh = iter(trainer.get_train_dataloader())
                    candidate = next(fresh)
            dapo_signal += min(kept, args.groups)
    rook_cost, dapo_cost = rook_generated / max(rook_signal, 1), dapo_generated / max(dapo_signal, 1)
    needed = args.batches * args.groups
    table = "\n".join([
        "| method | completions generated | signal groups delivered (of needed) | completions per signal group |",
        "| --- | --- | --- | --- |",
        f"| DAPO-style oversampling (whole batches) | {dapo_generated} | {dapo_signal} / {needed} | {dapo_cost:.2f} |",
        f"| rookgrpo `zero_std_resampling` | {rook_generated} | {rook_signal} / {needed} | {rook_cost:.2f} |",
        f"| **ratio DAPO / rookgrpo** | | | **{dapo_cost / rook_cost:.2f}x** |",
    ])
    result = {
        "title": "Resampling cost: completions per signal-bearing group",
        "description": f"Tiny char-level GPT-2 (fixed), {args.batches} batches of {args.groups} groups × {args.G} "
                       f"completions; {args.signal:.0%} of prompts can carry signal; cap {args.max_rounds} extra "
                       "rounds (rookgrpo) or extra batches (DAPO). Lower is better. Ideal is "
                       f"{args.G / args.signal:.1f} (G / signal share) when every signal prompt yields a signal group.",
        "table": table,
        "command": f"python benchmarks/bench_resampling.py --signal {args.signal} --batches {args.batches}",
        "ratio": dapo_cost / rook_cost, "rookgrpo": [rook_generated, rook_signal], "dapo": [dapo_generated, dapo_signal],
    }
    return finish(result, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
