#!/usr/bin/env python
"""Build the embedded default: ``rookgrpo/tiny-rookworld``, a small GPT-2 with a move-level tokenizer, taught by SFT.

Why: RookWorld-LM-124M and its dataset live on a hub our machines cannot reach, and a random model earns the same
floor reward on every completion, so GRPO has nothing to learn from. This script makes a starting point that has
learned the format and plays legal, often reasonable moves, yet leaves room to improve.

Its defaults are the packaged model's (v3) command: run with no option, it rebuilds v3 into ``build/tiny-rookworld``
(about two hours on 2 CPU cores), and writes the package's asset folder only when asked with
``--out src/rookgrpo/assets/tiny-rookworld``. Levers measured on this builder and not shipped are in
``docs/experiments/``, with the commit that holds their code.

Stages (each seeded, so a rebuild reproduces the shipped numbers within noise), runnable one at a time with
``--stage`` so the SFT can go to a GPU machine while the Stockfish work stays on a CPU one:

1. ``data``: generate RookWorld lines (``P:`` and ``A:``, compact layout) with :func:`rookgrpo.chess.data.generate`
   and split them by position into SFT data, GRPO training positions and held-out evaluation positions (no position
   in two splits; one copy of each line in the held-out splits); cached in ``--work``;
2. ``sft``: build a randomly initialised GPT-2 with one token per UCI move (:mod:`rookgrpo.models.tiny_model`) and
   fine-tune it with TRL's ``SFTTrainer`` on the whole line (reading the FEN teaches the board), with terms on the
   model's own greedy M: lists from ``--own_from`` on (:class:`OwnLists`), bf16 autocast, on a GPU when there is
   one, else CPU; a checkpoint every eighth of the run, and a rerun with the same arguments resumes from the last;
3. ``finish``: evaluate it with ``rookgrpo evaluate`` on three panels (:data:`PANELS`) and write model, tokenizer,
   positions and a model card (how it was made, its numbers) to ``--out``.

::

    python scripts/build_tiny_model.py                          # v3's build, into build/tiny-rookworld/out
    python scripts/build_tiny_model.py --out src/rookgrpo/assets/tiny-rookworld   # ... and replace the packaged one
    python scripts/build_tiny_model.py --stage data             # CPU machine with Stockfish
    python scripts/build_tiny_model.py --stage sft              # GPU machine, with build/tiny-rookworld copied over
    python scripts/build_tiny_model.py --stage finish           # back on the Stockfish machine
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
PACKAGED = REPO / "src" / "rookgrpo" / "assets" / "tiny-rookworld"
DEFAULT_WORK = REPO / "build" / "tiny-rookworld"

# The SFT model's GELU: GPT-2's tanh approximation as transformers' ``gelu_new`` writes it, which v3 was trained
# with; the packaged config names the same function as one fused kernel (``gelu_pytorch_tanh``, outputs equal to
# 1 ulp, faster in GRPO), so ``finish`` writes that name.
TRAIN_ACTIVATION, PACKAGED_ACTIVATION = "gelu_new", "gelu_pytorch_tanh"
DROPOUT = 0.1  # GPT-2's default, on embeddings, attention and residuals during SFT
OWN_ROWS = 32  # P: lines of each batch that the own-list terms generate on


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_WORK / "out",
                   help="where the model, its positions and its card go (the packaged asset folder only when named)")
    p.add_argument("--work", type=Path, default=DEFAULT_WORK, help="scratch (data cache, SFT checkpoints)")
    p.add_argument("--seed", type=int, default=1234, help="seeds every stage (games, labels, splits, weights, batches)")
    p.add_argument("--n_lines", type=int, default=200000, help="RookWorld lines generated in all (all splits)")
    p.add_argument("--a_share", type=float, default=0.7,
                   help="share of A: lines generated: they need no engine (only P: lines are labelled by Stockfish)")
    p.add_argument("--n_games", type=int, default=10000,
                   help="games played for positions (P: rows sample their positions, A: rows their moves)")
    p.add_argument("--n_grpo", type=int, default=1024, help="GRPO training lines (positions) kept out of SFT")
    p.add_argument("--n_eval", type=int, default=256, help="held-out evaluation lines (positions)")
    p.add_argument("--label_depth", type=int, default=8, help="Stockfish depth that labels P: rows")
    p.add_argument("--max_plies", type=int, default=24,
                   help="games stop after this many plies, so positions come from the opening (plies 4 to N-1)")
    p.add_argument("--eval_depth", type=int, default=8, help="Stockfish depth of the finish stage's evaluation")
    p.add_argument("--own_target", type=float, default=0.2,
                   help="weight of the term paying, at each move slot of the model's own greedy M: list, minus\n"
                        "log P(a move of the line's M: list not listed yet) (OwnLists); 0: off")
    p.add_argument("--own_unlikelihood", type=float, default=5.0,
                   help="weight of minus log(1 - p) of each move the model listed before, on the same greedy lists\n"
                        "(Welleck et al. 2019, 5.2); 0: off")
    p.add_argument("--own_from", type=int, default=2200,
                   help="SFT step from which the own-list terms apply (0: every step); each such step costs a greedy\n"
                        "generation and one more forward and backward")
    p.add_argument("--n_layer", type=int, default=6)
    p.add_argument("--n_head", type=int, default=4)
    p.add_argument("--n_embd", type=int, default=224)
    p.add_argument("--sft_a_share", type=float, default=0.5,
                   help="share of A: lines in the SFT mix: every P: line of the SFT split, A: lines drawn to this share")
    p.add_argument("--epochs", type=float, default=2.0, help="passes over the SFT mix")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (cosine schedule, 3%% warm-up)")
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2, help="Stockfish processes")
    p.add_argument("--stage", choices=("all", "data", "sft", "finish"), default="all",
                   help="run one stage (data, sft, finish) or all three")
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True,
                   help="bf16 autocast, weights stay fp32; --no-bf16 for a CPU without bf16 units")
    p.add_argument("--max_steps", type=int, default=-1, help="cap SFT steps (timing runs); -1 trains all epochs")
    args = p.parse_args(argv)
    for name in ("n_lines", "n_games", "n_eval", "n_layer", "n_head", "n_embd", "batch_size", "workers"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    for name in ("a_share", "sft_a_share"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            p.error(f"--{name} must be within [0, 1], got {getattr(args, name)}")
    for name in ("own_target", "own_unlikelihood", "own_from"):
        if getattr(args, name) < 0:
            p.error(f"--{name} must be at least 0, got {getattr(args, name)}")
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
    """Generate (or reuse the cached) lines and split them by position.

    The game generator replays openings, so a line can be generated more than once: the held-out splits keep one
    copy of each line (their quotas count distinct lines), the SFT split every copy.
    """
    from rookgrpo.chess.data import generate, position_key, write_lines
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
    positions = sorted({position_key(line) for line in lines})
    random.Random(args.seed).shuffle(positions)
    by_pos: dict[str, list[str]] = {}
    for line in lines:
        by_pos.setdefault(position_key(line), []).append(line)
    quota = {name: {"A": round(n * HELD_OUT_A_SHARE), "P": n - round(n * HELD_OUT_A_SHARE)}
             for name, n in (("eval", args.n_eval), ("grpo", args.n_grpo))}
    splits: dict[str, list[str]] = {"eval": [], "grpo": [], "sft": []}
    for pos in positions:
        held = list(dict.fromkeys(by_pos[pos]))  # what this position would add to a held-out split: one of each line
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


# What the SFT stage's result depends on; the finish stage checks it was given the same (its model card names them).
SFT_ARGS = ("seed", "n_layer", "n_head", "n_embd", "sft_a_share", "epochs", "lr", "batch_size", "max_steps", "bf16",
            "own_target", "own_unlikelihood", "own_from")


def sft_args(args) -> dict:
    """The arguments the SFT stage's result depends on, as the stages record and compare them."""
    return {k: getattr(args, k) for k in SFT_ARGS}


