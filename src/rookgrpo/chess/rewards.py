"""Chess rewards for the two RookWorld tasks, in TRL's reward signature.

Policy task (``P:`` rows), one reward per component so TRL logs each as ``rewards/<name>/mean`` and a recipe can
weight or swap it:

- ``chess_format``: the M:, E: and B: fields are present and well-formed;
- ``chess_legality``: share of the M: moves and the B: move that are legal;
- ``chess_move_rank``: quality of the B: move against the position's alternatives: the engine's rank of the move
  among its top 5 (1, .8, .6, .4, .2), discounted by the move's win-probability loss; any other move earns 0. What
  the recipes train on;
- ``chess_best_move``: the older absolute scale (Lichess move accuracy from win-probability loss). Kept under its
  name, but it pays generic moves: a random legal move keeps about half the best move's credit in quiet positions;
- ``chess_candidates``: overlap of the M: list with the engine's top 5, as min(precision, recall), so listing many
  moves cannot pay;
- ``chess_evals``: whether the E: evals separate the listed moves as the engine does, and sit at its level: constant
  evals earn 0.

Environment task (``A:`` rows): ``chess_env`` compares the completion with python-chess's ground truth, with partial
credit gated on making the change the move makes, so copying the input position earns nothing; ``chess_env_board``
is a penalty only (-1 for an answer whose placement is not a board, else 0) that ranks a broken board below a copy.

``rookgrpo rewards audit RECIPE`` prints what fixed degenerate answers (constant moves, exhaustive lists, copies)
earn under a recipe's rewards and weights; ``docs/rewards.md`` has the tables.

Each returns ``None`` for rows of the other task (so one mixed dataset trains both), and the floor (0.0) for
malformed or illegal output; none of them raises on model text. Policy rewards share one Stockfish pool and cache
per process (see :mod:`rookgrpo.chess.engine`), so five components cost one analysis per unique position.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import chess

from ..chess.engine import EngineSettings, find_stockfish, get_pool
from ..chess.formats import (
    MAX_MOVES,
    PolicyLine,
    board_from_fen,
    env_step,
    is_legal,
    parse_env,
    parse_env_completion,
    parse_policy,
    scored_errors,
    task_of,
)
from ..rewards.registry import register_reward
from ..rewards.utils import completion_text

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

    ``format_gate`` (the ``P:`` components but ``chess_format``; on by default): a ``P:`` answer whose M:, E: or B:
    field is not well-formed (:func:`~rookgrpo.chess.formats.scored_errors`: an E: list longer or shorter than M:, an
    eval that is not a number, a repeated or sixth M: move, a missing B:) earns the component's floor, 0, whatever its
    moves are worth, so such an answer keeps only ``chess_format``'s partial credit and earns less than the engine's
    second-best move written well (docs/rewards.md). ``format_gate: false`` scores what each component can read of
    the line, for ablations: there an answer with one eval too many kept 98% of the reference's weighted reward, and
    GRPO added such answers (docs/experiments/2026-12-01-format-gate-grid-plan.md). In a recipe:
    ``- {name: chess_move_rank, format_gate: false}``.

    """

    name = "chess_reward"
    needs_engine = True

    def __init__(self, engine: EngineSettings | None = None, format_gate: bool = True):
        self.engine = engine or EngineSettings()
        self.format_gate = bool(format_gate)
        self.__name__ = self.name  # TRL logs rewards/<__name__>/mean

    def setup(self, args: Any) -> ChessReward:
        settings = self.engine.with_args(args)
        if self.needs_engine:
            find_stockfish(settings.path)
        return type(self)(settings, format_gate=self.format_gate)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.engine}{'' if self.format_gate else ', format_gate=False'})"

    def _open(self, row: _PolicyRow) -> bool:
        """Whether a ``P:`` row is scored: with ``format_gate`` (the default) only a well-formed answer, else always."""
        return not self.format_gate or not scored_errors(row.line)

    def __call__(self, prompts, completions, **kwargs) -> list[float | None]:
        raise NotImplementedError

    def _score_legal_best(self, prompts, completions, kwargs, score) -> list[float | None]:
        """Per completion: ``None`` for the other task's rows, 0 for a missing, illegal or malformed B:, else the
        value ``score(pool, rows)`` gives each row whose B: is legal (one call for the whole batch)."""
        rows = _policy_rows(prompts, completions)
        scored = [r for r in rows if r is not None and r.board is not None and self._open(r)
                  and is_legal(r.board, r.line.best)]
        pool = get_pool(self.engine) if scored else None
        values = dict(zip(map(id, scored), score(pool, scored))) if scored else {}
        self._log(kwargs, pool)
        return [None if r is None else values.get(id(r), 0.0) for r in rows]

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
            bad = {e[0] for e in scored_errors(row.line)}
            out.append((3 - len(bad)) / 3)
        return out


