#!/usr/bin/env python
"""Build the embedded default: ``rookgrpo/tiny-rookworld``, a small GPT-2 with a move-level tokenizer, taught by SFT.

Why: RookWorld-LM-124M and its dataset live on a hub our machines cannot reach, and a random model earns the same
floor reward on every completion, so GRPO has nothing to learn from. This script makes a starting point that has
learned the format and plays legal, often reasonable moves, yet leaves room to improve.

Steps (each seeded, so a rebuild reproduces the shipped numbers within noise), runnable one at a time with
``--stage`` so the SFT can go to a GPU machine while the Stockfish work stays on a CPU one:

1. ``data``: generate RookWorld lines (``P:`` and ``A:``, compact layout) with :func:`rookgrpo.chess.data.generate`
   and split them into SFT data, GRPO training positions and held-out evaluation positions (no FEN shared between
   splits); cached in ``--work``. A: lines need no engine, so most lines are A: lines; the P: lines (Stockfish
   labels) are most of the time;
2. ``sft``: build a randomly initialised GPT-2 with one token per UCI move (:mod:`rookgrpo.models.tiny_model`) and
   fine-tune it with TRL's ``SFTTrainer`` on prompt/completion pairs with the loss on the whole line (reading the
   FEN teaches the board), bf16 autocast, on a GPU when there is one, else CPU; a checkpoint every eighth of the
   run, and a rerun with the same arguments resumes from the last one;
3. ``finish``: evaluate it with ``rookgrpo evaluate`` on the held-out positions and write model, tokenizer, positions
   and a model card (how it was made, its numbers) to ``src/rookgrpo/assets/tiny-rookworld/``.

``--stage all`` (the default) runs the three in a row. The shipped build took, on the 2-core reference machine: data
about 30 minutes (Stockfish bound: playing games, then labelling P: positions), SFT about 84 minutes (bf16 autocast),
evaluation under a minute; ``build_info.json`` and the model card hold the measured times::

    python scripts/build_tiny_model.py                          # everything, writes src/rookgrpo/assets/tiny-rookworld
    python scripts/build_tiny_model.py --stage data             # CPU machine with Stockfish
    python scripts/build_tiny_model.py --stage sft              # GPU machine, with build/tiny-rookworld copied over
    python scripts/build_tiny_model.py --stage finish           # back on the Stockfish machine
    python scripts/build_tiny_model.py --out /tmp/tr --work /tmp/trw   # a rebuild elsewhere, to compare numbers
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "src" / "rookgrpo" / "assets" / "tiny-rookworld"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the model and positions go")
    p.add_argument("--work", type=Path, default=REPO / "build" / "tiny-rookworld", help="scratch (data cache, SFT)")
    p.add_argument("--seed", type=int, default=1234, help="seeds the data (games, labels, splits) and, unless\n"
                   "--sft_seed is given, the SFT stage")
    p.add_argument("--sft_seed", type=int, default=None,
                   help="seeds the SFT stage alone (the fresh model's weights, the A: lines drawn into the mix, the\n"
                        "batch order, dropout); default --seed. A continuation (--init_from) passes a new one to draw\n"
                        "other A: lines in another order on the same splits")
    p.add_argument("--n_lines", type=int, default=200000, help="RookWorld lines generated in all (all splits)")
    p.add_argument("--a_share", type=float, default=0.7,
                   help="share of A: lines: they need no engine (only the P: lines are labelled by Stockfish), so\n"
                        "they are the cheap way to more data")
    p.add_argument("--n_games", type=int, default=10000,
                   help="games played for positions (P: rows sample their positions, A: rows their moves)")
    p.add_argument("--n_grpo", type=int, default=1024, help="GRPO training lines (positions) kept out of SFT")
    p.add_argument("--n_eval", type=int, default=256, help="held-out evaluation lines (positions)")
    p.add_argument("--held_out_copies", choices=("keep", "drop"), default="keep",
                   help="copies of a line in the held-out splits (the game generator replays openings, so a line\n"
                        "can be generated more than once): 'keep' as v2 was built (its 64 evaluation A: rows are 47\n"
                        "distinct prompts), 'drop' to keep one of each there; the SFT split keeps every copy")
    p.add_argument("--label_depth", type=int, default=8, help="Stockfish depth that labels P: rows")
    p.add_argument("--max_plies", type=int, default=24,
                   help="games stop after this many plies, so positions come from the opening (plies 4 to N-1):\n"
                        "a narrower distribution a sub-million-parameter model can learn within a CPU budget")
    p.add_argument("--eval_depth", type=int, default=8, help="Stockfish depth for evaluation")
    p.add_argument("--tokenizer", choices=("move", "board", "char"), default="move",
                   help="move: one token per UCI move, else one per character; board: move, plus one token per\n"
                        "frequent FEN rank string of the SFT lines (--rank_vocab of them); char: one per character\n"
                        "(rookgrpo.models.tiny_model.TOKENIZERS). board with --unlikelihood 1, on the shipped build's data\n"
                        "and steps, was worse on every held-out number but format (README.md), so move stays")
    p.add_argument("--rank_vocab", type=int, default=2048,
                   help="board tokenizer: at most this many FEN rank tokens, the most frequent in the SFT lines that\n"
                        "occur at least twice (rookgrpo.models.tiny_model.frequent_ranks). 2048 cover about 85%% of the\n"
                        "opening ranks and keep the default model's weights under 20 MB")
    p.add_argument("--unlikelihood", type=float, default=0.0,
                   help="weight of an unlikelihood term on M: lists (Welleck et al. 2019): at each move of M:, minus\n"
                        "log(1 - p) of every move already listed. RookWorld never repeats a move in M:, yet the v2\n"
                        "build's next-move distribution in M: did not change after a move was listed, so greedy\n"
                        "decoding wrote one move five times. Measured (README.md): it did not stop that, alone as a\n"
                        "300-step second pass on v2 or with the board tokenizer from scratch. 0: plain cross-entropy")
    p.add_argument("--own_target", type=float, default=0.0,
                   help="weight of a term on the model's own greedy M: lists (OwnLists): each step the model writes\n"
                        "M: greedily for up to --own_rows (32) of the batch's P: prompts, and each move slot of its list pays\n"
                        "minus log P(a move of the line's M: list not yet listed). Greedy decoding repeats the\n"
                        "model's first guess, a context the data lines never show. About 1.4x the step time. 0: off.\n"
                        "Measured (README.md), 300 steps on v2: alone at 1 the lists kept repeating; at 0.2 with\n"
                        "--own_unlikelihood 5, greedy format rose from 0 to 0.36 (0.59 after 300 more) and top-5 and\n"
                        "legal moves fell")
    p.add_argument("--own_unlikelihood", type=float, default=0.0,
                   help="weight of minus log(1 - p) of each move the model listed before, on the same greedy lists\n"
                        "(Welleck et al. 2019, 5.2). Alone at 5 it was gamed: lists shrank to one move (README.md)")
    p.add_argument("--own_evals", type=float, default=0.0,
                   help="weight of a term on the model's own greedy E: field (OwnLists.eval_slots): the greedy\n"
                        "generation runs on through E:, and after each space of it the model pays minus log P(an eval)\n"
                        "while the field holds fewer evals than its M: list has moves, minus log P(B) once it holds as\n"
                        "many. For builds without dropout, whose greedy lines wrote six evals for five moves. Measured\n"
                        "(docs/tiny-model.md), 300 steps on the --dropout 0 build at 1: greedy format 0.973 against\n"
                        "0.883 without it (GRPO positions), other numbers within noise; about 0.6 s more per step.\n"
                        "0: off")
    p.add_argument("--own_from", type=int, default=0,
                   help="SFT step from which the --own_target, --own_unlikelihood and --own_evals terms apply (0: every step): the\n"
                        "terms in the last part of one SFT run, where the learning rate has decayed, instead of a\n"
                        "second pass that warms it up again. Measured (README.md): the default build with --own_target\n"
                        "0.2 --own_unlikelihood 5 --own_from 1380 wrote greedy format 0.79 (v2: 0), beating a 600-step\n"
                        "second pass on format, top-5 and legal moves, but legal moves fell against v2 (0.52, v2 0.59)")
    p.add_argument("--own_evals_from", type=int, default=0,
                   help="SFT step from which the --own_evals term applies, when that is later than --own_from (0: with\n"
                        "the other own-list terms). The E: count was learnt within 20 steps of a 300-step second pass\n"
                        "at lr 1e-4 on a model whose M: lists the other terms had already repaired (tv21); the builds\n"
                        "that ran it from --own_from (tv23, tv24) lost some legal moves, by which term is not separated\n"
                        "(docs/tiny-model.md)")
    p.add_argument("--own_every", type=int, default=1,
                   help="apply the own-list terms on every Nth SFT step from --own_from (steps own_from, own_from + N,\n"
                        "...), at the weights given: each one costs a greedy generation and a forward, so 2 halves what\n"
                        "they add to the build's time. 1: every step")
    p.add_argument("--own_rows", type=int, default=SFT_ARG_DEFAULTS["own_rows"],
                   help="how many of each batch's P: lines the own-list terms generate on and charge (the first ones\n"
                        "in the batch; the terms are means over their slots, so fewer rows give a noisier term at the\n"
                        "same weight). Their greedy generation and extra forward and backward scale with it: on tv23's\n"
                        "model, one call with the E: term took about 0.9 s at 32 rows and 0.6 s at 16 (bf16, 2 cores)")
    p.add_argument("--a_completion_weight", type=float, default=SFT_ARG_DEFAULTS["a_completion_weight"],
                   help="weight of the cross-entropy on each A: line's completion tokens (after the prompt's third\n"
                        "+: the next state) against 1 on its prompt tokens, in training (the logged eval loss stays the\n"
                        "unweighted mean). The loss runs on the whole line, and on tv24's model the A: completion,\n"
                        "0.46 of an A: line's tokens, held 0.06 of its loss (0.06 nats a token against 0.81 on the\n"
                        "prompt's FEN and move history): A: exact is decided on a few of those tokens. Measured at 4\n"
                        "(tv25, docs/tiny-model.md): held-out A: exact 0.531 (tv24 0.391), but legal 0.615 (0.781)\n"
                        "and top-5 0.286 (0.443): the P: answers pay for it. 1: off")
    p.add_argument("--p_completion_weight", type=float, default=SFT_ARG_DEFAULTS["p_completion_weight"],
                   help="weight of the cross-entropy on each P: line's completion tokens (from M: on: the moves, evals\n"
                        "and best move), as --a_completion_weight is for A: lines. 1: off")
    p.add_argument("--prompt_weight", type=float, default=SFT_ARG_DEFAULTS["prompt_weight"],
                   help="weight of the cross-entropy on every line's prompt tokens (the task prefix, FEN and, in A:\n"
                        "lines, the move and history), in training. Below 1 it moves the loss toward both answers\n"
                        "without raising the loss's scale against the own-list terms (e.g. 0.5 with both completion\n"
                        "weights at 2). Not 0: predicting the FEN is part of how a model this small learns the board\n"
                        "(see completion_only_loss in sft()). 1: off")
    p.add_argument("--move_squares", action=argparse.BooleanOptionalAction, default=SFT_ARG_DEFAULTS["move_squares"],
                   help="train each UCI move token's embedding as its own vector plus shared from-square, to-square\n"
                        "and promotion vectors (MoveSquares), in the input and the tied output head; folded into the\n"
                        "embedding when the model is saved, so the packaged model stays a plain GPT-2. For the A: task,\n"
                        "whose commonest error is writing the board back unchanged, on rare moves most. Measured (tv26,\n"
                        "docs/tiny-model.md): within noise of the same terms without it (tv24) on every number, and the\n"
                        "rare moves are still copied; 1.05 [1.05, 1.16] of the own-list step time\n"
                        "(bench_sft_micro_batches.py). With --init_from the shared vectors start at zero")
    p.add_argument("--init_from", type=str, default=None,
                   help="start the SFT from this saved model and its tokenizer instead of a fresh one (the model\n"
                        "arguments and --tokenizer are then ignored): a short second pass on a finished build, e.g.\n"
                        "--init_from build/tv2/final --unlikelihood 1 --lr 1e-4 --max_steps 300. When it names a finished\n"
                        "build's --out (with its build_info.json), this build must have that build's data arguments (so no\n"
                        "held-out position was in the init model's SFT data), and the model card names both commands")
    p.add_argument("--n_layer", type=int, default=6)
    p.add_argument("--n_head", type=int, default=4)
    p.add_argument("--n_embd", type=int, default=224)
    p.add_argument("--activation", choices=("gelu_pytorch_tanh", "gelu_new"), default="gelu_pytorch_tanh",
                   help="the MLP's GELU: GPT-2's tanh approximation as one fused kernel (the default), or the same\n"
                        "function from seven tensor ops as transformers' GPT-2 writes it (gelu_new; v3 was trained\n"
                        "with it: its command needs it to compute what v3's build computed). Outputs agree to 1 ulp. gelu_new\n"
                        "took 1.47x the fused kernel's time in make train's fp32 GRPO step (bench_precision.py) but\n"
                        "1.08 [1.05, 1.11]x in this build's bf16 SFT step with 4 micro-batches (bench_sft_micro_batches.py\n"
                        "--arms 4 4:gelu_new). Also applies to an --init_from model")
    p.add_argument("--dropout", type=float, default=0.1,
                   help="GPT-2's dropout (embedding, attention and residual) during SFT: 0.1 is GPT-2's default and\n"
                        "v3's. 0 takes 0.76 [0.71, 0.79] of the plain step time (bench_sft_micro_batches.py --arms 4\n"
                        "4:dropout=0). Measured on v3's command with --micro_batches 4 from scratch: A: exact 0.211 ->\n"
                        "0.387 and legal 0.719 -> 0.802 on the GRPO positions, but greedy format 0.940 -> 0.904 (six\n"
                        "evals for five moves; docs/tiny-model.md). Also applies to an --init_from model. GRPO\n"
                        "recipes switch dropout off (disable_dropout)")
    p.add_argument("--m_order", choices=("random", "rank"), default="random",
                   help="order of the M: moves in the SFT lines: random (as generated, RookWorld's) or engine rank "
                        "(B: first, then by eval; rookgrpo.chess.data.rank_moves). Measured on the shipped build's "
                        "data and steps, rank order did not stop greedy decoding from repeating one move through "
                        "M: and lowered the legal rate (README.md), so random stays the default")
    p.add_argument("--sft_a_share", type=float, default=0.5,
                   help="share of A: lines in the SFT mix: all P: lines are used and A: lines are drawn to this share\n"
                        "(the data stage makes more than a CPU budget can train on)")
    p.add_argument("--sft_a_mix", choices=("random", *A_MIX_POWER), default="random",
                   help="how the A: lines of the mix are drawn: random (each move keeps its share of the data, as\n"
                        "every shipped build), sqrt (each move's count grows as the square root of its lines in the\n"
                        "SFT split) or balanced (one cap for every move). A: copies concentrate on rarely seen moves\n"
                        "(docs/tiny-model.md); sqrt and balanced give those all their lines")
    p.add_argument("--sft_a_distinct", action="store_true",
                   help="draw the mix's A: lines from one copy of each (the SFT split repeats some: in the default\n"
                        "build's, 139,562 A: lines are 77,385 distinct ones, and two ending lines make 6%% of them)")
    p.add_argument("--epochs", type=float, default=1.2,
                   help="passes over the SFT mix. 1.2 built v2 (84 min of SFT on its 2-core machine); the packaged v3 used\n"
                        "2.0 with the own-list terms from step 2200 of 3690 (109 min of SFT on a 2-core machine about\n"
                        "1.6x as fast per step): its model card has the command")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2, help="Stockfish processes")
    p.add_argument("--stage", choices=("all", "data", "sft", "finish"), default="all",
                   help="run one stage (data, sft, finish) or all three")
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True,
                   help="bf16 autocast, weights stay fp32: on the 2-core reference CPU (AMX) it halves the step time\n"
                        "of the default model; --no-bf16 for a CPU without bf16 units")
    p.add_argument("--max_steps", type=int, default=-1, help="cap SFT steps (timing runs); -1 trains all epochs")
    p.add_argument("--micro_batches", type=int, default=1,
                   help="run each SFT batch as this many micro-batches of lines sorted by length, each padded to its\n"
                        "own longest line, forward and backward one after another: the same loss and gradient as the\n"
                        "whole batch (float rounding and dropout draws aside), with fewer padded tokens and smaller\n"
                        "tensors. Batches stay mixed (P: and A: lines in every optimizer step). 1 (the default) is the\n"
                        "whole batch at once, as v3 was built; `python benchmarks/bench_sft_micro_batches.py` times it")
    args = p.parse_args(argv)
    for name in ("n_lines", "n_games", "n_eval", "n_layer", "n_head", "n_embd", "batch_size", "workers", "rank_vocab",
                 "micro_batches"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    for name in ("a_share", "sft_a_share"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            p.error(f"--{name} must be within [0, 1], got {getattr(args, name)}")
    if not 0.0 <= args.dropout < 1.0:
        p.error(f"--dropout must be within [0, 1), got {args.dropout}")
    for name in ("unlikelihood", *OWN_TERMS):
        if getattr(args, name) < 0:
            p.error(f"--{name} must be at least 0, got {getattr(args, name)}")
    if args.own_from < 0:
        p.error(f"--own_from must be at least 0, got {args.own_from}")
    if args.own_every < 1:
        p.error(f"--own_every must be at least 1, got {args.own_every}")
    if args.own_rows < 1:
        p.error(f"--own_rows must be at least 1, got {args.own_rows}")
    if not any(getattr(args, name) for name in OWN_TERMS):  # the flags that place the own-list terms need one
        give = "give --own_target, --own_unlikelihood or --own_evals"
        if args.own_every > 1:
            p.error(f"--own_every {args.own_every} has no terms to space out: {give}")
        if args.own_from:
            p.error(f"--own_from {args.own_from} has nothing to start: {give}")
        if args.own_rows != SFT_ARG_DEFAULTS["own_rows"]:
            p.error(f"--own_rows {args.own_rows} has nothing to charge: {give}")
    if args.own_evals_from < 0:
        p.error(f"--own_evals_from must be at least 0, got {args.own_evals_from}")
    if args.own_evals_from and not args.own_evals:
        p.error(f"--own_evals_from {args.own_evals_from} has no E: term to start: give --own_evals")
    for name in ("a_completion_weight", "p_completion_weight", "prompt_weight"):
        if not getattr(args, name) > 0:
            p.error(f"--{name} must be above 0, got {getattr(args, name)}")
    if args.micro_batches > args.batch_size:
        p.error(f"--micro_batches ({args.micro_batches}) must be at most --batch_size ({args.batch_size})")
    if args.n_embd % args.n_head:
        p.error(f"--n_embd ({args.n_embd}) must be a multiple of --n_head ({args.n_head})")
    return args


# Share of A: lines in the held-out splits (evaluation and GRPO positions), about RookWorld's mix, so the evaluation
# measures the policy task mostly whatever share of A: lines the SFT data has.
HELD_OUT_A_SHARE = 0.25


def data_cache(args, work: Path) -> Path:
    """The generated lines, cached by what they depend on; a ``.json`` beside it holds how long they took."""
    return work / (f"lines-{args.n_lines}-a{args.a_share}-g{args.n_games}-seed{args.seed}-d{args.label_depth}"
                   f"-plies{args.max_plies}.txt")


def _cpu() -> str:
    return f"CPU ({os.cpu_count()} cores)"


def make_data(args, work: Path) -> dict[str, list[str]]:
    """Generate (or reuse the cached) lines and split them by position."""
    from rookgrpo.chess.data import generate, write_lines
    from rookgrpo.chess.engine import EngineSettings
    from rookgrpo.chess.formats import COMPACT

    cache = data_cache(args, work)
    if cache.exists():
        lines = cache.read_text().splitlines()
    else:
        t0 = time.time()
        settings = EngineSettings(depth=args.label_depth, workers=args.workers)
        lines = generate(args.n_lines, tasks=("P", "A"), seed=args.seed, settings=settings, layout=COMPACT,
                         max_plies=args.max_plies, a_share=args.a_share, n_games=args.n_games)
        write_lines(lines, str(cache))
        info = {"seconds": round(time.time() - t0), "machine": _cpu(), "stockfish_workers": args.workers}
        cache.with_suffix(".json").write_text(json.dumps(info, indent=2))
    # Split by the position a line is about (P: its FEN, A: the FEN before the move), so no held-out position is
    # ever seen in SFT. Positions are shuffled with the seed and fill the eval split, then the GRPO split, each up to
    # its line count with a fixed A: share (HELD_OUT_A_SHARE, whatever --a_share the SFT mix has); the rest is SFT.
    def key(line: str) -> str:
        return line[3:].split(" M:")[0].split("+")[0].strip()

    positions = sorted({key(line) for line in lines})
    random.Random(args.seed).shuffle(positions)
    by_pos: dict[str, list[str]] = {}
    for line in lines:
        by_pos.setdefault(key(line), []).append(line)
    quota = {name: {"A": round(n * HELD_OUT_A_SHARE), "P": n - round(n * HELD_OUT_A_SHARE)}
             for name, n in (("eval", args.n_eval), ("grpo", args.n_grpo))}
    splits: dict[str, list[str]] = {"eval": [], "grpo": [], "sft": []}
    for pos in positions:
        # What this position would add to a held-out split: every line, or one of each (--held_out_copies drop).
        held = by_pos[pos] if args.held_out_copies == "keep" else list(dict.fromkeys(by_pos[pos]))
        need = {"A": 0, "P": 0}
        for line in held:
            need[line[0]] += 1
        name = next((n for n, q in quota.items() if all(need[t] <= q[t] for t in need)), "sft")
        if name != "sft":
            for t in need:
                quota[name][t] -= need[t]
        splits[name] += held if name != "sft" else by_pos[pos]
    return splits


def to_pairs(lines: list[str]):
    from datasets import Dataset

    from rookgrpo.chess.data import rookworld_row

    rows = [rookworld_row(line) for line in lines]
    return Dataset.from_list([{"prompt": r["prompt"], "completion": r["completion"]} for r in rows if r])


# The weights of OwnLists' terms: any of them above 0 turns the greedy own-list pass on.
OWN_TERMS = ("own_target", "own_unlikelihood", "own_evals")

# What the SFT stage's result depends on; the finish stage checks it was given the same (its model card names them).
SFT_ARGS = ("seed", "tokenizer", "n_layer", "n_head", "n_embd", "m_order", "sft_a_share", "epochs", "lr", "batch_size",
            "max_steps", "bf16", "rank_vocab", "unlikelihood", "init_from", "own_target",
            "own_unlikelihood", "own_from", "micro_batches", "activation", "sft_seed", "dropout", "own_evals",
            "own_every", "own_rows", "own_evals_from", "a_completion_weight", "p_completion_weight", "prompt_weight",
            "move_squares", "sft_a_mix", "sft_a_distinct")
# Added after a build was shipped: a build that did not record them used these values (older work dirs still resume).
SFT_ARG_DEFAULTS = {"rank_vocab": 2048, "unlikelihood": 0.0, "init_from": None, "own_target": 0.0,
                    "own_unlikelihood": 0.0, "own_from": 0, "micro_batches": 1, "activation": "gelu_new", "sft_seed": None,
                    "dropout": 0.1, "own_evals": 0.0, "own_every": 1, "own_rows": 32,
                    "own_evals_from": 0, "a_completion_weight": 1.0, "p_completion_weight": 1.0, "prompt_weight": 1.0,
                    "move_squares": False, "sft_a_mix": "random",
                    "sft_a_distinct": False}


def sft_args(args) -> dict:
    """The arguments the SFT stage's result depends on, as the stages record and compare them."""
    return {k: getattr(args, k) for k in SFT_ARGS}


