"""RookWorld data: load the published layout, and generate new rows with python-chess and Stockfish.

Loading: ``jrahn/rookworld_7m`` (hub) or local text/jsonl/parquet files with one ``text`` column, mixed ``P:`` and
``A:`` rows. Hub ``A:`` rows lack the ``A: `` prefix, which is added here. Each row is split into ``prompt`` and
``completion`` (see :mod:`rookgrpo.chess.formats`), with ``task`` and ``fen`` columns for rewards and sampling.

Generation: positions come from games that mix engine moves (one of the engine's top 3) with random moves, so they
are varied but realistic. ``P:`` rows are labelled with the engine's top 5 moves, their evals and the engine's
actual best move, which fixes the published generator's black-to-move defect. ``A:`` rows replay moves from those
games, plus the special cases the arbiter must get right: illegal moves, checkmate, stalemate, promotion, castling
and en passant. Output is deterministic for a seed, whatever the number of engine workers.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import chess

from ..errors import ConfigError
from .engine import EnginePool, EngineSettings
from .formats import (
    COMPACT,
    PADDED,
    PolicyLine,
    env_step,
    format_eval,
    parse_policy,
    render_env,
    render_policy,
    split_env,
    split_policy,
    task_of,
    update_history,
)

logger = logging.getLogger(__name__)

ROOKWORLD_HUB_ID = "jrahn/rookworld_7m"
A_SHARE = 0.27  # share of A: rows in RookWorld's mix (73% P:)


# --- loading ------------------------------------------------------------------------------------------------------


def normalize_rookworld_text(text: str) -> str:
    """Strip line breaks and add the ``A: `` prefix that hub environment rows lack."""
    text = text.strip("\r\n")
    if task_of(text) is None and text.count("+") >= 6:
        return "A: " + text.lstrip()
    return text


def rookworld_row(text: str) -> dict[str, Any] | None:
    """``{"text", "task", "prompt", "completion", "fen"}`` for one line, or ``None`` when it is no RookWorld row."""
    text = normalize_rookworld_text(text)
    task = task_of(text)
    try:
        if task == "P":
            prompt, completion = split_policy(text)
            fen = prompt[3:].strip()
        elif task == "A":
            prompt, completion = split_env(text)
            fen = prompt[3:].split("+", 1)[0].strip()
        else:
            return None
    except ValueError:
        return None
    return {"text": text, "task": task, "prompt": prompt, "completion": completion, "fen": fen}


def rookworld_format(dataset: Any, prompt_column: str = "prompt", tasks: Sequence[str] | None = None) -> Any:
    """The ``rookworld`` dataset format (a ``text`` column of P:/A: lines; ``tasks`` keeps some of them)."""
    return prepare_rookworld(dataset, tasks)


def prepare_rookworld(dataset: Any, tasks: Sequence[str] | None = None, text_column: str = "text") -> Any:
    """Turn a dataset with a RookWorld ``text`` column into prompt/completion/task/fen rows.

    Rows that are not RookWorld lines are dropped and counted in a warning (the data is not edited in place).
    """
    if text_column not in (dataset.column_names or []):
        raise ConfigError(
            f"dataset: RookWorld data needs a {text_column!r} column with P:/A: lines "
            f"(columns: {', '.join(dataset.column_names or [])})."
        )
    wanted = set(tasks) if tasks else {"P", "A"}
    bad = wanted - {"P", "A"}
    if bad:
        raise ConfigError(f"dataset_tasks: unknown task(s) {sorted(bad)}; use P, A or both.")

    def convert(batch):
        out = {k: [] for k in ("text", "task", "prompt", "completion", "fen")}
        for text in batch[text_column]:
            row = rookworld_row(text) if isinstance(text, str) else None
            if row is not None and row["task"] in wanted:
                for key, value in row.items():
                    out[key].append(value)
        return out

    before = len(dataset) if hasattr(dataset, "__len__") else None
    converted = dataset.map(convert, batched=True, remove_columns=dataset.column_names)
    if before is not None:
        dropped = before - len(converted)
        if dropped:
            logger.warning("RookWorld data: kept %d of %d rows (%d not %s rows or unreadable)",
                           len(converted), before, dropped, "/".join(sorted(wanted)))
    return converted


def position_key(line: str) -> str:
    """The position a RookWorld line is about: a P: line's FEN, an A: line's FEN before the move. Splits keep every
    line of one position together, so no held-out position is ever trained on.

    >>> position_key("P: 8/8/8/8/8/8/8/K6k w - - 0 1 M: a1a2 E: 0.0 B: a1a2")
    '8/8/8/8/8/8/8/K6k w - - 0 1'
    >>> position_key("A: 8/8/8/8/8/8/8/K6k w - - 0 1+a1a2+a1a2+8/8/8/8/8/8/K7/7k b - - 1 1+0.001+0+0")
    '8/8/8/8/8/8/8/K6k w - - 0 1'
    """
    return line[3:].split(" M:")[0].split("+")[0].strip()


def split_by_position(lines: Sequence[str], n_policy: int, n_env: int) -> tuple[list[str], list[str]]:
    """(rest, held) of ``lines``: ``held`` takes whole positions from the end of ``lines`` backwards while they fit
    in ``n_policy`` P: and ``n_env`` A: lines; ``rest`` keeps the others, both in file order.

    >>> lines = ["P: a M: x", "A: a+m+h+b+0+0+0", "P: b M: x", "A: c+m+h+d+0+0+0", "P: e M: x"]
    >>> split_by_position(lines, n_policy=1, n_env=1)
    (['P: a M: x', 'A: a+m+h+b+0+0+0', 'P: b M: x'], ['A: c+m+h+d+0+0+0', 'P: e M: x'])
    """
    by_pos: dict[str, list[int]] = {}
    for i, line in enumerate(lines):
        by_pos.setdefault(position_key(line), []).append(i)
    quota = {"P": n_policy, "A": n_env}
    held: set[int] = set()
    for pos in sorted(by_pos, key=lambda p: -max(by_pos[p])):
        need = {"P": 0, "A": 0}
        for i in by_pos[pos]:
            need["P" if lines[i].startswith("P:") else "A"] += 1
        if all(need[t] <= quota[t] for t in need):
            held.update(by_pos[pos])
            for t in need:
                quota[t] -= need[t]
        if not any(quota.values()):
            break
    return [x for i, x in enumerate(lines) if i not in held], [x for i, x in enumerate(lines) if i in held]


def load_rookworld(name_or_path: str = ROOKWORLD_HUB_ID, split: str = "train", tasks: Sequence[str] | None = None,
                   config_name: str | None = None) -> Any:
    """Load RookWorld-format data (hub id or local file/directory) as prompt/completion rows."""
    from ..data import load_recipe_dataset

    return prepare_rookworld(load_recipe_dataset(name_or_path, config_name, split), tasks)


# --- generation ---------------------------------------------------------------------------------------------------


@dataclass
class GameRecord:
    """A played game: the FEN before each ply and the move played from it."""

    fens: list[str] = field(default_factory=list)
    moves: list[str] = field(default_factory=list)


def play_game(pool: EnginePool, seed: int, random_move_prob: float = 0.35, max_plies: int = 160,
              top_k: int = 3) -> GameRecord:
    """One game mixing random moves (probability ``random_move_prob``) with one of the engine's top ``top_k``."""
    rng = random.Random(seed)
    board = chess.Board()
    record = GameRecord()
    for _ in range(max_plies):
        if board.is_game_over(claim_draw=False):
            break
        legal = [m.uci() for m in board.legal_moves]
        if rng.random() < random_move_prob:
            move = rng.choice(legal)
        else:
            analysis = pool.analyse(board.fen())
            move = rng.choice(list(analysis.moves[:top_k]) or legal)
        record.fens.append(board.fen())
        record.moves.append(move)
        board.push_uci(move)
    return record


