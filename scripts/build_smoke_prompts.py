"""Build ``src/rookgrpo/assets/smoke_prompts.jsonl``: RookWorld policy-task prompts from random legal play.

The smoke dataset lets `make train` and the tests run GRPO with no network and no engine: 128 positions reached by
seeded random play (4 to 60 plies), each as a compact policy prompt ``P: <FEN> `` (the prompt ends before ``M:``).

    python scripts/build_smoke_prompts.py [--n 128] [--seed 0]
"""

import argparse
import json
import random
from pathlib import Path

import chess

OUT = Path(__file__).resolve().parents[1] / "src" / "rookgrpo" / "assets" / "smoke_prompts.jsonl"


def random_position(rng: random.Random) -> chess.Board:
    board = chess.Board()
    for _ in range(rng.randint(4, 60)):
        moves = list(board.legal_moves)
        if not moves:
            break
        board.push(rng.choice(moves))
    return board


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    seen, rows = set(), []
    while len(rows) < args.n:
        board = random_position(rng)
        if board.is_game_over() or board.fen() in seen:
            continue
        seen.add(board.fen())
        rows.append({"prompt": f"P: {board.fen()} ", "fen": board.fen()})
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} prompts to {args.out}")


if __name__ == "__main__":
    main()