class ChessLegality(ChessReward):
    """Share of the proposed moves (every M: move and the B: move) that are legal in the position. Range [0, 1].

    An M: move counts once: a repeat is listed (it stays in the denominator) but earns no legality again. Otherwise
    ``M: g1f3 g1f3 g1f3 g1f3 g1f3`` earns full legality, while a model that lists five distinct moves, two of them
    illegal, earns 0.67, and a model that half knows the rules is paid to repeat its one safe move. Under that rule
    GRPO drove the own-list models' greedy M: lists back to repeats; paying a repeat once, much less (README.md).

    Example (the third answer repeats a legal move, which the format gate charges in full; with the gate off it
    earns 1 legal M: move of 3 listed, and a legal B:; the fourth has one eval too many):
        >>> r = ChessLegality()
        >>> p = "P: 8/8/8/8/8/8/8/K6k w - - 0 1"
        >>> repeated, long_e = " M: a1a2 a1a2 a1a2 E: 0 0 0 B: a1a2", " M: a1a2 E: 0 0 B: a1a2"
        >>> r([p] * 4, [" M: a1a2 a1b1 E: 0 0 B: a1a2", " M: a1a3 E: 0 B: a1a2", repeated, long_e])
        [1.0, 0.5, 0.0, 0.0]
        >>> ChessLegality(format_gate=False)([p] * 2, [repeated, long_e])
        [0.5, 1.0]
    """

    name = "chess_legality"
    needs_engine = False

    def __call__(self, prompts, completions, **kwargs):
        out = []
        for row in _policy_rows(prompts, completions):
            if row is None:
                out.append(None)
                continue
            if not self._open(row):
                out.append(0.0)
                continue
            moves, best = row.line.moves, [row.line.best] if row.line.best else []
            n = len(moves) + len(best)
            legal = sum(is_legal(row.board, m) for m in [*dict.fromkeys(moves), *best])
            out.append(legal / n if n else 0.0)
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
        def score(pool, rows):
            analyses = pool.analyse_many([r.fen for r in rows])
            move_cps = pool.move_scores([(r.fen, r.line.best) for r in rows])
            return [move_accuracy(a.scores[0], cp) if a.scores and cp is not None else 0.0
                    for a, cp in zip(analyses, move_cps)]

        return self._score_legal_best(prompts, completions, kwargs, score)


def rank_credit(analysis, move: str, move_cp: int | None = None) -> float:
    """Credit of ``move`` by its standing among the engine's top moves: ``(1 - k/K) * accuracy``. Range [0, 1].

    ``K`` is the number of moves analysed (multipv, 5), ``k`` the number of them that score strictly better than
    ``move`` (ties share a rank), and ``accuracy`` is :func:`move_accuracy` of the move's win-probability loss
    against the best, so a top-5 move that blunders (a position with one good move) earns little. A move outside
    the top ``K`` earns 0: it is no better than the engine's K-th move, whatever it is.

    >>> from rookgrpo.chess.engine import Analysis
    >>> a = Analysis("fen", ("e2e4", "d2d4", "g1f3", "c2c4", "b1c3"), (35, 35, 30, 25, -300))
    >>> [round(rank_credit(a, m), 2) for m in ("e2e4", "d2d4", "g1f3", "c2c4", "b1c3", "a2a3")]
    [1.0, 1.0, 0.59, 0.38, 0.05, 0.0]
    """
    if not analysis.scores or move not in analysis.moves:
        return 0.0
    score = analysis.score_of(move) if move_cp is None else move_cp
    better = sum(s > score for s in analysis.scores)
    return (1.0 - better / len(analysis.scores)) * move_accuracy(analysis.scores[0], score)


