"""Test callbacks and an evaluator for the two-process DDP/FSDP2/DeepSpeed runs: scripted held-out scores, and what
each rank holds at the end (its log history, a checksum of its weights and, under DeepSpeed, of the optimizer's fp32
master weights, whether they are sharded)."""

import contextlib
import json
import os
from pathlib import Path

import torch
from transformers import TrainerCallback

#: ``heldout/score`` at each evaluation, in order (steps 0, 1, 2, ...): set by ROOKGRPO_TEST_SCORES ("5,1,3,2,1").
_calls = {"n": 0}


def scripted_score(model, tokenizer, rows):
    """A held-out evaluator whose scores are scripted (``ROOKGRPO_TEST_SCORES``), the same on every rank; it runs a
    forward of the model on the first prompts too, as a real evaluator does (under FSDP2 every rank must), and decodes
    them for a different number of tokens on each rank, as ranks whose answers end at different tokens do: a sharded
    model must decode in step (rookgrpo.evaluation.complete), or the longer rank waits forever in a collective."""
    from rookgrpo.evaluation import complete

    scores = [float(x) for x in os.environ.get("ROOKGRPO_TEST_SCORES", "0").split(",")]
    ids = tokenizer([r["prompt"] for r in rows[:2]], return_tensors="pt", padding=True)
    with torch.no_grad():
        model(input_ids=ids["input_ids"], attention_mask=ids["attention_mask"])
    complete(model, tokenizer, [r["prompt"] for r in rows[:2]], max_new_tokens=2 + 3 * int(os.environ.get("RANK", "0")))
    n = _calls["n"]
    _calls["n"] += 1
    return {"score": scores[min(n, len(scores) - 1)]}


def whole_weights(model) -> dict:
    """The whole weights as this rank sees them, ``name -> float32 CPU tensor`` (ZeRO-3's partitions and FSDP2's shards
    gathered); under DeepSpeed also ``master/NAME``: the optimizer's fp32 copy. Collective: every rank calls it."""
    params = list(model.named_parameters())
    zero3 = any(hasattr(p, "ds_id") for _, p in params)
    gather = contextlib.nullcontext()
    if zero3:
        import deepspeed

        gather = deepspeed.zero.GatheredParameters([p for _, p in params])
    out = {}
    with gather:
        for name, p in params:
            full = getattr(p, "full_tensor", None)
            out[name] = (full() if callable(full) else p).detach().float().cpu().clone()
    if zero3 or any(hasattr(p, "_hp_mapping") for _, p in params):
        from deepspeed.utils import safe_get_full_fp32_param

        for name, p in params:
            if p.requires_grad:
                master = safe_get_full_fp32_param(p)
                if master is not None:
                    out[f"master/{name}"] = master.detach().float().cpu().reshape(out[name].shape).clone()
    return out


class RankProbe(TrainerCallback):
    """At the end of training (list it after the guard), writes ``$ROOKGRPO_TEST_PROBE_DIR/rank-R.json``: the rank's
    log history, the sum of its whole weights (gathered under FSDP2 and ZeRO-3) and of DeepSpeed's fp32 master weights,
    and whether the weights are DTensors (FSDP2) or ZeRO-3 partitions."""

    def on_train_end(self, args, state, control, model=None, **kwargs):
        probe_dir = os.environ.get("ROOKGRPO_TEST_PROBE_DIR")
        if not probe_dir:
            return
        weights = whole_weights(model)
        params = list(model.parameters())
        record = {
            "log_history": state.log_history,
            "checksum": float(sum(v.double().abs().sum() for k, v in weights.items() if not k.startswith("master/"))),
            "master_checksum": float(sum(v.double().abs().sum() for k, v in weights.items() if k.startswith("master/"))),
            "sharded": any(hasattr(p, "to_local") or hasattr(p, "ds_id") for p in params),
        }
        rank = os.environ.get("RANK", "0")
        (Path(probe_dir) / f"rank-{rank}.json").write_text(json.dumps(record))
