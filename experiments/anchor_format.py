"""Why supervised training on P: reference lines lowers greedy format: which error it adds, and whether scoring only the
B: move avoids it.

The best-move grid's supervised control (the SFT anchor on P: and A: lines, every reward weighted 0) lowered greedy
format by about 0.13 on every seed, although every P: reference line passes ``chess_format``
(docs/experiments/2026-11-27-best-move-grid-plan.md). This benchmark trains the packaged model with plain supervised
steps on the GRPO set's reference lines (the anchor's lines, without GRPO: one loss, one optimizer) and breaks the
greedy answers that newly fail format down by their first error. Arms (same steps, learning rate and schedule):

- ``A``: the A: lines (the shipped anchor's ``tasks: [A]``);
- ``PA``: the P: and A: lines (the grid's ``anchor-PA`` lines);
- ``PA-B``: the P: and A: lines with each P: line scored on its B: move only (and the end of the line): the engine's
  best move taught without the reference M: and E: lists.

The packaged model was built with terms on its own greedy M: lists against repeated moves
(scripts/build_tiny_model.py, ``OwnLists``); teacher-forced NLL on reference lists (in random move order) has no
such term. Each run: ``--steps`` AdamW steps of ``--batch`` lines drawn with the seed, learning rate ``--lr`` with
cosine decay after 5 warm-up steps (the grid's anchor: 16 lines per loss, 1e-5 cosine, 200 steps), then a greedy
evaluation of the reported panel's P: rows (``rookgrpo/tiny-rookworld-eval``, Stockfish depth 8). Seeds 1-5.

    python experiments/anchor_format.py --out experiments/results/anchor_format.json
    python experiments/anchor_format.py --from_result experiments/results/anchor_format.json    (re-table)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
import tempfile
from collections import Counter

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # for benchmarks/common.py
from grpo_grid import mean_se, t_stat  # experiments/grpo_grid.py
from common import STARTED_AT, finish  # benchmarks/common.py

ARMS = {"A": (["A"], False), "PA": (["P", "A"], False), "PA-B": (["P", "A"], True)}  # (tasks, P: lines on B: only)
TRAIN, EVAL, MODEL, DEPTH = "rookgrpo/tiny-rookworld-grpo", "rookgrpo/tiny-rookworld-eval", "rookgrpo/tiny-rookworld", 8
METRICS = [("format_rate", "greedy format"), ("best_move_accuracy", "best move"), ("move_rank_reward", "move-rank"),
           ("top_move_share", "top-move share")]


TITLE = "What supervised steps on the anchor's reference lines do to greedy format"
DESCRIPTION = (
    "The packaged model trained by plain supervised steps (no GRPO) on the GRPO set's reference lines: `A` on A: lines "
    "(the shipped anchor's), `PA` on P: and A: lines (the best-move grid's `anchor-PA`), `PA-B` on the same lines with "
    "each P: line scored on its B: move only; then greedy answers on the reported panel's 192 P: positions. A greedy "
    "answer that was well formed before and fails format after counts as a new failure, by its first error. The "
    "packaged model was built with terms against repeats in its own greedy M: lists (scripts/build_tiny_model.py, "
    "`OwnLists`); teacher-forced NLL on reference M: lists has none.")


def failure_kind(completion: str) -> str | None:
    """The first M:/E:/B: format error of a greedy P: answer, by kind; None when the answer is well formed.

    >>> failure_kind(" M: e2e4 d2d4 E: 0.3 0.2 B: e2e4")
    >>> failure_kind(" M: e2e4 e2e4 E: 0.3 0.3 B: e2e4")
    'M: repeated move'
    >>> failure_kind(" M: e2e4 d2d4 E: 0.3 B: e2e4")
    'E: evals for moves'
    """
    from rookgrpo.chess.formats import parse_policy

    errors = [e for e in parse_policy(" " + completion.split("\n", 1)[0]).errors if e[:2] in ("M:", "E:", "B:")]
    if not errors:
        return None
    e = errors[0]
    return e if e in ("M: repeated move", "M: missing", "M: no moves", "E: missing", "B: missing move") else \
        e[:2] + " " + " ".join(w for w in e[3:].split() if not w[0].isdigit() and "'" not in w)


def b_split(tokenizer, completion: str) -> tuple[list[int], list[int]]:
    """A P: completion's tokens up to and including ``B:``, and the rest (the move): the part a B:-only loss scores."""
    head, tail = completion.rsplit("B:", 1)
    return (tokenizer(head + "B:", add_special_tokens=False)["input_ids"],
            tokenizer(tail, add_special_tokens=False)["input_ids"])