class ChessMoveRank(ChessReward):
    """Quality of the B: move against the position's alternatives: rank among the engine's top 5, times accuracy.

    Range [0, 1]. Formula (:func:`rank_credit`): ``(1 - k/5) * move_accuracy(best_cp, move_cp)`` for a move in the
    engine's multipv-5 list, where ``k`` moves score strictly better; 0 for any other move, illegal, missing or
    malformed B:. So the engine's best earns 1.0 and its 2nd..5th about 0.8, 0.6, 0.4, 0.2 when they are close in
    value, less when they lose ground; a generic legal move outside the top 5 earns nothing here (legality is paid by
    ``chess_legality``). Why ranks and not an absolute scale: on a win-probability scale every quiet opening move is
    nearly as good as the best (a random legal move kept about half the best move's credit under
    ``chess_best_move``), and GRPO then learns generic moves. Needs one multipv analysis per unique position and no
    extra search.

    Example (depth-limited Stockfish, so exact numbers depend on the engine): b1b8 mates; b1d1 and g6f7 are legal
    but not in the top 5 of this won position; h8h7 moves the opponent's king:
        >>> r = ChessMoveRank(EngineSettings(depth=6, workers=1))
        >>> p = "P: 7k/8/6K1/8/8/8/8/1Q6 w - - 0 1"
        >>> r([p] * 4, [" M: b1b8 E: 999.99 B: b1b8", " B: b1d1", " B: g6f7", " B: h8h7"])
        [1.0, 0.0, 0.0, 0.0]
    """

    name = "chess_move_rank"

    def __call__(self, prompts, completions, **kwargs):
        def score(pool, rows):
            return [rank_credit(a, r.line.best) for r, a in zip(rows, pool.analyse_many([r.fen for r in rows]))]

        return self._score_legal_best(prompts, completions, kwargs, score)


class ChessCandidates(ChessReward):
    """Overlap of the M: list with the engine's top moves (up to 5), as min(precision, recall). Range [0, 1].

    ``|listed legal moves ∩ top| / max(len(M:), len(top))``: every listed item counts in the length, so illegal,
    repeated and extra moves cost, and naming every legal move earns about 5 / (number of legal moves). With fewer
    than 5 legal moves in the position the target is all of them.

    Example:
        >>> r = ChessCandidates(EngineSettings(depth=6, workers=1))
        >>> p = "P: 7k/8/8/8/8/8/P7/K7 w - - 0 1"  # four legal moves: all of them are the target
        >>> answers = [" M: a2a3 a2a4 a1b1 E: 0 0 0 B: a2a4", " M: a2a3 a2a3 h8h7 E: 0 0 0 B: a2a3"]
        >>> r([p] * 2, answers)  # the second repeats a move: ill-formed, charged in full by the format gate
        [0.75, 0.0]
        >>> ChessCandidates(EngineSettings(depth=6, workers=1), format_gate=False)([p] * 2, answers)
        [0.75, 0.25]
    """

    name = "chess_candidates"

    def __call__(self, prompts, completions, **kwargs):
        rows = _policy_rows(prompts, completions)
        live = [r for r in rows if r is not None and r.board is not None and self._open(r)]
        pool = get_pool(self.engine) if live else None
        values = {}
        if live:
            for r, analysis in zip(live, pool.analyse_many([r.fen for r in live])):
                top = set(analysis.moves)
                named = {m for m in row_moves(r) if is_legal(r.board, m)}
                values[id(r)] = len(named & top) / max(len(r.line.moves), len(top)) if top else 0.0
        self._log(kwargs, pool)
        return [None if r is None else values.get(id(r), 0.0) for r in rows]


def row_moves(row: _PolicyRow) -> list[str]:
    return list(dict.fromkeys(row.line.moves))


EVAL_SPREAD_FLOOR = 0.05  # pawns per listed move: below this the engine's evals count as tied


