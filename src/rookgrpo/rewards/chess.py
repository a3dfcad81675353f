"""Chess rewards for the two RookWorld tasks, in TRL's reward signature.

Policy task (``P:`` rows), one reward per component so TRL logs each as ``rewards/<name>/mean`` and a recipe can
weight or swap it:

- ``chess_format``: the M:, E: and B: fields are present and well-formed;
- ``chess_legality``: share of the M: moves and the B: move that are legal;
- ``chess_best_move``: quality of the B: move measured with Stockfish (Lichess move accuracy from win-probability
  loss): the engine's best move earns 1.0, a move 5 centipawns worse about 0.98, a blunder little;
- ``chess_candidates``: how many of the engine's top moves the M: list names;
- ``chess_evals``: closeness of each E: eval to the engine's eval of its move.

Environment task (``A:`` rows): ``chess_env`` compares the completion with python-chess's ground truth.

Each returns ``None`` for rows of the other task (so one mixed dataset trains both), and the floor (0.0) for
malformed or illegal output; none of them raises on model text. Policy rewards share one Stockfish pool and cache
per process (see :mod:`rookgrpo.chess.engine`), so five components cost one analysis per unique position.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import chess

from ..chess.engine import EngineSettings, find_stockfish, get_pool
from ..chess.formats import (
    PolicyLine,
    board_from_fen,
    env_step,
    is_legal,
    parse_env,
    parse_env_completion,
    parse_policy,
    task_of,
)
from .registry import register_reward
from .utils import completion_text

logger = logging.getLogger(__name__)

EVAL_CAP_PAWNS = 10.0  # mates (±999.xx pawns) and huge evals compare as ±10 pawns


# --- scoring helpers ---------------------------------------------------------------------------------------------


def win_percent(cp: float) -> float:
    """Lichess win probability (0-100) for the side to move, from centipawns.

    Unlike Lichess's game-review accuracy we do not clamp at ±1000 cp: a clamp makes every winning move in a won
    position score 1.0, so a mate in one would earn no more than a quiet move. Unclamped, mates (±99999 cp) still
    map to 100/0 and any mating move earns full credit, while a merely winning move earns slightly less.
    """
    cp = float(cp)
    if abs(cp) > 20_000:
        return 100.0 if cp > 0 else 0.0
    return 50.0 + 50.0 * (2.0 / (1.0 + math.exp(-0.00368208 * cp)) - 1.0)


def move_accuracy(best_cp: float, move_cp: float) -> float:
    """Lichess move accuracy in [0, 1] from the win-probability loss of playing ``move`` instead of the best move.

    >>> move_accuracy(30, 30), round(move_accuracy(30, 25), 3), round(move_accuracy(30, -870), 3)
    (1.0, 0.98, 0.091)
    """
    loss = win_percent(best_cp) - win_percent(move_cp)
    if loss <= 0:
        return 1.0
    raw = 103.1668100711649 * math.exp(-0.04354415386753951 * loss) - 3.166924740191411
    return max(0.0, min(1.0, raw / 99.99988533))  # normalised so a zero loss is exactly 1.0


def eval_closeness(predicted_pawns: float, engine_pawns: float) -> float:
    """1 / (1 + |error|) on evals capped at ±10 pawns: exact 1.0, off by one pawn 0.5, by three 0.25."""
    cap = lambda x: max(-EVAL_CAP_PAWNS, min(EVAL_CAP_PAWNS, x))  # noqa: E731
    return 1.0 / (1.0 + abs(cap(predicted_pawns) - cap(engine_pawns)))


# --- policy task -------------------------------------------------------------------------------------------------


@dataclass
class _PolicyRow:
    fen: str
    board: chess.Board | None
    line: PolicyLine


def _policy_rows(prompts: Sequence[Any], completions: Sequence[Any]) -> list[_PolicyRow | None]:
    """Parse each (prompt, completion); ``None`` for rows that are not policy-task rows.

    A completion is read up to its first newline: RookWorld lines are single lines, so text after one is not part
    of the answer.
    """
    rows: list[_PolicyRow | None] = []
    for prompt, completion in zip(prompts, completions, strict=True):
        prompt = completion_text(prompt)
        if task_of(prompt) != "P":
            rows.append(None)
            continue
        fen = parse_policy(prompt + " M:").fen  # the prompt ends before M:
        text = completion_text(completion).split("\n", 1)[0]
        rows.append(_PolicyRow(fen=fen, board=board_from_fen(fen), line=parse_policy(" " + text)))
    return rows


class ChessReward:
    """Base of the chess rewards: a named, picklable callable in TRL's signature with engine settings.

    ``setup(args)`` is called by :class:`~rookgrpo.RookGRPOTrainer` before training: it returns a copy configured from
    the trainer config (``stockfish_*`` fields) and fails early, with the fix, when Stockfish is missing.
    """

    name = "chess_reward"
    needs_engine = True

    def __init__(self, engine: EngineSettings | None = None):
        self.engine = engine or EngineSettings()
        self.__name__ = self.name  # TRL logs rewards/<__name__>/mean

    def setup(self, args: Any) -> ChessReward:
        settings = dataclasses.replace(
            self.engine,
            **{key: getattr(args, f"stockfish_{key}") for key in ("path", "depth", "nodes", "workers")
               if hasattr(args, f"stockfish_{key}")},
        )
        if self.needs_engine:
            find_stockfish(settings.path)
        return type(self)(settings)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.engine})"

    def __call__(self, prompts, completions, **kwargs) -> list[float | None]:
        raise NotImplementedError

    def _log(self, kwargs: dict, pool) -> None:
        log_metric = kwargs.get("log_metric")
        if callable(log_metric) and pool is not None:
            stats = pool.stats
            log_metric("stockfish/cache_hit_rate", stats.cache_hits / max(1, stats.requests))
            log_metric("stockfish/restarts", float(stats.restarts))


class ChessFormat(ChessReward):
    """Share of the M:, E: and B: fields that are present and well-formed. Range [0, 1] in steps of 1/3.

    M: is 1-5 distinct UCI moves, E: one number per move, B: one UCI move. Legality is not checked here.

    Example:
        >>> r = ChessFormat()
        >>> p = "P: 8/8/8/8/8/8/8/K6k w - - 0 1"
        >>> r([p] * 3, [" M: a1a2 a1b1 E: 0.0 0.1 B: a1a2", " M: a1a2 E: x B: a1a2", "garbage"])
        [1.0, 0.6666666666666666, 0.0]
    """

    name = "chess_format"
    needs_engine = False

    def __call__(self, prompts, completions, **kwargs):
        out = []
        for row in _policy_rows(prompts, completions):
            if row is None:
                out.append(None)
                continue
            bad = {e[0] for e in row.line.errors if e[:2] in ("M:", "E:", "B:")}
            out.append((3 - len(bad)) / 3)
        return out


class ChessLegality(ChessReward):
    """Share of the proposed moves (every M: move and the B: move) that are legal in the position. Range [0, 1].

    Example:
        >>> r = ChessLegality()
        >>> p = "P: 8/8/8/8/8/8/8/K6k w - - 0 1"
        >>> r([p] * 2, [" M: a1a2 a1b1 E: 0 0 B: a1a2", " M: a1a3 E: 0 B: a1a2"])
        [1.0, 0.5]
    """

    name = "chess_legality"
    needs_engine = False

    def __call__(self, prompts, completions, **kwargs):
        out = []
        for row in _policy_rows(prompts, completions):
            if row is None:
                out.append(None)
                continue
            proposed = row.line.moves + ([row.line.best] if row.line.best else [])
            out.append(sum(is_legal(row.board, m) for m in proposed) / len(proposed) if proposed else 0.0)
        return out


class ChessBestMove(ChessReward):
    """Quality of the B: move: Lichess move accuracy of its win-probability loss against the engine's best move.

    Range [0, 1]. The engine's best move earns 1.0; a move 5 centipawns worse earns about 0.98; one that drops a
    piece earns about 0.1-0.3; an illegal, missing or malformed move earns 0. Moves outside the engine's top 5 are
    searched once per (position, move) and never scored above the 5th-best move.

    Example (depth-limited Stockfish, so exact numbers depend on the engine): b1b8 mates, b1d1 keeps a won
    position, g6f7 stalemates (a draw from a won position), h8h7 moves the opponent's king (illegal):
        >>> r = ChessBestMove(EngineSettings(depth=6, workers=1))
        >>> p = "P: 7k/8/6K1/8/8/8/8/1Q6 w - - 0 1"
        >>> completions = [" M: b1b8 E: 999.99 B: b1b8", " M: b1d1 E: 8 B: b1d1", " M: g6f7 E: 0 B: g6f7", " B: h8h7"]
        >>> [round(x, 2) for x in r([p] * 4, completions)]
        [1.0, 0.81, 0.09, 0.0]
    """

    name = "chess_best_move"

    def __call__(self, prompts, completions, **kwargs):
        rows = _policy_rows(prompts, completions)
        scored = [r for r in rows if r is not None and r.board is not None and is_legal(r.board, r.line.best)]
        pool = get_pool(self.engine) if scored else None
        values = {}
        if scored:
            analyses = pool.analyse_many([r.fen for r in scored])
            move_cps = pool.move_scores([(r.fen, r.line.best) for r in scored])
            for r, analysis, cp in zip(scored, analyses, move_cps):
                values[id(r)] = move_accuracy(analysis.scores[0], cp) if analysis.scores and cp is not None else 0.0
        self._log(kwargs, pool)
        return [None if r is None else values.get(id(r), 0.0) for r in rows]


class ChessCandidates(ChessReward):
    """Share of the engine's top moves (up to 5) that the M: list names. Range [0, 1].

    Illegal and repeated moves count nothing. With fewer than 5 legal moves in the position the target is all of
    them.

    Example:
        >>> r = ChessCandidates(EngineSettings(depth=6, workers=1))
        >>> p = "P: 7k/8/8/8/8/8/P7/K7 w - - 0 1"  # four legal moves: all of them are the target
        >>> r([p] * 2, [" M: a2a3 a2a4 a1b1 E: 0 0 0 B: a2a4", " M: a2a3 a2a3 h8h7 E: 0 0 0 B: a2a3"])
        [0.75, 0.25]
    """

    name = "chess_candidates"

    def __call__(self, prompts, completions, **kwargs):
        rows = _policy_rows(prompts, completions)
        live = [r for r in rows if r is not None and r.board is not None]
        pool = get_pool(self.engine) if live else None
        values = {}
        if live:
            for r, analysis in zip(live, pool.analyse_many([r.fen for r in live])):
                top = set(analysis.moves)
                named = {m for m in row_moves(r) if is_legal(r.board, m)}
                values[id(r)] = len(named & top) / len(top) if top else 0.0
        self._log(kwargs, pool)
        return [None if r is None else values.get(id(r), 0.0) for r in rows]


def row_moves(row: _PolicyRow) -> list[str]:
    return list(dict.fromkeys(row.line.moves))


class ChessEvals(ChessReward):
    """Mean closeness of each E: eval to the engine's eval of its M: move: ``1 / (1 + |error in pawns|)``.

    Range [0, 1]. Evals are compared capped at ±10 pawns (so any mate score matches a mate). A move that is illegal,
    or has no parseable eval, scores 0 for its slot; the mean is over the M: moves.

    Example:
        >>> r = ChessEvals(EngineSettings(depth=6, workers=1))
        >>> p = "P: 7k/8/6K1/8/8/8/8/1Q6 w - - 0 1"
        >>> r([p] * 2, [" M: b1b8 E: 999.99 B: b1b8", " M: a1a8 E: x B: a1a8"])
        [1.0, 0.0]
    """

    name = "chess_evals"

    def __call__(self, prompts, completions, **kwargs):
        rows = _policy_rows(prompts, completions)
        pairs, owners = [], []
        for r in rows:
            if r is None or r.board is None:
                continue
            for i, (move, value) in enumerate(zip(r.line.moves, r.line.evals)):
                if value is not None and is_legal(r.board, move):
                    pairs.append((r.fen, move))
                    owners.append((id(r), value))
        pool = get_pool(self.engine) if pairs else None
        totals: dict[int, float] = {}
        if pairs:
            for (owner, predicted), cp in zip(owners, pool.move_scores(pairs)):
                if cp is not None:
                    totals[owner] = totals.get(owner, 0.0) + eval_closeness(predicted, cp / 100.0)
        self._log(kwargs, pool)
        return [None if r is None else totals.get(id(r), 0.0) / max(1, len(r.line.moves)) for r in rows]


# --- environment task --------------------------------------------------------------------------------------------

# Partial credit by field; the weights sum to 1 and partial credit is scaled to at most PARTIAL_MAX, so only an
# exact completion earns 1.0.
ENV_FIELD_WEIGHTS = {
    "board": 0.40, "side": 0.10, "castling": 0.10, "en_passant": 0.10, "clocks": 0.10, "reward": 0.10, "flags": 0.10,
}
PARTIAL_MAX = 0.9


def _squares(placement: str) -> list[str]:
    """Expand a FEN piece placement to 64 square symbols ('.' empty), leniently; pads or cuts to 64."""
    squares: list[str] = []
    for ch in placement.replace("/", ""):
        squares.extend("." * int(ch) if ch in "123456789" else ch)  # not isdigit(): "²" is a digit too
    return (squares + ["?"] * 64)[:64]


def env_field_scores(expected: str, predicted: str) -> dict[str, float]:
    """Per-field agreement (0..1) between an expected and a predicted ``A:`` completion."""
    exp, got = parse_env_completion(expected), parse_env_completion(predicted)
    e_fen, g_fen = exp.new_fen.split(), got.new_fen.split()
    field_at = lambda parts, i: parts[i] if len(parts) > i else None  # noqa: E731
    board = sum(a == b for a, b in zip(_squares(e_fen[0]), _squares(g_fen[0]) if g_fen else ["?"] * 64)) / 64
    clocks = (field_at(e_fen, 4) == field_at(g_fen, 4)) / 2 + (field_at(e_fen, 5) == field_at(g_fen, 5)) / 2
    return {
        "board": board,
        "side": float(field_at(e_fen, 1) == field_at(g_fen, 1)),
        "castling": float(field_at(e_fen, 2) == field_at(g_fen, 2)),
        "en_passant": float(field_at(e_fen, 3) == field_at(g_fen, 3)),
        "clocks": clocks,
        "reward": float(_same_number(exp.reward, got.reward)),
        "flags": (exp.terminated == got.terminated) / 2 + (exp.truncated == got.truncated) / 2,
    }


def _same_number(a: str, b: str) -> bool:
    try:
        return float(a) == float(b)
    except ValueError:
        return False


class ChessEnv(ChessReward):
    """Environment task: 1.0 for the exact ground-truth completion, else partial credit by field (at most 0.9).

    The ground truth is :func:`rookgrpo.chess.formats.env_step` on the prompt's FEN, move and history. Fields:
    board (share of the 64 squares right), side to move, castling, en passant, clocks, reward, flags. A prompt with
    an unreadable FEN cannot be judged and earns the floor like its completions.

    Example:
        >>> r = ChessEnv()
        >>> p = "A: 7k/8/6K1/8/8/8/8/1Q6 w - - 0 1+b1b8+b1b8+"
        >>> r([p] * 3, ["1Q5k/8/6K1/8/8/8/8/8 b - - 1 1+1.0+1+0", "1Q5k/8/6K1/8/8/8/8/8 b - - 1 1+0.001+0+0", "junk"])
        [1.0, 0.765, 0.0]
    """

    name = "chess_env"
    needs_engine = False

    def __call__(self, prompts, completions, **kwargs):
        out = []
        for prompt, completion in zip(prompts, completions, strict=True):
            prompt = completion_text(prompt)
            if task_of(prompt) != "A":
                out.append(None)
                continue
            fields = parse_env(prompt)
            if board_from_fen(fields.fen) is None:
                out.append(0.0)
                continue
            expected = env_step(fields.fen, fields.move, fields.history).completion()
            text = completion_text(completion).split("\n", 1)[0].strip()
            if text == expected:
                out.append(1.0)
                continue
            scores = env_field_scores(expected, text)
            partial = sum(ENV_FIELD_WEIGHTS[k] * v for k, v in scores.items())
            out.append(round(PARTIAL_MAX * partial, 6) if "+" in text else 0.0)
        return out


chess_format = register_reward("chess_format")(ChessFormat())
chess_legality = register_reward("chess_legality")(ChessLegality())
chess_best_move = register_reward("chess_best_move")(ChessBestMove())
chess_candidates = register_reward("chess_candidates")(ChessCandidates())
chess_evals = register_reward("chess_evals")(ChessEvals())
chess_env = register_reward("chess_env")(ChessEnv())

POLICY_REWARDS = ("chess_format", "chess_legality", "chess_best_move", "chess_candidates", "chess_evals")
