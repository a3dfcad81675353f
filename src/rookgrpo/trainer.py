"""``RookGRPOTrainer``: TRL's ``GRPOTrainer`` that also takes rewards and callbacks by name.

The subclass stays thin on purpose. It resolves names into the objects ``GRPOTrainer`` expects, checks the inputs
that would otherwise fail deep inside a training step, and hands everything to ``super()``. Features live in
callbacks and reward modules. TRL's own methods are wrapped, never copied, so upgrades of TRL carry over.
With no rookgrpo feature switched on it trains exactly as ``GRPOTrainer`` does (tested: same losses and rewards).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from trl import GRPOTrainer

from .assets import resolve_model
from .callbacks.base import RookCallback, batch_stage
from .callbacks.registry import resolve_callbacks
from .config import _check_num_generations
from .errors import ConfigError
from .callbacks.nonfinite import SkipNonfinite
from .dynamics.attention import guard_masks, sdpa_backend_guard, unguarded_roles
from .dynamics.positions import MaskPositions
from .rewards.registry import resolve_reward_func
from . import vllm_compat


logger = logging.getLogger(__name__)


class RookGRPOTrainer(GRPOTrainer):
    """Drop-in ``GRPOTrainer``.

    Args beyond ``GRPOTrainer``'s:
        model: as in TRL, plus packaged short names such as ``"rookgrpo/tiny-random"``.
        reward_funcs: as in TRL, plus registered names, ``"pkg.mod:fn"`` and ``"path/file.py:fn"`` (a string that is
            none of these and looks like a model id is passed on and loaded as a reward model, as TRL does).
        callbacks: as in TRL, plus registered names, dotted paths and ``{"name": ..., **kwargs}`` mappings.
    """

    # Class-level defaults of every attribute the overridden TRL methods read, so each override calls straight through
    # to TRL on an instance whose ``__init__`` never ran (TRL's own tests build trainers with ``object.__new__``).
    _hooks_ready = False  # True once __init__ bound the callbacks; add_callback before that is TRL's own
    _phases = None  # a PhaseMeter once a callback asks for phase measurements (diagnostics)
    _last_rewards_per_func = None
    _task_settings = None
    _pool_by_task: dict[str, list[int]] | None = None  # built on the first resampled batch
    _loss_inputs = None  # during a loss with hooks, until its policy pass: the copy they may change
    _batch_hooks: tuple | list = ()
    _log_hooks: tuple | list = ()
    _loss_hooks: tuple | list = ()
    _extra_loss_hooks: tuple | list = ()
    _training_loss_hooks: tuple | list = ()
    grad_norm_before_clip = None  # the last optimizer step's gradient norm before clipping (None: not clipped)
    _replacement_hooks: tuple | list = ()
    _sampler_hook = None
    _weights_hook = None
    _guarded_masks: list | tuple = ()  # the roles whose SDPA masks no_fully_masked_rows guards
    _masks_checked = False  # whether the first training loss checked that the guard reached those masks
    _isolation = None  # a RewardIsolation while reward_isolation is on (rookgrpo.rewards.isolation)

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
        callbacks = resolve_callbacks(callbacks)
        if any(isinstance(cb, RookCallback) and cb.needs_prompt_ids for cb in callbacks or ()):
            train_dataset = _with_prompt_ids(train_dataset)
        _check_prompt_column(train_dataset, "train_dataset")
        _check_reward_columns(reward_funcs or [], train_dataset)
        if getattr(args, "task_generation_kwargs", None):
            _check_task_column(train_dataset, args.task_column, args.task_generation_kwargs)
        if getattr(args, "use_vllm", False):
            _check_vllm_model(model, args)
        super().__init__(
            model=model,
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            reward_processing_classes=reward_processing_classes,
            callbacks=callbacks,
            **kwargs,
        )
        if getattr(self.args, "use_vllm", False):
            vllm_compat.enable_cpu_weight_reload(self)
        if getattr(self.args, "reward_isolation", True):
            from .rewards.isolation import RewardIsolation

            self._isolation = RewardIsolation(self.reward_func_names, getattr(self.args, "reward_timeout", None),
                                              getattr(self.args, "reward_failure_patience", 3))
        if getattr(self.args, "task_generation_kwargs", None):
            from .dynamics.task_sampling import TaskSettings

            self._task_settings = TaskSettings(self, self.args.task_generation_kwargs)
        self._positions = MaskPositions(self, enabled=getattr(self.args, "position_ids_from_mask", True))
        self._guarded_masks = guard_masks(self, enabled=getattr(self.args, "no_fully_masked_rows", True))
        if getattr(self.args, "skip_nonfinite_updates", True) and not any(
                isinstance(cb, SkipNonfinite) for cb in self.callback_handler.callbacks):
            self.callback_handler.add_callback(SkipNonfinite())
        for callback in self._rook_callbacks():
            callback.bind(self)
        self._register_hooks()
        self._hooks_ready = True
        if getattr(self.args, "use_vllm", False):
            vllm_compat.warn_truncated_sampling(self)

    def _register_hooks(self) -> None:
        """Sort the bound callbacks' hooks into the lists the trainer calls; rerun whenever the callbacks change."""
        # Hooks that change the batch (resampling) run before hooks that observe it (diagnostics), whatever order the
        # recipe lists them in: an observer must see the batch that is optimised, and the time spent making it.
        # A hook that judges the batch as generated (prompt selection, learning from the prompts it chose) runs first;
        # one that changes which tokens the loss counts or their advantages runs on the final rows, before the observers.
        callbacks = self._rook_callbacks()
        hooks = [cb for cb in callbacks if cb.implements("on_scored_batch")]
        self._batch_hooks = sorted(hooks, key=batch_stage)
        self._log_hooks = [cb for cb in callbacks if cb.implements("before_log")]
        # Hooks on each loss (kl_cap): this loss's copy of the batch with the policy's log-probs from its forward pass.
        self._loss_hooks = [cb for cb in callbacks if cb.implements("on_loss_logps")]
        # Terms added to each training loss (sft_anchor), each already scaled for gradient accumulation.
        self._extra_loss_hooks = [cb for cb in callbacks if cb.implements("extra_loss")]
        # Observers of each whole training loss before its backward pass (doctor's KL gradient).
        self._training_loss_hooks = [cb for cb in callbacks if cb.implements("on_training_loss")]
        self._sampler_hook = next((cb for cb in callbacks if cb.implements("make_sampler")), None)
        self._weights_hook = next((cb for cb in callbacks if cb.implements("replacement_weights")), None)
        self._replacement_hooks = [cb for cb in callbacks if cb.implements("observe_replacements")]

    # ---- callbacks added or removed after the trainer was built -------------------------------------------------

    def add_callback(self, callback) -> None:
        """TRL's ``add_callback``; a rookgrpo callback (class or instance) is bound and its hooks registered, as if it
        had been passed to the constructor. If its ``bind`` refuses the trainer (``ConfigError``), it is removed again
        and the error raised, so the trainer is left as it was.

        Example::

            trainer.add_callback(SFTAnchor(data="rookgrpo/tiny-rookworld-train", tasks=["A"]))
        """
        if not self._hooks_ready:  # transformers and TRL add their own callbacks while building
            return super().add_callback(callback)
        before = {id(cb) for cb in self.callback_handler.callbacks}
        super().add_callback(callback)
        added = [cb for cb in self._rook_callbacks() if id(cb) not in before]
        dataset = self.train_dataset
        try:
            for cb in added:
                if cb.needs_prompt_ids:  # as the constructor does for the callbacks given to it
                    self.train_dataset = _with_prompt_ids(self.train_dataset)
                cb.bind(self)
        except Exception:
            for cb in added:
                self.callback_handler.remove_callback(cb)
            self.train_dataset = dataset
            raise
        self._register_hooks()

    def pop_callback(self, callback):
        """TRL's ``pop_callback``; a removed rookgrpo callback's hooks stop being called."""
        removed = super().pop_callback(callback)
        self._register_hooks()
        return removed

    def remove_callback(self, callback) -> None:
        """TRL's ``remove_callback``; a removed rookgrpo callback's hooks stop being called."""
        super().remove_callback(callback)
        self._register_hooks()

    # ---- hooks around TRL's generation step -------------------------------------------------------------------
    # With no rookgrpo callback and no task settings these call straight through to TRL (tested: identical runs).

    def _generate_and_score_completions(self, inputs):
        """TRL's generate-and-score, then the scored-batch hooks: batch-changing ones (resampling) first, then observers
        (diagnostics), each group in the listed order."""
        if self._task_settings is not None:
            from .dynamics.task_sampling import batch_task

            self._task_settings.apply(self, batch_task(inputs, self.args.task_column))
        output = super()._generate_and_score_completions(inputs)
        if not self._batch_hooks:
            return output
        scored = ScoredBatch(inputs=inputs, output=output, rewards_per_func=self._last_rewards_per_func,
                             first_output=output, score=self._score_rows)
        for hook in self._batch_hooks:
            hook.on_scored_batch(self, scored)
        return scored.output

    def training_step(self, model, inputs, num_items_in_batch=None):
        """TRL's training step; with phase measurement on, the loss (forward and backward) is measured as a phase:
        from ``compute_loss`` (after any generation in ``_prepare_inputs``) to the end of the backward pass."""
        try:
            return super().training_step(model, inputs, num_items_in_batch)
        finally:
            if self._phases is not None:
                self._phases.stop("loss")

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """TRL's loss, with per-task sampling: at the temperature that sampled the batch being optimised; a training
        loss's forward on CUDA without the cuDNN SDPA backend unless ``allow_cudnn_attention``
        (:mod:`rookgrpo.dynamics.attention`: the backward runs the kernel its forward chose, so excluding cuDNN from the
        forward keeps it out of the backward; generation, the reference's and the old policy's scoring and evaluation
        keep every backend, as in TRL).

        A training batch is generated once and optimised over several steps (``steps_per_generation``,
        ``num_iterations``); an evaluation between those steps generates at its own settings, so the temperature is
        set here, per loss, from the task of the batch the loss is about, not from the last generation call.
        """
        if self._task_settings is not None:
            self._task_settings.before_loss(self)
        training = torch.is_grad_enabled() and getattr(model, "training", True)  # TRL's tests pass no module
        if self._phases is not None and torch.is_grad_enabled():
            self._phases.start("loss")
        if self._loss_hooks:
            # A shallow copy: loss hooks may replace entries for this loss; the buffered batch that later steps and
            # iterations reuse (steps_per_generation, num_iterations) keeps its own.
            inputs = self._loss_inputs = dict(inputs)
        accelerator = getattr(self, "accelerator", None)  # a trainer built without __init__ (TRL's tests) has none
        backends = sdpa_backend_guard(getattr(accelerator, "device", "cpu"),
                                      getattr(getattr(self, "args", None), "allow_cudnn_attention", False)) \
            if training else contextlib.nullcontext()
        try:
            with backends:
                loss = super().compute_loss(model, inputs, return_outputs=return_outputs,
                                            num_items_in_batch=num_items_in_batch)
                for hook in self._extra_loss_hooks:
                    term = hook.extra_loss(self, model)
                    if term is not None:
                        loss = loss + term
        finally:
            self._loss_inputs = None
        if self._training_loss_hooks and training:
            for hook in self._training_loss_hooks:
                hook.on_training_loss(self, model, loss)
        if training and self._guarded_masks and not self._masks_checked:
            self._masks_checked = True
            _say_unguarded_masks(self)
        return loss

    def _clip_grad_norm(self, model):
        """transformers' clipping; the norm before clipping is kept (``grad_norm_before_clip``) so a callback at
        ``on_pre_optimizer_step`` can undo the clip factor on the gradients it reads."""
        norm = super()._clip_grad_norm(model)
        self.grad_norm_before_clip = norm
        return norm

    def _score_rows(self, rows: list[dict]):
        """Generate and score extra rows with TRL's own code; returns (scored batch, gathered rewards per func)."""
        output = super()._generate_and_score_completions(rows)
        return output, self._last_rewards_per_func

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        """TRL's reward calls, each isolated (``reward_isolation``, :mod:`rookgrpo.rewards.isolation`): a call that
        raises, times out or returns a bad result leaves its rows unscorable on every rank (all components NaN: TRL
        excludes them), counted in ``rewards/<name>/failed``; the gathered rewards are kept for the batch hooks."""
        isolation = self._isolation
        if isolation is not None:
            funcs = self.reward_funcs
            self.reward_funcs = isolation.wrap(funcs)  # TRL's _calculate_rewards calls what self.reward_funcs holds
        try:
            if self._phases is None:
                rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            else:
                with self._phases.measure("rewards"):
                    rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        finally:
            if isolation is not None:
                self.reward_funcs = funcs
        if isolation is not None:
            from accelerate.utils import gather_object

            from .trl_compat import log_metric, metric_mode

            rewards, metrics = isolation.apply(rewards, len(prompts), self.accelerator.gather, gather_object,
                                               self.accelerator.process_index, self.state.global_step,
                                               training=self.model.training)
            mode = metric_mode(self)
            for name, value in metrics.items():
                log_metric(self, name, value, mode)
        self._last_rewards_per_func = rewards
        return rewards

    def _generate(self, prompts):
        if self._phases is None:
            return super()._generate(prompts)
        with self._phases.measure("generation"):
            return super()._generate(prompts)

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        # Calls outside the loss (reference model, old policy) happen under no_grad in the scoring phase.
        if self._phases is None or torch.is_grad_enabled():
            out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        else:
            with self._phases.measure("reference"):
                out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        inputs, self._loss_inputs = self._loss_inputs, None
        if inputs is not None:  # the loss's own policy pass, its first (under no_grad in an evaluation loss)
            for hook in self._loss_hooks:
                hook.on_loss_logps(self, inputs, out[0])
        return out

    def log(self, logs, *args, **kwargs):
        """TRL's log, after callbacks with ``before_log`` (e.g. diagnostics) added values derived from the step."""
        for callback in self._log_hooks:
            callback.before_log(self, logs)
        return super().log(logs, *args, **kwargs)

    def measure_phases(self, reset_cuda_peaks: bool = False):
        """Switch phase measurement on (idempotent) and return the trainer's
        :class:`~rookgrpo.dynamics.phases.PhaseMeter` (``reset_cuda_peaks``: exact CUDA peaks per phase, resetting
        ``torch.cuda``'s peak; any caller asking turns it on)."""
        if self._phases is None:
            from .dynamics.phases import PhaseMeter

            self._phases = PhaseMeter(self.accelerator.device)
        self._phases.reset_cuda_peaks = self._phases.reset_cuda_peaks or bool(reset_cuda_peaks)
        return self._phases

    def _get_train_sampler(self, dataset=None):
        """TRL's sampler; a task-homogeneous one when ``task_generation_kwargs`` is set; the selecting callback's
        (``prompt_selection``) when there is one, task-homogeneous where needed."""
        selector = self._sampler_hook
        if selector is not None:
            dataset = self.train_dataset if dataset is None else dataset
            tasks = dataset[self.args.task_column] if self._task_settings is not None else None
            return selector.make_sampler(self, dataset, tasks)
        if self._task_settings is None:
            return super()._get_train_sampler(dataset) if dataset is not None else super()._get_train_sampler()
        from .dynamics.task_sampling import TaskGroupedRepeatSampler

        dataset = self.train_dataset if dataset is None else dataset
        return TaskGroupedRepeatSampler(
            data_source=dataset,
            tasks=dataset[self.args.task_column],
            mini_repeat_count=self.num_generations,
            batch_size=self.args.generation_batch_size // self.num_generations,
            repeat_count=self.num_iterations * self.args.steps_per_generation,
            shuffle=getattr(self, "shuffle_dataset", True),
            seed=self.args.seed,
        )

    def _replacement_pool(self, inputs: list[dict]) -> list[int]:
        """Dataset indices a resampled group may come from: the batch's task when batches are task-homogeneous."""
        n = len(self.train_dataset)
        if self._task_settings is None:
            return list(range(n))
        from .dynamics.task_sampling import batch_task, indices_by_task

        if self._pool_by_task is None:
            self._pool_by_task = indices_by_task(self.train_dataset[self.args.task_column])
        return self._pool_by_task.get(batch_task(inputs, self.args.task_column), list(range(n)))

    def _replacement_weights(self, pool: list[int]) -> list[float] | None:
        """How likely each pool prompt is to be drawn as a replacement: the selecting callback's keep probabilities
        (``prompt_selection``), so resampling skips prompts it predicts flat too; ``None`` (uniform) without one."""
        return None if self._weights_hook is None else self._weights_hook.replacement_weights(pool)

    def _observe_replacements(self, prompt_ids: list[int], flat: list[bool], rewards_per_func) -> None:
        """Tell the callbacks that keep a per-prompt history about the groups resampling drew as replacements."""
        for cb in self._replacement_hooks:
            cb.observe_replacements(self, prompt_ids, flat, rewards_per_func)

    CALLBACK_STATE_FILE = "rookgrpo_callbacks.json"

    def _rook_callbacks(self) -> list:
        return [cb for cb in self.callback_handler.callbacks if isinstance(cb, RookCallback)]

    def _save_checkpoint(self, model, trial):
        """TRL's checkpoint, plus the state of rookgrpo's controllers (beta, counters) next to it."""
        super()._save_checkpoint(model, trial)
        callbacks = self._rook_callbacks()
        if not callbacks:
            return
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        if self.args.should_save:
            with open(os.path.join(folder, self.CALLBACK_STATE_FILE), "w") as fh:
                json.dump({cb.state_key: cb.state_dict() for cb in callbacks}, fh)
        for callback in callbacks:  # every process: a callback holding a shard of its own (heldout_guard) writes it
            callback.save_files(folder)

    def _load_best_model(self) -> None:
        """``load_best_model_at_end``: transformers loads the best checkpoint's weights after the last step, which TRL
        never pushes to vLLM (its sync runs before a generation whose step moved); push them, so what generates
        afterwards (``trainer.evaluate()``, a server others sample from) samples the weights the run hands back."""
        super()._load_best_model()
        from .trl_compat import sync_vllm_weights

        sync_vllm_weights(self)

    def _load_optimizer_and_scheduler(self, checkpoint):
        """On resume, restore rookgrpo's controller state from the checkpoint (TRL's own hook for this), before the
        optimizer's: a callback that refuses the checkpoint (``heldout_guard`` saved per rank, resumed on another number
        of ranks) says so before anything else of it is loaded."""
        self._load_rook_callback_state(checkpoint)
        super()._load_optimizer_and_scheduler(checkpoint)

    def _load_rook_callback_state(self, checkpoint) -> None:
        path = os.path.join(checkpoint, self.CALLBACK_STATE_FILE) if checkpoint else None
        if path and os.path.exists(path):
            with open(path) as fh:
                states = json.load(fh)
            for callback in self._rook_callbacks():
                if callback.state_key in states:
                    callback.load_state_dict(states[callback.state_key])
                    callback.load_files(checkpoint)