def train(arm: str, seed: int, steps: int, batch: int, lr: float, out_dir: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, get_cosine_schedule_with_warmup

    from rookgrpo.assets import resolve_model
    from rookgrpo.chess.data import load_rookworld

    tasks, b_only = ARMS[arm]
    torch.manual_seed(seed)
    path = resolve_model(MODEL)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    rows = load_rookworld(TRAIN, tasks=tasks)
    seqs, starts = [], []  # token ids of prompt + completion + EOS; where the scored part starts
    for prompt, completion, task in zip(rows["prompt"], rows["completion"], rows["task"]):
        p = tok(prompt, add_special_tokens=False)["input_ids"]
        if b_only and task == "P":
            head, tail = b_split(tok, completion)
            if head + tail != tok(completion, add_special_tokens=False)["input_ids"]:
                raise RuntimeError(f"the tokenizer does not split {completion!r} at B: the way it reads it whole")
            seqs.append(p + head + tail + [tok.eos_token_id])
            starts.append(len(p) + len(head))
        else:
            seqs.append(p + tok(completion, add_special_tokens=False)["input_ids"] + [tok.eos_token_id])
            starts.append(len(p))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = get_cosine_schedule_with_warmup(opt, 5, steps)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        idx = torch.randint(len(seqs), (batch,), generator=gen).tolist()
        width = max(len(seqs[i]) for i in idx)
        ids = torch.full((batch, width), tok.eos_token_id)
        mask = torch.zeros((batch, width), dtype=torch.long)
        labels = torch.full((batch, width), -100)
        for r, i in enumerate(idx):
            s = torch.tensor(seqs[i])
            ids[r, :len(s)], mask[r, :len(s)] = s, 1
            labels[r, starts[i]:len(s)] = s[starts[i]:]
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    model.eval()
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)


def measure(model: str) -> dict:
    """Greedy answers on the reported panel's P: rows: the evaluation's metrics and each answer's failure kind."""
    from rookgrpo.chess.data import load_rookworld
    from rookgrpo.chess.engine import EngineSettings
    from rookgrpo.chess.evaluate import generate_completions, score

    rows = load_rookworld(EVAL, tasks=["P"])
    completions = generate_completions(model, rows["prompt"], 104, 32, False)
    metrics = score(rows["prompt"], completions, rows["task"], EngineSettings(depth=DEPTH))
    return {**{k: metrics[k] for k, _ in METRICS}, "kinds": [failure_kind(c) for c in completions]}


def new_failures(before: list, after: list) -> dict[str, int]:
    """Answers well formed before and not after, counted by their kind after.

    >>> new_failures([None, None, "M: repeated move"], ["M: repeated move", None, None])
    {'M: repeated move': 1}
    """
    return dict(Counter(a for b, a in zip(before, after) if b is None and a is not None).most_common())


def table(result: dict) -> str:
    start = result["start"]
    head = "| arm | seeds | " + " | ".join(f"{label} (change)" for _, label in METRICS) + \
        " | new format failures per seed | of them repeated M: moves |"
    lines = [head, "|" + "---|" * (len(METRICS) + 4)]
    for arm, runs in result["runs"].items():
        cells = []
        for key, _ in METRICS:
            m, se = mean_se([r[key] - start[key] for r in runs])
            cells.append(f"{m:+.3f} ± {se:.3f} (t {t_stat(m, se):+.1f})")
        new = [new_failures(start["kinds"], r["kinds"]) for r in runs]
        total = mean_se([sum(n.values()) for n in new])
        rep = mean_se([n.get("M: repeated move", 0) for n in new])
        lines.append(f"| {arm} | {len(runs)} | " + " | ".join(cells) + f" | {total[0]:.1f} ± {total[1]:.1f} | "
                     f"{rep[0]:.1f} ± {rep[1]:.1f} |")
    kinds = Counter(k for k in start["kinds"] if k)
    return "\n".join(lines) + (
        f"\n\nStart (the packaged model, greedy): format {start['format_rate']:.3f}, best move "
        f"{start['best_move_accuracy']:.3f} on {len(start['kinds'])} P: positions; its failures: "
        f"{', '.join(f'{k} {n}' for k, n in kinds.most_common()) or 'none'}. Change against the start, mean ± se over "
        f"seeds; each run {result['steps']} steps of {result['batch']} lines, lr {result['lr']:g} cosine.")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3, 4, 5])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--out", default=None)
    ap.add_argument("--from_result", default=None, help="re-table a saved result, training nothing")
    args = ap.parse_args(argv)
    if args.from_result:
        with open(args.from_result) as fh:
            result = json.load(fh)
        result["table"] = table(result)
        return finish(result, None)
    from tqdm.auto import tqdm

    result = {"steps": args.steps, "batch": args.batch, "lr": args.lr, "measured": STARTED_AT,
              "start": measure(MODEL), "runs": {arm: [] for arm in args.arms}}
    bar = tqdm(total=len(args.arms) * len(args.seeds), desc="supervised runs", unit="run")
    for seed in args.seeds:
        for arm in args.arms:
            with tempfile.TemporaryDirectory() as tmp:
                train(arm, seed, args.steps, args.batch, args.lr, tmp)
                result["runs"][arm].append({"seed": seed, **measure(tmp)})
            bar.update()
    bar.close()
    result.update(title=TITLE, description=DESCRIPTION, table=table(result),
                  command="python experiments/anchor_format.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    return finish(result, args.out)


if __name__ == "__main__":
    main()
