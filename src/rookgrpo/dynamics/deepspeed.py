"""What rookgrpo needs of a DeepSpeed engine, in one place: which ZeRO stage and precision a run trains in, the
optimizer that applies the update, whether the last step was applied, and each rank's share of the optimizer's fp32
master weights.

Why: under DeepSpeed the engine owns the update. accelerate calls ``engine.step()`` inside ``accelerator.backward``,
before transformers' ``on_pre_optimizer_step``; the ZeRO optimizer keeps its own fp32 master copy of the trainable
weights (this rank's partition of it), from which it rewrites the module's weights after every step; under ZeRO-3 the
module's weights are partitioned too (``param.ds_tensor``: this rank's piece; ``param.data`` is empty outside a
forward). A callback that vetoes an update (``skip_nonfinite``) must act inside the engine's step, and one that
restores weights (``heldout_guard``) must restore the master copy with the module's, or the next step, a DeepSpeed
checkpoint or a ZeRO-3 save goes back to what the optimizer holds.

DeepSpeed's public API covers most of it (``engine.was_step_applied()``, ``deepspeed.utils.safe_get_full_fp32_param``,
``safe_get/set_local_fp32_param`` for ZeRO-3, ``deepspeed.zero.GatheredParameters``); the rest is read here and only
here: a ZeRO-1/2 parameter's ``_hp_mapping`` (its fragment of this rank's fp32 partition, the object DeepSpeed's own
``safe_*`` functions use), ``ds_id`` / ``ds_numel`` (a ZeRO-3 parameter and its whole size), and the chain of
``.optimizer`` attributes from accelerate's wrapper through DeepSpeed's ZeRO optimizer to the torch optimizer it steps,
and, on CPU, the entry of ``deepspeed.ops.__compatible_ops__`` that makes DeepSpeed compile its shared-memory
inference kernel (:func:`skip_cpu_inference_kernel`).
Checked against DeepSpeed 0.19.8 (``constraints.txt``: the suite runs ZeRO-2 and ZeRO-3 with it on 2 CPU processes);
the attributes above read the same in 0.14.5, 0.16.9 and 0.18.5's sources.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def zero_stage(trainer) -> int | None:
    """The ZeRO stage of a DeepSpeed run (0-3), ``None`` when the run is not under DeepSpeed."""
    if not getattr(trainer, "is_deepspeed_enabled", False):
        return None
    plugin = getattr(trainer.accelerator.state, "deepspeed_plugin", None)
    return int(getattr(plugin, "zero_stage", 0) or 0)


def engine(trainer):
    """The run's ``DeepSpeedEngine`` (``None`` before ``accelerator.prepare``, or outside DeepSpeed)."""
    wrapped = getattr(trainer.accelerator, "deepspeed_engine_wrapped", None)
    return getattr(wrapped, "engine", None)


def precision(trainer) -> str:
    """``"fp16"``, ``"bf16"`` or ``"fp32"``: what the engine trains in."""
    eng = engine(trainer)
    if eng is None:
        return "fp32"
    return "fp16" if eng.fp16_enabled() else "bf16" if eng.bfloat16_enabled() else "fp32"


def step_applied(trainer) -> bool:
    """Whether the engine's last optimizer step changed the weights (``False``: its overflow check skipped it)."""
    eng = engine(trainer)
    return True if eng is None else bool(eng.was_step_applied())


def stepped_optimizers(optimizer) -> list[torch.optim.Optimizer]:
    """The torch optimizers that apply the update: the end of the ``.optimizer`` chain (accelerate's wrapper, then
    DeepSpeed's ZeRO optimizer, then the client's ``AdamW`` on the fp32 partitions), and ZeRO-3's
    ``backup_optimizer`` where a partial optimizer offload keeps one."""
    chain = [optimizer]
    while getattr(chain[-1], "optimizer", None) is not None:
        chain.append(chain[-1].optimizer)
    backups = [getattr(o, "backup_optimizer", None) for o in chain]
    return [chain[-1], *(b for b in backups if isinstance(b, torch.optim.Optimizer))]


