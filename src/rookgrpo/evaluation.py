"""Held-out evaluation of a model on prompts, for any task: greedy (or seeded, sampled) completions, the reference
answers' teacher-forced NLL, and means with their standard errors. Task packs score the completions (the chess pack's
``rookgrpo evaluate``); the ``heldout_eval`` callback runs an evaluator during training.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

from .errors import ConfigError


def pick_device(device: str | None = None):
    """The device evaluation runs on: ``device`` as given (``cpu``, ``cuda``, ``cuda:1``, ``mps``), or with ``None``
    or ``"auto"`` the first GPU when there is one (CUDA, then Apple's MPS), else the CPU.

    >>> pick_device("cpu")
    device(type='cpu')
    """
    import torch

    if device not in (None, "auto"):
        try:
            chosen = torch.device(device)
        except RuntimeError as exc:
            raise ConfigError(f"--device: {device!r} is not a device ({exc}); use auto, cpu, cuda or cuda:N.") from None
        if chosen.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"--device: {device} asked for, but torch sees no CUDA device here; use --device cpu.")
        return chosen
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def generate_completions(model_path: str, prompts: Sequence[str], max_new_tokens: int, batch_size: int = 32,
                         progress: bool = True, temperature: float = 0.0, seed: int = 0,
                         device: str | None = None) -> list[str]:
    """Completions for ``prompts`` (left-padded batches, stop at EOS): greedy, or sampled when ``temperature`` > 0,
    on ``device`` (:func:`pick_device`: a GPU when there is one).

    Sampling measures the policy GRPO actually trains on; it is seeded, so a rerun draws the same completions.
    """
    if temperature < 0:
        raise ConfigError(f"temperature: expected 0 (greedy) or a positive value, got {temperature}.")
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .assets import resolve_model

    path = resolve_model(model_path)
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path).to(pick_device(device))
    model.eval()
    if temperature > 0:
        sampling = {"do_sample": True, "temperature": temperature, "top_k": 0}
        torch.manual_seed(seed)  # greedy decoding leaves the caller's global RNG alone (CUDA's too: seeded here)
    else:
        sampling = {"do_sample": False}
    bar = tqdm(total=len(prompts), desc="generating", disable=not progress, unit="prompt")
    out = complete(model, tokenizer, prompts, max_new_tokens, batch_size, on_batch=bar.update, **sampling)
    bar.close()
    return out


def complete(model, tokenizer, prompts: Sequence[str], max_new_tokens: int, batch_size: int = 32, on_batch=None,
             **sampling) -> list[str]:
    """Completions of ``prompts`` by a loaded ``model`` (left-padded batches, stop at EOS; greedy unless ``sampling``
    says otherwise). Uses the model as it is (train or eval mode): callers choose.

    A model sharded over several processes (FSDP2, DeepSpeed ZeRO-3) decodes in step on every rank (``synced_gpus``):
    each forward gathers weights from every rank, so a rank whose answers end a token earlier keeps stepping until all
    have ended, instead of leaving the others waiting in a collective. (transformers syncs ZeRO-3 by itself, and FSDP2
    only for models it sharded itself, not accelerate's.)"""
    import torch

    if "synced_gpus" not in sampling and _decodes_across_ranks(model):
        sampling = {**sampling, "synced_gpus": True}
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    out: list[str] = []
    try:
        for start in range(0, len(prompts), batch_size):
            batch = list(prompts[start: start + batch_size])
            enc = tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
            # no_grad, never inference_mode: a sharded model's (FSDP2) gathered buffers would become inference
            # tensors, which its next training forward may not update in place.
            with torch.no_grad():
                ids = model.generate(**enc, max_new_tokens=max_new_tokens, **({"do_sample": False} | sampling),
                                     pad_token_id=pad, eos_token_id=tokenizer.eos_token_id)
            out += tokenizer.batch_decode(ids[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            if on_batch is not None:
                on_batch(len(batch))
    finally:
        tokenizer.padding_side = side
    return out


def _decodes_across_ranks(model) -> bool:
    """Whether ``model``'s weights are sharded over the processes of a distributed run (FSDP2 DTensors, ZeRO-3)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return False
    from .dynamics.deepspeed import is_zero3_param
    from .dynamics.sharding import is_sharded

    return is_sharded(model) or any(is_zero3_param(p) for p in model.parameters())


def reference_nll(model, tokenizer, prompts: Sequence[str], completions: Sequence[str], batch_size: int = 64) -> list[float]:
    """Teacher-forced negative log-likelihood of each reference ``completion`` after its prompt, in nats per completion
    token (the end-of-text token included when the tokenizer has one), by a loaded ``model`` as it is.

    Why: it moves before greedy accuracy does. A policy that pushes down the tokens of right answers (the "likelihood
    displacement" of negative-gradient updates) raises it while its greedy answers still look the same. It needs no
    sampling and no engine, so it is cheap to log during training.
    """
    import torch

    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos[0] if eos else 0)
    out: list[float] = []
    for start in range(0, len(prompts), batch_size):
        p_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts[start: start + batch_size]]
        c_ids = [tokenizer(c, add_special_tokens=False)["input_ids"] + eos
                 for c in completions[start: start + batch_size]]
        rows = [p + c for p, c in zip(p_ids, c_ids)]
        width = max(map(len, rows))
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=model.device)
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], device=model.device)
        with torch.no_grad():  # not inference_mode: see complete()
            logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
        for b, (p, c) in enumerate(zip(p_ids, c_ids)):
            span = logp[b, len(p) - 1: len(p) - 1 + len(c)]  # position t predicts token t + 1
            out.append(float(-span.mean()) if len(c) else float("nan"))
    return out


def mean_se(values: Sequence[float], clusters: Sequence[Hashable] | None = None) -> tuple[float, float]:
    """Mean and its standard error over ``values`` (NaN entries skipped); NaNs when nothing is left.

    ``clusters`` (one label per value) marks rows that are not independent, such as copies of one prompt: the error is
    then the cluster-robust one, which treats each cluster's rows as one draw. With every label distinct it is the
    plain standard error; with every row repeated k times it is the plain error of the distinct rows, so copies of a
    prompt do not make a result look surer than its distinct prompts can show.

    Example (the second list repeats each row of the first three times):
        >>> [round(x, 4) for x in mean_se([1.0, 0.0, 0.0, 1.0])]
        [0.5, 0.2887]
        >>> [round(x, 4) for x in mean_se([1.0, 0.0, 0.0, 1.0] * 3, clusters=[0, 1, 2, 3] * 3)]
        [0.5, 0.2887]
    """
    if clusters is None:
        clusters = range(len(values))
    kept = [(v, c) for v, c in zip(values, clusters, strict=True) if not math.isnan(v)]
    n = len(kept)
    if n == 0:
        return float("nan"), float("nan")
    mean = sum(v for v, _ in kept) / n
    residual: dict[Hashable, float] = {}
    for v, c in kept:
        residual[c] = residual.get(c, 0.0) + v - mean
    g = len(residual)
    if g < 2:
        return mean, 0.0
    return mean, math.sqrt(g / (g - 1) * sum(r * r for r in residual.values())) / n


def prompt_clusters(prompts: Sequence[str]) -> list[int]:
    """One label per prompt: the index of its first copy, so identical prompts share a label (:func:`mean_se`)."""
    first: dict[str, int] = {}
    return [first.setdefault(p, i) for i, p in enumerate(prompts)]