def _recorded(saved: dict) -> dict:
    return {**SFT_ARG_DEFAULTS, **saved}


class RepeatUnlikelihood:
    """SFT loss (a ``compute_loss_func`` for ``SFTTrainer``; the build runs it through :func:`_unlikelihood_trainer`):
    next-token cross-entropy on every labelled token plus ``weight`` times an unlikelihood term (Welleck et al. 2019,
    "Neural text generation with unlikelihood training") on each line's M: list: at every move of the list,
    ``-log(1 - p(m))`` for each move ``m`` listed before it.

    The cross-entropy is the one ``SFTTrainer`` computes itself (summed over labelled tokens, divided by
    ``num_items_in_batch`` when the trainer passes it, else by their count), with each A: completion token's term
    (:meth:`completion_start`) times ``a_completion_weight``, each P: completion token's times ``p_completion_weight``
    and each prompt token's times ``prompt_weight`` when the call asks for the weighted loss.
    ``last_unlikelihood`` holds the latest batch's mean term (``nan`` when the batch had no repeat to penalise).
    """

    def __init__(self, tokenizer, weight: float, a_completion_weight: float = 1.0, p_completion_weight: float = 1.0,
                 prompt_weight: float = 1.0):
        from rookgrpo.models.tiny_model import geometric_moves

        vocab = tokenizer.get_vocab()
        self.weight, self.a_completion_weight = weight, a_completion_weight
        self.p_completion_weight, self.prompt_weight = p_completion_weight, prompt_weight
        self.m, self.e, self.colon, self.plus = vocab["M"], vocab["E"], vocab[":"], vocab["+"]
        self.p, self.a = vocab["P"], vocab["A"]
        self.moves = {vocab[m] for m in geometric_moves() if m in vocab}
        self.last_unlikelihood = float("nan")

    def m_span(self, row: list[int]) -> tuple[int, int] | None:
        """(position of the first ``M``, position of the ``E`` after it, or the row's end) of ``M: ... E:`` in a
        token row; ``None`` when the row has no ``M:``."""
        start = next((i for i in range(len(row) - 1) if row[i] == self.m and row[i + 1] == self.colon), None)
        if start is None:
            return None
        end = next((i for i in range(start + 2, len(row) - 1) if row[i] == self.e and row[i + 1] == self.colon),
                   len(row))
        return start, end

    def completion_start(self, row: list[int]) -> int:
        """Position of a token row's first completion token: the ``M`` of ``M:`` in a P: line, the token after the
        prompt's third ``+`` (``A: fen+move+history+``) in an A: line; the row's length where it has none."""
        if row[:1] == [self.p]:
            span = self.m_span(row)
            return span[0] if span else len(row)
        if row[:1] == [self.a]:
            pluses = [i for i, t in enumerate(row) if t == self.plus]
            return pluses[2] + 1 if len(pluses) >= 3 else len(row)
        return len(row)

    def token_weights(self, labels):
        """Weights of ``labels[:, 1:]``'s terms (each target token's): ``prompt_weight`` on a P: or A: line's prompt
        tokens, ``p_completion_weight`` / ``a_completion_weight`` on its completion tokens (:meth:`completion_start`),
        1 on any other line; ``None`` when all three weights are 1."""
        import torch

        completion = {self.p: self.p_completion_weight, self.a: self.a_completion_weight}
        if self.prompt_weight == 1 and set(completion.values()) == {1}:
            return None
        w = torch.ones(labels.shape[0], labels.shape[1] - 1)
        for b, row in enumerate(labels.tolist()):
            if row[0] not in completion:
                continue
            start = max(self.completion_start(row) - 1, 0)  # target t is row position t + 1
            w[b, :start] = self.prompt_weight
            w[b, start:] = completion[row[0]]
        return w.to(labels.device)

    def repeats(self, labels) -> tuple[list[int], list[int], list[int]]:
        """(row, position whose logits predict the move, earlier move to push down) for every M: repeat candidate."""
        rows, cols, bans = [], [], []
        for b, row in enumerate(labels.tolist()):
            span = self.m_span(row)
            if span is None:
                continue
            start, end = span
            listed: list[int] = []
            for t in range(start + 2, end):
                if row[t] not in self.moves:
                    continue
                for earlier in dict.fromkeys(listed):
                    if earlier != row[t]:
                        rows.append(b), cols.append(t - 1), bans.append(earlier)
                listed.append(row[t])
        return rows, cols, bans

    def __call__(self, outputs, labels, num_items_in_batch=None, num_repeats=None, weighted: bool = True):
        """The loss of one batch, or of one micro-batch of a batch: ``num_items_in_batch`` and ``num_repeats`` (the
        whole batch's labelled tokens and repeat candidates) then divide this part's sums, so that the parts' losses
        add up to the whole batch's. ``last_unlikelihood`` is this part's share of the batch's mean term.
        ``weighted=False`` gives the plain cross-entropy whatever the token weights are (the trainer's eval loss)."""
        import torch
        import torch.nn.functional as F

        logits = outputs.logits[:, :-1].float()
        target = labels[:, 1:].to(logits.device)
        w = self.token_weights(labels) if weighted else None
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100,
                              reduction="sum" if w is None else "none")
        if w is not None:
            nll = (nll * w.reshape(-1)).sum()
        n = num_items_in_batch if num_items_in_batch is not None else (target != -100).sum()
        loss = nll / torch.as_tensor(n, device=nll.device).clamp(min=1)
        rows, cols, bans = self.repeats(labels)
        if not self.weight or not (rows or num_repeats):
            self.last_unlikelihood = float("nan")
            return loss
        if not rows:  # a micro-batch without repeats, in a batch with some
            self.last_unlikelihood = 0.0
            return loss
        # Only the M: positions need the full distribution: a few per line, not every token's.
        p = torch.softmax(logits[rows, cols], dim=-1)[range(len(rows)), bans].clamp(max=1 - 1e-6)
        unlikelihood = -torch.log1p(-p).sum() / (num_repeats or len(rows))
        self.last_unlikelihood = float(unlikelihood.detach())
        return loss + self.weight * unlikelihood


