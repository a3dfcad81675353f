"""How often RookWorld's published A: convention and rookgrpo's answer a generated row differently.

RookWorld's published generator pushes a well-formed UCI move without checking that it is legal, so an illegal move
produces a corrupted next position (a piece teleports, a king may be captured, the side to move flips). rookgrpo's
environment (``env_step``) answers an illegal move as illegal: position unchanged, reward -1.0, truncated 1.

This generates A: rows with rookgrpo's generator, writes them in the hub layout (``text`` column, no ``A: `` prefix),
loads them back the way training does, and compares the next FEN of both conventions row by row.

    python benchmarks/bench_env_conventions.py [--n 2000] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

import chess

from rookgrpo.chess.data import generate, load_rookworld
from rookgrpo.chess.engine import EngineSettings
from rookgrpo.chess.formats import env_step, is_legal, is_uci, parse_env

from common import finish  # benchmarks/common.py


def published_next_fen(fen: str, move: str) -> str | None:
    """The next FEN as the published generator writes it: ``push`` with no legality check (``None`` if it fails)."""
    board = chess.Board(fen)
    try:
        board.push(chess.Move.from_uci(move))
        return board.fen()
    except (ValueError, AssertionError, AttributeError, TypeError):
        return None


def compare(n: int, seed: int) -> dict:
    lines = generate(n, tasks=["A"], seed=seed, settings=EngineSettings(depth=4, workers=2), progress=False)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "hub.jsonl"
        with open(path, "w") as fh:
            for line in lines:
                fh.write(json.dumps({"text": line[len("A: "):]}) + "\n")  # the hub's A: rows lack the prefix
        rows = load_rookworld(str(path))["text"]
    counts: Counter = Counter()
    for text in rows:
        fields = parse_env(text)
        board = chess.Board(fields.fen)
        kind = "legal" if is_legal(board, fields.move) else "illegal, well-formed" if is_uci(fields.move) \
            else "malformed"
        ours = env_step(fields.fen, fields.move, fields.history).new_fen
        theirs = published_next_fen(fields.fen, fields.move) if kind != "malformed" else None
        counts[(kind, "same" if ours == theirs else "differs")] += 1
    return {"rows": len(rows), "counts": {f"{k} / {v}": c for (k, v), c in sorted(counts.items())}}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    found = compare(args.n, args.seed)
    differs = sum(c for k, c in found["counts"].items() if k.endswith("differs"))
    lines = ["| A: rows by move | next FEN the same | next FEN differs |", "| --- | ---: | ---: |"]
    for kind in ("legal", "illegal, well-formed", "malformed"):
        same, diff = found["counts"].get(f"{kind} / same", 0), found["counts"].get(f"{kind} / differs", 0)
        if same or diff:
            lines.append(f"| {kind} | {same} | {diff} |")
    lines.append(f"| **all {found['rows']} rows** | {found['rows'] - differs} | **{differs} "
                 f"({differs / found['rows']:.1%})** |")
    result = {
        "title": "A: task: rookgrpo's legality-checked environment against RookWorld's published convention",
        "description": (
            f"{found['rows']} A: rows from rookgrpo's generator (seed {args.seed}), written in the hub layout and loaded "
            "back. The published generator pushes a well-formed move without a legality check; rookgrpo answers an "
            "illegal move with the position unchanged, reward -1.0 and truncated 1. The two disagree exactly on the "
            "rows whose move is illegal."
        ),
        "table": "\n".join(lines),
        "command": f"python benchmarks/bench_env_conventions.py --n {args.n} --seed {args.seed}",
        **found,
    }
    return finish(result, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
