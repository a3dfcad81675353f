"""A CPU stand-in for cuDNN's SDPA kernel on H100/H200, fault included (pytorch/pytorch#196678), for the tests.

What it reproduces, and how:

- forward: masked logits filled with the finite -65504 (not -inf), as the cuDNN path does, so a fully masked query row
  softmaxes over its -65504s and its logsumexp is about -65504 + log(keys); outputs are otherwise exact attention;
- backward: the exact gradients, plus what the kernel's last key tile adds when the key length is 64 mod 128: a tile of
  128 keys half filled with zero padding that the mask does not cover. Each padded key scores ``q . 0 = 0``, so its
  probability is ``exp(0 - logsumexp)``, computed in float32 as the kernel does: for a row whose logsumexp is below
  about -88.7 that is inf, its ``dS = P (dP - D)`` is inf or NaN, and ``dS @ K_pad`` (zeros) is NaN in the query
  gradient. Rows with an ordinary logsumexp get exactly 0 from the tile.

Only calls with an explicit boolean mask take this path (the fault needs one); everything else goes to torch's own
SDPA. Install with :func:`patched` (a context manager) or monkeypatch ``torch.nn.functional.scaled_dot_product_attention``
with :func:`cudnn_like_sdpa`.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

FILL = -65504.0  # what the cuDNN path writes into masked logits (fp16's lowest finite value)
TILE = 128  # the kernel's key tile; a key length of 64 mod 128 leaves a half-filled last tile
STOCK_SDPA = F.scaled_dot_product_attention


class _CudnnLikeAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, scale):
        scores = (q @ k.transpose(-2, -1)) * scale
        scores = scores.masked_fill(~mask, FILL)
        lse = torch.logsumexp(scores, dim=-1, keepdim=True)
        p = torch.exp(scores - lse)
        out = p @ v
        ctx.save_for_backward(q, k, v, p, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, p, out, lse = ctx.saved_tensors
        scale = ctx.scale
        d_v = p.transpose(-2, -1) @ d_out
        d_p = d_out @ v.transpose(-2, -1)
        delta = (d_out * out).sum(-1, keepdim=True)
        d_s = p * (d_p - delta)
        d_q = d_s @ k * scale
        d_k = d_s.transpose(-2, -1) @ q * scale
        pad = (-k.shape[-2]) % TILE
        if pad == TILE // 2:  # the faulty tile: zero keys and values, unmasked
            p_pad = torch.exp((0.0 - lse).float()).to(q.dtype)  # float32 inside the kernel: overflows below -88.7
            d_s_pad = p_pad.expand(*p_pad.shape[:-1], pad) * (0.0 - delta)  # d_p of a zero value is 0
            k_pad = torch.zeros(*k.shape[:-2], pad, k.shape[-1], dtype=k.dtype, device=k.device)
            d_q = d_q + d_s_pad @ k_pad * scale
        return d_q, d_k, d_v, None, None


def cudnn_like_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """``scaled_dot_product_attention`` as cuDNN computes it with an explicit boolean mask (module docstring)."""
    if attn_mask is None or attn_mask.dtype != torch.bool or dropout_p or enable_gqa:
        return STOCK_SDPA(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                          scale=scale, enable_gqa=enable_gqa)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    mask = attn_mask.expand(query.shape[0], query.shape[1], query.shape[-2], key.shape[-2])
    return _CudnnLikeAttention.apply(query, key, value, mask, scale)


@contextlib.contextmanager
def patched():
    """Every SDPA call in the block goes through :func:`cudnn_like_sdpa` (transformers looks it up at call time)."""
    F.scaled_dot_product_attention = cudnn_like_sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = STOCK_SDPA