def play_games(pool: EnginePool, n_games: int, seed: int, progress: bool = True, **kwargs) -> list[GameRecord]:
    """Play ``n_games`` in parallel over the pool's engines; game ``i`` is seeded by ``(seed, i)``."""
    from tqdm.auto import tqdm

    seeds = [random.Random(f"{seed}-{i}").getrandbits(32) for i in range(n_games)]
    with ThreadPoolExecutor(max_workers=len(pool.slots)) as ex:
        games = list(tqdm(ex.map(lambda s: play_game(pool, s, **kwargs), seeds), total=n_games,
                          desc="playing games", disable=not progress, unit="game"))
    return games


def policy_line(fen: str, analysis, rng: random.Random) -> PolicyLine:
    """A P: row for ``fen``: engine top moves in random order, their evals (pawns, side to move), engine best."""
    order = list(range(len(analysis.moves)))
    rng.shuffle(order)
    moves = [analysis.moves[i] for i in order]
    evals = [analysis.scores[i] / 100.0 for i in order]
    line = PolicyLine.from_values(fen, moves, evals, analysis.best)
    line.eval_texts = [format_eval(e) for e in evals]
    return line


def rank_moves(line: str, layout: str = COMPACT) -> str:
    """``line`` with its M: moves (and their E: evals, in step) in engine rank order; other lines unchanged.

    The B: move comes first, then the rest by eval, best first (ties keep their order; a move whose eval is not a
    number goes last). Random order (what :func:`policy_line` writes, as RookWorld does) spreads each M: slot's
    target evenly over the moves not yet listed; rank order gives every slot one target and makes M[0] the
    engine's best move. Both are valid policy lines: no reward reads the order. A line that does not parse cleanly
    is returned as it was.

    >>> rank_moves("P: 8/8/8/8/8/8/8/K6k w - - 0 1 M: a1b1 a1a2 a1b2 E: 0.0 0.1 -0.2 B: a1a2")
    'P: 8/8/8/8/8/8/8/K6k w - - 0 1 M: a1a2 a1b1 a1b2 E: 0.1 0.0 -0.2 B: a1a2'
    >>> rank_moves("A: not a policy line")
    'A: not a policy line'
    """
    if task_of(line) != "P":
        return line
    parsed = parse_policy(line)
    if not parsed.ok:
        return line
    evals = parsed.evals
    order = sorted(range(len(parsed.moves)),
                   key=lambda i: (parsed.moves[i] != parsed.best, evals[i] is None,
                                  -(evals[i] if evals[i] is not None else 0.0)))
    parsed.moves = [parsed.moves[i] for i in order]
    parsed.eval_texts = [parsed.eval_texts[i] for i in order]
    return render_policy(parsed, layout)


