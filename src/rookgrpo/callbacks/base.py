"""Base class for callbacks that act on the trainer itself (not only observe it) and keep state across resumes."""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback


class RookCallback(TrainerCallback):
    """A ``TrainerCallback`` that :class:`~rookgrpo.RookGRPOTrainer` binds to itself and checkpoints.

    - ``bind(trainer)`` is called once the trainer is built, or when the callback is added with
      ``trainer.add_callback`` later: validate the config (raise ``ConfigError``) and keep a reference to the trainer
      for the hooks.
    - ``on_scored_batch(trainer, scored)`` (optional) sees each scored generation batch; set ``changes_batch = True``
      when it replaces rows, so it runs before the observers, or ``changes_mask = True`` when it changes which tokens
      the loss counts, so it runs on the final rows (after the hooks that replace rows) and before the observers.
    - ``on_loss_logps(trainer, inputs, per_token_logps)`` (optional): after each loss's own policy forward pass,
      with that loss's shallow copy of the batch (entries may be replaced before the loss reads them; the buffered
      batch is not touched) and the policy's per-token log-probs (``kl_cap``).
    - ``extra_loss(trainer, model)`` (optional): a term added to each training loss, already scaled for gradient
      accumulation, or ``None`` (``sft_anchor``).
    - ``before_log(trainer, logs)`` (optional): add values to each log entry before it is written (``diagnostics``).
    - ``state_dict()`` / ``load_state_dict()`` are saved in every checkpoint and restored on
      ``resume_from_checkpoint``, so a controller continues where it stopped.
    """

    state_key: str = "rook_callback"
    # True for callbacks whose ``on_scored_batch`` replaces rows of the batch (resampling): the trainer runs them before
    # the callbacks that only observe it, whatever the listed order.
    changes_batch: bool = False

    def bind(self, trainer: Any) -> None:
        self.trainer = trainer

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
