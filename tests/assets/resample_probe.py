"""Test callback named by dotted path: after resampling, records this rank's ``resample/*`` values per batch."""

import json
import os
from pathlib import Path

from rookgrpo.callbacks import RookCallback


class ResampleProbe(RookCallback):
    state_key = "resample_probe"

    def on_scored_batch(self, trainer, scored):
        metrics = trainer._metrics["train"]
        record = {k: metrics[k][-1] for k in ("resample/rounds", "resample/frac_zero_std_after")}
        record["local_rows"] = len(scored.output["advantages"])
        record["zero_groups_local"] = int(
            (scored.output["advantages"].view(-1, trainer.num_generations).abs().amax(dim=1) == 0).sum())
        rank = trainer.accelerator.process_index
        with open(Path(os.environ["ROOKGRPO_TEST_PROBE_DIR"]) / f"rank-{rank}.jsonl", "a") as fh:
            fh.write(json.dumps(record) + "\n")
