"""A lever for docs/tiny-model.md: a reward paid only for the engine's best move, added to the recipe's rank reward.

``chess_move_rank`` pays the engine's 2nd..5th moves about 0.8..0.2 of the best's credit, so within a group the
advantage that separates the best move from a generic top-5 move is small next to the one that separates a legal
move from an illegal one; in `make train` the greedy P: answers moved to legal, lower-ranked moves and onto one move
while best-move accuracy stayed flat. This reward is 1 for a B: move that scores as well as the engine's best (a
tie with the best counts), 0 otherwise (illegal, missing, malformed, or any other move). Measured as::

    sed -e 's/^reward_funcs: \\[\\(.*\\)\\]/reward_funcs: [\\1, "benchmarks\\/levers\\/top_move.py:chess_top_move"]/' \\
        -e 's/^reward_weights: \\[\\(.*\\)\\]/reward_weights: [\\1, 2.0]/' recipes/rookworld-tiny.yaml > /tmp/rw-top.yaml
    accelerate launch --num_processes 1 -m rookgrpo /tmp/rw-top.yaml --output_dir runs/top-s42 --seed 42

What degenerate answers earn: a constant move, the engine's 2nd move everywhere, or a list of every legal move in M:
earn 0 unless B: is the best move of that position; only B: is read.

    >>> from rookgrpo.chess.engine import EngineSettings
    >>> r = ChessTopMove(EngineSettings(depth=6, workers=1))
    >>> p = "P: 7k/8/6K1/8/8/8/8/1Q6 w - - 0 1"
    >>> r([p] * 3, [" M: b1b8 E: 999.99 B: b1b8", " B: b1d1", " B: h8h7"])
    [1.0, 0.0, 0.0]
"""

from __future__ import annotations

from rookgrpo.rewards.chess import ChessReward


class ChessTopMove(ChessReward):
    """1 for a B: move that scores as well as the engine's best, else 0 (None on A: rows)."""

    name = "chess_top_move"

    def __call__(self, prompts, completions, **kwargs):
        def score(pool, rows):
            out = []
            for r, a in zip(rows, pool.analyse_many([r.fen for r in rows])):
                s = a.score_of(r.line.best)
                out.append(float(bool(a.scores) and s is not None and s >= a.scores[0]))
            return out

        return self._score_legal_best(prompts, completions, kwargs, score)


chess_top_move = ChessTopMove()