def evals_credit(predicted: Sequence[float], engine: Sequence[float], n_listed: int,
                 single_legal: bool = False) -> float:
    """Credit for evals ``predicted`` of moves whose engine evals are ``engine`` (pawns): separation, level, coverage.

    - separation: ``max(0, 1 - sum|dp - de| / max(sum|de|, 0.05 * n))`` with ``dp``, ``de`` the evals minus their
      mean: 1 when the evals separate the moves as the engine does, 0 for constant evals (whatever the constant);
      needs two judged moves unless the position has a single legal move;
    - level: ``1 / (1 + |mean(predicted) - mean(engine)|)``: how far off the evals sit on average;
    - coverage: judged moves / listed moves (an illegal move or an unreadable eval is a miss).

    Evals are capped at ±10 pawns, so any mate score matches a mate.

    >>> evals_credit([0.3, 0.1, -0.5], [0.3, 0.1, -0.5], 3), evals_credit([0.0, 0.0, 0.0], [0.3, 0.1, -0.5], 3)
    (1.0, 0.0)
    >>> round(evals_credit([1.3, 1.1, 0.5], [0.3, 0.1, -0.5], 3), 2)  # right differences, one pawn too high
    0.5
    """
    cap = lambda x: max(-EVAL_CAP_PAWNS, min(EVAL_CAP_PAWNS, x))  # noqa: E731
    p, e = [cap(x) for x in predicted], [cap(x) for x in engine]
    n = len(p)
    if n == 0 or n_listed == 0:
        return 0.0
    mp, me = sum(p) / n, sum(e) / n
    level = 1.0 / (1.0 + abs(mp - me))
    if n < 2:
        separation = 1.0 if single_legal else 0.0
    else:
        spread = sum(abs(x - me) for x in e)
        error = sum(abs((a - mp) - (b - me)) for a, b in zip(p, e))
        separation = max(0.0, 1.0 - error / max(spread, EVAL_SPREAD_FLOOR * n))
    return separation * level * n / max(n, n_listed)


class ChessEvals(ChessReward):
    """Whether the E: evals separate the M: moves as the engine does, at its level. Range [0, 1].

    Each M: move's eval is compared with the engine's eval of that move (:func:`evals_credit`): separation (the
    evals' differences from their mean against the engine's) × level (mean offset) × coverage (share of the listed
    moves that are legal, listed for the first time and have a readable eval; only the first 5 are judged). Constant
    evals (``E: 0.0`` everywhere) earn 0: in quiet positions the engine's evals sit near 0, so closeness alone paid
    a constant answer about half the credit. Fewer than two judged moves earn 0, unless the position has only one
    legal move, so one move repeated through M: earns 0.

    Example (depth-limited Stockfish: e1d2 takes the queen, about +5.3; e1f1 leaves it, about -6.4): close evals, the
    constant 0.0, the right differences a pawn too high, one move only, one move twice:
        >>> r = ChessEvals(EngineSettings(depth=6, workers=1))
        >>> p = "P: 4k3/8/8/8/8/8/3q4/4K2R w K - 0 1"
        >>> c = [" M: e1d2 e1f1 E: 5.3 -6.4 B: e1d2", " M: e1d2 e1f1 E: 0.0 0.0 B: e1d2",
        ...      " M: e1d2 e1f1 E: 6.3 -5.4 B: e1d2", " M: e1d2 E: 5.3 B: e1d2", " M: e1d2 e1d2 E: 5.3 5.3 B: e1d2"]
        >>> [round(x, 2) for x in r([p] * 5, c)]
        [0.99, 0.0, 0.5, 0.0, 0.0]
    """

    name = "chess_evals"

    def __call__(self, prompts, completions, **kwargs):
        rows = _policy_rows(prompts, completions)
        pairs, owners = [], []
        for r in rows:
            if r is None or r.board is None or not self._open(r):
                continue
            seen: set[str] = set()
            for move, value in list(zip(r.line.moves, r.line.evals))[:MAX_MOVES]:  # a longer list: the rest is missed
                # A repeat is listed but not judged again: five copies of one move with its eval once earned full
                # separation (identical truths, identical guesses) and full coverage (rookgrpo rewards audit).
                if value is not None and move not in seen and is_legal(r.board, move):
                    seen.add(move)
                    pairs.append((r.fen, move))
                    owners.append((id(r), value))
        pool = get_pool(self.engine) if pairs else None
        judged: dict[int, tuple[list[float], list[float]]] = {}
        if pairs:
            for (owner, predicted), cp in zip(owners, pool.move_scores(pairs)):
                if cp is not None:
                    got, truth = judged.setdefault(owner, ([], []))
                    got.append(predicted)
                    truth.append(cp / 100.0)
        self._log(kwargs, pool)
        out = []
        for r in rows:
            if r is None:
                out.append(None)
            elif id(r) not in judged:
                out.append(0.0)
            else:
                single = r.board.legal_moves.count() == 1
                out.append(evals_credit(*judged[id(r)], n_listed=len(r.line.moves), single_legal=single))
        return out


