"""What TRL's ``AsyncGRPOTrainer`` (TRL 1.16, ``trl.experimental.async_grpo``) needs to train on a CPU: stand-ins for
its GPU-only parts, for tests and CPU benchmarks. On GPUs nothing here is used.

TRL's async trainer is GPU-only in three places, each replaced here where the device is not CUDA (the patches live in
:func:`rookgrpo.trl_compat.async_grpo_on_cpu`, with TRL's other private names):

- the loss forward packs each group's samples into a token tree and runs attention through FlashAttention-3's varlen
  kernel, fetched from the hub by the ``kernels`` package (``packing._flash_attn``): :func:`varlen_attention` computes
  the same attention in plain torch (per segment, causal aligned bottom-right as FlashAttention aligns it when a
  segment has fewer queries than keys);
- it asks ``torch.cuda`` for the device's name for MFU metrics (``get_peak_flops_per_device``): off CUDA the peak is
  unknown and MFU is off;
- weight sync is NCCL (``WeightTransferClient``): pass
  :class:`rookgrpo.vllm_cpu_transport.AsyncCPUWeightTransfer` as ``weight_transfer``.

And one in vLLM's CPU build, for the server the rollouts come from: TRL's rollout worker seeds each request, and
vLLM 0.31's CPU model runner then fails on a chunked prefill ("CPU Generator does not use offset"), so the server runs
with chunked prefill off (:data:`SERVER_FLAGS`).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

#: ``vllm serve`` flags for a CPU server TRL's async rollout worker can use (see the module docstring).
SERVER_FLAGS = ("--no-enable-chunked-prefill", "--max-num-batched-tokens", "16384")


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, softmax_scale=None,
                     causal=True, window_size=(-1, -1), softcap=None, **kwargs):
    """FlashAttention's ``flash_attn_varlen_func`` in plain torch: ``q`` (total_q, heads, dim), ``k``/``v``
    (total_k, kv_heads, dim), segments given by the cumulative lengths; returns (total_q, heads, dim)."""
    import torch

    if window_size not in (None, (-1, -1)) or softcap:
        raise NotImplementedError("the CPU stand-in for FlashAttention has no sliding window or softcap")
    heads, kv_heads, dim = q.shape[1], k.shape[1], q.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(dim)
    out = torch.empty_like(q)
    for i in range(len(cu_seqlens_q) - 1):
        qs, qe, ks, ke = (int(x) for x in (cu_seqlens_q[i], cu_seqlens_q[i + 1], cu_seqlens_k[i], cu_seqlens_k[i + 1]))
        query, key, value = q[qs:qe].transpose(0, 1), k[ks:ke].transpose(0, 1), v[ks:ke].transpose(0, 1)
        if kv_heads != heads:
            key = key.repeat_interleave(heads // kv_heads, dim=0)
            value = value.repeat_interleave(heads // kv_heads, dim=0)
        scores = (query.float() @ key.float().transpose(1, 2)) * scale
        if causal:
            lq, lk = qe - qs, ke - ks
            allowed = torch.ones(lq, lk, dtype=torch.bool).tril(diagonal=lk - lq)
            scores = scores.masked_fill(~allowed, float("-inf"))
        out[qs:qe] = (scores.softmax(-1) @ value.float()).transpose(0, 1).to(q.dtype)
    return out


#: What ``packing._flash_attn()`` returns on CPU: an object with FlashAttention's ``flash_attn_varlen_func``.
KERNEL = SimpleNamespace(flash_attn_varlen_func=varlen_attention)