def _recorded(saved: dict) -> dict:
    """The SFT arguments a stage recorded, as :func:`sft_args` lists them."""
    return {k: saved.get(k) for k in SFT_ARGS}


def m_span(row: list[int], m: int, e: int, colon: int) -> tuple[int, int] | None:
    """(position of the first ``M``, position of the ``E`` after it, or the row's end) of ``M: ... E:`` in a token
    row (``m``, ``e``, ``colon``: the tokens of ``M``, ``E`` and ``:``); ``None`` when the row has no ``M:``.

    >>> m_span([7, 1, 3, 9, 9, 2, 3, 5], m=1, e=2, colon=3)
    (1, 5)
    >>> m_span([7, 9], m=1, e=2, colon=3) is None
    True
    """
    start = next((i for i in range(len(row) - 1) if row[i] == m and row[i + 1] == colon), None)
    if start is None:
        return None
    end = next((i for i in range(start + 2, len(row) - 1) if row[i] == e and row[i + 1] == colon), len(row))
    return start, end


def line_loss(outputs, labels, num_items_in_batch=None):
    """Next-token cross-entropy summed over labelled tokens, divided by ``num_items_in_batch`` when the trainer passes
    it, else by their count: the loss ``SFTTrainer`` computes itself, without its second, gradient-free forward for
    entropy and token-accuracy metrics (about a third more time per step on CPU)."""
    import torch
    import torch.nn.functional as F

    logits = outputs.logits[:, :-1].float()
    target = labels[:, 1:].to(logits.device)
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100, reduction="sum")
    n = num_items_in_batch if num_items_in_batch is not None else (target != -100).sum()
    return nll / torch.as_tensor(n, device=nll.device).clamp(min=1)