# --- environment task --------------------------------------------------------------------------------------------

# Partial credit, in tiers that each need the one before complete: the board change (up to CHANGE_CREDIT), then the
# legality verdict (reward, terminated, truncated; up to VERDICT_CREDIT), then the other FEN fields (side to move,
# castling, en passant, clocks; up to REST_CREDIT). At most 0.9 in all, so only an exact completion earns 1.0.
CHANGE_CREDIT, VERDICT_CREDIT, REST_CREDIT = 0.5, 0.2, 0.2


def _squares(placement: str) -> list[str]:
    """Expand a FEN piece placement to 64 square symbols ('.' empty), leniently; pads or cuts to 64."""
    squares: list[str] = []
    for ch in placement.replace("/", ""):
        squares.extend("." * int(ch) if ch in "123456789" else ch)  # not isdigit(): "²" is a digit too
    return (squares + ["?"] * 64)[:64]


def is_board(placement: str) -> bool:
    """Whether ``placement`` (FEN's first field) is a board: 8 ranks of 8 squares of known pieces.

    >>> is_board("8/8/8/8/8/8/8/K6k"), is_board("88/8/8/8/8/8/K6k")
    (True, False)
    """
    try:
        chess.BaseBoard(placement)
    except ValueError:
        return False
    return True


def board_change_credit(before: str, expected: str, predicted: str) -> float:
    """How much of the move's change to the board ``predicted`` makes, from placements (FEN's first field). [0, 1].

    The changed squares are those where ``expected`` differs from ``before`` (from and to squares, a castling rook,
    an en-passant capture). Credit is ``(changed squares right - other squares wrong) / changed squares``, floored
    at 0: the unchanged input earns 0, moving the piece off its square but not onto the target earns half on a
    two-square move. When nothing changes (an illegal move), the unchanged board earns 1 and each wrongly changed
    square costs half. A ``predicted`` placement that is not a board (not 8 ranks of 8 squares of known pieces) earns
    0: read square by square it can match, as ``88`` for two empty ranks or a rank whose ``/`` is missing does, and
    it was paid 0.9 with the verdict and fields right.

    >>> start = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR"
    >>> after = "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR"
    >>> board_change_credit(start, after, after), board_change_credit(start, after, start)
    (1.0, 0.0)
    >>> board_change_credit(start, after, "rnbqkbnr/pppppppp/8/8/8/8/PPPP1PPP/RNBQKBNR")  # pawn lifted, not placed
    0.5
    >>> board_change_credit(start, after, "rnbqkbnr/pppppppp/88/4P3/8/PPPP1PPP/RNBQKBNR")  # seven ranks: no board
    0.0
    """
    if not is_board(predicted):
        return 0.0
    b, e, p = _squares(before), _squares(expected), _squares(predicted)
    changed = [i for i in range(64) if b[i] != e[i]]
    wrong_elsewhere = sum(p[i] != e[i] for i in range(64) if b[i] == e[i])
    if not changed:
        return max(0.0, 1.0 - wrong_elsewhere / 2)
    right = sum(p[i] == e[i] for i in changed)
    return max(0.0, (right - wrong_elsewhere) / len(changed))


