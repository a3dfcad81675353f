"""Reward functions that fail on purpose, for the reward-isolation tests run on several processes, and a probe that
records what each rank scored.

``rank1_hangs_once``: on rank 1, the call at training step ``ROOKGRPO_TEST_HANG_STEP`` sleeps ten minutes (a judge
request that never returns); elsewhere it pays completions by length. ``length_reward``: a plain reward that varies.
``ScoreProbe`` writes each batch's gathered rewards per function and this rank's advantages to
``$ROOKGRPO_TEST_PROBE_DIR/rank-R.jsonl`` (NaN written as null), with the wall time of the scoring.
"""

import json
import math
import os
import time
from pathlib import Path

from rookgrpo.callbacks import RookCallback


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def length_reward(completions, **kwargs):
    return [min(len(c), 40) / 40 for c in completions]


def rank1_hangs_once(completions, trainer_state=None, **kwargs):
    if _rank() == 1 and trainer_state.global_step == int(os.environ.get("ROOKGRPO_TEST_HANG_STEP", "1")):
        time.sleep(600)
    return [float(sum(ch in "aeiou" for ch in c)) / max(len(c), 1) for c in completions]


class ScoreProbe(RookCallback):
    state_key = "score_probe"

    def on_scored_batch(self, trainer, scored):
        rewards = [[None if math.isnan(v) else v for v in row] for row in scored.rewards_per_func.tolist()]
        record = {"step": trainer.state.global_step, "rewards": rewards,
                  "advantages": scored.output["advantages"].tolist(), "time": time.time()}
        rank = trainer.accelerator.process_index
        with open(Path(os.environ["ROOKGRPO_TEST_PROBE_DIR"]) / f"rank-{rank}.jsonl", "a") as fh:
            fh.write(json.dumps(record) + "\n")