class OwnLists:
    """Terms on the model's own greedy M: lists, the context greedy decoding puts it in and the data lines never do.

    At each training step from ``start`` on it takes up to ``rows`` P: lines of the batch, cuts each after ``M:``,
    lets the model write its M: list greedily (``max_new`` tokens, dropout off, no gradient), runs it again with
    gradient and adds, at the k-th move slot of that list (the token after its k-th space):

    - ``target`` times ``-log P(next move is one the line's own M: lists and the model has not listed yet)``, for
      k up to the line's number of moves: the data's set of moves as the target, on the model's own prefix (as
      DAgger trains on the learner's states). A repeat is never in the set, a list that stops early or breaks its
      layout owes the slot where it did (:meth:`slots`), and a wrong move is answered with the right ones;
    - ``unlikelihood`` times ``-log(1 - p(m))`` for each move ``m`` it listed before (Welleck et al. 2019, section
      5.2).

    ``last`` holds the latest batch's ``rows`` (how many of its P: lines were charged), ``repeat_share`` (greedy
    lists with a repeated move), ``list_len`` (mean moves per greedy list) and each term's mean; empty when the batch
    had no P: line.
    """

    def __init__(self, tokenizer, target: float = 0.0, unlikelihood: float = 0.0, rows: int = OWN_ROWS,
                 max_new: int = 11, start: int = 0):
        from rookgrpo.models.tiny_model import geometric_moves

        vocab = tokenizer.get_vocab()
        self.target, self.unlikelihood, self.rows, self.max_new, self.start = target, unlikelihood, rows, max_new, start
        self.m, self.e, self.colon = vocab["M"], vocab["E"], vocab[":"]
        self.moves = {vocab[m] for m in geometric_moves() if m in vocab}
        self.pad, self.eos = tokenizer.pad_token_id, tokenizer.eos_token_id
        (self.space,) = tokenizer(" ", add_special_tokens=False)["input_ids"]
        self.last: dict[str, float] = {}

    def due(self, step: int) -> bool:
        """Whether the terms apply at training step ``step`` (the trainer's ``global_step`` before the update)."""
        return step >= self.start

    def prompts(self, input_ids) -> list[tuple[list[int], list[int]]]:
        """(tokens up to and including the first ``M:``, the line's distinct M: moves) for each line with M:."""
        out = []
        for row in input_ids.tolist():
            row = [t for t in row if t != self.pad]  # padding on either side (never inside a line)
            span = m_span(row, self.m, self.e, self.colon)
            if span is None:
                continue
            start, end = span
            out.append((row[:start + 2], list(dict.fromkeys(t for t in row[start + 2:end] if t in self.moves))))
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
                if j + 1 >= len(row) or row[j + 1] not in self.moves:
                    break
                listed.append(row[j + 1])
                j += 1
        return out

    def __call__(self, model, input_ids):
        """The weighted terms for this batch (a 0-d tensor), or ``None`` when there is nothing to charge."""
        import torch

        lines = self.prompts(input_ids)
        self.last = {}
        if not lines or not (self.target or self.unlikelihood):
            return None
        width = max(len(x) for x, _ in lines)
        ids = torch.tensor([[self.pad] * (width - len(x)) + x for x, _ in lines], device=input_ids.device)
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x, _ in lines], device=input_ids.device)
        was_training = model.training
        model.eval()
        with torch.no_grad():
            seq = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=self.max_new, do_sample=False,
                                 pad_token_id=self.pad)
        model.train(was_training)
        slots = self.slots(seq, width, [d for _, d in lines])
        moves: list[list[int]] = [[] for _ in lines]
        for b, j, owed, _ in slots:
            if owed != [self.space] and j + 1 < seq.shape[1] and int(seq[b, j + 1]) in self.moves:
                moves[b].append(int(seq[b, j + 1]))
        self.last = {"rows": len(lines), "repeat_share": sum(len(set(x)) < len(x) for x in moves) / len(lines),
                     "list_len": sum(map(len, moves)) / len(lines)}
        if not slots:
            return None
        full = torch.cat([mask, torch.ones_like(seq[:, width:])], dim=1)
        positions = (full.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=seq, attention_mask=full, position_ids=positions, use_cache=False).logits
        logp = torch.log_softmax(logits[[b for b, *_ in slots], [j for _, j, *_ in slots]].float(), dim=-1)
        total = logits.new_zeros((), dtype=torch.float32)
        if self.target:
            term = -torch.stack([torch.logsumexp(logp[i, owed], 0) for i, (_, _, owed, _) in enumerate(slots)]).mean()
            self.last["target"] = float(term.detach())
            total = total + self.target * term
        pairs = [(i, m) for i, (*_, before) in enumerate(slots) for m in before]
        if self.unlikelihood and pairs:
            p = logp[[i for i, _ in pairs], [m for _, m in pairs]].exp().clamp(max=1 - 1e-6)
            term = -torch.log1p(-p).mean()
            self.last["unlikelihood"] = float(term.detach())
            total = total + self.unlikelihood * term
        return total


