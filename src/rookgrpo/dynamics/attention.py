"""Attention that cannot turn a padded batch's gradient into NaN: no fully masked query row, no cuDNN SDPA in training.

Why: on H100/H200 GPUs torch's default SDPA backend for an explicit mask is cuDNN's, and its backward returns NaN in
the query gradient when the key length is 64 mod 128 (192, 320, ...) and a query row's logsumexp is below about
-88.7 (pytorch/pytorch#196678; huggingface/trl#7181 is the same fault in DPO/KTO). Forward is fine: the loss stays
finite and only ``grad_norm`` goes NaN. A GRPO batch has such rows whenever it has left padding: transformers 5.x's
``sdpa_mask`` leaves a pad query row's attention fully masked, cuDNN fills masked logits with a finite -65504, so that
row's logsumexp is about -65500. The kernel's last key tile is then half zero-filled padding that it does not mask;
``exp(0 - logsumexp)`` overflows for that row, and ``inf x 0`` puts NaN into the query gradient, from there into every
weight. With left padding (any batch of several prompts) and a width of 64 mod 128, that is nearly every long run.
The one GPU run of ``recipes/rookworld.yaml`` (H200, bf16) ended at step 1 on it; vanilla TRL hits it the same way.

Two guards, each on by default in :class:`~rookgrpo.RookGRPOTrainer`:

- :func:`guard_masks` (config field ``no_fully_masked_rows``): the SDPA masks built for the models a trainer uses have
  no fully masked query row: such a row (a pad token's, left of the prompt) attends to itself. Exact for the real
  tokens: their mask rows are unchanged, so real queries still never see pad keys, and a pad row's output reaches
  nothing the loss reads (the next layer's real queries do not attend to pad keys), so it gets zero gradient. The
  row's logsumexp is then an ordinary score's, and the faulty tile overflows nowhere. It wraps transformers'
  ``sdpa`` mask function in ``ALL_MASK_ATTENTION_FUNCTIONS`` (the public registry for custom masks) and changes only
  the masks of the model configs registered here, so other models in the process are untouched.
- :func:`sdpa_backend_guard` (``allow_cudnn_attention: false``): on CUDA, the training forward and backward run with
  the cuDNN SDPA backend excluded (flash, memory-efficient and math stay). This covers what the mask cannot: real rows
  with a very negative logsumexp (trl#7181's). What it costs is measured by ``benchmarks/bench_gpu_check.py`` where a
  GPU is lent (docs/benchmarks.md).

``tests/test_attention_guard.py`` forces the mechanism on CPU: SDPA replaced by an autograd function that behaves as
the cuDNN kernel does (the -65504 fill, and the unmasked zero-filled key tail in backward at widths 64 mod 128).

Example::

    >>> import torch
    >>> mask = torch.tensor([[[[False, False, False], [False, True, False], [False, True, True]]]])
    >>> no_fully_masked_rows(mask)[0, 0]
    tensor([[ True, False, False],
            [False,  True, False],
            [False,  True,  True]])
"""

from __future__ import annotations

import contextlib
import logging
import weakref

import torch

logger = logging.getLogger(__name__)

#: The mask function this module wraps, keyed by attention implementation (transformers' originals).
_ORIGINAL: dict = {}
#: id(config) -> a weak reference to it: the model configs whose SDPA masks are guarded.
_GUARDED: dict[int, weakref.ref] = {}


def no_fully_masked_rows(mask: torch.Tensor) -> torch.Tensor:
    """``mask`` (boolean, ``True`` = attend, shape ``(batch, heads, queries, keys)``) with every fully masked query
    row attending to itself (the diagonal, counted from the right when there are more keys than queries), or to every
    key where that position is not a key. Rows with any ``True`` are returned unchanged."""
    dead = ~mask.any(-1, keepdim=True)
    if not bool(dead.any()):
        return mask
    q, k = mask.shape[-2], mask.shape[-1]
    if k >= q:
        own = torch.zeros(q, k, dtype=torch.bool, device=mask.device)
        own[torch.arange(q, device=mask.device), torch.arange(k - q, k, device=mask.device)] = True
    else:
        own = torch.ones(q, k, dtype=torch.bool, device=mask.device)
    return mask | (dead & own)


def _is_guarded(config) -> bool:
    ref = _GUARDED.get(id(config)) if config is not None else None
    return ref is not None and ref() is config


#: id(config) of the guarded configs a mask has been built for since they were guarded (:func:`unguarded_roles`).
_SEEN: set[int] = set()