# Positions that guarantee each special A: case exists even in small samples: (fen, move, kind).
SPECIAL_TEMPLATES = [
    ("r3k2r/pppq1ppp/2npbn2/2b1p3/2B1P3/2NPBN2/PPPQ1PPP/R3K2R w KQkq - 4 8", "e1g1", "castling"),
    ("r3k2r/pppq1ppp/2npbn2/2b1p3/2B1P3/2NPBN2/PPPQ1PPP/R3K2R w KQkq - 4 8", "e1c1", "castling"),
    ("r3k2r/pppq1ppp/2npbn2/2b1p3/2B1P3/2NPBN2/PPPQ1PPP/R4RK1 b kq - 5 8", "e8g8", "castling"),
    ("r3k2r/pppq1ppp/2npbn2/2b1p3/2B1P3/2NPBN2/PPPQ1PPP/R4RK1 b kq - 5 8", "e8c8", "castling"),
    ("rnbqkbnr/ppp1p1pp/8/3pPp2/8/8/PPPP1PPP/RNBQKBNR w KQkq f6 0 3", "e5f6", "en_passant"),
    ("rnbqkbnr/pppp1ppp/8/8/3Pp3/4P3/PPP2PPP/RNBQKBNR b KQkq d3 0 3", "e4d3", "en_passant"),
    ("8/P6k/8/8/8/8/6K1/8 w - - 0 1", "a7a8q", "promotion"),
    ("8/P6k/8/8/8/8/6K1/8 w - - 0 1", "a7a8n", "promotion"),
    ("8/6K1/8/8/8/8/p6k/8 b - - 0 1", "a2a1r", "promotion"),
    ("7k/8/6K1/8/8/8/8/1Q6 w - - 0 1", "b1b8", "checkmate"),
    ("rnbqkbnr/pppp1ppp/8/4p3/6P1/5P2/PPPPP2P/RNBQKBNR b KQkq g3 0 2", "d8h4", "checkmate"),
    ("7k/8/5K2/8/8/8/8/6Q1 w - - 0 1", "g1g6", "stalemate"),
    ("k7/8/2K5/8/8/8/8/1R6 w - - 0 1", "b1b7", "stalemate"),
]


