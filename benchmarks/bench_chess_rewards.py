"""Chess reward throughput: rookgrpo's pool + cache against a naive scorer that calls the engine per completion.

One GRPO step's worth of policy-task scoring: 16 prompts x G completions (default G=8), all five policy components
the recipes use (format, legality, move rank, candidates, evals), for two completion mixes (``--mix``, see
``make_batch``): model-like samples, and a random worst case where most moves are unique.

- rookgrpo: the registered reward classes sharing one ``EnginePool`` of N processes. Each repeat starts from a new
  pool with an empty cache, so this is the cost of a step on new prompts.
- naive: the same N engine processes, each completion scored by one of them: one multipv-5 analysis of its position
  plus one search per judged M: move outside the top 5, computing the same formulas. Equal engines, so the ratio is
  what deduplication and caching buy, not parallelism.
- floor: the unique work the batch needs (one analysis per unique position, one search per unique judged move
  outside the top 5), timed one request after another on one engine and divided by N: what no scheduling can beat.

Same Stockfish, depth and machine, in one run; both scorers must produce identical rewards (checked).

    python benchmarks/bench_chess_rewards.py [--mix model-like|random] [--generations 8] [--workers 2] [--depth 10]
"""

from __future__ import annotations

import argparse
import random
import queue
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import chess
import chess.engine

from rookgrpo.chess.data import generate
from rookgrpo.chess.engine import MATE_SCORE, EnginePool, EngineSettings, find_stockfish
from rookgrpo.chess.formats import MAX_MOVES, is_legal, parse_policy, split_policy
from rookgrpo.chess import rewards as chess_rewards
from rookgrpo.chess.rewards import evals_credit, rank_credit

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
        funcs = [chess_rewards.ChessFormat(), chess_rewards.ChessLegality(), chess_rewards.ChessMoveRank(settings),
                 chess_rewards.ChessCandidates(settings), chess_rewards.ChessEvals(settings)]
        start = time.perf_counter()
        values = [f(prompts, completions) for f in funcs]
        elapsed = time.perf_counter() - start
    finally:
        chess_rewards.get_pool = original
        pool.close()
    return elapsed, [list(col) for col in zip(*values)]


def _engines(settings, n):
    engines = []
    for _ in range(n):
        engine = chess.engine.SimpleEngine.popen_uci(find_stockfish(settings.path))
        engine.configure({"Threads": 1, "Hash": settings.hash_mb})
        engines.append(engine)
    return engines


def naive_score(prompts, completions, settings, engines):
    """Every completion scored on its own by one of ``engines`` processes (no deduplication, no cache)."""
    engine_queue = queue.Queue()
    for engine in _engines(settings, engines):
        engine_queue.put(engine)
    limit = settings.limit()

    def one(pair):
        engine = engine_queue.get()
        try:
            return _naive_one(engine, limit, *pair)
        finally:
            engine_queue.put(engine)

    start = time.perf_counter()
    try:
        with ThreadPoolExecutor(max_workers=engines) as executor:
            out = list(executor.map(one, zip(prompts, completions)))
    finally:
        elapsed = time.perf_counter() - start
        while not engine_queue.empty():
            engine_queue.get().quit()
    return elapsed, out


def _analyse(engine, limit, board):
    infos = engine.analyse(board, limit, multipv=5, game=object())
    return [(i["pv"][0].uci(), i["score"].pov(board.turn).score(mate_score=MATE_SCORE)) for i in infos]


def _search(engine, limit, board, move):
    info = engine.analyse(board, limit, root_moves=[chess.Move.from_uci(move)], game=object())
    return info["score"].pov(board.turn).score(mate_score=MATE_SCORE)


def _judged(line, board):
    """The (move, predicted eval) pairs ``chess_evals`` judges: the first 5 M: moves, legal, with a number."""
    pairs = list(zip(line.moves, line.evals))[:MAX_MOVES]
    return [(m, v) for m, v in pairs if v is not None and is_legal(board, m)]


def _naive_one(engine, limit, prompt, completion):
    from rookgrpo.chess.engine import Analysis

    fen = parse_policy(prompt + " M:").fen
    line = parse_policy(" " + completion)
    board = chess.Board(fen)
    top = _analyse(engine, limit, board)
    analysis = Analysis(fen, tuple(m for m, _ in top), tuple(s for _, s in top))
    floor = min(analysis.scores)
    legal = lambda m: is_legal(board, m)  # noqa: E731

    def value(move):
        if move in analysis.moves:
            return analysis.score_of(move)
        return min(_search(engine, limit, board, move), floor)

    bad = {e[0] for e in line.errors if e[:2] in ("M:", "E:", "B:")}
    fmt = (3 - len(bad)) / 3
    proposed = line.moves + ([line.best] if line.best else [])
    legality = sum(map(legal, proposed)) / len(proposed) if proposed else 0.0
    rank = rank_credit(analysis, line.best) if legal(line.best) else 0.0
    named = {m for m in dict.fromkeys(line.moves) if legal(m)}
    candidates = len(named & set(analysis.moves)) / max(len(line.moves), len(analysis.moves))
    judged = _judged(line, board)
    if judged:
        evals = evals_credit([v for _, v in judged], [value(m) / 100.0 for m, _ in judged], len(line.moves),
                             single_legal=board.legal_moves.count() == 1)
    else:
        evals = 0.0
    return [fmt, legality, rank, candidates, evals]


