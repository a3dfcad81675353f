"""What rookgrpo needs to know of sharded (FSDP2) weights: a rank's own part of a tensor, and putting every module's
weights back in their sharded state.

Why: FSDP2 (``fully_shard``) keeps each parameter as a ``DTensor`` of which every rank holds one shard, gathers a
module's weights for its forward and backward, and lets them go again; its root module keeps its weights gathered after
a forward. A callback that copies or restores weights (``heldout_guard``), or that runs forwards between training steps
(``heldout_eval``), must work on each rank's shard and leave the modules as FSDP2 expects them at the start of a step.

    >>> import torch
    >>> t = torch.ones(2)
    >>> local(t) is t, is_sharded(torch.nn.Linear(2, 2))
    (True, False)
"""

from __future__ import annotations


def local(t):
    """This rank's shard of an FSDP2 ``DTensor`` (a view: writing into it writes the weight), else ``t`` itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def is_sharded(model) -> bool:
    """Whether any of ``model``'s parameters is a ``DTensor`` (FSDP2, tensor parallelism)."""
    return any(callable(getattr(p, "to_local", None)) for p in model.parameters())


def reshard(model) -> None:
    """Put every FSDP2 module's sharded parameters back in place (a no-op elsewhere).

    A forward outside training (a held-out evaluation, under ``no_grad``) leaves FSDP2's root module gathered, and the
    next training forward would then reuse those gathered weights instead of gathering its own: its graph would
    save tensors that FSDP2 hands back to its buffers at the next reshard. And a copy written into gathered weights
    is dropped at the next reshard; a copy read from them is the whole weight, not this rank's shard.
    """
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2: nothing is sharded this way
        return
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
