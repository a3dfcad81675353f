"""Candidate levers of the best-move grid (docs/experiments/2026-11-27-best-move-grid-plan.md) that are not in the
package: a lever enters ``rookgrpo`` only if the grid picks it, so one that loses never touches the product's code.
Recipes name them by file path (``experiments/levers.py:ChessBestHit``), as a user names a reward of their own."""

from __future__ import annotations

from rookgrpo.chess.rewards import ChessReward


class ChessBestHit(ChessReward):
    """1.0 when the B: move is the engine's best move (its multipv line 1, as held-out best-move accuracy counts it),
    else 0; ``None`` for other-task rows. Paid apart from ``chess_move_rank``, which pays the 2nd move about 0.8 of
    the best's credit: under it, moving probability from the best move to a close 2nd costs a group little.

    Degenerate answers earn what any wrong move does (0): a missing, malformed or illegal B:, or a legal move that is
    not the engine's first line. Nothing in the answer's text but the move is read.
    """

    name = "chess_best_hit"

    def __call__(self, prompts, completions, **kwargs):
        def score(pool, rows):
            return [float(a.best == r.line.best) for r, a in zip(rows, pool.analyse_many([r.fen for r in rows]))]

        return self._score_legal_best(prompts, completions, kwargs, score)
