"""Where a model's greedy A: answers go wrong, answer by answer, for docs/tiny-model.md.

``rookgrpo evaluate`` counts A: answers that are exact, copies of the input board, or not a board. This splits the
wrong ones further, by the ranks they get wrong (FEN's first field, rank 8 first):

- ``exact``: the whole completion is the ground truth;
- ``copy``: the input board again, on a move that changes it;
- ``broken, unchanged rank``: not a board, and a rank the move leaves as it was is written wrong (a square dropped
  from a run of pawns, say): the copying the answer needed went wrong, not the move;
- ``broken, changed rank only``: not a board, every wrong rank is one the move changes;
- ``broken, not 8 ranks``: more or fewer than 8 ranks;
- ``board, wrong``: a board, not the right one (nor the input);
- ``board right, fields wrong``: the right board, another field (side to move, counters, verdict) wrong.

``--move_counts SFT_TXT`` adds a second table: exact and copied answers by the A: row's move, an illegal one (whose
right answer is the input board again) apart, the legal ones by how often the move's token occurs in a build's SFT
lines (every place a line writes a move: M: lists, B:, A: moves and histories). A model that cannot read a move it
has seen rarely writes the board back unchanged on it (the question ``--move_squares`` asks).

::

    python benchmarks/levers/a_errors.py --model rookgrpo/tiny-rookworld runs/pos-aonly-s42 [--examples 5]
    python benchmarks/levers/a_errors.py --model rookgrpo/tiny-rookworld build/tv26/out \
        --data rookgrpo/tiny-rookworld-train --move_counts build/tv26/sft.txt
"""

from __future__ import annotations

import argparse
import collections

KINDS = ("exact", "copy", "broken, unchanged rank", "broken, changed rank only", "broken, not 8 ranks",
         "board, wrong", "board right, fields wrong")


def placements(fen: str, expected: str, answer: str) -> tuple[str, str, str]:
    """The piece placements (FEN's first field) of the position, the ground truth and the answer."""
    from rookgrpo.rewards.chess import _placement

    return fen.split()[0], expected.split()[0], _placement(answer)


def classify(fen: str, expected: str, answer: str) -> str:
    """The kind of an ``A:`` answer (one of :data:`KINDS`) for the position ``fen`` and the ground truth ``expected``.

    >>> fen = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
    >>> truth = "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0"
    >>> classify(fen, truth, "rnbqkbnr/ppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0")
    'broken, unchanged rank'
    >>> classify(fen, truth, "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PP/RNBQKBNR b KQkq - 0 1+0.001+0+0")
    'broken, changed rank only'
    >>> classify(fen, truth, fen + "+0.001+0+0"), classify(fen, truth, truth)
    ('copy', 'exact')
    """
    from rookgrpo.rewards.chess import is_board

    if answer == expected:
        return "exact"
    before, right, got = placements(fen, expected, answer)
    if got == before != right:
        return "copy"
    if is_board(got):
        return "board right, fields wrong" if got == right else "board, wrong"
    b, e, g = (p.split("/") for p in (before, right, got))
    if len(g) != 8 or len(e) != 8 or len(b) != 8:
        return "broken, not 8 ranks"
    wrong = {r for r in range(8) if g[r] != e[r]}
    changed = {r for r in range(8) if b[r] != e[r]}
    return "broken, changed rank only" if wrong <= changed else "broken, unchanged rank"


def move_bin(move: str, illegal: bool, counts: dict, edges: list[int]) -> str:
    """The row's bin in the ``--move_counts`` table: ``illegal move``, else the range of ``counts[move]`` among
    ``edges``.

    >>> [move_bin("e2e4", False, {"e2e4": n}, [10, 100]) for n in (0, 10, 99, 100)]
    ['legal, seen 0-9', 'legal, seen 10-99', 'legal, seen 10-99', 'legal, seen 100+']
    >>> move_bin("e2e5", True, {}, [10])
    'illegal move'
    """
    if illegal:
        return "illegal move"
    n, lo = counts.get(move, 0), 0
    for edge in edges:
        if n < edge:
            return f"legal, seen {lo}-{edge - 1}"
        lo = edge
    return f"legal, seen {lo}+"


