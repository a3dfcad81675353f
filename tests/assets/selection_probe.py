"""Test callback named by dotted path: records, per rank, the prompt ids this rank was handed in each generation
batch and the prompt-selection history after it (the two ranks must make the same decisions)."""

import hashlib
import json
import os
from pathlib import Path

from rookgrpo.callbacks import RookCallback
from rookgrpo.callbacks.selection import PROMPT_ID_COLUMN, PromptSelection


class SelectionProbe(RookCallback):
    state_key = "selection_probe"

    def on_scored_batch(self, trainer, scored):
        selection = next(cb for cb in trainer.callback_handler.callbacks if isinstance(cb, PromptSelection))
        history = json.dumps(selection.history.state_dict(), sort_keys=True)
        record = {"local_ids": [int(r[PROMPT_ID_COLUMN]) for r in scored.inputs],
                  "history": hashlib.sha256(history.encode()).hexdigest(),
                  "skipped": trainer._metrics["train"]["select/skipped"][-1]}
        rank = trainer.accelerator.process_index
        with open(Path(os.environ["ROOKGRPO_TEST_PROBE_DIR"]) / f"rank-{rank}.jsonl", "a") as fh:
            fh.write(json.dumps(record) + "\n")