def classify_move(board: chess.Board, move: chess.Move) -> str:
    """``castling``, ``en_passant``, ``promotion``, ``checkmate``, ``stalemate`` or ``move``."""
    if board.is_castling(move):
        return "castling"
    if board.is_en_passant(move):
        return "en_passant"
    after = board.copy(stack=False)
    after.push(move)
    if after.is_checkmate():
        return "checkmate"
    if after.is_stalemate():
        return "stalemate"
    if move.promotion:
        return "promotion"
    return "move"


def illegal_move(board: chess.Board, rng: random.Random) -> str:
    """A well-formed UCI move that is illegal here: one of the mover's pieces to a square it cannot reach."""
    legal = {m.uci() for m in board.legal_moves}
    own = sorted(board.pieces(chess.PAWN, board.turn) | board.pieces(chess.KNIGHT, board.turn)
                 | board.pieces(chess.BISHOP, board.turn) | board.pieces(chess.ROOK, board.turn)
                 | board.pieces(chess.QUEEN, board.turn) | board.pieces(chess.KING, board.turn))
    for _ in range(200):
        frm = rng.choice(own) if own and rng.random() < 0.8 else rng.randrange(64)
        to = rng.randrange(64)
        uci = chess.square_name(frm) + chess.square_name(to)
        if frm != to and uci not in legal:
            return uci
    return "a1h8"  # unreachable in practice: 200 random tries always find an illegal move


def env_rows_from_games(games: Sequence[GameRecord], n: int, rng: random.Random, illegal_share: float = 0.1,
                        special_share: float = 0.3) -> list[str]:
    """``n`` A: lines: moves replayed from ``games`` (with their history), illegal moves, and special cases.

    About ``special_share`` of the rows are special moves (castling, en passant, promotion, checkmate, stalemate)
    taken from the games, topped up from :data:`SPECIAL_TEMPLATES` so every kind appears.
    """
    ordinary, special = [], {k: [] for k in ("castling", "en_passant", "promotion", "checkmate", "stalemate")}
    for game in games:
        history = ""
        for fen, move in zip(game.fens, game.moves):
            history = update_history(history, move)
            board = chess.Board(fen)
            kind = classify_move(board, chess.Move.from_uci(move))
            (special[kind] if kind in special else ordinary).append((fen, move, history))
    for fen, move, kind in SPECIAL_TEMPLATES:
        if kind in special:
            special[kind].append((fen, move, move))
    n_illegal = round(n * illegal_share)
    n_special = round(n * special_share)
    rows: list[tuple[str, str, str]] = []
    kinds = [k for k in special if special[k]]
    for i in range(n_special):  # round-robin over kinds so each appears
        pool_ = special[kinds[i % len(kinds)]]
        rows.append(pool_[rng.randrange(len(pool_))])
    for _ in range(n_illegal):
        fen, _, history = ordinary[rng.randrange(len(ordinary))]
        move = illegal_move(chess.Board(fen), rng)
        rows.append((fen, move, update_history(" ".join(history.split()[:-1]), move)))
    while len(rows) < n:
        rows.append(ordinary[rng.randrange(len(ordinary))])
    rng.shuffle(rows)
    return [render_env(env_step(fen, move, history)) for fen, move, history in rows[:n]]


