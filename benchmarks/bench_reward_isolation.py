"""What reward isolation (``reward_isolation``, on by default) costs when every reward call succeeds: step time with
it on against off, with a confidence interval, and the cost of one isolated call.

Table 1: ``RookGRPOTrainer`` with ``reward_isolation`` off and on (its default timeout: each synchronous call in a
thread of its own), same config, model, data and seed as ``bench_step_time.py`` (a 4-layer char GPT-2, 16 completions
of 32 tokens per step, CPU: a short step, where a fixed cost per call weighs most), with three reward functions
(``uci_charset``, a second synchronous one and an async one), every call succeeding. The trainers train in
interleaved blocks, the first block of each a warm-up; the ratio of median step times (TRL's ``step_time``) has a 95%
paired bootstrap interval over blocks; blocks are added until the interval lies wholly below or above 1.02, or
``--max-blocks``.

Table 2: one call of a reward function that does nothing (16 completions), directly and isolated: with the timeout (a
thread per call) and without (``reward_timeout: null``: exceptions and results checked only); microseconds per call,
median of ``--calls`` calls.

    python benchmarks/bench_reward_isolation.py [--steps 10] [--min-blocks 6] [--max-blocks 30]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time

from bench_step_time import build, interleaved_blocks, ratio_interval, verdict_text  # benchmarks/
from common import finish

TARGET = 1.02


def vowels(completions, **kwargs):
    return [sum(ch in "aeiou" for ch in c) / max(len(c), 1) for c in completions]


async def length_async(completions, **kwargs):
    await asyncio.sleep(0)
    return [min(len(c), 32) / 32 for c in completions]


def nothing(completions, **kwargs):
    return [0.0] * len(completions)


def step_cost(model, dataset, tmp, args) -> tuple[str, dict]:
    from rookgrpo import RookGRPOTrainer
    from rookgrpo.rewards.basic import uci_charset

    rewards = [uci_charset, vowels, length_async]
    trainers = {"off": build(RookGRPOTrainer, model, dataset, f"{tmp}/off", args.steps, reward=rewards,
                             reward_isolation=False),
                "on": build(RookGRPOTrainer, model, dataset, f"{tmp}/on", args.steps, reward=rewards)}
    blocks, decided = interleaved_blocks(trainers, args.min_blocks, args.max_blocks, reference="off", arm="on",
                                         target=TARGET)
    ratio, low, high = ratio_interval(blocks["off"], blocks["on"])
    rows = []
    for name in trainers:
        steps = [t for b in blocks[name] for t in b]
        tail = f" **{ratio:.3f}** [{low:.3f}, {high:.3f}] |" if name == "on" else " 1 |"
        rows.append(f"| {name} | {statistics.median(steps):.4f} | {len(steps)} |{tail}")
    table = "\n".join([
        "| reward_isolation | median step time (s) | steps measured | ratio to off [95% interval] |",
        "| --- | --- | --- | --- |",
        *rows,
        "",
        f"Isolation on against off, every reward succeeding (target <= {TARGET}): "
        f"{verdict_text(decided, args.max_blocks, TARGET)}.",
    ])
    return table, {"blocks": blocks, "ratio": ratio, "ci95": [low, high], "decided": decided}


def call_cost(calls: int) -> tuple[str, dict]:
    from rookgrpo.rewards.isolation import IsolatedSync

    prompts, completions = ["p"] * 16, ["c"] * 16
    arms = {"direct": nothing,
            "isolated, reward_timeout: null": IsolatedSync(nothing, 0, "nothing", lambda *a: None, None),
            "isolated, with a timeout (a thread per call)": IsolatedSync(nothing, 0, "nothing", lambda *a: None, 300.0)}
    micros = {}
    for name, func in arms.items():
        samples = []
        for _ in range(calls):
            start = time.perf_counter()
            func(prompts=prompts, completions=completions)
            samples.append((time.perf_counter() - start) * 1e6)
        micros[name] = statistics.median(samples)
    rows = [f"| {name} | {us:.1f} |" for name, us in micros.items()]
    table = "\n".join(["| one call of a reward that does nothing (16 completions) | microseconds (median) |",
                       "| --- | --- |", *rows])
    return table, micros


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10, help="optimizer steps per block")
    ap.add_argument("--min-blocks", type=int, default=6, help="measured blocks before the interval is checked")
    ap.add_argument("--max-blocks", type=int, default=30, help="measured blocks at most per arm")
    ap.add_argument("--calls", type=int, default=2000, help="calls per arm in the per-call table")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from rookgrpo.data import load_recipe_dataset
    from rookgrpo.models.tiny_model import TinyGPT2Spec, build_tiny_gpt2

    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_gpt2(f"{tmp}/model", TinyGPT2Spec(n_layer=4, n_head=4, n_embd=128))
        dataset = load_recipe_dataset("rookgrpo/smoke-prompts")
        step_table, step_stats = step_cost(model, dataset, tmp, args)
    call_table, micros = call_cost(args.calls)
    result = {
        "title": "Reward isolation's cost when every reward succeeds",
        "description": (
            "RookGRPOTrainer with reward_isolation off and on, the config of bench_step_time (char GPT-2, 4 layers, "
            "width 128; 16 completions of 32 tokens per step; CPU) and three reward functions (two synchronous, one "
            f"async). Interleaved blocks of {args.steps} steps, first block discarded; ratio of median step times "
            "with a 95% paired bootstrap interval over blocks. Second table: the cost of one call."
        ),
        "table": step_table + "\n\n" + call_table,
        "command": f"python benchmarks/bench_reward_isolation.py --steps {args.steps} --min-blocks {args.min_blocks} "
                   f"--max-blocks {args.max_blocks} --calls {args.calls}",
        "ratio": step_stats["ratio"],
        "ci95": step_stats["ci95"],
        "decided": step_stats["decided"],
        "call_micros": micros,
        "step": step_stats,
    }
    return finish(result, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
