"""Chess reward throughput: rookgrpo's pool + cache against a naive scorer that calls the engine per completion.

One GRPO step's worth of policy-task scoring: 16 prompts x G completions (default G=8), all five policy
components (format, legality, best move, candidates, evals), for two completion mixes (``--mix``, see
``make_batch``): model-like samples, and a random worst case where most moves are unique.

- rookgrpo: the registered reward classes sharing one ``EnginePool`` (2 processes by default). Each repeat starts
  from a new pool with an empty cache, so this is the cost of a step on new prompts.
- naive: one engine process; for every completion, one multipv-5 analysis of its position plus one search per M:/B:
  move outside the top 5, computing the same formulas.

Same Stockfish, depth and machine, in one run; both sides must produce identical rewards (checked).

    python benchmarks/bench_chess_rewards.py [--mix model-like|random] [--generations 8] [--workers 2] [--depth 10]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

import chess
import chess.engine

from rookgrpo.chess.data import generate
from rookgrpo.chess.engine import MATE_SCORE, EnginePool, EngineSettings, find_stockfish
from rookgrpo.chess.formats import is_legal, parse_policy, split_policy
from rookgrpo.rewards import chess as chess_rewards
from rookgrpo.rewards.chess import eval_closeness, move_accuracy

from common import finish  # benchmarks/common.py


def make_batch(n_prompts: int, generations: int, seed: int, depth: int, mix: str = "model-like"):
    """16 prompts x G completions.

    ``model-like``: what a policy that learned the format samples: M: is the engine's top moves with each slot
    swapped for a random legal move with probability 0.2, evals the engine's plus noise, B: the best move 60% of
    the time, else another listed move; one completion in eight is malformed or names an illegal move.
    ``random``: a worst case for caching: half the completions list five uniformly random legal moves.
    """
    lines = generate(n_prompts * 2, tasks=["P"], seed=seed, settings=EngineSettings(depth=depth), progress=False)
    lines = lines[:n_prompts]
    rng = random.Random(seed)
    prompts, completions = [], []
    for line in lines:
        prompt, reference = split_policy(line)
        parsed = parse_policy(line)
        legal = [m.uci() for m in chess.Board(parsed.fen).legal_moves]
        for g in range(generations):
            prompts.append(prompt)
            completions.append(_model_like(parsed, legal, rng) if mix == "model-like" else _random(parsed, legal, reference, g, rng))
    return prompts, completions


def _model_like(parsed, legal, rng):
    if rng.random() < 1 / 8:
        return rng.choice([" M: e2e4 E: 0.3 B:", " M: " + " ".join(parsed.moves) + " E: x B: " + parsed.moves[0],
                           f" M: {parsed.moves[0]} E: 0.1 B: a1h8"])
    moves = [m if rng.random() > 0.2 else rng.choice(legal) for m in parsed.moves]
    moves = list(dict.fromkeys(moves))
    rng.shuffle(moves)
    engine = dict(zip(parsed.moves, parsed.evals))
    evals = " ".join(f"{engine.get(m, rng.uniform(-3, 3)) + rng.gauss(0, 0.5):.2f}" for m in moves)
    best = parsed.best if rng.random() < 0.6 else rng.choice(moves)
    return f" M: {' '.join(moves)} E: {evals} B: {best}"


def _random(parsed, legal, reference, g, rng):
    kind = g % 4
    if kind == 0:
        return reference
    moves = rng.sample(legal, min(len(legal), 5)) if kind != 1 else parsed.moves[:]
    rng.shuffle(moves)
    best = moves[0] if kind != 3 else "a1" + rng.choice(["h8", "d5"])  # kind 3: an illegal B:
    evals = " ".join(f"{rng.uniform(-3, 3):.2f}" for _ in moves)
    return f" M: {' '.join(moves)} E: {evals} B: {best}"


def rookgrpo_score(prompts, completions, settings):
    pool = EnginePool(settings)
    original = chess_rewards.get_pool
    chess_rewards.get_pool = lambda s: pool  # a fresh pool (empty cache) per repeat
    try:
        funcs = [chess_rewards.ChessFormat(), chess_rewards.ChessLegality(), chess_rewards.ChessBestMove(settings),
                 chess_rewards.ChessCandidates(settings), chess_rewards.ChessEvals(settings)]
        start = time.perf_counter()
        values = [f(prompts, completions) for f in funcs]
        elapsed = time.perf_counter() - start
    finally:
        chess_rewards.get_pool = original
        pool.close()
    return elapsed, [list(col) for col in zip(*values)]


def naive_score(prompts, completions, settings):
    engine = chess.engine.SimpleEngine.popen_uci(find_stockfish(settings.path))
    engine.configure({"Threads": 1, "Hash": settings.hash_mb})
    limit = settings.limit()
    start = time.perf_counter()
    out = []
    try:
        for prompt, completion in zip(prompts, completions):
            out.append(_naive_one(engine, limit, prompt, completion))
    finally:
        elapsed = time.perf_counter() - start
        engine.quit()
    return elapsed, out


def _naive_one(engine, limit, prompt, completion):
    fen = parse_policy(prompt + " M:").fen
    line = parse_policy(" " + completion)
    board = chess.Board(fen)
    infos = engine.analyse(board, limit, multipv=5, game=object())
    top = [(i["pv"][0].uci(), i["score"].pov(board.turn).score(mate_score=MATE_SCORE)) for i in infos]
    top_moves = [m for m, _ in top]
    floor = min(s for _, s in top)
    legal = lambda m: is_legal(board, m)  # noqa: E731

    def value(move):
        if move in top_moves:
            return dict(top)[move]
        info = engine.analyse(board, limit, root_moves=[chess.Move.from_uci(move)], game=object())
        return min(info["score"].pov(board.turn).score(mate_score=MATE_SCORE), floor)

    bad = {e[0] for e in line.errors if e[:2] in ("M:", "E:", "B:")}
    fmt = (3 - len(bad)) / 3
    proposed = line.moves + ([line.best] if line.best else [])
    legality = sum(map(legal, proposed)) / len(proposed) if proposed else 0.0
    best = move_accuracy(top[0][1], value(line.best)) if legal(line.best) else 0.0
    named = {m for m in dict.fromkeys(line.moves) if legal(m)}
    candidates = len(named & set(top_moves)) / len(top_moves)
    total = 0.0
    for move, predicted in zip(line.moves, line.evals):
        if predicted is not None and legal(move):
            total += eval_closeness(predicted, value(move) / 100.0)
    evals = total / max(1, len(line.moves))
    return [fmt, legality, best, candidates, evals]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--depth", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mix", choices=["model-like", "random"], default="model-like")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    settings = EngineSettings(depth=args.depth, workers=args.workers)
    prompts, completions = make_batch(args.prompts, args.generations, args.seed, args.depth, args.mix)
    n = len(completions)
    naive_t, rook_t = [], []
    rookgrpo_score(prompts[:8], completions[:8], settings)  # warm-up (process start, page cache)
    for _ in range(args.repeats):  # interleaved, so machine load affects both alike
        t, naive_values = naive_score(prompts, completions, settings)
        naive_t.append(t)
        t, rook_values = rookgrpo_score(prompts, completions, settings)
        rook_t.append(t)
        mismatches = sum(abs(a - b) > 1e-9 for ra, rb in zip(rook_values, naive_values) for a, b in zip(ra, rb))
        if mismatches:
            raise SystemExit(f"rookgrpo and naive rewards differ in {mismatches} values")
    naive_med, rook_med = statistics.median(naive_t), statistics.median(rook_t)
    ratio = naive_med / rook_med
    table = "\n".join([
        "| scorer | engines | completions/s (median) | seconds per batch (median, min-max) |",
        "| --- | --- | --- | --- |",
        f"| naive (engine call per completion) | 1 | {n / naive_med:.1f} | {naive_med:.2f} ({min(naive_t):.2f}-{max(naive_t):.2f}) |",
        f"| rookgrpo pool + cache (cold cache) | {args.workers} | {n / rook_med:.1f} | {rook_med:.2f} ({min(rook_t):.2f}-{max(rook_t):.2f}) |",
        f"| **speed-up** | | **{ratio:.1f}x** | |",
    ])
    result = {
        "title": f"Chess reward throughput, {args.mix} completions ({args.prompts} prompts x G={args.generations}, "
                 f"depth {args.depth})",
        "description": (
            f"All five policy components for one batch of {n} {args.mix} completions "
            f"(see `make_batch` in the script); both scorers return identical "
            f"rewards (checked every repeat). {args.repeats} interleaved repeats after a warm-up. Target: >= 6x at "
            f"G=8 with 2 engine processes."
        ),
        "table": table,
        "command": f"python benchmarks/bench_chess_rewards.py --mix {args.mix} --generations {args.generations} "
                   f"--workers {args.workers} --depth {args.depth} --repeats {args.repeats}",
        "ratio": ratio,
        "naive_seconds": naive_t,
        "rookgrpo_seconds": rook_t,
        "completions": n,
    }
    return finish(result, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