def own_lists_trainer(base):
    """``base`` (TRL's ``SFTTrainer``) with :func:`line_loss` in one forward pass, plus the :class:`OwnLists` terms on
    training steps from their ``start`` on (a greedy generation and one more forward); logs ``own/repeat_share``,
    ``own/list_len`` and ``own/<term>`` for the greedy lists."""

    class OwnListsSFTTrainer(base):
        def __init__(self, own: OwnLists, *a, **kw):
            super().__init__(*a, **kw)
            self.own = own

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            outputs = model(**{k: v for k, v in inputs.items() if k != "labels"}, use_cache=False)
            loss = line_loss(outputs, inputs["labels"], num_items_in_batch=num_items_in_batch)
            if model.training and self.own.due(self.state.global_step):
                term = self.own(self.accelerator.unwrap_model(model), inputs["input_ids"])
                if term is not None:
                    loss = loss + term
                for key, value in self.own.last.items():
                    self._metrics["train"][f"own/{key}"].append(value)
            return (loss, outputs) if return_outputs else loss

    return OwnListsSFTTrainer


def sft_mix(lines: list[str], a_share: float, seed: int) -> list[str]:
    """All P: lines and as many A: lines (a seeded draw, file order kept) as make ``a_share`` of the mix.

    >>> lines = ["P: x"] * 4 + [f"A: b+{m}+h+c+0+0+0" for m in ["e2e4"] * 6 + ["h1g1"] * 2]
    >>> mix = sft_mix(lines, 0.5, 0)
    >>> sum(x.startswith("P:") for x in mix), sum(x.startswith("A:") for x in mix)
    (4, 4)
    """
    p_lines = [line for line in lines if line.startswith("P:")]
    a_lines = [line for line in lines if not line.startswith("P:")]
    if a_share >= 1.0 or not p_lines:
        return lines
    want = min(len(a_lines), round(len(p_lines) * a_share / (1.0 - a_share)))
    keep = set(random.Random(f"{seed}-sft-mix").sample(range(len(a_lines)), want))
    kept = iter(i in keep for i in range(len(a_lines)))
    return [line for line in lines if line.startswith("P:") or next(kept)]


