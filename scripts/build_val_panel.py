#!/usr/bin/env python
"""Build the held-out guard's validation panel for the packaged chess model: fresh positions, labelled by Stockfish as
the shipped ones were, in none of the packaged splits.

Why: the guard (``heldout_guard``) selects a run's checkpoint on this panel, so it must resolve the gains it selects
for. The best-move grid measured the shipped recipe's best-move gain at about +0.024 with a per-position standard
deviation of the paired change of 0.20, so a panel needs about 280 P: positions for that gain to stand 2 standard
errors out (docs/experiments/2026-11-27-best-move-grid-plan.md); the panel carved from the GRPO positions had 96.
Carving 280 would take 27% more of the training split; fresh positions take none.

The positions come from new games played as the shipped ones were (``rookgrpo.chess.data.generate``: engine moves
mixed with random ones, games stopped at ``--max_plies``, P: rows labelled at ``--label_depth``, the compact layout),
with another seed, and every position already in a packaged file is dropped: the GRPO positions
(``train_positions.txt``, whose last 96 P: and 32 A: lines were the old panel), the reported panel
(``eval_positions.txt``) and the SFT sample (``sft_sample.txt``; the full SFT data is not shipped, so an overlap with
it cannot be ruled out, as for any position of these openings: the script reports the share found in the sample).
Each kept position gives one line; positions fill the P: quota, then the A: quota, in the generator's shuffled order.

    python scripts/build_val_panel.py            # writes src/rookgrpo/assets/tiny-rookworld/val_positions.txt

The panel is ``rookgrpo/tiny-rookworld-val-fresh``; ``rookgrpo/tiny-rookworld-val`` stays the panel carved from the
GRPO positions until a measured grid ships the fresh one (docs/experiments/2026-11-29-b-anchor-grid-plan.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ASSETS = REPO / "src" / "rookgrpo" / "assets" / "tiny-rookworld"
#: The packaged files whose positions the panel must not contain.
EXCLUDE = ("train_positions.txt", "eval_positions.txt", "sft_sample.txt")


def build(n_policy: int, n_env: int, seed: int, label_depth: int, max_plies: int, workers: int,
          progress: bool = True) -> tuple[list[str], dict]:
    """The panel's lines (P: first, then A:) and what was dropped to make it."""
    from rookgrpo.chess.data import generate, position_key
    from rookgrpo.chess.engine import EngineSettings
    from rookgrpo.chess.formats import COMPACT

    excluded = {position_key(line) for name in EXCLUDE for line in (ASSETS / name).read_text().splitlines() if line}
    sample = {position_key(line) for line in (ASSETS / "sft_sample.txt").read_text().splitlines() if line}
    total = n_policy + n_env
    lines = generate(int(total * 1.5) + 16, tasks=("P", "A"), seed=seed, layout=COMPACT, max_plies=max_plies,
                     a_share=n_env / total, settings=EngineSettings(depth=label_depth, workers=workers),
                     progress=progress)
    kept: dict[str, list[str]] = {"P": [], "A": []}
    seen, dropped = set(), {"packaged": 0, "repeated": 0}
    for line in lines:
        key = position_key(line)
        if key in excluded:
            dropped["packaged"] += 1
            continue
        if key in seen:
            dropped["repeated"] += 1
            continue
        task = line[0]
        quota = n_policy if task == "P" else n_env
        if len(kept[task]) < quota:
            kept[task].append(line)
            seen.add(key)
    if len(kept["P"]) < n_policy or len(kept["A"]) < n_env:
        raise SystemExit(f"only {len(kept['P'])} P: and {len(kept['A'])} A: fresh positions; raise the generated count")
    info = {"n_policy": n_policy, "n_env": n_env, "seed": seed, "label_depth": label_depth, "max_plies": max_plies,
            "generated": len(lines), "dropped_in_packaged_files": dropped["packaged"],
            "dropped_repeated": dropped["repeated"], "in_sft_sample": sum(position_key(x) in sample for x in lines)}
    return kept["P"] + kept["A"], info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n_policy", type=int, default=288, help="P: positions (default 288: about 280, in batches of 64 "
                                                              "with the A: lines)")
    ap.add_argument("--n_env", type=int, default=32, help="A: positions (default 32, as the old panel)")
    ap.add_argument("--seed", type=int, default=20261129, help="the games' seed (the shipped positions used 1234)")
    ap.add_argument("--label_depth", type=int, default=8, help="Stockfish depth of the P: labels (the shipped: 8)")
    ap.add_argument("--max_plies", type=int, default=24, help="games stop here, as the shipped positions' did")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=str(ASSETS / "val_positions.txt"))
    args = ap.parse_args(argv)
    lines, info = build(args.n_policy, args.n_env, args.seed, args.label_depth, args.max_plies, args.workers)
    out = Path(args.out)
    out.write_text("".join(line + "\n" for line in lines))
    print(json.dumps({"out": str(out), **info}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