def env_credit(fen: str, expected: str, predicted: str) -> float:
    """Credit of an ``A:`` completion ``predicted`` against the ground truth ``expected`` for the position ``fen``.

    1.0 for an exact match. Otherwise tiered partial credit, each tier gated on the one before being complete:
    ``0.5 * board change`` (:func:`board_change_credit`), then ``0.2 *`` the share of reward, terminated and truncated
    right, then ``0.2 *`` the share of side to move, castling, en passant and clocks right. Copying the input
    position earns 0 on any legal move; a completion without ``+`` fields earns 0.

    >>> fen = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
    >>> truth = "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0"
    >>> env_credit(fen, truth, truth), env_credit(fen, truth, fen + "+0.001+0+0")
    (1.0, 0.0)
    >>> env_credit(fen, truth, "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 1+0.001+0+0")  # side kept
    0.85
    >>> env_credit(fen, truth, "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1+1.0+1+0")  # wrong verdict
    0.566667
    """
    if not isinstance(predicted, str) or "+" not in predicted:
        return 0.0
    if predicted == expected:
        return 1.0
    exp, got = parse_env_completion(expected), parse_env_completion(predicted)
    e_fen, g_fen = exp.new_fen.split(), got.new_fen.split()
    change = board_change_credit(fen.split()[0], e_fen[0], g_fen[0] if g_fen else "")
    credit = CHANGE_CREDIT * change
    if change < 1.0:
        return round(credit, 6)
    verdict = (_same_number(exp.reward, got.reward) + (exp.terminated == got.terminated)
               + (exp.truncated == got.truncated)) / 3
    credit += VERDICT_CREDIT * verdict
    if verdict < 1.0:
        return round(credit, 6)
    field_at = lambda parts, i: parts[i] if len(parts) > i else None  # noqa: E731
    rest = [field_at(e_fen, i) == field_at(g_fen, i) for i in (1, 2, 3)]
    rest.append(((field_at(e_fen, 4) == field_at(g_fen, 4)) + (field_at(e_fen, 5) == field_at(g_fen, 5))) / 2)
    return round(credit + REST_CREDIT * sum(rest) / len(rest), 6)


def _env_prompt(prompt: Any):
    """The fields of an ``A:`` prompt, or ``None`` when its FEN is unreadable."""
    fields = parse_env(completion_text(prompt))
    return None if board_from_fen(fields.fen) is None else fields


def _env_text(completion: Any) -> str:
    """An ``A:`` completion read up to its first newline."""
    return completion_text(completion).split("\n", 1)[0].strip()


def _placement(answer: str) -> str:
    """The piece placement (FEN's first field) an ``A:`` answer writes; ``""`` when it writes none."""
    return (parse_env_completion(answer).new_fen.split() or [""])[0]


def env_answer(prompt: Any, completion: Any) -> tuple[str, str, str] | None:
    """``(FEN, ground-truth completion, answer)`` of an ``A:`` row, the answer read up to its first newline; ``None``
    when the prompt's FEN is unreadable. What :class:`ChessEnv` and the evaluation's error kinds read."""
    fields = _env_prompt(prompt)
    if fields is None:
        return None
    expected = env_step(fields.fen, fields.move, fields.history).completion()
    return fields.fen, expected, _env_text(completion)


def env_broken(prompt: Any, completion: Any) -> bool:
    """Whether an ``A:`` answer's placement is not a board (not 8 ranks of 8 squares of known pieces); ``False`` for
    an unreadable prompt. Needs no ground truth, so no :func:`~rookgrpo.chess.formats.env_step`.

    >>> env_broken("A: 7k/8/6K1/8/8/8/8/1Q6 w - - 0 1+b1b8+b1b8+", "1Q5k/8/6K1/8/8/8/8 b - - 1 1+1.0+1+0")
    True
    """
    return _env_prompt(prompt) is not None and not is_board(_placement(_env_text(completion)))


def env_failure(prompt: Any, completion: Any) -> str | None:
    """How a wrong ``A:`` answer is wrong, where ``chess_env`` pays both kinds 0: ``"copied"`` (the input board
    again, on a move that changes it) or ``"broken"`` (a placement that is not a board: not 8 ranks of 8 squares of
    known pieces). ``None`` otherwise (right, other errors, or an unreadable prompt).

    >>> p = "A: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+e2e4+e2e4+"
    >>> env_failure(p, "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR b KQkq - 0 1+0.001+0+0")
    'copied'
    >>> env_failure(p, "rnbqkbnr/ppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0")
    'broken'
    >>> env_failure(p, "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0") is None
    True
    """
    if env_broken(prompt, completion):
        return "broken"
    row = env_answer(prompt, completion)
    if row is None:
        return None
    fen, expected, answer = row
    return "copied" if _placement(answer) == fen.split()[0] != expected.split()[0] else None


def _same_number(a: str, b: str) -> bool:
    try:
        return float(a) == float(b)
    except ValueError:
        return False