def move_bins(edges: list[int]) -> list[str]:
    """Every bin :func:`move_bin` can give for ``edges``, in table order: illegal, then by count.

    >>> move_bins([10, 100])
    ['illegal move', 'legal, seen 0-9', 'legal, seen 10-99', 'legal, seen 100+']
    """
    return ["illegal move"] + [move_bin("", False, {"": n}, edges) for n in (0, *edges)]


def move_counts_of(lines) -> collections.Counter:
    """How often each move-shaped word occurs in ``lines`` (:data:`rookgrpo.models.tiny_model.MOVE_WORD`).

    >>> move_counts_of(["P: 8/8/8/8/8/8/8/K6k w - - 0 1 M: a1a2 a1b1 E: 0.1 0.2 B: a1a2"])
    Counter({'a1a2': 2, 'a1b1': 1})
    """
    import re

    from rookgrpo.models.tiny_model import MOVE_WORD

    word = re.compile(MOVE_WORD)
    counts: collections.Counter = collections.Counter()
    for line in lines:
        counts.update(word.findall(line))
    return counts


def move_counts(path: str) -> collections.Counter:
    """How often each move-shaped word occurs in the lines of ``path`` (:func:`move_counts_of`)."""
    with open(path) as f:
        return move_counts_of(f)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", nargs="+", required=True, help="model directories or packaged names")
    ap.add_argument("--data", default="rookgrpo/tiny-rookworld-eval")
    ap.add_argument("--examples", type=int, default=0, help="print this many 'broken, unchanged rank' answers per model")
    ap.add_argument("--move_counts", default=None,
                    help="a build's sft.txt: also table exact and copied answers by how often the row's move occurs there")
    ap.add_argument("--bins", type=int, nargs="+", default=[30, 300], help="bin edges of those counts")
    args = ap.parse_args(argv)

    from rookgrpo.chess.data import load_rookworld
    from rookgrpo.evaluate import generate_completions
    from rookgrpo.rewards.chess import env_answer

    rows = load_rookworld(args.data)
    prompts = [p for p, t in zip(rows["prompt"], rows["task"]) if t == "A"]
    print(f"{len(prompts)} A: rows of {args.data}, greedy\n")
    print("| model | " + " | ".join(KINDS) + " |")
    print("|" + " --- |" * (len(KINDS) + 1))
    shown, by_move = [], {}
    counts_in_sft = move_counts(args.move_counts) if args.move_counts else None
    for model in args.model:
        completions = generate_completions(model, prompts, 96, 32, False, 0.0, 0)
        counts: collections.Counter = collections.Counter()
        for prompt, completion in zip(prompts, completions):
            row = env_answer(prompt, completion)
            if row is None:
                continue
            kind = classify(*row)
            counts[kind] += 1
            move = prompt.split("+")[1]
            if counts_in_sft is not None:
                cell = by_move.setdefault(model, collections.defaultdict(collections.Counter))[
                    move_bin(move, row[1].split("+")[1] == "-1.0", counts_in_sft, args.bins)]
                cell["rows"] += 1
                cell[kind] += 1
            if kind == "broken, unchanged rank" and sum(m == model for m, *_ in shown) < args.examples:
                pairs = [(e, g) for b, e, g in zip(*(p.split("/") for p in placements(*row))) if b == e != g]
                shown.append((model, move, pairs))
        print(f"| {model} | " + " | ".join(str(counts[k]) for k in KINDS) + " |")
    for model, move, pairs in shown:
        print(f"{model}, move {move}: " + ", ".join(f"{e} written {g}" for e, g in pairs))
    if by_move:
        bins = [b for b in move_bins(args.bins) if any(b in cells for cells in by_move.values())]
        print(f"\nexact / board copied, by the row's move (counts in {args.move_counts}); rows in brackets\n")
        print("| model | " + " | ".join(bins) + " |")
        print("|" + " --- |" * (len(bins) + 1))
        for model, cells in by_move.items():
            print(f"| {model} | " + " | ".join(
                f"{cells[b]['exact'] / cells[b]['rows']:.2f} / {cells[b]['copy'] / cells[b]['rows']:.2f} "
                f"({cells[b]['rows']})" if cells[b]["rows"] else "–" for b in bins) + " |")


if __name__ == "__main__":
    main()
