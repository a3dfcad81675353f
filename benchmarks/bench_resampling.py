"""Resampling cost: what each way of filling a batch with signal-bearing groups spends, side by side.

Same model (fixed: no optimizer step, so every arm samples one policy), prompts and reward. The reward gives a graded
score on a share ``--signal`` of the prompts and a constant on the rest, so the rest always form zero-std groups.
Every arm needs batches of ``--groups`` groups of ``--G`` completions:

- vanilla: TRL as it is: one generation batch of ``groups`` prompts; its flat groups are trained on (no signal).
- DAPO (faithful to verl's ``filter_groups``): generation batches of ``--gen-factor`` x ``groups`` *new* prompts
  (DAPO's recipes use about 3x), keep the groups with reward spread, repeat until ``groups`` are kept or
  ``--max-gen-batches`` batches were generated, drop the excess. verl computes old-policy and reference log-probs
  after filtering, on the final batch only, so its no-grad rows are counted that way.
- rookgrpo ``zero_std_resampling``: score the batch, then replace only its flat groups with groups of fresh prompts,
  up to ``--max-rounds`` extra rounds. It works through TRL's generate-and-score, which computes the reference
  log-probs of every round; those passes, and the rows recomputed after splicing, are counted as they happen.

Per arm, over ``--batches`` batches: completions generated per signal group delivered (lower is better), generate
calls, no-grad log-prob rows and wall time, each per batch and per signal group. The floor is ``G / p``, with ``p`` the
share of drawn prompts whose group has signal (measured on every group the vanilla and DAPO arms generated): no
method that draws prompts blind can do better on average.

    python benchmarks/bench_resampling.py [--signal 0.3] [--batches 12]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import torch

from common import finish  # benchmarks/common.py


class Counter:
    """Counts generate calls, completions and no-grad log-prob rows a trainer spends."""

    def __init__(self, trainer):
        self.calls = self.completions = self.no_grad_rows = 0
        generate, logps = trainer._generate, trainer._get_per_token_logps_and_entropies

        def counted_generate(prompts):
            self.calls += 1
            self.completions += len(prompts)
            return generate(prompts)

        def counted_logps(model, input_ids, *args, **kwargs):
            if not torch.is_grad_enabled():
                self.no_grad_rows += input_ids.size(0)
            return logps(model, input_ids, *args, **kwargs)

        trainer._generate = counted_generate
        trainer._get_per_token_logps_and_entropies = counted_logps

    def snapshot(self):
        return self.calls, self.completions, self.no_grad_rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--signal", type=float, default=0.3, help="share of prompts whose groups can have signal")
    ap.add_argument("--groups", type=int, default=8, help="groups per training batch")
    ap.add_argument("--G", type=int, default=4, help="completions per group")
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument("--gen-factor", type=int, default=3, help="DAPO generation batch, in training batches")
    ap.add_argument("--max-gen-batches", type=int, default=8, help="DAPO: generation batches per training batch")
    ap.add_argument("--max-rounds", type=int, default=8, help="rookgrpo: extra rounds per batch")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from trl import GRPOTrainer

    from rookgrpo import RookGRPOConfig, RookGRPOTrainer
    from rookgrpo.dynamics.batch import zero_std_groups
    from rookgrpo.callbacks import ZeroStdResampling
    from rookgrpo.data import load_recipe_dataset
    from rookgrpo.models.tiny_model import build_tiny_gpt2

    allowed = set("abcdefgh12345678qrbn ")

    def partly_flat(completions, signal, **kwargs):
        return [(sum(c in allowed for c in x) / len(x) if x else 0.0) if s else 0.5 for x, s in zip(completions, signal)]

    n_signal_every = round(1 / args.signal)
    dataset = load_recipe_dataset("rookgrpo/smoke-prompts").map(
        lambda row, i: {"signal": i % n_signal_every == 0}, with_indices=True)
    G, groups = args.G, args.groups
    drawn = {"groups": 0, "signal": 0}  # every group the vanilla and DAPO arms generated: an unbiased draw

    def signal_mask(trainer):
        flat = zero_std_groups(trainer._last_rewards_per_func, trainer.reward_weights, G)
        drawn["groups"] += flat.numel()
        drawn["signal"] += int((~flat).sum())
        return ~flat

    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_gpt2(f"{tmp}/model")
        config = RookGRPOConfig(output_dir=tmp, seed=5, use_cpu=True, bf16=False, report_to="none", beta=0.04,
                                per_device_train_batch_size=groups * G, num_generations=G,
                                max_completion_length=8, max_steps=args.batches, disable_tqdm=True)
        resampler = ZeroStdResampling(max_rounds=args.max_rounds)
        trainer = RookGRPOTrainer(model=str(model), reward_funcs=partly_flat, args=config, train_dataset=dataset,
                                  callbacks=[resampler])
        trainer.model.train()
        counter = Counter(trainer)
        loader = iter(trainer.get_train_dataloader())
        batches = [next(loader) for _ in range(args.batches)]
        generator = torch.Generator().manual_seed(11)
        stream = iter(())

        def fresh_rows(n_prompts):
            nonlocal stream
            rows = []
            for _ in range(n_prompts):
                index = next(stream, None)
                if index is None:
                    stream = iter(torch.randperm(len(dataset), generator=generator).tolist())
                    index = next(stream)
                rows += [dict(dataset[index])] * G
            return rows

        results = {}

        # vanilla: TRL's own generate-and-score on each batch, flat groups and all.
        start, before, delivered = time.perf_counter(), counter.snapshot(), 0
        for batch in batches:
            GRPOTrainer._generate_and_score_completions(trainer, batch)
            delivered += int(signal_mask(trainer).sum())
        results["vanilla"] = (time.perf_counter() - start, before, counter.snapshot(), delivered, None)

        # DAPO, as verl's filter_groups: generation batches of new prompts, keep signal groups, drop the excess.
        start, before, delivered = time.perf_counter(), counter.snapshot(), 0
        for _ in batches:
            kept = 0
            for _ in range(args.max_gen_batches):
                GRPOTrainer._generate_and_score_completions(trainer, fresh_rows(args.gen_factor * groups))
                kept += int(signal_mask(trainer).sum())
                if kept >= groups:
                    break
            delivered += min(kept, groups)
        after = counter.snapshot()
        # verl computes old/ref log-probs on the final batch only: count those rows, not the ones TRL computed.
        verl_rows = (after[2] - before[2], groups * G * args.batches)
        results["dapo"] = (time.perf_counter() - start, before, after, delivered, verl_rows)

        # rookgrpo: the trainer's own hook, batch by batch.
        start, before, delivered = time.perf_counter(), counter.snapshot(), 0
        for batch in batches:
            trainer.state.global_step += 1
            trainer._generate_and_score_completions(batch)
            metrics = trainer._metrics["train"]
            delivered += round((1 - metrics["resample/frac_zero_std_after"][-1]) * groups)
        results["rookgrpo"] = (time.perf_counter() - start, before, counter.snapshot(), delivered, None)

    p = drawn["signal"] / drawn["groups"]
    floor = G / p
    n = args.batches
    rows, stats = [], {}
    labels = {"vanilla": "vanilla TRL (no filtering)", "dapo": f"DAPO-style (verl `filter_groups`, {args.gen_factor}x "
              "generation batch, new prompts)", "rookgrpo": "rookgrpo `zero_std_resampling`"}
    for name, (seconds, before, after, delivered, verl_rows) in results.items():
        calls, completions, no_grad = (a - b for a, b in zip(after, before))
        if verl_rows is not None:
            no_grad = verl_rows[1]
        per_signal = completions / max(delivered, 1)
        stats[name] = {"seconds": seconds, "generate_calls": calls, "completions": completions,
                       "no_grad_rows": no_grad, "signal_groups": delivered, "completions_per_signal_group": per_signal}
        rows.append(f"| {labels[name]} | {delivered} / {groups * n} | {completions / n:.1f} | **{per_signal:.2f}** | "
                    f"{calls / n:.2f} | {no_grad / n:.1f} | {seconds / max(delivered, 1):.3f} |")
    ratio = stats["dapo"]["completions_per_signal_group"] / stats["rookgrpo"]["completions_per_signal_group"]
    table = "\n".join([
        "| method | signal groups delivered (of needed) | completions / batch | completions / signal group | "
        "generate calls / batch | no-grad log-prob rows / batch | seconds / signal group |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *rows,
        f"| floor: G / p (p = {p:.3f}, share of drawn groups with signal) | | | {floor:.2f} | | | |",
        f"| **DAPO / rookgrpo, completions per signal group** | | | **{ratio:.2f}x** | | | |",
    ])
    result = {
        "title": "Resampling cost: completions, generate calls and no-grad rows per signal-bearing group",
        "description": (
            f"Tiny char-level GPT-2 (fixed), {n} batches of {groups} groups x {G} completions; {args.signal:.0%} of "
            f"prompts can carry signal. DAPO: generation batches of {args.gen_factor}x the training batch of new "
            f"prompts, at most {args.max_gen_batches} per training batch, excess dropped; its no-grad rows as verl "
            "counts them (old/ref log-probs on the final batch only). rookgrpo: at most "
            f"{args.max_rounds} extra rounds; reference log-probs of every round (TRL computes them while scoring) and "
            "rows recomputed after splicing, as counted. Vanilla delivers its signal groups and trains on its flat "
            "ones too. Beta 0.04."
        ),
        "table": table,
        "command": f"python benchmarks/bench_resampling.py --signal {args.signal} --batches {args.batches} "
                   f"--gen-factor {args.gen_factor}",
        "ratio": ratio, "floor": floor, "signal_share": p, "arms": stats,
    }
    return finish(result, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