class OwnLists:
    """Terms on the model's own greedy M: lists, the context greedy decoding puts it in and the data lines never do.

    At each training step it takes up to ``rows`` P: lines of the batch, cuts each after ``M:``, lets the model write
    its M: list greedily (``max_new`` tokens, dropout off, no gradient), runs it again with gradient and adds, at
    the k-th move slot of that list (the token after its k-th space):

    - ``target`` times ``-log P(next move is one the line's own M: lists and the model has not listed yet)``, for
      k up to the line's number of moves: the data's set of moves as the target, on the model's own prefix (as
      DAgger trains on the learner's states). A repeat is never in the set, a list that stops early or breaks its
      layout owes the slot where it did (:meth:`slots`), and a wrong move is answered with the right ones;
    - ``unlikelihood`` times ``-log(1 - p(m))`` for each move ``m`` it listed before (Welleck et al. 2019, section
      5.2). Measured alone at weight 5 on v2 it was gamed: within 40 steps the greedy lists shrank to one move or
      none, which no repeat can be charged to (README.md).

    - ``evals`` times ``-log P(what the E: count owes)`` along the model's own greedy E: field (:meth:`eval_slots`):
      after each space of it, an eval's first character while the field holds fewer evals than the model's own M:
      list has moves, ``B`` once it holds as many. A build without dropout wrote six evals for five moves, each
      the same value: a repeated context the data lines never show, as the M: repeats were (docs/tiny-model.md).
      The generation then runs on through E: (``max_new`` at least 64 tokens).

    ``start`` is the first training step (``global_step``, 0-based) the trainer applies the terms at;
    ``evals_start`` the first one the E: term joins them at (when later: a call given an earlier ``step`` runs
    without it, generation and all).
    ``last`` holds the latest batch's ``rows`` (how many of its P: lines were charged, at most the ``rows`` argument),
    ``repeat_share`` (greedy lists with a repeated move), ``list_len`` (mean moves per greedy list), with ``evals``
    on ``eval_count_ok`` (the share of greedy E: fields, after a well-formed M: list, that hold one eval per move and
    then ``B``), and each term's mean; empty when the batch had no P: line.
    """

    EVAL_START = "-0123456789"  # the first character of an eval text (rookgrpo.chess.formats.format_eval)
    EVAL_CHARS = EVAL_START + "."

    def __init__(self, tokenizer, target: float = 0.0, unlikelihood: float = 0.0, rows: int = 32, max_new: int = 11,
                 start: int = 0, evals: float = 0.0, every: int = 1, evals_start: int = 0):
        self.find = RepeatUnlikelihood(tokenizer, 0.0)  # for its M: span and move token ids
        self.target, self.unlikelihood, self.evals, self.rows = target, unlikelihood, evals, rows
        self.max_new = max(max_new, 64) if evals else max_new
        self.list_new = max_new  # before evals_start: the M: list alone
        self.start, self.every, self.evals_start = start, every, evals_start
        self.pad, self.eos = tokenizer.pad_token_id, tokenizer.eos_token_id
        (self.space,) = tokenizer(" ", add_special_tokens=False)["input_ids"]
        vocab = tokenizer.get_vocab()
        self.b = vocab["B"]
        self.eval_start = [vocab[c] for c in self.EVAL_START]
        self.eval_chars = {vocab[c] for c in self.EVAL_CHARS}
        self.last: dict[str, float] = {}

    def due(self, step: int) -> bool:
        """Whether the terms apply at training step ``step`` (the trainer's ``global_step`` before the update): from
        ``start`` on, one step in ``every``."""
        return step >= self.start and (step - self.start) % self.every == 0

    def prompts(self, input_ids) -> list[tuple[list[int], list[int]]]:
        """(tokens up to and including the first ``M:``, the line's distinct M: moves) for each line with M:."""
        out = []
        for row in input_ids.tolist():
            row = [t for t in row if t != self.pad]  # padding on either side (never inside a line)
            span = self.find.m_span(row)
            if span is None:
                continue
            start, end = span
            out.append((row[:start + 2], list(dict.fromkeys(t for t in row[start + 2:end] if t in self.find.moves))))
        return out[:self.rows]

    def slots(self, seq, width: int, data: list[list[int]]) -> list[tuple[int, int, list[int], list[int]]]:
        """(row, position whose logits give the next token, the tokens owed there, moves listed before) along each
        generated list (from position ``width``, right after ``M:``) until it holds the line's number of moves.

        A move slot (after a space) owes the line's moves not listed yet; where a space is due (after ``M:`` or a
        move) and the model wrote something else, that position owes the space and the walk ends there, as it ends
        at a move slot that got no move.
        """
        out = []
        for b, row in enumerate(seq.tolist()):
            listed: list[int] = []
            j = width - 1
            while len(listed) < len(data[b]) and j + 1 < len(row):
                if row[j + 1] != self.space:
                    out.append((b, j, [self.space], []))
                    break
                j += 1
                out.append((b, j, [x for x in data[b] if x not in listed], list(dict.fromkeys(listed))))
                if j + 1 >= len(row) or row[j + 1] not in self.find.moves:
                    break
                listed.append(row[j + 1])
                j += 1
        return out

    def eval_slots(self, seq, width: int) -> tuple[list[tuple[int, int, list[int]]], list[bool | None]]:
        """(row, position whose logits give the next token, the tokens owed there) along each generated E: field,
        and for each row whether its E: field holds one eval per move and then `` B`` (``None`` where the generation
        from ``width`` is not a list of moves then `` E:``: such a row owes nothing here, its M: list is the other
        terms' business).

        Each space of the field is followed by an eval or, once the field holds one eval per move of the model's own
        M: list, by ``B``: a space owes the eval characters' first (``EVAL_START``) while evals are due, ``B`` when
        none is. The walk ends at the first space that got what it did not owe, at ``B``, or where the field breaks.
        """
        out, fields = [], []
        for b, row in enumerate(seq.tolist()):
            j, n = width, 0
            while j + 1 < len(row) and row[j] == self.space and row[j + 1] in self.find.moves:
                j, n = j + 2, n + 1
            if not (n and j + 2 < len(row) and row[j] == self.space and row[j + 1] == self.find.e
                    and row[j + 2] == self.find.colon):
                fields.append(None)
                continue
            j, k, ok = j + 3, 0, False
            while j + 1 < len(row) and row[j] == self.space:
                out.append((b, j, [self.b] if k == n else self.eval_start))
                if k == n or row[j + 1] not in self.eval_start:
                    ok = k == n and row[j + 1] == self.b
                    break
                j += 1
                while j < len(row) and row[j] in self.eval_chars:
                    j += 1
                k += 1
            fields.append(ok)
        return out, fields

    @staticmethod
    def _owed(logp, owed: list[list[int]]):
        """Mean over slots of ``-log P(one of the tokens owed there)``; row ``i`` of ``logp`` is slot ``i``."""
        import torch

        return -torch.stack([torch.logsumexp(logp[i, tokens], 0) for i, tokens in enumerate(owed)]).mean()

    def __call__(self, model, input_ids, step: int | None = None):
        """The weighted terms for this batch (a 0-d tensor), or ``None`` when there is nothing to charge. ``step``
        (the training step; ``None``: any) leaves the E: term out before ``evals_start``."""
        import torch

        lines = self.prompts(input_ids)
        self.last = {}
        evals = self.evals if step is None or step >= self.evals_start else 0.0
        if not lines or not (self.target or self.unlikelihood or evals):
            return None
        width = max(len(x) for x, _ in lines)
        ids = torch.tensor([[self.pad] * (width - len(x)) + x for x, _ in lines], device=input_ids.device)
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x, _ in lines], device=input_ids.device)
        was_training = model.training
        model.eval()
        with torch.no_grad():
            # With the E: term, a row is done at B (nothing after it is charged): the batch stops when all are.
            stop = {"eos_token_id": [self.b] + ([self.eos] if self.eos is not None else [])} if evals else {}
            max_new = self.max_new if evals else self.list_new
            seq = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
                                 pad_token_id=self.pad, **stop)
        model.train(was_training)
        slots = self.slots(seq, width, [d for _, d in lines])
        moves: list[list[int]] = [[] for _ in lines]
        for b, j, owed, _ in slots:
            if owed != [self.space] and j + 1 < seq.shape[1] and int(seq[b, j + 1]) in self.find.moves:
                moves[b].append(int(seq[b, j + 1]))
        self.last = {"rows": len(lines), "repeat_share": sum(len(set(x)) < len(x) for x in moves) / len(lines),
                     "list_len": sum(map(len, moves)) / len(lines)}
        e_slots: list[tuple[int, int, list[int]]] = []
        if evals:
            e_slots, fields = self.eval_slots(seq, width)
            judged = [ok for ok in fields if ok is not None]
            if judged:
                self.last["eval_count_ok"] = sum(judged) / len(judged)
        if not (slots or e_slots):
            return None
        full = torch.cat([mask, torch.ones_like(seq[:, width:])], dim=1)
        positions = (full.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=seq, attention_mask=full, position_ids=positions, use_cache=False).logits
        total = logits.new_zeros((), dtype=torch.float32)
        if e_slots:
            logp = torch.log_softmax(logits[[b for b, *_ in e_slots], [j for _, j, _ in e_slots]].float(), dim=-1)
            term = self._owed(logp, [owed for *_, owed in e_slots])
            self.last["evals"] = float(term.detach())
            total = total + evals * term
        if not slots:
            return total
        logp = torch.log_softmax(logits[[b for b, *_ in slots], [j for _, j, *_ in slots]].float(), dim=-1)
        if self.target:
            term = self._owed(logp, [owed for _, _, owed, _ in slots])
            self.last["target"] = float(term.detach())
            total = total + self.target * term
        pairs = [(i, m) for i, (*_, before) in enumerate(slots) for m in before]
        if self.unlikelihood and pairs:
            p = logp[[i for i, _ in pairs], [m for _, m in pairs]].exp().clamp(max=1 - 1e-6)
            term = -torch.log1p(-p).mean()
            self.last["unlikelihood"] = float(term.detach())
            total = total + self.unlikelihood * term
        return total


