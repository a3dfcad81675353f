"""Everything rookgrpo reads or writes of TRL's ``GRPOTrainer`` that is not TRL's public API, in one place.

Checked against TRL 1.10.0 (the oldest supported, ``make test-oldest-trl``) and the version in ``constraints.txt``
(what ``make test`` installs). When a TRL release changes one of these, this module is where it breaks, and the suite's
tests of each hook say which.

Attributes (read or written through the helpers below, never directly by a callback):

- ``trainer._metrics[mode][name]``: the lists TRL averages into each log entry and then clears. rookgrpo callbacks
  add their values with :func:`log_metric` and read the pending ones with :func:`pending_metrics`, so a value
  lands in the same log entry as TRL's own for that step; :func:`pending_log_entry` names them as TRL's ``log()``
  will (``eval_`` during an evaluation, where ``trainer.model.training`` is off).
- ``trainer._logs``: TRL's completions table (prompt, completion, rewards, advantages of the last generation batch),
  which ``zero_std_resampling`` widens while it scores replacement rounds and rewrites to the optimised batch
  (:func:`widen_completion_table`, :func:`completion_table`, :func:`rewrite_completion_table`). Relies on: a dict of
  ``deque`` columns with a ``maxlen``, ``rewards`` and ``extra`` dicts of such columns.
- ``trl.generation.vllm_generation.VLLMClient`` (the client class TRL's server mode builds):
  :func:`replace_vllm_client`, for the CPU weight transport (:mod:`rookgrpo.vllm_cpu_transport`).
- ``trl.experimental.async_grpo`` (TRL 1.16: ``AsyncGRPOConfig``, the config of ``AsyncGRPOTrainer``, which is not a
  ``GRPOTrainer``): :func:`is_async_grpo_args`, by which rookgrpo callbacks refuse it; ``async_grpo_trainer.
  get_peak_flops_per_device`` and ``packing._flash_attn`` (:func:`async_grpo_on_cpu`: the two GPU-only parts that stop
  it on CPU).
- ``trainer.vllm_generation`` (TRL's vLLM backend: ``sync_weights()``, ``llm``, ``mode``, ``vllm_client``) and
  ``trainer._last_loaded_step`` (the step whose weights TRL last pushed to vLLM): :func:`sync_vllm_weights`, and
  :mod:`rookgrpo.vllm_compat` (vLLM's own internals) for the engine.
- ``trl.trainer.grpo_trainer.use_adapter`` (``zero_std_resampling``'s reference log-probs of a PEFT model),
  ``trl.trainer.utils.RepeatSampler`` (the samplers), ``trl.trainer.utils.nanstd`` (advantages recomputed as TRL
  computes them) and ``trl.trainer.utils.add_fused_lm_head`` (per-task temperatures in the loss): imported where they
  are used, listed here.

Methods ``RookGRPOTrainer`` overrides (each calls ``super()`` and adds one dispatch point; ``trainer.py``):

- ``_generate_and_score_completions(inputs)``: the scored batch, for ``on_scored_batch`` (zero-std resampling,
  selection, diagnostics). Relies on: it returns the dict of tensors the loss consumes, with ``advantages``.
- ``_calculate_rewards(inputs, prompts, completions, completion_ids_list)``: per-function rewards, for resampling, and
  reward isolation (:mod:`rookgrpo.rewards.isolation`). Relies on: it calls the functions ``trainer.reward_funcs`` holds
  when it runs (rookgrpo puts isolating wrappers there for the call and restores the list after it), converts ``None``
  to NaN, and returns the rewards gathered over processes, each process's rows contiguous in process order.
- ``_generate(prompts)``: generation, wrapped for per-task sampling settings and the phase timer.
- ``_get_per_token_logps_and_entropies(...)``: the policy's token log-probs, for ``on_loss_logps`` (KL cap).
- ``_get_train_sampler(dataset)``: the sampler, for per-task batches and prompt selection.
- ``_save_checkpoint`` / ``_load_optimizer_and_scheduler``: callback state saved and restored with checkpoints.
- ``_clip_grad_norm`` (transformers): the gradient norm, for the KL-gradient meter.
- ``_load_best_model`` (transformers): ``load_best_model_at_end``'s load, after which vLLM is synced
  (:func:`sync_vllm_weights`).

The upstream changes that would let rookgrpo drop overrides are proposed in docs/trl-hooks.md.
"""

from __future__ import annotations

import functools
from collections import defaultdict, deque
from typing import Any

#: The TRL versions this module was checked against (oldest supported, newest tested).
CHECKED_TRL = ("1.10.0", "1.16.0")


def log_metric(trainer: Any, name: str, value: float, mode: str = "train") -> None:
    """Add ``value`` to the metric ``name`` of the log entry TRL writes next (averaged with the step's other values).

    ``mode`` is ``"train"`` or ``"eval"``, the entry it lands in.
    """
    trainer._metrics[mode][name].append(float(value))


def pending_metrics(trainer: Any, mode: str = "train") -> dict[str, list[float]]:
    """The values TRL holds for its next log entry, by metric name (a live view: do not modify it)."""
    return trainer._metrics[mode]


def pending_log_entry(trainer: Any) -> dict[str, float]:
    """What TRL's ``log()`` is about to merge into the entry being logged, as it will name it: the pending metrics of
    the current mode averaged (NaN values left out, as TRL does), with ``eval_`` in front of each name during an
    evaluation (TRL's own ``eval_reward``, ``eval_rewards/NAME/mean``, ...). A callback's ``before_log`` reads the
    whole entry as ``{**logs, **pending_log_entry(trainer)}``.
    """
    import math

    mode = metric_mode(trainer)
    out = {}
    for name, values in trainer._metrics[mode].items():
        valid = [v for v in values if not math.isnan(v)]
        if valid:
            out[f"eval_{name}" if mode == "eval" else name] = sum(valid) / len(valid)
    return out


