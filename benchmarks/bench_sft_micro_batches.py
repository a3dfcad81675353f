"""The tiny model's SFT step with the batch run whole against length-sorted micro-batches (`--micro_batches`).

`scripts/build_tiny_model.py --micro_batches K` runs each batch of 64 lines as K parts of lines sorted by length, each
padded to its own longest line, forward and backward one after another: the same loss and gradient as the whole
batch (`tests/test_build_tiny_model.py` checks it), fewer padded tokens (P: lines are about 116 tokens, A: lines about
157, and a mixed batch pads every line to its longest) and smaller tensors. This measures what that buys per step.

Every arm is the build's own SFT trainer (the packaged model's shape and tokenizer, bf16 autocast, eager attention,
batch 64, the loss on the whole line) on the same stream of lines, half P: and half A: as the build's SFT mix, drawn
with replacement from the packaged positions (the SFT lines themselves are not packaged; `--work` reads a build's
`sft.txt` instead). Each trainer is built once and trained in interleaved blocks (1, 2, 4, 1, 2, 4, ...), the first
block of each a warm-up. Reported: median step time per arm and its ratio to the first arm's, with a 95% paired
bootstrap interval over blocks; `--own` adds the own-list terms to every step, as v3's last 40% of steps had them.
An arm ``K:OPTION...`` runs K micro-batches with the model's config changed: an activation (``4:gelu_new``, the GELU
of `build_tiny_model.py --activation`), ``dropout=P`` (``4:dropout=0``, `--dropout`) or ``squares`` (``4:squares``,
the shared square vectors of `--move_squares`); a plain ``K`` keeps the packaged config's (dropout 0.1). Gradient
checkpointing is off, as in the build (TRL's `SFTConfig` turns it on by default; timings at commit `0043756` and `be3ecfe` had it on, so they included a second forward pass per step).

    python benchmarks/bench_sft_micro_batches.py [--steps 8] [--blocks 5] [--arms 1 2 4] [--own] [--out result.json]
    python benchmarks/bench_sft_micro_batches.py --arms 4 4:gelu_new     # the GELU kernel, at the build's setting
    python benchmarks/bench_sft_micro_batches.py --arms 4 4:dropout=0    # the dropout masks
    python benchmarks/bench_sft_micro_batches.py --arms 4:dropout=0 4:dropout=0:squares   # --move_squares
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_step_time import ratio_interval  # benchmarks/bench_step_time.py
from common import finish  # benchmarks/common.py

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import build_tiny_model  # noqa: E402  (scripts/build_tiny_model.py: the trainer, loss and data helpers it times)


def sft_stream(n: int, work: str | None, seed: int = 0) -> list[str]:
    """``n`` lines, half P: and half A: (the build's SFT mix), drawn with replacement."""
    from rookgrpo.assets import resolve_model

    if work:
        lines = (Path(work) / "sft.txt").read_text().splitlines()
    else:
        assets = Path(resolve_model("rookgrpo/tiny-rookworld"))
        lines = [x for f in ("train_positions.txt", "eval_positions.txt") for x in (assets / f).read_text().splitlines()]
    by_task = {t: [x for x in lines if x.startswith("P:") == (t == "P")] for t in ("P", "A")}
    rng = random.Random(seed)
    return [rng.choice(by_task["P" if i % 2 else "A"]) for i in range(n)]


class StepTimer:
    """Wall time of each optimizer step (a ``TrainerCallback``)."""

    def __init__(self):
        from transformers import TrainerCallback

        timer = self

        class _Callback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                timer.started = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                timer.times.append(time.perf_counter() - timer.started)

        self.callback, self.times, self.started = _Callback(), [], 0.0


def parse_arm(arm: str) -> tuple[int, dict]:
    """An arm: ``K`` micro-batches, then ``:``-separated changes to the model's config.

    >>> parse_arm("4")
    (4, {})
    >>> parse_arm("4:gelu_new:dropout=0")
    (4, {'activation_function': 'gelu_new', 'embd_pdrop': 0.0, 'attn_pdrop': 0.0, 'resid_pdrop': 0.0})
    >>> parse_arm("4:squares")
    (4, {'move_squares': True})
    """
    k, *options = arm.split(":")
    config = {}
    for option in options:
        name, eq, value = option.partition("=")
        if name == "dropout" and eq:
            config.update(build_tiny_model.dropout_config(float(value)))
        elif name in build_tiny_model.ACTIVATION_TEXT and not eq:
            config["activation_function"] = name
        elif name == "squares" and not eq:
            config["move_squares"] = True
        else:
            raise ValueError(f"unknown option {option!r}: expected an activation "
                             f"({', '.join(sorted(build_tiny_model.ACTIVATION_TEXT))}), dropout=P or squares")
    return int(k), config


def build(arm: str, lines: list[str], steps: int, own: bool, bf16: bool, out: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from rookgrpo.assets import resolve_model

    path = resolve_model("rookgrpo/tiny-rookworld")
    tok = AutoTokenizer.from_pretrained(path)
    micro_batches, config_changes = parse_arm(arm)
    squares = config_changes.pop("move_squares", False)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", **config_changes)
    config = SFTConfig(output_dir=out, use_cpu=not torch.cuda.is_available(), bf16=bf16, tf32=False, seed=0,
                       max_steps=steps, learning_rate=1e-4, lr_scheduler_type="constant",
                       per_device_train_batch_size=64, max_length=256, completion_only_loss=False,
                       save_strategy="no", eval_strategy="no", logging_steps=steps, report_to="none",
                       disable_tqdm=True, dataloader_num_workers=0, gradient_checkpointing=False)
    timer = StepTimer()
    own_terms = build_tiny_model.OwnLists(tok, 0.2, 5.0) if own else None
    trainer = build_tiny_model._unlikelihood_trainer(SFTTrainer)(
        build_tiny_model.RepeatUnlikelihood(tok, 0.0), own_terms, model=model, args=config,
        train_dataset=build_tiny_model.to_pairs(lines), processing_class=tok, micro_batches=micro_batches,
        callbacks=[timer.callback])
    if squares:  # as the build attaches them: after the trainer is built, before it trains
        build_tiny_model.MoveSquares.attach(trainer.model, tok, seed=0)
    return trainer, timer


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8, help="optimizer steps per block")
    ap.add_argument("--blocks", type=int, default=5, help="measured blocks per arm (after one warm-up block)")
    ap.add_argument("--arms", nargs="+", default=["1", "2", "4"],
                    help="--micro_batches values, each optionally with :OPTION changes to the config (4:gelu_new, "
                         "4:dropout=0); the first is the one the others are compared with")
    ap.add_argument("--own", action="store_true", help="the own-list terms on every step (v3's last 40%%)")
    ap.add_argument("--no-bf16", dest="bf16", action="store_false", help="fp32 instead of the build's bf16 autocast")
    ap.add_argument("--work", default=None, help="a build's work dir: time on its sft.txt lines")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    try:
        parsed = [parse_arm(a) for a in args.arms]
    except ValueError as e:
        ap.error(f"--arms: each arm is K[:OPTION...] with K an integer, got {args.arms}: {e}")
    if args.steps < 1 or args.blocks < 2 or len(args.arms) < 2 or len(set(args.arms)) != len(args.arms) \
            or not all(1 <= k <= 64 for k, _ in parsed):
        ap.error("--steps must be at least 1, --blocks at least 2, and --arms at least two different arms with K in "
                 "[1, 64]")

    lines = sft_stream(64 * args.steps, args.work)
    times = {k: [] for k in args.arms}
    losses = {k: [] for k in args.arms}  # each block's mean training loss: the arms train the same weights alike
    with tempfile.TemporaryDirectory() as tmp:
        trainers = {k: build(k, lines, args.steps, args.own, args.bf16, f"{tmp}/{k}") for k in args.arms}
        for b in range(args.blocks + 1):
            for k, (trainer, timer) in trainers.items():
                timer.times.clear()
                losses[k].append(trainer.train().training_loss)
                print(f"block {b} micro_batches {k}: median step {statistics.median(timer.times):.2f} s", flush=True)
                if b > 0:
                    times[k].append(list(timer.times))
    base = args.arms[0]
    # The config keys whose values differ between arms (a key every arm sets alike, 4:dropout=0 in both, is not varied).
    changed = {key for _, config in parsed for key in config if len({repr(c.get(key)) for _, c in parsed}) > 1}
    median = {k: statistics.median([t for blk in v for t in blk]) for k, v in times.items()}
    ratios = {k: ratio_interval(times[base], times[k]) for k in args.arms[1:]}
    # Each arm keeps training its own copy of the model block after block on the same lines; with the build's dropout
    # (0.1) each arm draws its own masks, so the losses differ by that noise, and a wrong gradient would add a drift.
    drift = {k: max(abs(a - b) for a, b in zip(losses[k], losses[base])) for k in args.arms}
    rows = [f"| {k} | {median[k]:.2f} | " + (f"{ratios[k][0]:.3f} [{ratios[k][1]:.3f}, {ratios[k][2]:.3f}]"
                                              if k in ratios else "1") + f" | {sum(map(len, times[k]))} | "
            + (f"{drift[k]:.1e}" if k != base else "–") + " |" for k in args.arms]
    source = f"`{args.work}/sft.txt`" if args.work else "the packaged positions"
    table = "\n".join([
        f"| micro-batches per batch of 64[:config change] | median step (s) | step time / arm {base} | steps measured | largest gap in "
        "a block's training loss |",
        "| --- | --- | --- | --- | --- |",
        *rows,
        "",
        f"Lines: half P:, half A:, drawn from {source}; {'bf16 autocast' if args.bf16 else 'fp32'}"
        f"{', the own-list terms on every step' if args.own else ''}. Ratios of medians, 95% paired bootstrap "
        "intervals over blocks in brackets. Each arm trains its own copy of the packaged model through all "
        f"{args.blocks + 1} blocks on the same lines; the last column is the largest difference between its mean "
        f"training loss in a block and arm {base}'s (nats per token): dropout (0.1, as in the build) draws differ "
        "between arms, so it is that noise; the gradient's equality is checked without dropout by the tests"
        + (" (an arm with other dropout or the square vectors trains differently: its gap is not only noise)."
           if changed & {"resid_pdrop", "move_squares"} else "."),
    ])
    command = (f"python benchmarks/bench_sft_micro_batches.py --steps {args.steps} --blocks {args.blocks} --arms "
               + " ".join(map(str, args.arms)) + (" --own" if args.own else "") + ("" if args.bf16 else " --no-bf16")
               + (f" --work {args.work}" if args.work else ""))
    varied = (["the GELU kernel"] if "activation_function" in changed else []) + (
        ["dropout"] if "resid_pdrop" in changed else []) + (
        ["the shared square vectors (--move_squares)"] if "move_squares" in changed else []) + (
        ["the whole batch against length-sorted micro-batches"] if len({k for k, _ in parsed}) > 1 else [])
    result = {
        "title": "The tiny model's SFT step: " + " and ".join(varied)
                 + (" (steps with the own-list terms)" if args.own else " (plain steps)"),
        "description": (
            f"The build's SFT trainer (packaged model, batch 64) on the same line stream per arm, {args.steps}-step "
            "blocks interleaved across arms, first block discarded; wall time per optimizer step."
        ),
        "table": table, "command": command, "median_step": median,
        "ratios": {k: {"ratio": r, "ci95": [lo, hi]} for k, (r, lo, hi) in ratios.items()}, "blocks": times,
        "block_losses": losses, "loss_drift": drift,
    }
    return finish(result, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