def _say_unguarded_masks(trainer) -> None:
    """Once, after the first training loss: name the models whose masks ``no_fully_masked_rows`` did not reach."""
    roles = unguarded_roles(trainer)
    if roles and trainer.accelerator.is_main_process:
        logger.warning("no_fully_masked_rows: the %s built no attention mask through transformers' mask registry in "
                       "the first training step (a model that builds its own masks), so its masks are left as they are "
                       "and a left-padded batch may hit the cuDNN attention fault (docs/howto.md); "
                       "skip_nonfinite_updates still keeps such a step out.", " and ".join(roles))


@dataclass
class ScoredBatch:
    """What the scored-batch hooks see and may change: the rows (``inputs``), TRL's scored batch for them
    (``output``), the rewards of every completion on every process (``rewards_per_func``, gathered by TRL), the
    batch as first scored (``first_output``), and ``score(rows)`` to generate and score more rows the same way.
    A hook that replaces rows (resampling) updates ``inputs``, ``output`` and ``rewards_per_func`` together."""

    inputs: list[dict]
    output: dict
    rewards_per_func: Any
    first_output: dict
    score: Callable[[list[dict]], tuple[dict, Any]]


def _with_prompt_ids(dataset: Any) -> Any:
    """The training data with a column numbering its rows, for callbacks that keep a history per prompt."""
    from .callbacks.selection import PROMPT_ID_COLUMN

    if dataset is None or not hasattr(dataset, "__len__") or not hasattr(dataset, "add_column"):
        return dataset  # streaming or a plain list: the callback's bind says what it needs
    if PROMPT_ID_COLUMN in dataset.column_names:
        dataset = dataset.remove_columns(PROMPT_ID_COLUMN)
    return dataset.add_column(PROMPT_ID_COLUMN, list(range(len(dataset))))