def generate(n: int, tasks: Sequence[str] = ("P", "A"), seed: int = 0, settings: EngineSettings | None = None,
             layout: str = PADDED, a_share: float = A_SHARE, random_move_prob: float = 0.35,
             play_depth: int = 4, max_plies: int = 160, progress: bool = True,
             n_games: int | None = None) -> list[str]:
    """Generate ``n`` RookWorld lines (P: and/or A:), deterministic for ``seed``.

    ``settings`` labels the P: rows (depth/nodes); games are played with a cheaper ``play_depth`` search.
    ``max_plies`` stops each game early: a small value (e.g. 24) keeps every position in the opening, which a small
    model can learn to play legally from far less data than the whole game. ``n_games`` overrides how many games
    are played (by default about one per 10 rows): A: rows are sampled from the games' moves, so a large A: share
    needs no more games than its P: rows do, and playing fewer saves most of the engine time.
    """
    from tqdm.auto import tqdm

    tasks = [t.strip().upper() for t in tasks]
    if not tasks or set(tasks) - {"P", "A"}:
        raise ConfigError(f"tasks: expected P, A or both, got {tasks!r}.")
    if layout not in (PADDED, COMPACT):
        raise ConfigError(f"layout: expected {PADDED!r} or {COMPACT!r}, got {layout!r}.")
    if max_plies < 6:
        raise ConfigError(f"max_plies: P: positions start at ply 4, so games need at least 6 plies; got {max_plies}.")
    settings = settings or EngineSettings()
    n_a = (round(n * a_share) if "P" in tasks else n) if "A" in tasks else 0
    n_p = n - n_a
    rng = random.Random(seed)
    play_settings = EngineSettings(path=settings.path, depth=play_depth, nodes=None, multipv=3,
                                   workers=settings.workers, timeout=settings.timeout)
    # Each game yields ~10 sampled P: positions and replays (fewer when games are cut short); play enough for variety.
    per_game = min(10, max(1, (max_plies - 4) // 3))
    if n_games is not None and n_games < 1:
        raise ConfigError(f"n_games: expected at least 1, got {n_games}.")
    n_games = n_games or max(4, (n_p + n_a) // per_game + 1)
    with EnginePool(play_settings) as play_pool:
        games = play_games(play_pool, n_games, seed, progress=progress, random_move_prob=random_move_prob,
                           max_plies=max_plies)
    lines: list[str] = []
    if n_p:
        candidates = [fen for game in games for ply, fen in enumerate(game.fens) if ply >= 4]
        candidates = list(dict.fromkeys(candidates))
        rng.shuffle(candidates)
        if len(candidates) < n_p:
            raise ConfigError(f"n: only {len(candidates)} distinct positions from {n_games} games; lower n "
                              f"or raise max_plies ({max_plies}).")
        fens = candidates[:n_p]
        with EnginePool(settings) as pool:
            analyses = []
            bar = tqdm(total=len(fens), desc="labelling P: positions", disable=not progress, unit="pos")
            for chunk in _chunks(fens, 64):
                analyses += pool.analyse_many(chunk)
                bar.update(len(chunk))
            bar.close()
        for fen, analysis in zip(fens, analyses):
            lines.append(render_policy(policy_line(fen, analysis, rng), layout))
    if n_a:
        lines += env_rows_from_games(games, n_a, rng)
    rng.shuffle(lines)
    return lines


def _chunks(items: Sequence, size: int) -> Iterator[Sequence]:
    for i in range(0, len(items), size):
        yield items[i: i + size]


def write_lines(lines: Sequence[str], path: str) -> None:
    """Write lines as RookWorld text (``.txt``) or as ``{"text": ...}`` rows (``.jsonl``)."""
    import json
    from pathlib import Path

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".jsonl":
        out.write_text("".join(json.dumps({"text": line}) + "\n" for line in lines))
    else:
        out.write_text("".join(line + "\n" for line in lines))