OPTIMIZER_STEPS = [0]  # optimizer steps taken in this process, once _count_optimizer_steps is on
_STEP_HOOK: list = []


def _count_optimizer_steps() -> None:
    """Count every optimizer step of this process in ``OPTIMIZER_STEPS`` (a global post-step hook, set once)."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    def count(optimizer, args, kwargs) -> None:
        OPTIMIZER_STEPS[0] += 1

    if not _STEP_HOOK:
        _STEP_HOOK.append(register_optimizer_step_post_hook(count))


class MoveSquares:
    """Each UCI move token's embedding as its own vector plus three shared ones: its from-square's, its to-square's
    and its promotion piece's (``--move_squares``), in the input embedding and, through GPT-2's tied weights, in the
    output head.

    Why: with one token per move, a move's squares are only in what its embedding learns from the lines it occurs in.
    The A: task has to apply the move to the board (a model that cannot read the move writes the board back
    unchanged, the largest A: error of the packaged models, docs/tiny-model.md), and a move seen in few lines has
    an embedding that says little about where it goes. Shared square vectors give every move, rare or not, the same
    readable code for its squares, and tie each P: move's logit to its squares as well.

    :meth:`attach` adds the vectors to a loaded GPT-2 as a submodule ``move_squares`` (saved in checkpoints, so a
    resumed run has them), and the token embedding and the head then run on their weight plus each token's share of
    the vectors; :meth:`fold` adds that share into the embedding rows and removes the vectors, so the saved model is
    a plain GPT-2 computing the same function.

    >>> from rookgrpo.models.tiny_model import build_move_tokenizer
    >>> index = MoveSquares.index(build_move_tokenizer())
    >>> tok = build_move_tokenizer().get_vocab()
    >>> index[tok["e2e4"]].tolist(), index[tok["e7e8q"]].tolist(), index[tok["e"]].tolist()
    ([12, 92, 132], [52, 124, 128], [132, 132, 132])
    """

    SLOTS = 64 + 64 + 4  # from-squares, to-squares, promotion pieces; slot SLOTS is the zero vector

    @classmethod
    def index(cls, tokenizer):
        """(vocabulary size, 3) long tensor: each token's from-square, to-square and promotion slot, ``SLOTS`` where
        it has none (every token that is not a move)."""
        import torch

        from rookgrpo.models.tiny_model import SQUARES, geometric_moves

        index = torch.full((len(tokenizer), 3), cls.SLOTS, dtype=torch.long)
        vocab = tokenizer.get_vocab()
        for move in geometric_moves():
            if move in vocab:
                index[vocab[move], 0] = SQUARES.index(move[:2])
                index[vocab[move], 1] = 64 + SQUARES.index(move[2:4])
                if len(move) == 5:
                    index[vocab[move], 2] = 128 + "qrbn".index(move[4])
        return index

    @classmethod
    def attach(cls, model, tokenizer, seed: int, zero: bool = False) -> None:
        """Give ``model`` (a GPT-2 with tied embeddings) the shared square vectors, drawn as GPT-2 draws its
        embeddings (normal, std ``initializer_range``) from ``seed``, or all zero (``zero``: a model that already
        computes what it should, such as a continued one, then starts from its own function)."""
        import torch
        import torch.nn.functional as F

        wte, head = model.get_input_embeddings(), model.get_output_embeddings()
        if head.weight is not wte.weight:
            raise ValueError("--move_squares needs a GPT-2 whose output head is tied to its token embedding")
        gen = torch.Generator().manual_seed(seed)
        module = torch.nn.Module()
        module.weight = torch.nn.Parameter(
            torch.randn(cls.SLOTS, wte.weight.shape[1], generator=gen) * (0.0 if zero else model.config.initializer_range))
        module.register_buffer("index", cls.index(tokenizer).to(wte.weight.device), persistent=False)
        model.move_squares = module.to(wte.weight.device)

        def rows():  # (vocabulary, n_embd): each token's share of the square vectors
            table = torch.cat([module.weight, module.weight.new_zeros(1, module.weight.shape[1])])
            return table[module.index].sum(1)

        cache: dict = {}
        _count_optimizer_steps()

        def weight():  # the tied weight plus the rows; without grad (generation, eval) kept until either changes
            if torch.is_grad_enabled():
                return wte.weight + rows()
            # An in-place edit bumps a tensor's _version, a new tensor has a new data_ptr, but a fused optimizer step
            # (AdamW fused, the Trainer's default) bumps neither: count optimizer steps as well.
            key = (OPTIMIZER_STEPS[0], wte.weight._version, module.weight._version, wte.weight.data_ptr(),
                   module.weight.data_ptr())
            if cache.get("key") != key:
                cache["key"], cache["weight"] = key, wte.weight + rows()
            return cache["weight"]

        # The two modules' own forward, on their weight plus the vectors' rows (one lookup, one matmul, as before).
        wte.forward = lambda ids: F.embedding(ids, weight())
        head.forward = lambda x: F.linear(x, weight(), head.bias)
        module.rows = rows

    @staticmethod
    def fold(model) -> None:
        """Add the square vectors into the (tied) embedding rows, remove them and give the embedding and the head
        their class's forward again: the model is then a plain GPT-2 with the same outputs."""
        import torch

        module = model.move_squares
        with torch.no_grad():
            model.get_input_embeddings().weight += module.rows()
        for layer in (model.get_input_embeddings(), model.get_output_embeddings()):
            del layer.forward  # the class's own forward again
        del model.move_squares