def floor_seconds(prompts, completions, settings, engines):
    """The batch's unique engine work, one request after another on one engine, divided by ``engines``."""
    (engine,) = _engines(settings, 1)
    limit = settings.limit()
    try:
        fens = list(dict.fromkeys(parse_policy(p + " M:").fen for p in prompts))
        start = time.perf_counter()
        tops = {fen: {m for m, _ in _analyse(engine, limit, chess.Board(fen))} for fen in fens}
        outside = set()
        for prompt, completion in zip(prompts, completions):
            fen = parse_policy(prompt + " M:").fen
            board = chess.Board(fen)
            outside |= {(fen, m) for m, _ in _judged(parse_policy(" " + completion), board) if m not in tops[fen]}
        for fen, move in outside:
            _search(engine, limit, chess.Board(fen), move)
        elapsed = time.perf_counter() - start
    finally:
        engine.quit()
    return elapsed / engines, len(fens), len(outside)


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
    naive1_t, naive_t, rook_t, floor_t = [], [], [], []
    rookgrpo_score(prompts[:8], completions[:8], settings)  # warm-up (process start, page cache)
    for _ in range(args.repeats):  # interleaved, so machine load affects every scorer alike
        t, naive_values = naive_score(prompts, completions, settings, 1)
        naive1_t.append(t)
        t, naive_values = naive_score(prompts, completions, settings, args.workers)
        naive_t.append(t)
        t, rook_values = rookgrpo_score(prompts, completions, settings)
        rook_t.append(t)
        t, unique_positions, unique_searches = floor_seconds(prompts, completions, settings, args.workers)
        floor_t.append(t)
        mismatches = sum(abs(a - b) > 1e-9 for ra, rb in zip(rook_values, naive_values) for a, b in zip(ra, rb))
        if mismatches:
            raise SystemExit(f"rookgrpo and naive rewards differ in {mismatches} values")
    med = {k: statistics.median(v) for k, v in
           {"naive1": naive1_t, "naive": naive_t, "rook": rook_t, "floor": floor_t}.items()}
    ratio = med["naive"] / med["rook"]

    def row(label, engines, times):
        m = statistics.median(times)
        return f"| {label} | {engines} | {n / m:.1f} | {m:.2f} ({min(times):.2f}-{max(times):.2f}) |"

    table = "\n".join([
        "| scorer | engines | completions/s (median) | seconds per batch (median, min-max) |",
        "| --- | --- | --- | --- |",
        row("naive (engine call per completion)", 1, naive1_t),
        row("naive (engine call per completion)", args.workers, naive_t),
        row("rookgrpo pool + cache (cold cache)", args.workers, rook_t),
        row(f"floor: unique work / engines ({unique_positions} positions, {unique_searches} searches)", args.workers,
            floor_t),
        f"| **speed-up at equal engines** (naive / rookgrpo) | {args.workers} | **{ratio:.1f}x** | |",
        f"| rookgrpo / floor | {args.workers} | {med['rook'] / med['floor']:.2f}x | |",
    ])
    result = {
        "title": f"Chess reward throughput, {args.mix} completions ({args.prompts} prompts x G={args.generations}, "
                 f"depth {args.depth})",
        "description": (
            f"The five policy components the recipes use, for one batch of {n} {args.mix} completions "
            f"(see `make_batch` in the script). The naive scorer gets the same {args.workers} engine processes as "
            "rookgrpo (and one, for reference), so the speed-up is what deduplication and caching buy; the floor is "
            "the batch's unique engine work timed on one engine and divided by the engines. Both scorers return "
            f"identical rewards (checked every repeat). {args.repeats} interleaved repeats after a warm-up."
        ),
        "table": table,
        "command": f"python benchmarks/bench_chess_rewards.py --mix {args.mix} --generations {args.generations} "
                   f"--workers {args.workers} --depth {args.depth} --repeats {args.repeats}",
        "ratio": ratio,
        "ratio_to_floor": med["rook"] / med["floor"],
        "naive_one_engine_seconds": naive1_t,
        "naive_seconds": naive_t,
        "rookgrpo_seconds": rook_t,
        "floor_seconds": floor_t,
        "completions": n,
    }
    return finish(result, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
