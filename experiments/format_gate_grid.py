"""The format-gate grid: do chess rewards that charge an ill-formed P: answer let GRPO raise best move and hold greedy
format?

The plan (arms, metrics, seeds, decision rule) was written before the runs:
docs/experiments/2026-12-01-format-gate-grid-plan.md. Arms:

- the control: ``recipes/rookworld-tiny.yaml`` as shipped (the B:-only anchor, ``chess_eval`` on the fresh validation
  panel every 20 steps, the guard on best move + format + move-rank reward + A: exact), judged by the guard's weights;
- the charged reward: the same with ``format_gate: true`` on the chess P: components (an ill-formed answer keeps only
  ``chess_format``'s credit);
- each of those two with a guard that has format as a floor, on the same trajectories (no run of its own): among the
  evaluated steps whose held-out format is not below the start's, the best guard score (every evaluation's weights
  are kept for it, ``EvalSnapshots``);
- vanilla TRL at the shipped recipe's settings (its ``GRPOTrainer`` with the recipe's fields, learning rate 2e-6
  cosine, one temperature, no resampling, anchor or guard), judged by its last step's weights: a reference, never
  shipped.

Trained by :func:`grpo_grid.run` at ``make train``'s completions budget (200 steps of 32, resampling rounds
counted), evaluated greedily on the 256 reported held-out positions (``rookgrpo/tiny-rookworld-eval``, Stockfish
depth 8). Seeds 1-5, arms interleaved per seed. The tables are ``best_move_grid.py``'s, with this grid's rule.

    python experiments/format_gate_grid.py --out experiments/results/format_gate_grid.json     (run or resume)
    python experiments/format_gate_grid.py --from_result experiments/results/format_gate_grid.json   (re-table)

Each finished run is kept in ``OUT.partial``; the same command again skips the runs it holds (run it from a ``git
worktree`` pinned at the plan's commit).

Measured 2026-12-02: no arm met the rule and the control stays (the plan's Results). The charged reward tied the
control with the floor; ``format_gate`` is on by default since docs/experiments/2026-12-06-format-gate-ships.md (the tie decided by the reward
rule), so ``format-gate`` is no longer a lever: its runs still table here, and run at ``081c42d`` (``grpo_grid.RETIRED``).
"""

from __future__ import annotations

import sys

import best_move_grid as bm  # experiments/best_move_grid.py: the harness, tables and decision
from rookgrpo.chess.assets import FRESH_VAL_POLICY

CONTROL = "lr2e-6-cosine+anchor-PB-0.1+guard"  # recipes/rookworld-tiny.yaml as shipped
CHARGED = f"{CONTROL}+format-gate"
ARMS = [CONTROL, CHARGED, "vanilla-shipped"]
FLOOR = "heldout/format_rate"
DERIVED = {f"{CONTROL}+format-floor": (CONTROL, FLOOR), f"{CHARGED}+format-floor": (CHARGED, FLOOR)}
METRICS = bm.METRICS + [("env_broken_rate", "A: not a board")]
FORMAT_GATE = bm.Grid(
    script="experiments/format_gate_grid.py", plan="docs/experiments/2026-12-01-format-gate-grid-plan.md",
    title="Format-gate grid: the shipped recipe, the charged reward, a guard with format as a floor, vanilla TRL",
    control=CONTROL, arms=ARMS, supervised={}, up=("best_move_accuracy",), held=("format_rate",),
    guards=("move_rank_reward", "env_exact_accuracy", "env_broken_rate"), guard_t=-1.5,
    lower_better=("env_broken_rate",), references=("vanilla-shipped",), order_fallback=True, derived=DERIVED,
    metrics=METRICS, panel=FRESH_VAL_POLICY)


def main(argv=None):
    return bm.main(argv, FORMAT_GATE, description=__doc__.splitlines()[0])


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