A_MIX_POWER = {"sqrt": 0.5, "balanced": 0.0}  # --sft_a_mix: a move's quota of A: lines grows as (its lines) ** power


def a_quotas(counts: dict[str, int], want: int, power: float) -> dict[str, int]:
    """How many A: lines of each move a mix of ``want`` A: lines draws (``counts``: each move's A: lines on offer).

    Each move gets ``min(n, k * n ** power)`` with one ``k`` for all, fitted so the quotas add up to ``want``
    (rounded down, the lines left over going to the largest remainders, ties by move). ``power`` 1 is the data's own
    move frequencies; 0.5 (``--sft_a_mix sqrt``) draws rare moves more and common ones less; 0 (``balanced``) caps
    every move at one count. A move with fewer lines than its quota gets them all.

    >>> a_quotas({"e2e4": 400, "g1f3": 100, "h1g1": 4}, 90, 0.5)
    {'e2e4': 57, 'g1f3': 29, 'h1g1': 4}
    >>> a_quotas({"e2e4": 400, "g1f3": 100, "h1g1": 4}, 90, 0.0)
    {'e2e4': 43, 'g1f3': 43, 'h1g1': 4}
    >>> a_quotas({"e2e4": 3, "h1g1": 1}, 10, 0.5)  # more wanted than on offer: everything
    {'e2e4': 3, 'h1g1': 1}
    """
    if want >= sum(counts.values()):
        return dict(counts)

    def quota(n: int, k: float) -> float:
        return min(float(n), k * n ** power)

    lo, hi = 0.0, float(max(counts.values()))  # quota(n, hi) = n for every n >= 1: the sum is all lines > want
    for _ in range(100):
        k = (lo + hi) / 2
        lo, hi = (k, hi) if sum(quota(n, k) for n in counts.values()) <= want else (lo, k)
    exact = {m: quota(n, lo) for m, n in counts.items()}
    out = {m: int(q) for m, q in exact.items()}
    short = want - sum(out.values())
    for m in sorted(exact, key=lambda m: (out[m] - exact[m], m))[:short]:
        out[m] += 1
    return out


def a_move(line: str) -> str:
    """The move of an A: line (its second ``+`` field; ``""`` when it has none).

    >>> a_move("A: 8/8/8/8/8/8/8/K6k w - - 0 1+a1a2+a1a2+8/8/8/8/8/8/K7/7k b - - 1 1+0.001+0+0")
    'a1a2'
    """
    fields = line.split("+", 2)
    return fields[1] if len(fields) > 1 else ""


def sft_mix(lines: list[str], a_share: float, seed: int, a_mix: str = "random", a_distinct: bool = False) -> list[str]:
    """All P: lines and as many A: lines (a seeded draw, file order kept) as make ``a_share`` of the mix.

    ``a_mix`` ``random`` draws the A: lines uniformly, so each move keeps its share of the data; ``sqrt`` and
    ``balanced`` draw each move's quota (:func:`a_quotas`, :data:`A_MIX_POWER`), then that many of its lines.
    ``a_distinct`` draws from one copy of each A: line (the first in the file): the generator replays openings and
    endings, so without it a few lines fill much of the draw.

    >>> lines = ["P: x"] * 4 + [f"A: b+{m}+h+c+0+0+0" for m in ["e2e4"] * 6 + ["h1g1"] * 2]
    >>> [a_move(x) for x in sft_mix(lines, 0.5, 0, "balanced") if x.startswith("A:")]
    ['e2e4', 'e2e4', 'h1g1', 'h1g1']
    >>> [x for x in sft_mix(lines, 0.5, 0, a_distinct=True) if x.startswith("A:")]
    ['A: b+e2e4+h+c+0+0+0', 'A: b+h1g1+h+c+0+0+0']
    """
    if a_distinct:
        seen: set[str] = set()
        lines = [line for line in lines if line.startswith("P:") or not (line in seen or seen.add(line))]
    p_lines = [line for line in lines if line.startswith("P:")]
    a_lines = [line for line in lines if not line.startswith("P:")]
    if a_share >= 1.0 or not p_lines:
        return lines
    want = min(len(a_lines), round(len(p_lines) * a_share / (1.0 - a_share)))
    rng = random.Random(f"{seed}-sft-mix")
    if a_mix == "random":
        keep = set(rng.sample(range(len(a_lines)), want))
    else:
        by_move: dict[str, list[int]] = {}
        for i, line in enumerate(a_lines):
            by_move.setdefault(a_move(line), []).append(i)
        quotas = a_quotas({m: len(ix) for m, ix in by_move.items()}, want, A_MIX_POWER[a_mix])
        keep = {i for m in sorted(by_move) for i in rng.sample(by_move[m], quotas[m])}
    kept = iter(i in keep for i in range(len(a_lines)))
    return [line for line in lines if line.startswith("P:") or next(kept)]


def trained_mix(args, sft_lines: list[str]) -> list[str]:
    """The lines the SFT stage trains on: :func:`sft_mix` of the SFT split with ``--sft_a_share``, ``--sft_a_mix``,
    ``--sft_a_distinct`` and the SFT seed
    (:func:`_sft_seed`); the finish stage draws :func:`fit_sample` from it."""
    return sft_mix(sft_lines, args.sft_a_share, _sft_seed(vars(args)), args.sft_a_mix, args.sft_a_distinct)


def dropout_config(p: float) -> dict[str, float]:
    """GPT-2's config fields for dropout ``p`` on embeddings, attention and residuals (``--dropout``).

    >>> dropout_config(0)
    {'embd_pdrop': 0.0, 'attn_pdrop': 0.0, 'resid_pdrop': 0.0}
    """
    return {k: float(p) for k in ("embd_pdrop", "attn_pdrop", "resid_pdrop")}


def fit_sample(mix: list[str], n: int, seed: int) -> list[str]:
    """``n`` distinct lines the SFT stage trained on (``mix``: :func:`trained_mix`'s lines), with the held-out panels'
    A: share (``HELD_OUT_A_SHARE``), a seeded draw in file order.

    Evaluated beside the held-out panels it separates the two ways a model misses a target: no better on lines it
    was trained on than on held-out ones means it is fit-bound (more steps, width or less regularisation would
    help, more data would not); much better means it memorises.

    >>> fit_sample(["P: a", "A: b", "P: c", "P: a"], 4, seed=0)
    ['P: a', 'A: b', 'P: c']
    """
    distinct = list(dict.fromkeys(mix))
    picked = set()
    rng = random.Random(f"{seed}-fit-sample")
    for task, k in (("A", round(n * HELD_OUT_A_SHARE)), ("P", n - round(n * HELD_OUT_A_SHARE))):
        pool = [line for line in distinct if line.startswith("P:") == (task == "P")]
        picked.update(rng.sample(pool, min(k, len(pool))))
    return [line for line in distinct if line in picked]