def _wrap(original):
    def sdpa_mask_without_fully_masked_rows(*args, **kwargs):
        mask = original(*args, **kwargs)
        config = kwargs.get("config")
        if _is_guarded(config):
            _SEEN.add(id(config))
            if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and mask.dim() == 4:
                mask = no_fully_masked_rows(mask)
        return mask

    sdpa_mask_without_fully_masked_rows.__wrapped__ = original
    return sdpa_mask_without_fully_masked_rows


def _install() -> bool:
    """Wrap transformers' ``sdpa`` mask function once per process; False where this transformers has no registry."""
    if "sdpa" in _ORIGINAL:
        return True
    try:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    except ImportError:  # transformers before the mask registry: masks are built inside each model
        return False
    original = ALL_MASK_ATTENTION_FUNCTIONS["sdpa"]
    _ORIGINAL["sdpa"] = original
    ALL_MASK_ATTENTION_FUNCTIONS.register("sdpa", _wrap(original))
    return True


def mask_configs(config) -> list:
    """The configs a model builds its attention masks from: the model's own, and a composite model's sub-configs
    (a vision-language model's text model builds its masks from ``text_config``: Qwen2.5-VL, Gemma 3, LLaVA).

    >>> from transformers import GPT2Config, Qwen2_5_VLConfig
    >>> [type(c).__name__ for c in mask_configs(GPT2Config())]
    ['GPT2Config']
    >>> [type(c).__name__ for c in mask_configs(Qwen2_5_VLConfig())]
    ['Qwen2_5_VLConfig', 'Qwen2_5_VLVisionConfig', 'Qwen2_5_VLTextConfig']
    """
    out, seen = [], set()
    stack = [config]
    while stack:
        c = stack.pop(0)
        if c is None or id(c) in seen:
            continue
        seen.add(id(c))
        out.append(c)
        stack += [getattr(c, name, None) for name in (getattr(type(c), "sub_configs", None) or {})]
    return out


def _configs(trainer):
    from .task_sampling import innermost_model, models_in_use

    for role, model in models_in_use(trainer):
        config = getattr(innermost_model(model), "config", None)
        if config is not None:
            yield role, config


def guard_masks(trainer, enabled: bool = True) -> list[str]:
    """Guard (``enabled``) or unguard the SDPA masks of the policy's and the reference's configs (and their
    sub-configs: :func:`mask_configs`); returns the roles guarded. Models with another attention implementation
    (eager, flash, flex) build no SDPA mask and are unaffected.
    """
    roles = []
    for role, config in _configs(trainer):
        configs = mask_configs(config)
        if not enabled:
            for c in configs:
                _GUARDED.pop(id(c), None)
            continue
        sdpa = [c for c in configs if getattr(c, "_attn_implementation", None) == "sdpa"]
        if not sdpa:
            continue
        if not _install():
            logger.info("no_fully_masked_rows: this transformers version builds masks inside each model; left as is.")
            return []
        for c in sdpa:
            _GUARDED[id(c)] = weakref.ref(c)
            _SEEN.discard(id(c))
        roles.append(role)
    return roles


def unguarded_roles(trainer) -> list[str]:
    """The guarded roles (policy, reference) none of whose configs a mask was built for since they were guarded: their
    masks do not come from transformers' mask registry (a model that builds its own), so the guard does not reach
    them. Meaningful after a forward of each (the first training loss)."""
    out = []
    for role, config in _configs(trainer):
        guarded = [c for c in mask_configs(config) if _is_guarded(c)]
        if guarded and not any(id(c) in _SEEN for c in guarded):
            out.append(role)
    return out


def sdpa_backend_guard(device, allow_cudnn: bool = False):
    """A context in which SDPA may use every backend but cuDNN's, on a CUDA ``device`` unless ``allow_cudnn``; a no-op
    elsewhere (CPU, other accelerators) or where this torch cannot choose backends.

    >>> with sdpa_backend_guard(torch.device("cuda")):
    ...     torch.backends.cuda.cudnn_sdp_enabled()
    False
    >>> torch.backends.cuda.cudnn_sdp_enabled(), type(sdpa_backend_guard(torch.device("cpu"))).__name__
    (True, 'nullcontext')
    """
    if allow_cudnn or getattr(torch.device(device), "type", None) != "cuda":
        return contextlib.nullcontext()
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return contextlib.nullcontext()
    backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    return sdpa_kernel(backends)
