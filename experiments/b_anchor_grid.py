"""The B:-only anchor grid: does the SFT anchor on P: lines scored on the B: move alone raise best move and hold
greedy format, with a guard that selects on best move?

The plan (arms, metrics, seeds, decision rule) was written before the runs:
docs/experiments/2026-11-29-b-anchor-grid-plan.md. Every arm is ``recipes/rookworld-tiny.yaml`` as shipped (the
control) or that recipe with its anchor on P: lines scored on the B: move (``score: rookworld_best_move``) and A:
lines whole, at learning rate 2e-6 or 1e-5, plus the anchor's supervised-only control; each runs with ``chess_eval``
on the fresh validation panel (``rookgrpo/tiny-rookworld-val-fresh``: 288 P:, 32 A:) every 20 steps and the guard on
best move + format + move-rank reward + A: exact, as ``make train`` runs, and is judged by the weights the guard hands
back: trained by :func:`grpo_grid.run` at the completions budget (200 steps of 32, resampling rounds counted),
then evaluated greedily on the 256 reported held-out positions (``rookgrpo/tiny-rookworld-eval``, Stockfish depth 8).
Seeds 1-5, arms interleaved per seed. The tables and decision are ``best_move_grid.py``'s, with this grid's rule.

    python experiments/b_anchor_grid.py --out experiments/results/b_anchor_grid.json     (run or resume)
    python experiments/b_anchor_grid.py --from_result experiments/results/b_anchor_grid.json    (re-table)

Each finished run is kept in ``OUT.partial``; the same command again skips the runs it holds (run it from a ``git
worktree`` pinned at the plan's commit).
"""

from __future__ import annotations

import sys

import best_move_grid as bm  # experiments/best_move_grid.py: the harness, tables and decision
from rookgrpo.chess.assets import FRESH_VAL_POLICY

CONTROL = "lr2e-6-cosine+anchor-0.1+guard"  # the recipe as shipped, with the fresh panel and the guard on best move
ARMS = [
    CONTROL,
    "lr2e-6-cosine+anchor-PB-0.1+guard",  # the anchor on P: lines' B: move and whole A: lines, at the shipped step
    "lr1e-5-cosine+anchor-PB-0.1+guard",  # ... at the step before it
    "sft-only-PB",  # the anchor's supervised steps alone (1e-5 cosine), with the guard: never ships
]
SUPERVISED = {"sft-only-PB": ("lr1e-5-cosine+anchor-PB-0.1+guard", "lr2e-6-cosine+anchor-PB-0.1+guard")}
METRICS = bm.METRICS + [("env_broken_rate", "A: not a board")]
B_ANCHOR = bm.Grid(
    script="experiments/b_anchor_grid.py", plan="docs/experiments/2026-11-29-b-anchor-grid-plan.md",
    title="B:-only anchor grid: the shipped recipe, the anchor on the B: move at two steps, its supervised control",
    control=CONTROL, arms=ARMS, supervised=SUPERVISED, up=("best_move_accuracy", "move_rank_reward"),
    held=("format_rate", "env_exact_accuracy"), fallback_best_up=True, metrics=METRICS, panel=FRESH_VAL_POLICY)


def main(argv=None):
    return bm.main(argv, B_ANCHOR, description=__doc__.splitlines()[0])


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