def metric_mode(trainer: Any) -> str:
    """``"train"`` while the model trains, else ``"eval"``: the log entry a value computed now belongs to."""
    return "train" if trainer.model.training else "eval"


# ---- TRL's completions table (trainer._logs), which zero-std resampling rewrites ------------------------------------

TABLE_COLUMNS = ("prompt", "completion", "advantages")


def widen_completion_table(trainer, rows: int):
    """TRL's completions table (``trainer._logs``) keeps one generation batch; a resampling round can score more rows
    than that (DAPO-style oversampling), and the rows it would drop may be the ones trained on. Widen the table for
    the rounds; the returned function puts its length back (after the rewrite it holds the optimised batch)."""
    logs = getattr(trainer, "_logs", None)
    maxlen = getattr(logs.get("prompt") if isinstance(logs, dict) else None, "maxlen", None)
    if maxlen is None or rows <= maxlen:
        return lambda: None

    def resize(n: int) -> None:
        for key in ("images", "prompt", "completion", "advantages"):
            if isinstance(logs.get(key), deque):
                logs[key] = deque(logs[key], maxlen=n)
        for key in ("rewards", "extra"):
            if isinstance(logs.get(key), dict):
                columns = defaultdict(functools.partial(deque, maxlen=n))
                columns.update({name: deque(values, maxlen=n) for name, values in logs[key].items()})
                logs[key] = columns

    resize(rows)
    return functools.partial(resize, maxlen)


def completion_table(trainer, n: int) -> dict[str, list]:
    """The last ``n`` rows of TRL's completions table (``trainer._logs``): the round just scored, all processes."""
    logs = trainer._logs
    table = {key: list(logs[key])[-n:] for key in TABLE_COLUMNS}
    table["rewards"] = {name: list(values)[-n:] for name, values in logs["rewards"].items()}
    table["extra"] = {name: list(values)[-n:] for name, values in logs["extra"].items()}
    return table


def rewrite_completion_table(trainer, tables: list[dict], order: list[tuple[int, int]], scored) -> None:
    """Put the optimised batch in TRL's completions table, in place of the rows the rounds logged.

    TRL logs every scored round (dropped groups included, with that round's advantages); the table a user reads
    (``log_completions``, the wandb/trackio table) must show the completions that were trained on, with their rewards
    and final advantages. ``order`` lists (round, global row) for each row of the optimised batch, rank-major.
    """
    logs = trainer._logs
    for key in ("prompt", "completion"):
        logs[key].clear()
        logs[key].extend(tables[k][key][i] for k, i in order)
    for i, name in enumerate(trainer.reward_func_names):
        logs["rewards"][name].clear()
        logs["rewards"][name].extend(scored.rewards_per_func[:, i].tolist())
    logs["advantages"].clear()
    logs["advantages"].extend(trainer.accelerator.gather(scored.output["advantages"]).tolist())
    for name in list(logs["extra"]):
        columns = [t["extra"].get(name, []) for t in tables]
        logs["extra"][name].clear()
        if all(len(c) == len(t["prompt"]) for c, t in zip(columns, tables)):
            logs["extra"][name].extend(columns[k][i] for k, i in order)


# ---- TRL's vLLM backend ------------------------------------------------------------------------------------------

def sync_vllm_weights(trainer: Any) -> bool:
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


def replace_vllm_client(cls: type) -> type:
    """Make TRL's server mode build ``cls`` (a ``VLLMClient`` subclass with its interface) instead of TRL's client;
    returns the class it replaced. TRL's ``VLLMGeneration`` looks the name up in its module when it starts the client."""
    from trl.generation import vllm_generation

    previous = vllm_generation.VLLMClient
    vllm_generation.VLLMClient = cls
    return previous


def is_async_grpo_args(args: Any) -> bool:
    """Whether ``args`` configures TRL's ``AsyncGRPOTrainer`` (``trl.experimental.async_grpo.AsyncGRPOConfig``)."""
    return any(cls.__name__ == "AsyncGRPOConfig" and "async_grpo" in cls.__module__ for cls in type(args).__mro__)


def async_grpo_on_cpu() -> None:
    """Let TRL 1.16's ``AsyncGRPOTrainer`` build and train on CPU (:mod:`rookgrpo.async_grpo_cpu` says what and why):
    its MFU lookup asks ``torch.cuda`` for the device's name (off CUDA: no peak, MFU off) and its packed loss forward
    fetches FlashAttention-3 from the hub (off CUDA: :func:`rookgrpo.async_grpo_cpu.varlen_attention`). On CUDA TRL's
    own run. Idempotent."""
    import torch
    from trl.experimental.async_grpo import async_grpo_trainer, packing

    from .async_grpo_cpu import KERNEL

    lookup = async_grpo_trainer.get_peak_flops_per_device
    if getattr(lookup, "_rookgrpo_cpu", False):
        return

    @functools.wraps(lookup)
    def peak_flops(accelerator, dtype):
        if torch.device(accelerator.device).type != "cuda":
            return None
        return lookup(accelerator, dtype)

    kernel = packing._flash_attn

    @functools.wraps(kernel)
    def flash_attn():
        return kernel() if torch.cuda.is_available() else KERNEL

    peak_flops._rookgrpo_cpu = True
    async_grpo_trainer.get_peak_flops_per_device = peak_flops
    packing._flash_attn = flash_attn
