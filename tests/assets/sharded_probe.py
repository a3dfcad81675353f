"""Test callbacks and an evaluator for the two-process DDP/FSDP2 runs: scripted held-out scores, and what each rank
holds at the end (its log history, a checksum of its weights, whether they are sharded)."""

import json
import os
from pathlib import Path

import torch
from transformers import TrainerCallback

#: ``heldout/score`` at each evaluation, in order (steps 0, 1, 2, ...): set by ROOKGRPO_TEST_SCORES ("5,1,3,2,1").
_calls = {"n": 0}


def scripted_score(model, tokenizer, rows):
    """A held-out evaluator whose scores are scripted (``ROOKGRPO_TEST_SCORES``), the same on every rank; it runs a
    forward of the model on the first prompts too, as a real evaluator does (under FSDP2 every rank must)."""
    scores = [float(x) for x in os.environ.get("ROOKGRPO_TEST_SCORES", "0").split(",")]
    ids = tokenizer([r["prompt"] for r in rows[:2]], return_tensors="pt", padding=True)
    with torch.no_grad():
        model(input_ids=ids["input_ids"], attention_mask=ids["attention_mask"])
    n = _calls["n"]
    _calls["n"] += 1
    return {"score": scores[min(n, len(scores) - 1)]}


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


class RankProbe(TrainerCallback):
    """At the end of training (list it after the guard), writes ``$ROOKGRPO_TEST_PROBE_DIR/rank-R.json``: the rank's
    log history, the sum of its weights (its shards under FSDP2) and whether they are DTensors."""

    def on_train_end(self, args, state, control, model=None, **kwargs):
        probe_dir = os.environ.get("ROOKGRPO_TEST_PROBE_DIR")
        if not probe_dir:
            return
        params = list(model.parameters())
        record = {
            "log_history": state.log_history,
            "checksum": float(sum(_local(p.detach()).double().abs().sum() for p in params)),
            "sharded": any(hasattr(p, "to_local") for p in params),
        }
        rank = os.environ.get("RANK", "0")
        (Path(probe_dir) / f"rank-{rank}.json").write_text(json.dumps(record))
