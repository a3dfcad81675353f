"""``RookGRPOTrainer``: TRL's ``GRPOTrainer`` that also takes rewards and callbacks by name.

The subclass stays thin on purpose. It resolves names into the objects ``GRPOTrainer`` expects, checks the inputs
that would otherwise fail deep inside a training step, and hands everything to ``super()``. Features live in
callbacks and reward modules. TRL's own methods are wrapped, never copied, so upgrades of TRL carry over.
With no rookgrpo feature switched on it trains exactly as ``GRPOTrainer`` does (tested: same losses and rewards).
"""

from __future__ import annotations

import json
import os
from typing import Any

from trl import GRPOTrainer

from .assets import resolve_model
from .callbacks.registry import resolve_callbacks
from .config import _check_num_generations
from .errors import ConfigError
from .rewards.registry import resolve_reward_func


class RookGRPOTrainer(GRPOTrainer):
    """Drop-in ``GRPOTrainer``.

    Args beyond ``GRPOTrainer``'s:
        model: as in TRL, plus packaged short names such as ``"rookgrpo/tiny-random"``.
        reward_funcs: as in TRL, plus registered names, ``"pkg.mod:fn"`` and ``"path/file.py:fn"`` (a string that is
            none of these and looks like a model id is passed on and loaded as a reward model, as TRL does).
        callbacks: as in TRL, plus registered names, dotted paths and ``{"name": ..., **kwargs}`` mappings.
    """

    def __init__(
        self,
        model: Any,
        reward_funcs: Any = None,
        args: Any = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        reward_processing_classes: Any = None,
        callbacks: Any = None,
        **kwargs: Any,
    ):
        if args is not None:
            _check_num_generations(args.num_generations)
        if isinstance(model, str):
            model = resolve_model(model)
        if reward_funcs is not None:
            entries = reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
            reward_funcs = [_setup_reward(resolve_reward_func(entry), args) for entry in entries]
            if not reward_funcs:
                raise ConfigError("reward_funcs: the list is empty. Name at least one reward, e.g. reward_funcs: [uci_charset].")
        _check_prompt_column(train_dataset, "train_dataset")
        _check_reward_columns(reward_funcs or [], train_dataset)
        super().__init__(
            model=model,
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            reward_processing_classes=reward_processing_classes,
            callbacks=resolve_callbacks(callbacks),
            **kwargs,
        )
        for callback in self._rook_callbacks():
            callback.bind(self)

    CALLBACK_STATE_FILE = "rookgrpo_callbacks.json"

    def _rook_callbacks(self) -> list:
        from .callbacks.base import RookCallback

        return [cb for cb in self.callback_handler.callbacks if isinstance(cb, RookCallback)]

    def _save_checkpoint(self, model, trial):
        """TRL's checkpoint, plus the state of rookgrpo's controllers (beta, counters) next to it."""
        super()._save_checkpoint(model, trial)
        callbacks = self._rook_callbacks()
        if callbacks and self.args.should_save:
            from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

            folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            with open(os.path.join(folder, self.CALLBACK_STATE_FILE), "w") as fh:
                json.dump({cb.state_key: cb.state_dict() for cb in callbacks}, fh)

    def _load_optimizer_and_scheduler(self, checkpoint):
        """On resume, restore rookgrpo's controller state from the checkpoint (TRL's own hook for this)."""
        super()._load_optimizer_and_scheduler(checkpoint)
        path = os.path.join(checkpoint, self.CALLBACK_STATE_FILE) if checkpoint else None
        if path and os.path.exists(path):
            with open(path) as fh:
                states = json.load(fh)
            for callback in self._rook_callbacks():
                if callback.state_key in states:
                    callback.load_state_dict(states[callback.state_key])


def _setup_reward(reward: Any, args: Any) -> Any:
    """Let a reward configure itself from the trainer config and fail early (e.g. Stockfish missing).

    A reward object with a ``setup(args)`` method returns the configured reward to use; others pass unchanged.
    """
    setup = getattr(reward, "setup", None)
    if callable(setup) and not isinstance(reward, type):
        return setup(args)
    return reward


def _check_reward_columns(reward_funcs: list, dataset: Any) -> None:
    """Rewards that read dataset columns (e.g. code_exec's ``tests``) declare them; check before training."""
    columns = getattr(dataset, "column_names", None)
    if columns is None:
        return
    for reward in reward_funcs:
        missing = [c for c in getattr(reward, "required_columns", ()) if c not in columns]
        if missing:
            name = getattr(reward, "__name__", type(reward).__name__)
            raise ConfigError(
                f"reward_funcs: {name} needs dataset column(s) {missing}, which train_dataset lacks "
                f"(columns: {', '.join(columns)})."
            )


def _check_prompt_column(dataset: Any, name: str) -> None:
    columns = getattr(dataset, "column_names", None)
    if columns is not None and "prompt" not in columns:
        raise ConfigError(
            f"{name}: no 'prompt' column (columns: {', '.join(columns)}). GRPO generates from prompts: rename the "
            "column holding them to 'prompt', or set dataset_prompt_column in the recipe."
        )
