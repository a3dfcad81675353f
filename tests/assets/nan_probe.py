"""Test callback for the forced-NaN runs on several processes (DDP, FSDP2, DeepSpeed ZeRO-2/3).

``NaNProbe`` makes the gradient of optimizer step ``ROOKGRPO_TEST_NAN_STEP`` non-finite on rank 0 only (the way a
faulty backward kernel would on one GPU: the NaN reaches the other ranks through the gradient reduction), and after
every step writes the whole weights as every rank holds them (gathered for the comparison: ZeRO-3's partitions and
FSDP2's shards; under DeepSpeed, the optimizer's fp32 master weights too) to ``$ROOKGRPO_TEST_PROBE_DIR/rank-R.pt``,
with the rank's log history in ``rank-R.json`` at the end.

List it first in ``callbacks`` so its gradient hook is the model's. Environment:
``ROOKGRPO_TEST_NAN_STEP`` (1-based optimizer step; ``0``: none), ``ROOKGRPO_TEST_NAN_RANKS`` (``0`` by default,
``all`` for every rank), ``ROOKGRPO_TEST_NAN_KIND`` (``gradient``: NaN in the backward, finite loss; ``loss``: a NaN
loss and NaN gradients; ``loss_only``: a NaN loss whose gradients stay finite, a constant NaN added to it, which no
gradient check can see).
"""

import json
import os
from pathlib import Path

import torch
from rookgrpo.callbacks import RookCallback
from sharded_probe import whole_weights


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


class NaNProbe(RookCallback):
    state_key = "nan_probe"

    def __init__(self):
        self.step = int(os.environ.get("ROOKGRPO_TEST_NAN_STEP", "0"))
        ranks = os.environ.get("ROOKGRPO_TEST_NAN_RANKS", "0")
        self.poisoned = ranks == "all" or str(_rank()) in ranks.split(",")
        self.kind = os.environ.get("ROOKGRPO_TEST_NAN_KIND", "gradient")
        self.out = Path(os.environ["ROOKGRPO_TEST_PROBE_DIR"])
        self.weights: dict[int, dict] = {}
        self.state = None

    def _poison_now(self) -> bool:
        return self.poisoned and self.state is not None and self.state.global_step == self.step - 1

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.state = state
        block = model.transformer.h[0].attn if hasattr(model, "transformer") else next(iter(model.modules()))

        def forward_hook(module, inputs, output):
            hidden = output[0] if isinstance(output, tuple) else output
            if not (torch.is_grad_enabled() and module.training and self._poison_now()):
                return output
            if self.kind == "loss_only":
                return output
            if self.kind == "loss":
                hidden = hidden * float("nan")
            else:
                hidden.register_hook(lambda grad: grad * float("nan"))
            return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

        block.register_forward_hook(forward_hook)
        self.weights[0] = self._snapshot(model, kwargs.get("optimizer"))

    def extra_loss(self, trainer, model):
        if self.kind == "loss_only" and model.training and self._poison_now():
            return torch.tensor(float("nan"))
        return None

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.weights[state.global_step] = self._snapshot(model, kwargs.get("optimizer"))

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self.weights["end"] = self._snapshot(model, kwargs.get("optimizer"))
        torch.save(self.weights, self.out / f"rank-{_rank()}.pt")
        (self.out / f"rank-{_rank()}.json").write_text(json.dumps({"log_history": state.log_history}, default=str))

    @staticmethod
    def _snapshot(model, optimizer) -> dict:
        return whole_weights(model)