def sft(args, work: Path, sft_lines: list[str], held_lines: list[str]) -> Path:
    """Fine-tune a fresh GPT-2 (``--tokenizer``) on the SFT lines with TRL's SFTTrainer; return the saved model dir.

    Runs on a GPU when there is one, else CPU; fp32 unless ``--bf16`` (autocast, weights and optimizer stay fp32).
    ``held_lines`` (the GRPO positions, never the evaluation ones) give an eval loss to read over- or under-fitting.
    """
    import torch
    from trl import SFTConfig, SFTTrainer

    from rookgrpo.chess.data import rank_moves
    from rookgrpo.models.tiny_model import TOKENIZERS, TinyGPT2Spec, build_tiny_gpt2, frequent_ranks

    if args.m_order == "rank":
        sft_lines, held_lines = [rank_moves(x) for x in sft_lines], [rank_moves(x) for x in held_lines]
    seed = _sft_seed(vars(args))
    sft_lines = trained_mix(args, sft_lines)
    if args.init_from:
        from transformers import AutoConfig, AutoTokenizer

        init = Path(args.init_from)
        if not (init / "config.json").exists():
            sys.exit(f"--init_from {init}: no saved model there (config.json missing).")
        tokenizer, n_positions = AutoTokenizer.from_pretrained(init), AutoConfig.from_pretrained(init).n_positions
    else:
        # The board tokenizer's rank tokens come from the lines it trains on, never from the held-out ones.
        ranks = tuple(frequent_ranks(sft_lines, args.rank_vocab)) if args.tokenizer == "board" else ()
        tokenizer = TOKENIZERS[args.tokenizer](**({"ranks": ranks} if ranks else {}))
        init = work / "init"
    lengths = [len(ids) for ids in tokenizer(sft_lines + held_lines)["input_ids"]]
    print(f"sft: {len(tokenizer)} tokens in the vocabulary, {sum(lengths) / len(lengths):.1f} tokens per line",
          flush=True)
    if not args.init_from:
        n_positions = max(256, 64 * ((max(lengths) + 2 + 63) // 64))
        spec = TinyGPT2Spec(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, n_positions=n_positions,
                            seed=seed, tokenizer=args.tokenizer, ranks=ranks, activation=args.activation)
    checkpoint = _last_checkpoint(work / "sft", args)
    if checkpoint is None:
        shutil.rmtree(work / "sft", ignore_errors=True)
        if not args.init_from:
            shutil.rmtree(init, ignore_errors=True)
            build_tiny_gpt2(init, spec)
        (work / "sft").mkdir(parents=True)
        (work / "sft" / "build_args.json").write_text(json.dumps(sft_args(args)))
    else:
        print(f"sft: resuming from {checkpoint}", flush=True)
    gpu = torch.cuda.is_available()
    train, held = to_pairs(sft_lines), to_pairs(held_lines)
    steps = args.max_steps if args.max_steps > 0 else int(args.epochs * -(-len(train) // args.batch_size))
    config = SFTConfig(
        output_dir=str(work / "sft"), seed=seed, use_cpu=not gpu, bf16=args.bf16, tf32=False,
        num_train_epochs=args.epochs, max_steps=args.max_steps, learning_rate=args.lr, lr_scheduler_type="cosine",
        warmup_steps=0.03, weight_decay=0.01, per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=256, max_length=n_positions,
        # Loss on the whole line, prompt included: predicting the FEN's characters is how a model this small learns
        # where the pieces are. The build before this one (loss on the completion only, whole games) stayed near 5%
        # legal moves; this one (whole line, openings) reached 35%. Both changed at once, so neither gets the credit.
        completion_only_loss=False,
        logging_steps=max(1, steps // 200), eval_strategy="steps", eval_steps=max(1, steps // 8),
        # A checkpoint every eighth of the run: a stopped build resumes from the last one (same arguments).
        save_strategy="steps", save_steps=max(1, steps // 8), save_total_limit=1, report_to="none", dataloader_num_workers=2 if gpu else 0, gradient_checkpointing=False,
        # Eager attention: with bf16 autocast on the 2-core reference CPU it ran a step ~15% faster than SDPA.
        # The activation and dropout are set here too, so that they also hold for an --init_from model (and the saved
        # config names them).
        model_init_kwargs={"attn_implementation": "eager", "activation_function": args.activation,
                           **dropout_config(args.dropout)},
        # Random order, not grouped by length: grouping halved the step time but made batches single-task (P: and
        # A: lines differ in length), and the A: loss stalled near 3.7 nats/char where mixed batches reached 1.4.
    )
    own = OwnLists(tokenizer, args.own_target, args.own_unlikelihood, start=args.own_from, evals=args.own_evals,
                   every=args.own_every, rows=args.own_rows, evals_start=args.own_evals_from) \
        if any(getattr(args, name) for name in OWN_TERMS) else None
    weights = {k: getattr(args, k) for k in ("a_completion_weight", "p_completion_weight", "prompt_weight")}
    if args.unlikelihood or own is not None or args.micro_batches > 1 or set(weights.values()) != {1}:
        loss_fn = RepeatUnlikelihood(tokenizer, args.unlikelihood, **weights)
        trainer = _unlikelihood_trainer(SFTTrainer)(loss_fn, own,
                                                    model=str(init), args=config, train_dataset=train,
                                                    eval_dataset=held, micro_batches=args.micro_batches)
    else:
        trainer = SFTTrainer(model=str(init), args=config, train_dataset=train, eval_dataset=held)
    if args.move_squares:  # before train(): the optimizer and a resumed checkpoint see the vectors
        MoveSquares.attach(trainer.model, tokenizer, seed, zero=bool(args.init_from))
    t0 = time.time()
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    seconds = time.time() - t0
    final = work / "final"
    shutil.rmtree(final, ignore_errors=True)
    if args.move_squares:
        MoveSquares.fold(trainer.model)
    trainer.save_model(str(final))
    trainer.processing_class.save_pretrained(str(final))
    history = trainer.state.log_history
    (final / "sft_log_history.json").write_text(json.dumps(history))
    losses = [h["loss"] for h in history if "loss" in h]
    evals = [h["eval_loss"] for h in history if "eval_loss" in h]
    info = {
        "seconds": round(seconds), "steps": trainer.state.global_step, "train_lines": len(train),
        "resumed_from": checkpoint.name if checkpoint else None,
        "device": torch.cuda.get_device_name(0) if gpu else _cpu(),
        "torch": torch.__version__, "final_train_loss": losses[-1] if losses else None,
        "final_eval_loss": evals[-1] if evals else None,
        "args": sft_args(args),
    }
    (work / "sft_info.json").write_text(json.dumps(info, indent=2))
    print("sft:", info, flush=True)
    return final


def length_sorted_chunks(inputs: dict, k: int) -> list[dict]:
    """A right-padded batch (``input_ids``, ``attention_mask``, ``labels``, ...) as up to ``k`` batches of its rows
    sorted by length (shortest first, ties in batch order), each cut to its own longest row.

    Every row of the batch is in exactly one chunk, whole, and no real token is cut; only padding goes.

    >>> import torch
    >>> batch = {"input_ids": torch.tensor([[5, 6, 7, 0], [8, 0, 0, 0], [9, 9, 9, 9]]),
    ...          "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])}
    >>> [c["input_ids"].tolist() for c in length_sorted_chunks(batch, 2)]
    [[[8, 0, 0], [5, 6, 7]], [[9, 9, 9, 9]]]
    """
    import torch

    mask = inputs["attention_mask"]
    lengths = mask.sum(1)
    if not bool((mask == (torch.arange(mask.shape[1], device=mask.device) < lengths[:, None])).all()):
        raise ValueError("length_sorted_chunks: the batch is not right-padded (a row has padding before a token)")
    order = torch.argsort(lengths, stable=True)
    chunks = []
    for idx in torch.tensor_split(order, min(k, len(order))):
        width = int(lengths[idx].max())
        chunks.append({key: (v[idx, :width] if torch.is_tensor(v) and v.dim() >= 2 and v.shape[:2] == mask.shape
                             else v[idx] if torch.is_tensor(v) and v.dim() >= 1 and v.shape[0] == mask.shape[0]
                             else v) for key, v in inputs.items()})
    return chunks


def _unlikelihood_trainer(base):
    """``base`` (TRL's SFTTrainer) with its loss from a :class:`RepeatUnlikelihood`, in one forward pass (one per
    micro-batch with ``micro_batches`` > 1, see :func:`length_sorted_chunks`), plus, when
    given, :class:`OwnLists` terms on training steps from its ``start`` on (a greedy generation and one more forward).

    ``SFTTrainer(compute_loss_func=...)`` would do, but it runs a second, gradient-free forward for its entropy and
    token-accuracy metrics, about a third more time per step on CPU; this subclass logs the unlikelihood terms
    instead (``unlikelihood``; ``own/repeat_share``, ``own/list_len`` and ``own/<term>`` for the greedy lists).
    """

    class UnlikelihoodSFTTrainer(base):
        def __init__(self, loss_fn: RepeatUnlikelihood, own: OwnLists | None, *a, micro_batches: int = 1, **kw):
            super().__init__(*a, **kw)
            self.loss_fn, self.own, self.micro_batches = loss_fn, own, micro_batches
            if micro_batches > 1 and self.args.gradient_accumulation_steps != 1:
                raise ValueError("micro_batches > 1 runs its own backward passes and needs gradient_accumulation_steps 1")

        def _micro_batch_loss(self, model, inputs, num_items_in_batch):
            """The batch's loss, run as ``micro_batches`` length-sorted parts: every part but the last is backpropagated
            here, the last is returned with the others' (detached) values added, so the trainer's backward completes
            the batch's gradient and its logged loss is the whole batch's."""
            labels = inputs["labels"]
            n = num_items_in_batch if num_items_in_batch is not None else (labels[:, 1:] != -100).sum()
            num_repeats = len(self.loss_fn.repeats(labels)[0]) if self.loss_fn.weight else 0
            chunks = length_sorted_chunks(inputs, self.micro_batches)
            done, parts = 0.0, []  # parts: each micro-batch's share of the batch's mean unlikelihood term
            for i, chunk in enumerate(chunks):
                outputs = model(**{k: v for k, v in chunk.items() if k != "labels"}, use_cache=False)
                loss = self.loss_fn(outputs, chunk["labels"], num_items_in_batch=n, num_repeats=num_repeats,
                                    weighted=model.training)
                if self.loss_fn.last_unlikelihood == self.loss_fn.last_unlikelihood:  # not nan
                    parts.append(self.loss_fn.last_unlikelihood)
                if i < len(chunks) - 1:
                    self.accelerator.backward(loss)
                    done = done + loss.detach()
            self.loss_fn.last_unlikelihood = sum(parts) if parts else float("nan")
            return loss + done

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if self.micro_batches > 1 and model.training and not return_outputs:
                outputs, loss = None, self._micro_batch_loss(model, inputs, num_items_in_batch)
            else:
                outputs = model(**{k: v for k, v in inputs.items() if k != "labels"}, use_cache=False)
                loss = self.loss_fn(outputs, inputs["labels"], num_items_in_batch=num_items_in_batch,
                                    weighted=model.training)
            mode = "train" if model.training else "eval"
            metrics = self._metrics[mode]
            if self.loss_fn.weight and self.loss_fn.last_unlikelihood == self.loss_fn.last_unlikelihood:  # not nan
                metrics["unlikelihood"].append(self.loss_fn.last_unlikelihood)
            if self.own is not None and model.training and self.own.due(self.state.global_step):
                term = self.own(self.accelerator.unwrap_model(model), inputs["input_ids"], step=self.state.global_step)
                if term is not None:
                    loss = loss + term
                for key, value in self.own.last.items():
                    metrics[f"own/{key}"].append(value)
            return (loss, outputs) if return_outputs else loss

    return UnlikelihoodSFTTrainer


def _sft_done(work: Path, args) -> bool:
    info = work / "sft_info.json"
    return ((work / "final" / "config.json").exists() and info.exists()
            and _recorded(json.loads(info.read_text()).get("args", {})) == sft_args(args))


def _last_checkpoint(sft_dir: Path, args) -> Path | None:
    """The SFT checkpoint to resume from: the latest in ``sft_dir`` if it was written with these arguments."""
    from transformers.trainer_utils import get_last_checkpoint

    saved = sft_dir / "build_args.json"
    if not sft_dir.is_dir() or not saved.exists():
        return None
    if _recorded(json.loads(saved.read_text())) != sft_args(args):
        print(f"sft: {sft_dir} holds a run with other arguments; starting over", flush=True)
        return None
    last = get_last_checkpoint(str(sft_dir))
    return Path(last) if last else None


def read_splits(work: Path) -> dict[str, list[str]]:
    """The splits written by the data stage."""
    splits = {}
    for name in ("sft", "grpo", "eval"):
        path = work / f"{name}.txt"
        if not path.exists():
            sys.exit(f"{path} is missing: run `--stage data` first (same --work, --n_lines, --seed).")
        splits[name] = path.read_text().splitlines()
    return splits


# What the data stage's splits depend on. A continuation (--init_from a finished build) must split as its init model's
# build did, or its held-out positions would include ones that model was trained on.
DATA_ARGS = ("seed", "n_lines", "a_share", "n_games", "n_grpo", "n_eval", "held_out_copies", "label_depth", "max_plies")


def init_build(args) -> dict | None:
    """The ``build_info.json`` of the finished build ``--init_from`` names (None for a bare SFT dir or no init).

    Exits when this build's data arguments differ from that build's: the splits would differ, and the held-out
    positions of this build could be SFT positions of the init model.
    """
    if not args.init_from or not (Path(args.init_from) / "build_info.json").exists():
        return None
    base = json.loads((Path(args.init_from) / "build_info.json").read_text())
    differ = [f"--{k} {getattr(args, k)} (it was built with {base['args'][k]})" for k in DATA_ARGS
              if k in base.get("args", {}) and base["args"][k] != getattr(args, k)]
    if differ:
        sys.exit(f"--init_from {args.init_from}: " + "; ".join(differ) + ". A continuation keeps its init model's data "
                 "arguments, so that no held-out position was in that model's SFT data; --sft_seed varies the SFT stage "
                 "alone.")
    return base


def main(argv=None) -> int:
    args = parse_args(argv)
    base = init_build(args)  # checked before any stage runs
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    if args.stage in ("all", "data"):
        splits = make_data(args, work)
        for name, lines in splits.items():
            (work / f"{name}.txt").write_text("".join(line + "\n" for line in lines))
        cache_info = data_cache(args, work).with_suffix(".json")
        data_info = {**(json.loads(cache_info.read_text()) if cache_info.exists() else {}),
                     "lines": args.n_lines, "label_depth": args.label_depth, "max_plies": args.max_plies,
                     "held_out_copies": args.held_out_copies,
                     "splits": {k: len(v) for k, v in splits.items()}}
        (work / "data_info.json").write_text(json.dumps(data_info, indent=2))
        print(data_info, flush=True)
    if args.stage in ("all", "sft"):
        if _sft_done(work, args):
            print(f"sft: {work / 'final'} was trained with these arguments already; skipping (delete it to retrain)")
        else:
            splits = read_splits(work)
            sft(args, work, splits["sft"], splits["grpo"])
    if args.stage in ("all", "finish"):
        finish(args, work, read_splits(work), argv, base)
    print(f"stage {args.stage} done in {time.time() - t0:.0f}s")
    return 0


def finish(args, work: Path, splits: dict[str, list[str]], argv, base: dict | None = None) -> None:
    """Evaluate the SFT model on each of :data:`PANELS` and write the package assets with their model card.

    ``base``: the build_info of the finished build this one continues (:func:`init_build`), recorded in this one's.
    """
    from rookgrpo.chess.engine import EngineSettings
    from rookgrpo.evaluate import PER_ROW_KEYS, evaluate, format_table

    model_dir = work / "final"
    if not (model_dir / "config.json").exists():
        sys.exit(f"{model_dir} has no model: run `--stage sft` first (same --work).")
    sft_info = work / "sft_info.json"
    used = _recorded(json.loads(sft_info.read_text()).get("args", {})) if sft_info.exists() else {}
    differ = [f"--{k} {getattr(args, k)} (the SFT stage used {used[k]})" for k in SFT_ARGS
              if k in used and used[k] != getattr(args, k)]
    if differ:
        sys.exit("finish: " + "; ".join(differ) + ". Pass the same arguments to every stage; the model card names "
                 "them.")
    t0 = time.time()
    settings = EngineSettings(depth=args.eval_depth, workers=args.workers)
    # The third panel's lines: drawn here, since they depend on the SFT stage's arguments (its mix).
    fit = fit_sample(trained_mix(args, splits["sft"]), args.n_grpo, args.seed)
    (work / "sft_sample.txt").write_text("".join(line + "\n" for line in fit))
    metrics = {p.key: evaluate(str(model_dir), str(work / p.work_file), settings=settings) for p in PANELS}
    t_eval = time.time() - t0
    for p in PANELS:
        print(f"{p.heading.format(depth=args.eval_depth)}:\n{format_table(metrics[p.key])}", flush=True)

    def summary(m: dict) -> dict:  # an evaluation's metrics, without its per-row data
        return {k: v for k, v in m.items() if k not in ("samples", "model", "data", *PER_ROW_KEYS)}

    out = args.out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
              "tokenizer_config.json", "special_tokens_map.json"):
        if (model_dir / f).exists():
            shutil.copy2(model_dir / f, tmp / f)
    for p in PANELS:
        shutil.copy2(work / p.work_file, tmp / p.packaged_file)
    stage_info = {name: json.loads((work / f"{name}_info.json").read_text())
                  for name in ("data", "sft") if (work / f"{name}_info.json").exists()}
    build = {
        "command": " ".join(["python scripts/build_tiny_model.py",
                             *_without_stage(sys.argv[1:] if argv is None else argv)]),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "stage"},
        "splits": {k: len(v) for k, v in splits.items()},
        "stages": {**stage_info, "finish": {"seconds": round(t_eval)}},
        "parameters": _n_params(model_dir),
        "architecture": _architecture(model_dir),
        **{p.key: summary(metrics[p.key]) for p in PANELS},
        "samples": metrics["eval"]["samples"],
    }
    if base is not None:
        # The build this one continues, as its own build_info recorded it (its per-row samples left out).
        build["init"] = {k: v for k, v in base.items() if k != "samples"}
    (tmp / "build_info.json").write_text(json.dumps(build, indent=2))
    (tmp / "README.md").write_text(model_card(build, {p.key: format_table(metrics[p.key]) for p in PANELS}))
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    print(f"wrote {out} ({sum(f.stat().st_size for f in out.iterdir()) / 1e6:.1f} MB)")


def _without_stage(argv: list[str]) -> list[str]:
    """The command line minus ``--stage X``: the model card names the build, not the stage that wrote it."""
    out, skip = [], False
    for arg in argv:
        if skip or arg.startswith("--stage="):
            skip = False
            continue
        if arg == "--stage":
            skip = True
            continue
        out.append(arg)
    return out


def _architecture(model_dir: Path) -> dict:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    return {"n_layer": config.n_layer, "n_head": config.n_head, "n_embd": config.n_embd}


def _n_params(model_dir: Path) -> int:
    from transformers import AutoModelForCausalLM

    return sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters())


def _micro_text(a: dict) -> str:
    k = a.get("micro_batches", 1)
    return f" (run as {k} length-sorted micro-batches, the same gradient)" if k > 1 else ""


ACTIVATION_TEXT = {"gelu_pytorch_tanh": "GPT-2's tanh GELU as one fused kernel (`gelu_pytorch_tanh`)",
                   "gelu_new": "GPT-2's tanh GELU as transformers' `gelu_new` writes it (seven tensor ops)"}


def model_card(build: dict, tables: dict[str, str]) -> str:
    """The model card; ``tables``: each panel's evaluation table (``format_table``) by its key in :data:`PANELS`."""
    a = build["args"]
    shape = build.get("architecture", a)  # the saved model's own shape (an --init_from build ignores the shape args)
    init = build.get("init")
    if init:
        made = f"""Two commands: the build of the model it continues, then the continuation, whose `--init_from` names the model
the first one wrote.

1. `{init['command']}` (seed {init['args']['seed']}):

{_indent(_data_text(init) + _sft_text(init) + _time_text(init), 3)}
2. `{build['command']}` (SFT seed {_sft_seed(a)}), on the first command's splits (the same data arguments; the
   script checks them):

{_indent(_sft_text(build) + _time_text(build), 3)}"""
    else:
        made = f"`{build['command']}` (seed {a['seed']}):\n\n" + _data_text(build) + _sft_text(build) + _time_text(build)
    return f"""# rookgrpo/tiny-rookworld

A {build['parameters'] / 1e6:.2f}M-parameter GPT-2 ({shape['n_layer']} layers, {shape['n_head']} heads,
width {shape['n_embd']}, {TOKENIZER_TEXT[a.get('tokenizer', 'char')]}) that has learned the RookWorld text
formats by supervised fine-tuning. It is rookgrpo's
embedded default: `make train` runs GRPO on it with no network. It is a starting point with room to improve,
not a chess player, and it knows openings only: every position it was taught comes from the first
{a.get('max_plies', '?')} plies of a game, so later positions are outside what it has seen.

## How it was made

{made}""" + "".join(_panel_section(p, tables[p.key], a["eval_depth"]) for p in PANELS)


def _panel_section(p: "Panel", table: str, depth: int) -> str:
    text = f"{p.text}\n\n" if p.text else ""
    return f"""
## {p.heading.format(depth=depth)}

{text}```
{table}
```

Reproduce: `rookgrpo evaluate --model rookgrpo/tiny-rookworld --data rookgrpo/{p.alias} --depth {depth}`.
"""


class Panel(NamedTuple):
    """A set of lines the finish stage evaluates the SFT model on; packaged, with a section in the model card."""

    key: str  # the evaluation's key in build_info.json
    work_file: str  # in --work
    alias: str  # rookgrpo/<alias>: a packaged data name (rookgrpo.assets.DATASETS)
    heading: str  # the card section's ({depth}: the evaluation's Stockfish depth)
    text: str  # what the card says before the table ("" for nothing)

    @property
    def packaged_file(self) -> str:
        from rookgrpo.assets import DATASETS

        return DATASETS[self.alias].name


PANELS = (
    Panel("eval", "eval.txt", "tiny-rookworld-eval", "Numbers (held-out positions, greedy decoding, Stockfish depth {depth})",
          ""),
    # The GRPO positions were never in SFT either: a second held-out panel, four times the size, for the SFT model (not
    # for a GRPO run, which trains on them). A 300-step continuation that raised best move with z 2.1 on the evaluation
    # positions changed it by -0.009 (z -1.2) here (docs/tiny-model.md).
    Panel("eval_grpo_positions", "grpo.txt", "tiny-rookworld-train",
          "Numbers on the GRPO positions (a second held-out panel, four times the size)",
          """The GRPO training positions were never in the SFT data either, so for this model they are held out too (not for a
model GRPO has trained on them). Compare SFT models on both panels: a change of a few rows on the first is noise."""),
    # Lines the SFT stage trained on (fit_sample), as many as the GRPO panel: no better there than held out means
    # fit-bound.
    Panel("eval_sft_sample", "sft_sample.txt", "tiny-rookworld-sft-sample", "Numbers on lines it was trained on",
          """As many lines as the GRPO panel, with its A: share, drawn from the lines the SFT stage trained on (one copy
of each; `sft_sample.txt`). Set against the two held-out panels, they tell why the model misses a number: no better
here than held out means it is fit-bound (more steps, width or less regularisation would raise the number, more
data would not); much better here means it memorises."""),
)


def _indent(text: str, n: int) -> str:
    return "".join(" " * n + line if line.strip() else line for line in text.splitlines(keepends=True))


def _sft_seed(a: dict) -> int:
    """The seed of the SFT stage: ``--sft_seed``, else ``--seed`` (``a``: the arguments as a dict)."""
    return a["seed"] if a.get("sft_seed") is None else a["sft_seed"]


def _data_text(build: dict) -> str:
    a = build["args"]
    return f"""- data: {a['n_lines']} RookWorld lines (compact layout, {a.get('a_share', 0.27):.0%} A:, the rest P:) from
  `rookgrpo.chess.data.generate`, from {a.get('n_games') or 'about one game per ten lines of'} games stopped after
  {a.get('max_plies', '?')} plies, so every position is an opening one (plies 4 and up); P: rows labelled by
  Stockfish at depth {a['label_depth']}; split by position into SFT ({build['splits']['sft']} lines), GRPO training
  positions ({build['splits']['grpo']}, `train_positions.txt`) and held-out evaluation positions
  ({build['splits']['eval']}, `eval_positions.txt`). No position is in two splits.{_copies_text(a)}
"""


def _sft_text(build: dict) -> str:
    a, sft = build["args"], build["stages"].get("sft", {})
    precision = "bf16 autocast" if a.get("bf16") else "fp32"
    return f"""- SFT{_init_text(a)}: TRL `SFTTrainer` on all P: lines of the SFT split and A: lines drawn to
  {a.get('sft_a_share', 1.0):.0%} of the mix{_a_mix_text(a)} ({sft.get('train_lines', '?')} lines), M: moves in
  {M_ORDER_TEXT[a.get('m_order', 'random')]}, prompt/completion pairs with the loss on the whole
  line{_unlikelihood_text(a)}{_squares_text(a)}, {_length_text(a, sft)}, lr {a['lr']} cosine, batch {a['batch_size']}{_micro_text(a)}, {precision},
  {ACTIVATION_TEXT[_recorded(a)['activation']]}, dropout {_recorded(a)['dropout']:g};
  final train loss {_fmt(sft.get('final_train_loss'))}, eval loss on the GRPO positions
  {_fmt(sft.get('final_eval_loss'))} (nats per token).
"""


def _length_text(a: dict, sft: dict) -> str:
    if a.get("max_steps", -1) > 0 and sft.get("train_lines"):
        epoch = -(-sft["train_lines"] // a["batch_size"])
        return f"{a['max_steps']} steps ({a['max_steps'] / epoch:.2f} of an epoch of the mix)"
    return f"{a['epochs']} epochs"


def _time_text(build: dict) -> str:
    data, sft = build["stages"].get("data"), build["stages"].get("sft", {})
    text = f"data {_fmt(data.get('seconds'))} s on {data.get('machine', '?')} with {data.get('stockfish_workers', '?')}\n" \
           f"  Stockfish processes; " if data else ""
    return f"""- run time: {text}SFT {_fmt(sft.get('seconds'))} s ({sft.get('steps', '?')} steps) on {sft.get('device', '?')};
  evaluation {build['stages']['finish']['seconds']} s.
"""


M_ORDER_TEXT = {"random": "random order (as RookWorld writes them)",
                "rank": "engine rank order (B: first, then by eval)"}
TOKENIZER_TEXT = {"move": "one token per UCI move and per character otherwise",
                  "board": "one token per UCI move, per frequent FEN rank string and per character otherwise",
                  "char": "one token per character"}


def _copies_text(a: dict) -> str:
    if a.get("held_out_copies", "keep") == "drop":
        return " The held-out splits hold one copy of each line\n  (`--held_out_copies drop`); SFT keeps every copy."
    return ""


def _init_text(a: dict) -> str:
    return f" (continued from `{a['init_from']}`, its weights and tokenizer)" if a.get("init_from") else ""


def _unlikelihood_text(a: dict) -> str:
    """The model card's words for the SFT loss's extra terms.

    >>> _unlikelihood_text({"own_evals": 1.0, "own_from": 3000})
    ' plus 1.0 x the E: count (an eval per listed move, then B:) along its own greedy E: fields (the own-list terms from step 3000 on)'
    >>> _unlikelihood_text({"own_target": 0.2, "own_evals": 1.0, "own_from": 2200, "own_evals_from": 3000,
    ...                     "a_completion_weight": 3.0})[-136:]
    '(the own-list terms from step 2200 on, the E: count from step 3000 on), the cross-entropy weighted 3 on A: completion tokens in training'
    >>> _unlikelihood_text({"prompt_weight": 0.5, "p_completion_weight": 2.0, "a_completion_weight": 2.0})
    ', the cross-entropy weighted 0.5 on prompt tokens, 2 on P: completion tokens, 2 on A: completion tokens in training'
    """
    weight, target, own, evals = (a.get(k) or 0 for k in ("unlikelihood", "own_target", "own_unlikelihood", "own_evals"))
    text = f" plus {weight} x an unlikelihood term against repeating a move in M:" if weight else ""
    if target:
        text += f" plus {target} x the line's unlisted M: moves as the target at each slot of its own greedy M: lists"
    if own:
        text += f" plus {own} x an unlikelihood term against repeats in its own greedy M: lists"
    if evals:
        text += f" plus {evals} x the E: count (an eval per listed move, then B:) along its own greedy E: fields"
    every = a.get("own_every") or 1
    rows, all_rows = a.get("own_rows") or SFT_ARG_DEFAULTS["own_rows"], SFT_ARG_DEFAULTS["own_rows"]
    evals_from = a.get("own_evals_from") or 0
    if (target or own or evals) and (a.get("own_from") or every > 1 or rows != all_rows or evals_from):
        text += (f" (the own-list terms {f'on one step in {every} ' if every > 1 else ''}from step {a.get('own_from') or 0} on"
                 f"{f', the E: count from step {evals_from} on' if evals_from else ''}"
                 f"{f', on {rows} P: lines of each batch' if rows != all_rows else ''})")
    parts = [f"{w:g} on {what} tokens"
             for key, what in (("prompt_weight", "prompt"), ("p_completion_weight", "P: completion"),
                               ("a_completion_weight", "A: completion"))
             if (w := a.get(key) or 1.0) != 1]
    if parts:
        text += ", the cross-entropy weighted " + ", ".join(parts) + " in training"
    return text


def _a_mix_text(a: dict) -> str:
    """The model card's words for ``--sft_a_mix`` and ``--sft_a_distinct``.

    >>> _a_mix_text({"sft_a_mix": "sqrt", "sft_a_distinct": True})
    ' (one copy of each A: line, each move drawn as the square root of its lines, `--sft_a_distinct --sft_a_mix sqrt`)'
    >>> _a_mix_text({})
    ''
    """
    mix = a.get("sft_a_mix", "random")
    words = [w for w, on in (("one copy of each A: line", a.get("sft_a_distinct")),
                             ("each move drawn as the square root of its lines", mix == "sqrt"),
                             ("each move's lines capped at one count", mix == "balanced")) if on]
    flags = ["--sft_a_distinct"] * bool(a.get("sft_a_distinct")) + [f"--sft_a_mix {mix}"] * (mix != "random")
    return f" ({', '.join(words)}, `{' '.join(flags)}`)" if words else ""


def _squares_text(a: dict) -> str:
    """The model card's words for ``--move_squares``.

    >>> _squares_text({"move_squares": True})
    ', each move token trained as its own vector plus shared from-square, to-square and promotion vectors (`--move_squares`, folded into the embedding)'
    >>> _squares_text({})
    ''
    """
    if not a.get("move_squares"):
        return ""
    return (", each move token trained as its own vector plus shared from-square, to-square and promotion vectors"
            " (`--move_squares`, folded into the embedding)")


def _fmt(value) -> str:
    return "?" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


if __name__ == "__main__":
    sys.exit(main())