class ChessEnv(ChessReward):
    """Environment task: 1.0 for the exact ground-truth completion, else credit gated on the move's change (≤ 0.9).

    The ground truth is :func:`rookgrpo.chess.formats.env_step` on the prompt's FEN, move and history. Partial credit
    (:func:`env_credit`) comes in tiers, each needing the one before complete: the board change the move makes (0.5),
    the legality verdict (reward and flags, 0.2), the other FEN fields (0.2). So copying the input position, with or
    without the side to move flipped, earns 0 on a legal move, and credit still rises square by square towards the
    right board, which keeps a spread within a group. A prompt with an unreadable FEN earns the floor.

    Example:
        >>> r = ChessEnv()
        >>> p = "A: 7k/8/6K1/8/8/8/8/1Q6 w - - 0 1+b1b8+b1b8+"
        >>> r([p] * 4, ["1Q5k/8/6K1/8/8/8/8/8 b - - 1 1+1.0+1+0", "1Q5k/8/6K1/8/8/8/8/8 b - - 1 1+0.001+0+0",
        ...             "7k/8/6K1/8/8/8/8/1Q6 w - - 0 1+0.001+0+0", "junk"])
        [1.0, 0.566667, 0.0, 0.0]
    """

    name = "chess_env"
    needs_engine = False

    def __call__(self, prompts, completions, **kwargs):
        return _env_rows(prompts, completions, self._credit)

    @staticmethod
    def _credit(prompt, completion) -> float:
        row = env_answer(prompt, completion)
        return 0.0 if row is None else env_credit(*row)


def _env_rows(prompts, completions, score) -> list[float | None]:
    """``score(prompt, completion)`` on ``A:`` rows, ``None`` on the others."""
    return [score(p, c) if task_of(completion_text(p)) == "A" else None
            for p, c in zip(prompts, completions, strict=True)]


class ChessEnvBoard(ChessReward):
    """Environment task, a penalty only: -1.0 when the answer's placement is not a board, else 0.0.

    ``chess_env`` pays a broken board (a rank a square short or long, ranks run together, junk) and a copy of the
    input board both 0 on a legal move, so GRPO's updates, from either task, can trade copies and right answers for
    broken boards and nothing pulls back (docs/experiments/2026-11-23-tiny-model-builds.md). Next to ``chess_env`` this ranks a broken board below
    a copy. It pays nothing a board earns, so no answer gains from it: a copy still earns 0 and the exact answer 1.0
    in the sum. In a group of copies and broken boards alone, group normalisation makes it the whole signal and the
    copies the best answers there; ``rookgrpo rewards audit`` shows the sums. A prompt with an unreadable FEN earns
    0 (no spread to learn from).

    Example:
        >>> r = ChessEnvBoard()
        >>> p = "A: 7k/8/6K1/8/8/8/8/1Q6 w - - 0 1+b1b8+b1b8+"
        >>> r([p] * 4, ["1Q5k/8/6K1/8/8/8/8/8 b - - 1 1+1.0+1+0", "7k/8/6K1/8/8/8/8/1Q6 w - - 0 1+0.001+0+0",
        ...             "1Q5k/8/6K1/8/8/8/8 b - - 1 1+1.0+1+0", "junk"])
        [0.0, 0.0, -1.0, -1.0]
    """

    name = "chess_env_board"
    needs_engine = False

    def __call__(self, prompts, completions, **kwargs):
        return _env_rows(prompts, completions, lambda p, c: -1.0 if env_broken(p, c) else 0.0)


chess_format = register_reward("chess_format")(ChessFormat())
chess_legality = register_reward("chess_legality")(ChessLegality())
chess_best_move = register_reward("chess_best_move")(ChessBestMove())
chess_move_rank = register_reward("chess_move_rank")(ChessMoveRank())
chess_candidates = register_reward("chess_candidates")(ChessCandidates())
chess_evals = register_reward("chess_evals")(ChessEvals())
chess_env = register_reward("chess_env")(ChessEnv())
chess_env_board = register_reward("chess_env_board")(ChessEnvBoard())

POLICY_REWARDS = (
    "chess_format", "chess_legality", "chess_move_rank", "chess_best_move", "chess_candidates", "chess_evals",
)
#: The P: components ``format_gate`` applies to (on by default): every one but the format's own.
GATED_REWARDS = POLICY_REWARDS[1:]

