"""Score completions at the positions that sampled them: position ids from the attention mask.

Why: transformers' ``generate`` numbers a left-padded row from its first real token (``attention_mask.cumsum(-1) -
1``), but a model's plain forward without ``position_ids`` numbers every column from 0, pads included. TRL's GRPO
log-prob forwards (policy, old policy, reference) pass ``input_ids`` and ``attention_mask`` only, and its prompts are
left-padded, so on a model with learned absolute position embeddings (GPT-2, RookWorld-LM) a completion whose prompt
has ``k`` pad tokens is scored ``k`` positions later than it was sampled. The loss's log-probs, the importance ratio
and the KL term then describe a distribution that did not sample the tokens, and the update is applied to the model
at positions that generation never uses. On ``make train``'s batches of the packaged chess model (about 70% of rows
padded, by 5 to 8 tokens) TRL's log-probs lie 0.19 nats per token off the sampling distribution on P: completions
and 0.50 on A: ones (``benchmarks/bench_position_gap.py``, ``docs/dynamics.md``). Rotary-position models see only
relative offsets, so for them this changes nothing beyond float rounding.

:class:`MaskPositions` puts a forward pre-hook on the backbone of each model in use (the policy and, when there is
one, the reference). A call that brings no ``position_ids``, no filled cache, and a 2-D attention mask with padding
gets the positions ``generate`` would have used. Calls that bring their own (``generate`` does) are left alone, and
so are multimodal models, whose rotary positions are 3-D and computed inside the model.

Example::

    >>> import torch
    >>> positions_from_mask(torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]))
    tensor([[0, 0, 0, 1, 2],
            [0, 1, 2, 3, 4]])
"""

from __future__ import annotations

import inspect
import logging

import torch

from .task_sampling import innermost_model, models_in_use

logger = logging.getLogger(__name__)

HANDLE = "_rookgrpo_mask_positions"


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """The position ids ``generate`` gives a batch with this 2-D mask: real tokens count from 0, pads get 0."""
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.masked_fill(attention_mask == 0, 0)


def _fill_positions(module, args, kwargs):
    """Forward pre-hook: add mask-derived ``position_ids`` to a full-sequence forward with padding and none given."""
    if kwargs.get("position_ids") is not None:
        return None
    mask = kwargs.get("attention_mask")
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or bool(mask.all()):
        return None
    tokens = kwargs.get("input_ids", args[0] if args else None)
    if tokens is None:
        tokens = kwargs.get("inputs_embeds")
    if tokens is None or tokens.shape[1] != mask.shape[1]:
        return None  # a step on a cache: the mask covers more than the new tokens, whose positions the caller owns
    cache = kwargs.get("past_key_values")
    if cache is not None and hasattr(cache, "get_seq_length") and cache.get_seq_length() > 0:
        return None
    return args, {**kwargs, "position_ids": positions_from_mask(mask)}


def backbone_of(model):
    """The module that embeds positions: the innermost model's ``base_model`` (GPT-2's ``transformer``)."""
    inner = innermost_model(model)
    return getattr(inner, "base_model", inner), inner


class MaskPositions:
    """Install (``enabled``) or take off the mask-positions hook on the policy's and the reference's backbones.

    ``installed`` lists the roles that have it; ``skipped`` maps a role to why it does not (a multimodal model, or a
    backbone whose forward takes no ``position_ids``). Taking it off matters for a model object reused from an
    earlier trainer: ``position_ids_from_mask: false`` then scores as TRL does.
    """

    def __init__(self, trainer, enabled: bool = True):
        self.installed: list[str] = []
        self.skipped: dict[str, str] = {}
        for role, model in models_in_use(trainer):
            backbone, inner = backbone_of(model)
            handle = getattr(backbone, HANDLE, None)
            if not enabled:
                if handle is not None:
                    handle.remove()
                    delattr(backbone, HANDLE)
                continue
            reason = _unsupported(backbone, inner)
            if reason:
                self.skipped[role] = reason
                logger.info("position_ids_from_mask: %s model left as is (%s).", role, reason)
                continue
            if handle is None:
                setattr(backbone, HANDLE, backbone.register_forward_pre_hook(_fill_positions, with_kwargs=True))
            self.installed.append(role)


def _unsupported(backbone, inner) -> str | None:
    if getattr(getattr(inner, "config", None), "vision_config", None) is not None:
        return "multimodal: its rotary positions are computed inside the model"
    try:
        parameters = inspect.signature(backbone.forward).parameters
    except (TypeError, ValueError):
        return "its forward's signature cannot be read"
    if "position_ids" not in parameters:
        return f"{type(backbone).__name__}.forward takes no position_ids"
    return None
