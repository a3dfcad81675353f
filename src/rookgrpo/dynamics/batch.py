"""Operations on TRL's scored generation batch (the dict ``_generate_and_score_completions`` returns).

Why a module of its own: zero-std resampling builds one batch out of groups from several generation rounds, and
those rounds pad their tensors to different lengths. These helpers re-pad and splice rows exactly the way TRL pads
them (prompts on the left, completions on the right), and recompute what depends on the whole batch (advantages
under batch-level scaling, the token count that normalises the loss).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from trl.trainer.utils import nanstd  # TRL's own, so recomputed advantages match TRL's exactly

# key → (side, pad value or "pad_token") for the per-row tensors of a scored batch. Each pad value is the one TRL
# itself has at padded positions: masked log-prob differences give an importance-sampling ratio of exp(0) = 1 there,
# and losses that sum log-ratios without a mask (VESPO) would zero a row's weight if padding were 0.
ROW_KEYS: dict[str, tuple[str, Any]] = {
    "prompt_ids": ("left", "pad_token"),
    "prompt_mask": ("left", 0),
    "completion_ids": ("right", "pad_token"),
    "completion_mask": ("right", 0),
    "old_per_token_logps": ("right", 0.0),
    "ref_per_token_logps": ("right", 0.0),
    "sampling_per_token_logps": ("right", 0.0),
    "importance_sampling_ratio": ("right", 1.0),
    "tool_mask": ("right", 1),
    "advantages": ("none", None),
}
SCALAR_KEYS = {"num_items_in_batch"}


def unsupported_keys(batch: dict) -> list[str]:
    """Keys of a scored batch that :func:`take_rows` cannot splice (multimodal inputs)."""
    return sorted(k for k in batch if k not in ROW_KEYS and k not in SCALAR_KEYS)


def _pad_to(t: torch.Tensor, length: int, side: str, value: Any) -> torch.Tensor:
    missing = length - t.size(1)
    if missing <= 0:
        return t
    filler = t.new_full((t.size(0), missing, *t.shape[2:]), value)
    return torch.cat([filler, t] if side == "left" else [t, filler], dim=1)


def take_rows(batches: Sequence[dict], picks: Sequence[tuple[int, int]], pad_token_id: int,
              pad_to_multiple_of: int | None = None, per_sequence: Sequence[str] = ()) -> dict:
    """A new batch whose row ``i`` is row ``picks[i][1]`` of ``batches[picks[i][0]]``, re-padded to a common width.

    ``per_sequence``: keys holding one value per row in a (B, 1) column (TRL's importance-sampling ratio under a
    ``sequence_*`` mode, see :func:`per_sequence_keys`); they keep their one column, where padding them like a
    per-token tensor would give a (B, 8) ratio under ``pad_to_multiple_of: 8`` that no longer broadcasts against the
    loss's (B, T) tokens. ``num_items_in_batch`` is not set here (a cross-process count; see :func:`count_loss_tokens`).

    >>> a = {"completion_ids": torch.tensor([[5, 6]]), "importance_sampling_ratio": torch.tensor([[0.9]])}
    >>> b = {"completion_ids": torch.tensor([[7]]), "importance_sampling_ratio": torch.tensor([[1.1]])}
    >>> out = take_rows([a, b], [(0, 0), (1, 0)], pad_token_id=0, pad_to_multiple_of=8,
    ...                 per_sequence=["importance_sampling_ratio"])
    >>> out["completion_ids"].shape, out["importance_sampling_ratio"].tolist()
    (torch.Size([2, 8]), [[0.8999999761581421], [1.100000023841858]])
    """
    out: dict[str, Any] = {}
    for key, (side, pad) in ROW_KEYS.items():
        present = [key in b for b in batches]
        if not any(present):
            continue
        if not all(present):
            raise ValueError(f"scored batches disagree on key {key!r}")
        value = pad_token_id if pad == "pad_token" else pad
        rows = [batches[b][key][r] for b, r in picks]
        if side == "none" or rows[0].dim() == 0 or key in per_sequence:
            out[key] = torch.stack(rows)
            continue
        width = max(batches[b][key].size(1) for b in {b for b, _ in picks})
        if pad_to_multiple_of:
            width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
        out[key] = torch.cat([_pad_to(row.unsqueeze(0), width, side, value) for row in rows], dim=0)
    return out


def per_sequence_keys(importance_sampling_mode: str | None) -> tuple[str, ...]:
    """The keys of a scored batch that hold one value per sequence under TRL's vLLM importance-sampling mode.

    >>> per_sequence_keys("sequence_mask"), per_sequence_keys("token_truncate"), per_sequence_keys(None)
    (('importance_sampling_ratio',), (), ())
    """
    return ("importance_sampling_ratio",) if str(importance_sampling_mode).startswith("sequence") else ()


def loss_mask(batch: dict) -> torch.Tensor:
    """The completion tokens that count in the loss (completion mask, times the tool mask when there is one)."""
    mask = batch["completion_mask"]
    return mask * batch["tool_mask"] if "tool_mask" in batch else mask


def count_loss_tokens(batch: dict, accelerator) -> torch.Tensor:
    """Completion tokens that count in the loss, summed over all processes (TRL's ``num_items_in_batch``)."""
    return accelerator.gather(loss_mask(batch).sum()).sum()


def combined_rewards(rewards_per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted sum over reward functions, NaN (unscored) entries skipped; rows scored by none stay NaN."""
    rewards = (rewards_per_func * weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
    rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    return rewards


def normalized_per_function(rewards_per_func: torch.Tensor, group_size: int) -> torch.Tensor:
    """Each reward function's values standardised within each group, as TRL's ``normalize_then_sum`` does."""
    grouped = rewards_per_func.view(-1, group_size, rewards_per_func.size(1))
    normed = (grouped - torch.nanmean(grouped, dim=1, keepdim=True)) / (nanstd(grouped, dim=1, keepdim=True) + 1e-4)
    return normed.view(-1, rewards_per_func.size(1))


def zero_std_groups(rewards_per_func: torch.Tensor, weights: torch.Tensor, group_size: int,
                    aggregation: str = "sum_then_normalize") -> torch.Tensor:
    """One bool per group of ``group_size`` consecutive rows: True when the group's rewards carry no signal.

    A group has no signal when the reward its advantages are computed from has (numerically) zero spread within the
    group, so TRL gives all its completions the same advantage: the weighted sum of the rewards
    (``sum_then_normalize``), or the weighted sum of each reward standardised within the group
    (``normalize_then_sum``, where rewards [1, 0] and [0, 0.5] sum to a spread but standardise to none; standardised
    values are of order 1 and TRL's 1e-4 epsilon alone leaves differences near 1e-4, so spreads under 1e-3 count as
    none there). Rows no reward scored are ignored; a group with fewer than two scored rows has no signal either.
    """
    tolerance = 1e-6
    if aggregation == "normalize_then_sum":
        rewards_per_func = normalized_per_function(rewards_per_func, group_size)
        tolerance = 1e-3
    rewards = combined_rewards(rewards_per_func, weights).view(-1, group_size)
    finite = ~torch.isnan(rewards)
    filled = torch.where(finite, rewards, torch.zeros_like(rewards))
    count = finite.sum(dim=1)
    mean = filled.sum(dim=1) / count.clamp(min=1)
    spread = torch.where(finite, (filled - mean.unsqueeze(1)).abs(), torch.zeros_like(filled)).amax(dim=1)
    return (count < 2) | (spread <= tolerance)


def trl_frac_zero_std(rewards_per_func: torch.Tensor, weights: torch.Tensor, group_size: int,
                      aggregation: str = "sum_then_normalize", scale_rewards: str = "group") -> float:
    """TRL's ``frac_reward_zero_std`` for a batch: the share of rows whose reward std, the one TRL scales advantages by,
    is ``torch.isclose`` to 0 (|std| <= 1e-8), computed exactly as TRL computes it for the batch it scores.

    It differs from :func:`zero_std_groups` on near-flat groups: a group whose rewards differ only by float noise
    (a judge scoring identical texts 1e-7 apart) has signal here and none there.

    >>> trl_frac_zero_std(torch.tensor([[1.0], [1.0], [0.0], [1.0 + 1e-7]]), torch.tensor([1.0]), 2)
    0.5
    """
    if aggregation == "normalize_then_sum":
        rewards = combined_rewards(normalized_per_function(rewards_per_func, group_size), weights)
        std = nanstd(rewards) if rewards.numel() > 1 else torch.zeros(())
        return float(torch.isclose(std, torch.zeros_like(std)))
    rewards = combined_rewards(rewards_per_func, weights)
    if scale_rewards == "batch":
        std = nanstd(rewards) if rewards.numel() > 1 else torch.zeros(())
        return float(torch.isclose(std, torch.zeros_like(std)))
    if group_size < 2:
        return 1.0
    std = nanstd(rewards.view(-1, group_size), dim=1)
    return torch.isclose(std, torch.zeros_like(std)).float().mean().item()


def batch_advantages(rewards_per_func: torch.Tensor, weights: torch.Tensor, group_size: int, scale_rewards: str,
                     aggregation: str = "sum_then_normalize") -> torch.Tensor:
    """GRPO advantages for a whole (gathered) batch, following the trainer's ``scale_rewards`` and aggregation.

    Only needed when a batch is assembled from several generation rounds and the advantages depend on the whole
    batch (``scale_rewards: batch``, ``normalize_then_sum``); with per-group scaling each group's advantages are the
    ones TRL computed when it scored the group.
    """
    eps = 1e-4
    if aggregation == "normalize_then_sum":
        rewards = combined_rewards(normalized_per_function(rewards_per_func, group_size), weights)
        advantages = (rewards - torch.nanmean(rewards)) / (nanstd(rewards) + eps)
        return torch.nan_to_num(advantages, nan=0.0)
    rewards = combined_rewards(rewards_per_func, weights)
    grouped = rewards.view(-1, group_size)
    advantages = (grouped - torch.nanmean(grouped, dim=1, keepdim=True)).view(-1)
    if scale_rewards == "group":
        advantages = advantages / (nanstd(grouped, dim=1, keepdim=True).expand_as(grouped).reshape(-1) + eps)
    elif scale_rewards == "batch":
        advantages = advantages / (nanstd(rewards) + eps)
    return torch.nan_to_num(advantages, nan=0.0)


def vllm_importance_sampling_ratio(old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor, mode: str,
                                   clip_min: float | None, clip_max: float | None) -> torch.Tensor:
    """The vLLM importance-sampling ratio exactly as TRL computes it from old and sampling log-probs.

    Needed for rows whose old log-probs were recomputed after splicing (their padding changed); TRL computes this
    inside ``_generate_and_score_completions`` (TRL 1.16) and exposes no function for it. A test compares this with
    the ratio TRL itself produced for an unspliced batch, so a change in TRL's formula fails the suite.
    """
    diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)  # unscored tokens: ratio exactly 1, as in TRL
    if mode in ("sequence_mask", "sequence_truncate"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode in ("sequence_truncate", "token_truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    if mode in ("sequence_mask", "token_mask"):
        low = clip_min if clip_min is not None else -math.inf
        high = clip_max if clip_max is not None else math.inf
        return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)
    raise ValueError(f"unknown vllm_importance_sampling_mode {mode!r}")
