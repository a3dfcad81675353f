"""How many A: lines of each move a build's SFT mix draws, under each ``--sft_a_mix`` / ``--sft_a_distinct``.

A: copies concentrate on moves a build's SFT lines hold rarely (``a_errors.py --move_counts``). This counts, for
the moves in each band of that count, the median number of A: lines the SFT mix trains on per move (and, in
brackets, how many of them are distinct), with the same draw the build makes
(``scripts/build_tiny_model.py``'s ``sft_mix``). No model, no engine: seconds.

::

    python benchmarks/levers/sft_mix.py --sft build/tv26/sft.txt --mixes random sqrt distinct distinct+sqrt \\
        --bins 300 1000 3000 10000
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for _path in (HERE.parents[1] / "scripts", HERE):  # build_tiny_model's sft_mix; a_errors' move bands
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))


def parse_mix(spec: str) -> tuple[str, bool]:
    """A ``--mixes`` entry as (``--sft_a_mix``, ``--sft_a_distinct``).

    >>> parse_mix("random"), parse_mix("distinct+sqrt"), parse_mix("distinct")
    (('random', False), ('sqrt', True), ('random', True))
    """
    from build_tiny_model import A_MIX_POWER

    parts = spec.split("+")
    mixes = [p for p in parts if p != "distinct"] or ["random"]
    if len(mixes) != 1 or mixes[0] not in ("random", *A_MIX_POWER):
        raise SystemExit(f"--mixes {spec!r}: expected random, {', '.join(A_MIX_POWER)}, optionally with 'distinct+'")
    return mixes[0], "distinct" in parts


def per_move(lines: list[str], a_move) -> tuple[collections.Counter, collections.Counter]:
    """Each move's A: lines in ``lines``, all copies and distinct ones.

    >>> a_move = lambda line: line.split("+")[1]
    >>> per_move(["P: x", "A: b+e2e4+h", "A: b+e2e4+h", "A: c+e2e4+h"], a_move)
    (Counter({'e2e4': 3}), Counter({'e2e4': 2}))
    """
    a_lines = [line for line in lines if line.startswith("A:")]
    return (collections.Counter(map(a_move, a_lines)), collections.Counter(map(a_move, set(a_lines))))


def table(lines: list[str], mixes: list[str], edges: list[int], share: float, seed: int) -> str:
    """The markdown table: per band of how often a move occurs in ``lines``, its A: lines in the split and in each
    mix (median per move; distinct in brackets).

    >>> fen = "8/8/8/8/8/8/8/K6k w - - 0 1"
    >>> lines = [f"P: {fen} M: a1a2 E: 0.1 B: a1a2"] * 2 + [f"A: {fen}+a1a2+a1a2+{fen}+0+0+0"] * 3
    >>> lines += [f"A: {fen}+h1g1+h1g1+{fen}+0+0+0"]
    >>> print(table(lines, ["random", "distinct"], [5], 0.5, 0))
    | moves | count | in the SFT split | random | distinct |
    | --- | --- | --- | --- | --- |
    | seen 0-4 | 1 | 1 (1) | 0 (0) | 1 (1) |
    | seen 5+ | 1 | 3 (1) | 2 (1) | 1 (1) |
    """
    import build_tiny_model as script
    from a_errors import move_bin, move_bins, move_counts_of

    seen = move_counts_of(lines)
    split, split_distinct = per_move(lines, script.a_move)
    drawn = {m: per_move(script.sft_mix(lines, share, seed, *parse_mix(m)), script.a_move) for m in mixes}
    bands: dict[str, list[str]] = {}
    for move in split:
        bands.setdefault(move_bin(move, False, seen, edges), []).append(move)

    def cell(counts: tuple[collections.Counter, collections.Counter], moves: list[str]) -> str:
        return (f"{statistics.median(counts[0][m] for m in moves):g} "
                f"({statistics.median(counts[1][m] for m in moves):g})")

    out = [f"| moves | count | in the SFT split | {' | '.join(mixes)} |", "| --- " * (3 + len(mixes)) + "|"]
    for band in (b for b in move_bins(edges) if b in bands):
        moves = bands[band]
        out.append(f"| {band.removeprefix('legal, ')} | {len(moves)} | {cell((split, split_distinct), moves)} | "
                   + " | ".join(cell(drawn[m], moves) for m in mixes) + " |")
    return "\n".join(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sft", required=True, help="a build's sft.txt (its --work directory)")
    ap.add_argument("--mixes", nargs="+", default=["random", "sqrt", "distinct", "distinct+sqrt"],
                    help="mixes to draw: random, sqrt or balanced, each optionally 'distinct+'")
    ap.add_argument("--bins", type=int, nargs="+", default=[300, 1000, 3000, 10000], help="band edges of move counts")
    ap.add_argument("--sft_a_share", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=1234, help="the SFT seed the build used")
    args = ap.parse_args(argv)
    for m in args.mixes:
        parse_mix(m)
    lines = Path(args.sft).read_text().splitlines()
    a_lines = [line for line in lines if line.startswith("A:")]
    top = collections.Counter(a_lines).most_common(3)
    print(f"{args.sft}: {len(a_lines)} A: lines, {len(set(a_lines))} distinct; the three most repeated are "
          f"{', '.join(str(n) for _, n in top)} copies ({sum(n for _, n in top) / max(1, len(a_lines)):.1%} of the A: "
          f"lines)")
    print(f"A: lines per move drawn into the SFT mix (median per move; distinct in brackets), moves banded by how "
          f"often they occur in {args.sft}")
    print(table(lines, args.mixes, args.bins, args.sft_a_share, args.seed))


if __name__ == "__main__":
    main()
