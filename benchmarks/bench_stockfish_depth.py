"""Which Stockfish depth the chess rewards should use: separation, agreement with a deep search, and cost.

For each data set (default: the packaged held-out positions and the RookWorld validation file) a deep multipv-5
search (``--reference-depth``, default 16) gives the "true" best and 5th-best moves. Then, for each candidate depth,
the rewards' own engine settings (one multipv-5 analysis per position) are measured for:

- agreement: the depth's best move equals the deep best (top-1), and lies in the deep top 5;
- order: ``chess_move_rank`` at this depth pays the deep best strictly more than the deep 5th-best;
- separation: ``chess_move_rank``'s mean credit for the deep best, the deep 5th-best and a random legal move;
- labels: on RookWorld's black-to-move lines (whose B: is the known defect, the worst of its five moves), the share
  whose label earns strictly less than the depth's best move;
- cost: engine milliseconds per unique position (wall time x engines / positions).

    python benchmarks/bench_stockfish_depth.py [--n 200] [--depths 4 6 8 10 12] [--reference-depth 16]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import chess

from rookgrpo.chess.data import load_rookworld
from rookgrpo.chess.engine import EnginePool, EngineSettings
from rookgrpo.chess.formats import parse_policy
from rookgrpo.chess.rewards import rank_credit

from common import finish  # benchmarks/common.py

ROOK_VAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "rook_val_500.txt"


def positions(data: str, n: int) -> list[tuple[str, str]]:
    """(FEN, B: label) of the first ``n`` P: rows with a legal move to play."""
    rows = load_rookworld(data, tasks=["P"])["text"][:n]
    out = []
    for text in rows:
        line = parse_policy(text)
        if any(True for _ in chess.Board(line.fen).legal_moves):
            out.append((line.fen, line.best))
    return out


def analyse_all(fens: list[str], depth: int, workers: int) -> tuple[list, float]:
    with EnginePool(EngineSettings(depth=depth, workers=workers)) as pool:
        start = time.perf_counter()
        analyses = pool.analyse_many(fens)
        elapsed = time.perf_counter() - start
    return analyses, elapsed * workers / max(1, len(fens)) * 1000


def measure(data: str, n: int, depths: list[int], reference_depth: int, workers: int, seed: int) -> list[dict]:
    rows = positions(data, n)
    fens = [fen for fen, _ in rows]
    print(f"{data}: {len(fens)} positions; reference depth {reference_depth}", file=sys.stderr, flush=True)
    reference, ref_ms = analyse_all(fens, reference_depth, workers)
    rng = random.Random(seed)
    randoms = [rng.choice([m.uci() for m in chess.Board(f).legal_moves]) for f in fens]
    black = [i for i, (fen, label) in enumerate(rows) if " b " in fen and label and "rook_val" in data]
    results = []
    for depth in depths:
        analyses, ms = analyse_all(fens, depth, workers)
        best, fifth, rand, order, top1, top5 = [], [], [], [], [], []
        for ref, a, r in zip(reference, analyses, randoms):
            true_best, true_fifth = ref.moves[0], ref.moves[-1]
            best.append(rank_credit(a, true_best))
            fifth.append(rank_credit(a, true_fifth) if len(ref.moves) >= 5 else float("nan"))
            rand.append(rank_credit(a, r))
            if len(ref.moves) >= 5:
                order.append(rank_credit(a, true_best) > rank_credit(a, true_fifth))
            top1.append(a.best == true_best)
            top5.append(a.best in ref.moves)
        labels = [rank_credit(analyses[i], rows[i][1]) < rank_credit(analyses[i], analyses[i].best) for i in black]
        results.append({
            "data": data, "depth": depth, "positions": len(fens), "ms_per_position": ms,
            "top1_agreement": statistics.mean(top1), "in_deep_top5": statistics.mean(top5),
            "orders_best_above_fifth": statistics.mean(order) if order else float("nan"),
            "credit_deep_best": statistics.mean(best),
            "credit_deep_fifth": statistics.mean([x for x in fifth if x == x]),
            "credit_random_legal": statistics.mean(rand),
            "black_labels_below_best": statistics.mean(labels) if labels else None, "black_lines": len(labels),
        })
        print(f"  depth {depth}: {ms:.1f} ms/position", file=sys.stderr, flush=True)
    results.append({"data": data, "depth": reference_depth, "reference": True, "ms_per_position": ref_ms,
                    "positions": len(fens)})
    return results


def table(results: list[dict]) -> str:
    lines = [
        "| data | depth | ms / position | top-1 = deep best | best in deep top 5 | ranks deep best > deep 5th "
        "| credit: deep best / 5th / random legal | black-to-move labels below best |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for r in results:
        if r.get("reference"):
            lines.append(f"| {r['data']} | {r['depth']} (reference) | {r['ms_per_position']:.0f} | | | | | |")
            continue
        labels = f"{r['black_labels_below_best']:.0%} of {r['black_lines']}" if r["black_lines"] else ""
        lines.append(
            f"| {r['data']} | {r['depth']} | {r['ms_per_position']:.1f} | {r['top1_agreement']:.0%} | "
            f"{r['in_deep_top5']:.0%} | {r['orders_best_above_fifth']:.0%} | {r['credit_deep_best']:.2f} / "
            f"{r['credit_deep_fifth']:.2f} / {r['credit_random_legal']:.2f} | {labels} |"
        )
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", nargs="+", default=["rookgrpo/tiny-rookworld-eval", str(ROOK_VAL)])
    ap.add_argument("--n", type=int, default=200, help="positions per data set")
    ap.add_argument("--depths", type=int, nargs="+", default=[4, 6, 8, 10, 12])
    ap.add_argument("--reference-depth", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    data = [d for d in args.data if not d.endswith(".txt") or Path(d).exists()]
    results = [r for d in data for r in measure(d, args.n, args.depths, args.reference_depth, args.workers, args.seed)]
    shown = [{**r, "data": Path(r["data"]).name} for r in results]
    result = {
        "title": "Stockfish depth for the chess rewards: separation, agreement with a deep search, cost",
        "description": (
            f"Per data set, the first {args.n} P: positions. A depth-{args.reference_depth} multipv-5 search gives the "
            "deep best and 5th-best moves; each depth is then scored as the rewards use it (one multipv-5 analysis "
            "per position, `chess_move_rank`'s credit). ms / position is engine time (wall x engines / positions). "
            "Labels: RookWorld's black-to-move B: (the worst of its five moves) earning strictly less than the "
            "depth's best move."
        ),
        "table": table(shown),
        "command": "python benchmarks/bench_stockfish_depth.py " + " ".join(argv or []),
        "results": results,
    }
    return finish(result, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
