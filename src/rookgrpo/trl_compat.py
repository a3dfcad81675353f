"""Everything rookgrpo reads or writes of TRL's ``GRPOTrainer`` that is not TRL's public API, in one place.

Checked against TRL 1.10.0 (the oldest supported, ``make test-oldest-trl``) and the version in ``constraints.txt``
(what ``make test`` installs). When a TRL release changes one of these, this module is where it breaks, and the suite's
tests of each hook say which.

Attributes (read or written through the helpers below, never directly by a callback):

- ``trainer._metrics[mode][name]``: the lists TRL averages into each log entry and then clears. rookgrpo callbacks
  add their values with :func:`log_metric` and read the pending ones with :func:`pending_metrics`, so a value
  lands in the same log entry as TRL's own for that step.
- ``trainer._logs``: TRL's completions table (prompt, completion, rewards, advantages of the last generation batch),
  which ``zero_std_resampling`` widens while it scores replacement rounds (``callbacks/zero_std.py``).

Methods ``RookGRPOTrainer`` overrides (each calls ``super()`` and adds one dispatch point; ``trainer.py``):

- ``_generate_and_score_completions(inputs)``: the scored batch, for ``on_scored_batch`` (zero-std resampling,
  selection, diagnostics). Relies on: it returns the dict of tensors the loss consumes, with ``advantages``.
- ``_calculate_rewards(inputs, prompts, completions, completion_ids_list)``: per-function rewards, for resampling.
- ``_generate(prompts)``: generation, wrapped for per-task sampling settings and the phase timer.
- ``_get_per_token_logps_and_entropies(...)``: the policy's token log-probs, for ``on_loss_logps`` (KL cap).
- ``_get_train_sampler(dataset)``: the sampler, for per-task batches and prompt selection.
- ``_save_checkpoint`` / ``_load_optimizer_and_scheduler``: callback state saved and restored with checkpoints.
- ``_clip_grad_norm`` (transformers): the gradient norm, for the KL-gradient meter.

The upstream changes that would let rookgrpo drop overrides are proposed in docs/trl-hooks.md.
"""

from __future__ import annotations

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


def metric_mode(trainer: Any) -> str:
    """``"train"`` while the model trains, else ``"eval"``: the log entry a value computed now belongs to."""
    return "train" if trainer.model.training else "eval"