def fit_sample(mix: list[str], n: int, seed: int) -> list[str]:
    """``n`` distinct lines the SFT stage trained on (``mix``: :func:`sft_mix`'s lines), with the held-out panels'
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
    """Fine-tune a fresh move-tokenizer GPT-2 on the SFT mix with TRL's SFTTrainer; return the saved model dir.

    Runs on a GPU when there is one, else CPU; fp32 unless ``--bf16`` (autocast, weights and optimizer stay fp32).
    ``held_lines`` (the GRPO positions, never the evaluation ones) give an eval loss to read over- or under-fitting.
    """
    import torch
    from trl import SFTConfig, SFTTrainer

    from rookgrpo.models.tiny_model import TinyGPT2Spec, build_move_tokenizer, build_tiny_gpt2

    sft_lines = sft_mix(sft_lines, args.sft_a_share, args.seed)
    tokenizer = build_move_tokenizer()
    init = work / "init"
    lengths = [len(ids) for ids in tokenizer(sft_lines + held_lines)["input_ids"]]
    print(f"sft: {len(tokenizer)} tokens in the vocabulary, {sum(lengths) / len(lengths):.1f} tokens per line",
          flush=True)
    n_positions = max(256, 64 * ((max(lengths) + 2 + 63) // 64))
    spec = TinyGPT2Spec(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, n_positions=n_positions,
                        seed=args.seed, tokenizer="move", activation=TRAIN_ACTIVATION)
    checkpoint = _last_checkpoint(work / "sft", args)
    if checkpoint is None:
        shutil.rmtree(work / "sft", ignore_errors=True)
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
        output_dir=str(work / "sft"), seed=args.seed, use_cpu=not gpu, bf16=args.bf16, tf32=False,
        num_train_epochs=args.epochs, max_steps=args.max_steps, learning_rate=args.lr, lr_scheduler_type="cosine",
        warmup_steps=0.03, weight_decay=0.01, per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=256, max_length=n_positions,
        # Loss on the whole line, prompt included: predicting the FEN's characters is how a model this small learns
        # where the pieces are.
        completion_only_loss=False,
        logging_steps=max(1, steps // 200), eval_strategy="steps", eval_steps=max(1, steps // 8),
        # A checkpoint every eighth of the run: a stopped build resumes from the last one (same arguments).
        save_strategy="steps", save_steps=max(1, steps // 8), save_total_limit=1, report_to="none",
        dataloader_num_workers=2 if gpu else 0, gradient_checkpointing=False,
        # Eager attention: with bf16 autocast on the 2-core reference CPU it ran a step ~15% faster than SDPA.
        model_init_kwargs={"attn_implementation": "eager", "activation_function": TRAIN_ACTIVATION,
                           **{k: DROPOUT for k in ("embd_pdrop", "attn_pdrop", "resid_pdrop")}},
        # Random order, not grouped by length: grouping makes batches single-task (P: and A: lines differ in length),
        # and the A: loss stalled where mixed batches kept learning.
    )
    if args.own_target or args.own_unlikelihood:
        own = OwnLists(tokenizer, args.own_target, args.own_unlikelihood, start=args.own_from)
        trainer = own_lists_trainer(SFTTrainer)(own, model=str(init), args=config, train_dataset=train,
                                                eval_dataset=held)
    else:
        trainer = SFTTrainer(model=str(init), args=config, train_dataset=train, eval_dataset=held)
    t0 = time.time()
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    seconds = time.time() - t0
    final = work / "final"
    shutil.rmtree(final, ignore_errors=True)
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


def main(argv=None) -> int:
    args = parse_args(argv)
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
        finish(args, work, read_splits(work), argv)
    print(f"stage {args.stage} done in {time.time() - t0:.0f}s")
    return 0


def finish(args, work: Path, splits: dict[str, list[str]], argv) -> None:
    """Evaluate the SFT model on each of :data:`PANELS` and write the model, its panels and its card to ``--out``."""
    from rookgrpo.chess.engine import EngineSettings
    from rookgrpo.chess.evaluate import PER_ROW_KEYS, evaluate, format_table

    model_dir = work / "final"
    if not (model_dir / "config.json").exists():
        sys.exit(f"{model_dir} has no model: run `--stage sft` first (same --work).")
    sft_info = work / "sft_info.json"
    used = _recorded(json.loads(sft_info.read_text()).get("args", {})) if sft_info.exists() else {}
    differ = [f"--{k} {getattr(args, k)} (the SFT stage used {used[k]})" for k in SFT_ARGS
              if used.get(k) is not None and used[k] != getattr(args, k)]
    if differ:
        sys.exit("finish: " + "; ".join(differ) + ". Pass the same arguments to every stage; the model card names "
                 "them.")
    t0 = time.time()
    settings = EngineSettings(depth=args.eval_depth, workers=args.workers)
    # The third panel's lines: drawn here, since they depend on the SFT stage's arguments (its mix).
    fit = fit_sample(sft_mix(splits["sft"], args.sft_a_share, args.seed), args.n_grpo, args.seed)
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
    for f in ("generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json"):
        if (model_dir / f).exists():
            shutil.copy2(model_dir / f, tmp / f)
    config = json.loads((model_dir / "config.json").read_text())
    config["activation_function"] = PACKAGED_ACTIVATION  # the same function as one fused kernel
    (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
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
    (tmp / "build_info.json").write_text(json.dumps(build, indent=2))
    (tmp / "README.md").write_text(model_card(build, {p.key: format_table(metrics[p.key]) for p in PANELS}))
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    print(f"wrote {out} ({sum(f.stat().st_size for f in out.iterdir()) / 1e6:.1f} MB)")


def _without_stage(argv: list[str]) -> list[str]:
    """The command line minus ``--stage X``: the model card names the build, not the stage that wrote it.

    >>> _without_stage(["--seed", "1", "--stage", "sft", "--stage=finish"])
    ['--seed', '1']
    """
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


def model_card(build: dict, tables: dict[str, str]) -> str:
    """The model card; ``tables``: each panel's evaluation table (``format_table``) by its key in :data:`PANELS`."""
    a = build["args"]
    shape = build.get("architecture", a)
    made = f"`{build['command']}` (seed {a['seed']}):\n\n" + _data_text(build) + _sft_text(build) + _time_text(build)
    return f"""# rookgrpo/tiny-rookworld

A {build['parameters'] / 1e6:.2f}M-parameter GPT-2 ({shape['n_layer']} layers, {shape['n_head']} heads,
width {shape['n_embd']}, one token per UCI move and per character otherwise) that has learned the RookWorld text
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
    alias: str  # rookgrpo/<alias>: a packaged data file (registered by the chess pack, rookgrpo/chess/pack.py)
    heading: str  # the card section's ({depth}: the evaluation's Stockfish depth)
    text: str  # what the card says before the table ("" for nothing)

    @property
    def packaged_file(self) -> str:
        from rookgrpo.registry import lookup

        return lookup("dataset", self.alias).name


PANELS = (
    Panel("eval", "eval.txt", "tiny-rookworld-eval", "Numbers (held-out positions, greedy decoding, Stockfish depth {depth})",
          ""),
    # The GRPO positions were never in SFT either: a second held-out panel, four times the size, for the SFT model (not
    # for a GRPO run, which trains on them).
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


def _data_text(build: dict) -> str:
    a = build["args"]
    return f"""- data: {a['n_lines']} RookWorld lines (compact layout, {a['a_share']:.0%} A:, the rest P:) from
  `rookgrpo.chess.data.generate`, from {a['n_games']} games stopped after
  {a['max_plies']} plies, so every position is an opening one (plies 4 and up); P: rows labelled by
  Stockfish at depth {a['label_depth']}; split by position into SFT ({build['splits']['sft']} lines), GRPO training
  positions ({build['splits']['grpo']}, `train_positions.txt`) and held-out evaluation positions
  ({build['splits']['eval']}, `eval_positions.txt`). No position is in two splits. The held-out splits hold one copy
  of each line; SFT keeps every copy.