def skip_cpu_inference_kernel() -> bool:
    """On DeepSpeed's CPU accelerator, do not build its shared-memory all-reduce kernel; ``True`` where it was skipped.

    DeepSpeed compiles that kernel with the system's C++ compiler when its communication backend starts
    (``deepspeed.comm.torch.build_shm_op``; about a minute on 2 cores the first time, cached after, and a failure
    where the machine has no compiler), and uses it only for ``inference_all_reduce``: tensor-parallel inference
    (AutoTP), which GRPO training never calls; every collective of a ZeRO step goes through torch.distributed
    (gloo). Marked incompatible, the backend falls back to torch.distributed's all-reduce there too, as DeepSpeed
    does on any machine where the kernel cannot build. Call it before the backend starts (before the trainer's
    config sets up its devices); on any accelerator but the CPU it changes nothing.
    """
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    if accelerator.device_name() != "cpu":
        return False
    builder = accelerator.create_op_builder("ShareMemCommBuilder")
    if builder is None:
        return False
    deepspeed.ops.__compatible_ops__[builder.NAME] = False  # the dict build_shm_op reads, probed once per process
    return True


def is_zero3_param(p) -> bool:
    return hasattr(p, "ds_id")


def numel(p) -> int:
    """A parameter's whole size (a ZeRO-3 parameter's own ``numel()`` is 0 outside a forward)."""
    return int(getattr(p, "ds_numel", None) or p.numel())


# ---- each rank's share of the optimizer's fp32 master weights -------------------------------------------------------

def copy_master(named_params: Iterable) -> dict[str, torch.Tensor]:
    """This rank's pieces of the fp32 master weights, ``name -> CPU tensor`` (a parameter of which this rank holds no
    piece is left out). About 1/N of the trainable weights in fp32 per rank, never the gathered whole."""
    out = {}
    for name, p in named_params:
        piece = _master_piece(p)
        if piece is not None:
            out[name] = piece.detach().to("cpu", copy=True)
    return out


def restore_master(named_params: Iterable, pieces: dict[str, torch.Tensor]) -> None:
    """Write ``pieces`` (from :func:`copy_master`, on this rank) back into the optimizer's fp32 master weights, then
    rebuild the module's weights from the master, as the optimizer does after a step. Collective: every rank calls it
    with the same parameters, in the same order (one parameter at a time is gathered, never the whole model)."""
    from deepspeed.utils import safe_get_full_fp32_param

    params = list(named_params)
    with torch.no_grad():
        for name, p in params:
            piece = _master_piece(p)
            if piece is not None and name in pieces:
                if is_zero3_param(p):
                    from deepspeed.utils import safe_set_local_fp32_param

                    safe_set_local_fp32_param(p, pieces[name].to(piece.device))
                else:
                    piece.copy_(pieces[name].to(piece.device))
        for name, p in params:
            if not p.requires_grad:
                continue
            full = safe_get_full_fp32_param(p)  # all-reduce / all-gather of every rank's piece: the whole fp32 weight
            if full is None:
                continue
            if is_zero3_param(p):
                import deepspeed

                with deepspeed.zero.GatheredParameters([p], modifier_rank=0):
                    p.data.copy_(full.reshape(p.ds_shape).to(p.dtype))  # re-partitioned from rank 0 on exit
            else:
                p.data.copy_(full.reshape(p.shape).to(p.dtype))


def _master_piece(p) -> torch.Tensor | None:
    """This rank's piece of ``p``'s fp32 master weight (a view the optimizer steps), or ``None``."""
    if not p.requires_grad:
        return None
    if is_zero3_param(p):
        from deepspeed.utils import safe_get_local_fp32_param

        return safe_get_local_fp32_param(p)
    mapping = getattr(p, "_hp_mapping", None)  # ZeRO-1/2: None where another rank owns all of p
    return None if mapping is None else mapping.get_hp_fragment()