def _check_task_column(dataset: Any, column: str, per_task: dict) -> None:
    columns = getattr(dataset, "column_names", None)
    if columns is not None and column not in columns:
        raise ConfigError(
            f"task_generation_kwargs: needs a task column, but train_dataset has no {column!r} column (columns: "
            f"{', '.join(columns)}). Set task_column to the column naming each row's task."
        )
    if columns is not None:
        present = set(dataset[column])
        unknown = sorted(set(per_task) - {str(t) for t in present})
        if unknown:
            raise ConfigError(
                f"task_generation_kwargs: task(s) {unknown} do not occur in column {column!r} (tasks present: "
                f"{sorted(map(str, present))})."
            )


def _check_vllm_model(model: Any, args: Any) -> None:
    """``use_vllm`` with colocated generation: refuse a model the installed vLLM cannot serve, before its engine starts
    (:func:`rookgrpo.vllm_compat.check_servable`). A config that cannot be read here is left to TRL to report."""
    if getattr(args, "vllm_mode", "colocate") != "colocate":
        return
    config = getattr(model, "config", None)
    if config is None and isinstance(model, (str, os.PathLike)):
        try:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(str(model), trust_remote_code=getattr(args, "trust_remote_code", False))
        except Exception:  # noqa: BLE001 - TRL loads the model next and says what is wrong with it
            return
    if config is not None:
        vllm_compat.check_servable(config)


def _setup_reward(reward: Any, args: Any) -> Any:
    """Let a reward configure itself from the trainer config and fail early (e.g. Stockfish missing).

    A reward object with a ``setup(args)`` method returns the configured reward to use; others pass unchanged.
    """
    setup = getattr(reward, "setup", None)
    if callable(setup) and not isinstance(reward, type):
        return setup(args)
    return reward


def _check_reward_columns(reward_funcs: list, dataset: Any) -> None:
    """Rewards that read dataset columns (e.g. code_exec's ``tests``) declare them, and may check the rows
    (``check_rows(dataset)``); both before training."""
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
        check_rows = getattr(reward, "check_rows", None)
        if callable(check_rows) and hasattr(dataset, "__getitem__"):
            check_rows(dataset)  # e.g. code_exec: tests that name a helper nothing defines


def _check_prompt_column(dataset: Any, name: str) -> None:
    columns = getattr(dataset, "column_names", None)
    if columns is not None and "prompt" not in columns:
        raise ConfigError(
            f"{name}: no 'prompt' column (columns: {', '.join(columns)}). GRPO generates from prompts: rename the "
            "column holding them to 'prompt', or set dataset_prompt_column in the recipe."
        )