"""


def _sft_text(build: dict) -> str:
    a, sft = build["args"], build["stages"].get("sft", {})
    precision = "bf16 autocast" if a.get("bf16") else "fp32"
    return f"""- SFT: TRL `SFTTrainer` on all P: lines of the SFT split and A: lines drawn to
  {a['sft_a_share']:.0%} of the mix ({sft.get('train_lines', '?')} lines), prompt/completion pairs with the loss on
  the whole line{_own_text(a)}, {_length_text(a, sft)}, lr {a['lr']} cosine, batch {a['batch_size']}, {precision},
  GPT-2's tanh GELU (`{TRAIN_ACTIVATION}` in training; the packaged config names the same function as one fused
  kernel, `{PACKAGED_ACTIVATION}`), dropout {DROPOUT:g};
  final train loss {_fmt(sft.get('final_train_loss'))}, eval loss on the GRPO positions
  {_fmt(sft.get('final_eval_loss'))} (nats per token).
"""


def _own_text(a: dict) -> str:
    """The model card's words for the own-list terms.

    >>> print(_own_text({"own_target": 0.2, "own_unlikelihood": 5.0, "own_from": 2200}))
     plus 0.2 x the line's unlisted M: moves as the target at each slot of its own greedy M: lists plus 5.0 x an unlikelihood term against repeats in its own greedy M: lists (from step 2200 on)
    >>> _own_text({"own_target": 0.0, "own_unlikelihood": 0.0, "own_from": 0})
    ''
    """
    target, own = a.get("own_target") or 0, a.get("own_unlikelihood") or 0
    text = f" plus {target} x the line's unlisted M: moves as the target at each slot of its own greedy M: lists" \
        if target else ""
    if own:
        text += f" plus {own} x an unlikelihood term against repeats in its own greedy M: lists"
    if (target or own) and a.get("own_from"):
        text += f" (from step {a['own_from']} on)"
    return text


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


def _fmt(value) -> str:
    return "?" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


if __name__ == "__main__":
    sys.exit(main())
