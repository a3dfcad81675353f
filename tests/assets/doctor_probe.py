"""Test callbacks for the doctor's two-process run: a policy moved off its reference, and each rank's log history."""

import json
import os
from pathlib import Path

import torch
from transformers import TrainerCallback

from rookgrpo.callbacks import RookCallback


def constant_reward(completions, **kwargs):
    """Every completion earns 1.0: every advantage is 0, so the only gradient left is the KL term's."""
    return [1.0 for _ in completions]


class PerturbPolicy(TrainerCallback):
    """Adds seeded noise to the policy's trainable weights before the first step (the same on every rank), so the
    policy differs from its reference and the KL term has a gradient."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad:
                    p.add_(0.05 * torch.randn(p.shape, generator=gen).to(p.dtype))


class LogProbe(TrainerCallback):
    """Writes the rank's log history to ``$ROOKGRPO_TEST_PROBE_DIR/rank-R.jsonl`` at the end of training."""

    def on_train_end(self, args, state, control, **kwargs):
        probe_dir = os.environ.get("ROOKGRPO_TEST_PROBE_DIR")
        if probe_dir:
            rank = os.environ.get("RANK", "0")
            with open(Path(probe_dir) / f"rank-{rank}.jsonl", "w") as fh:
                for entry in state.log_history:
                    fh.write(json.dumps(entry) + "\n")



class RecompileOnOneRank(RookCallback):
    """Rank 1 alone logs ``compile/graphs`` = 1 from step 2 on, as a rank that compiled again by itself would, behind
    the diagnostics (which share the count over ranks): only that rank's doctor sees a recompile."""

    state_key = "recompile_on_one_rank"

    def on_step_end(self, args, state, control, **kwargs):
        from rookgrpo.trl_compat import log_metric

        if os.environ.get("RANK") == "1" and state.global_step >= 2:
            log_metric(self.trainer, "compile/graphs", 1.0)
