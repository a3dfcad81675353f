"""The callback contract: every hook :class:`~rookgrpo.RookGRPOTrainer` calls on a callback, declared in one place.

A plain ``transformers.TrainerCallback`` only observes the trainer through ``on_*`` events. A :class:`RookCallback`
may also act on it: change a scored batch, the loss, the sampler, the log. The trainer calls a hook only on the
callbacks that override it (:meth:`RookCallback.implements`), so a callback implements just the hooks it needs and
the rest cost nothing.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

#: The optional hooks, in the order a training step reaches them. The trainer registers a callback for a hook only
#: where the callback's class overrides it.
HOOKS = ("make_sampler", "on_scored_batch", "replacement_weights", "observe_replacements", "on_loss_logps",
         "extra_loss", "on_training_loss", "before_log")


class RookCallback(TrainerCallback):
    """A ``TrainerCallback`` that :class:`~rookgrpo.RookGRPOTrainer` binds to itself, calls at its hooks, and checkpoints.

    Subclass it, override the hooks you need, and register the class with
    :func:`~rookgrpo.callbacks.register_callback` so recipes can name it. With a plain TRL ``GRPOTrainer`` a
    ``RookCallback`` is an ordinary ``TrainerCallback``: only its ``on_*`` events run.

    Lifecycle (always called):

    - :meth:`bind` once the trainer is built, or when the callback is added later with ``trainer.add_callback``:
      validate the trainer's config (raise :class:`~rookgrpo.errors.ConfigError`) and keep the trainer.
    - :meth:`state_dict` / :meth:`load_state_dict`: saved under :attr:`state_key` in every checkpoint and restored on
      ``resume_from_checkpoint``, so a controller continues where it stopped; :meth:`save_files` /
      :meth:`load_files` for state that is no JSON (tensors), in the checkpoint's folder.

    Hooks (called only where a subclass overrides them, see :data:`HOOKS`):

    - :meth:`make_sampler`: the training sampler (one callback at most; ``prompt_selection``).
    - :meth:`on_scored_batch`: each scored generation batch, at its :attr:`batch_stage`.
    - :meth:`replacement_weights` / :meth:`observe_replacements`: how resampling draws replacement prompts, and what
      it drew (callbacks that keep a per-prompt history).
    - :meth:`on_loss_logps`: each loss's own policy log-probs (``kl_cap``).
    - :meth:`extra_loss`: a term added to each training loss (``sft_anchor``).
    - :meth:`on_training_loss`: each training loss, whole, before its backward pass (``doctor``'s KL gradient).
    - :meth:`before_log`: values added to each log entry (``diagnostics``).

    Example:
        >>> from rookgrpo.callbacks import RookCallback
        >>> class CountBatches(RookCallback):
        ...     state_key = "count_batches"
        ...     def __init__(self):
        ...         self.batches = 0
        ...     def on_scored_batch(self, trainer, scored):
        ...         self.batches += 1
        ...     def state_dict(self):
        ...         return {"batches": self.batches}
        ...     def load_state_dict(self, state):
        ...         self.batches = state["batches"]
        >>> CountBatches().implements("on_scored_batch"), CountBatches().implements("extra_loss")
        (True, False)
    """

    #: Key of this callback's state in a checkpoint's ``rookgrpo_callbacks.json``; unique per callback class.
    state_key: str = "rook_callback"
    #: When ``on_scored_batch`` runs, one of :data:`BATCH_STAGES`, whatever order the recipe lists the callbacks in
    #: (the listed order holds within a stage): ``"first_round"``, on the batch exactly as generated (before resampling
    #: replaces rows: a callback that judges the prompts it chose, ``prompt_selection``); ``"change_rows"``, replaces
    #: rows (``zero_std_resampling``); ``"change_mask"``, changes what the loss reads of the final rows, which tokens
    #: count (``completion_mask``) or their advantages (no built-in: the two that did lost the GRPO grid,
    #: docs/experiments/); ``"observe"`` (the default), sees the batch that is optimised (``diagnostics``).
    batch_stage: str = "observe"
    #: The trainer adds a column numbering the training rows (``rookgrpo.callbacks.selection.PROMPT_ID_COLUMN``)
    #: before building, for callbacks that keep a history per prompt.
    needs_prompt_ids: bool = False
    #: Whether the callback runs under TRL's ``AsyncGRPOTrainer`` (its ``on_*`` events and logs are all it needs); the
    #: others are refused there when the trainer is built (:meth:`on_init_end`), naming what they need.
    async_grpo: bool = False

    def implements(self, hook: str) -> bool:
        """Whether this callback's class overrides the optional hook ``hook`` (one of :data:`HOOKS`)."""
        if hook not in HOOKS:
            raise ValueError(f"{hook!r} is not a RookCallback hook; hooks: {', '.join(HOOKS)}")
        return getattr(type(self), hook) is not getattr(RookCallback, hook)

    # ---- lifecycle -------------------------------------------------------------------------------------------------

    def on_init_end(self, args, state, control, **kwargs):
        """Refuse, when the trainer is built, a trainer that never calls rookgrpo's hooks: TRL's ``AsyncGRPOTrainer``
        (not a ``GRPOTrainer``: its rollouts are generated and scored in a worker process against a vLLM server, up to
        ``max_staleness`` weight versions behind, and it binds no rookgrpo callback)."""
        from ..trl_compat import is_async_grpo_args

        if not self.async_grpo and is_async_grpo_args(args):
            from ..errors import ConfigError

            hooks = [h for h in HOOKS if self.implements(h)]
            needs = ", ".join(hooks) if hooks else "binding (it acts on the trainer it is bound to)"
            raise ConfigError(
                f"callbacks: {callback_name(self)} does not apply under TRL's AsyncGRPOTrainer: it needs "
                f"RookGRPOTrainer's {needs}, and AsyncGRPOTrainer calls none of them (it generates and scores rollouts "
                "in a worker process against a vLLM server, training on samples up to max_staleness weight versions "
                "old). Train with RookGRPOTrainer (vllm_mode: server is the same layout, synchronous), or leave the "
                "callback out: rookgrpo's reward functions and the doctor work under AsyncGRPOTrainer "
                "(docs/howto.md#three-vllm-layouts).")
        return super().on_init_end(args, state, control, **kwargs)

    def bind(self, trainer: Any) -> None:
        """Called once the trainer is built (or on ``add_callback``): check its config, keep a reference."""
        self.trainer = trainer

    def state_dict(self) -> dict:
        """JSON-serialisable state saved with every checkpoint."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned, on ``resume_from_checkpoint``."""

    def save_files(self, folder: str) -> None:
        """Write state that is no JSON (tensors) into a checkpoint's ``folder``. Called on every process: write what
        every process shares on the main one only (``self.trainer.args.should_save``), and what each holds alone (a
        shard of sharded weights) under a name of its own."""

    def load_files(self, folder: str) -> None:
        """Read what :meth:`save_files` wrote, on every process, on ``resume_from_checkpoint``."""

    # ---- optional hooks (the trainer calls them only where overridden) ---------------------------------------------

    def make_sampler(self, trainer: Any, dataset: Any, tasks: list | None = None) -> Any:
        """Return the training sampler in place of TRL's ``RepeatSampler``; ``tasks`` (each row's task) is given when
        generation batches must be task-homogeneous (``task_generation_kwargs``). The first callback that overrides
        it is used."""
        raise NotImplementedError

    def on_scored_batch(self, trainer: Any, scored: Any) -> None:
        """See each scored generation batch (a :class:`~rookgrpo.trainer.ScoredBatch`) after TRL scored it and before
        any loss is computed on it; a callback that changes it sets :attr:`batch_stage`."""

    def replacement_weights(self, pool: list[int]) -> list[float] | None:
        """How likely each dataset index in ``pool`` is to be drawn when resampling replaces a flat group (``None``:
        uniform). The first callback that overrides it is used."""
        return None

    def observe_replacements(self, trainer: Any, prompt_ids: list[int], flat: list[bool], rewards_per_func: Any) -> None:
        """Told which prompts resampling drew as replacements, whether each group came out flat, and their rewards."""

    def on_loss_logps(self, trainer: Any, inputs: dict, per_token_logps: Any) -> None:
        """After each loss's own policy forward pass: that loss's shallow copy of the batch (entries may be replaced
        before the loss reads them; the buffered batch is not touched) and the policy's per-token log-probs."""

    def extra_loss(self, trainer: Any, model: Any) -> Any:
        """A term added to each training loss, already scaled for gradient accumulation, or ``None``."""
        return None

    def on_training_loss(self, trainer: Any, model: Any, loss: Any) -> None:
        """Each training loss (a micro-batch's, extra terms included, graph attached) before the trainer's backward
        pass on it; not called for evaluation losses."""

    def before_log(self, trainer: Any, logs: dict) -> None:
        """Add values to each log entry before TRL writes it."""


#: The stages of ``on_scored_batch``, in the order they run (:attr:`RookCallback.batch_stage`).
BATCH_STAGES = ("first_round", "change_rows", "change_mask", "observe")
# The three flags batch_stage replaced: still read, with a warning once per class.
_OLD_FLAGS = {"sees_first_round": "first_round", "changes_batch": "change_rows", "changes_mask": "change_mask"}
_warned: set = set()


def batch_stage(callback) -> int:
    """The position of ``callback``'s :attr:`~RookCallback.batch_stage` in :data:`BATCH_STAGES` (the old flags
    ``sees_first_round``, ``changes_batch`` and ``changes_mask`` still count, with a warning naming the new field)."""
    stage = getattr(callback, "batch_stage", "observe")
    old = next((flag for flag in _OLD_FLAGS if getattr(callback, flag, False)), None)
    if old is not None and stage == "observe":
        stage = _OLD_FLAGS[old]
        if type(callback) not in _warned:
            _warned.add(type(callback))
            import warnings

            warnings.warn(f"{type(callback).__name__}.{old} = True is replaced by batch_stage = {stage!r}; the old "
                          "flag still works and will be removed in a later release.", FutureWarning, stacklevel=2)
    if stage not in BATCH_STAGES:
        from ..errors import ConfigError

        raise ConfigError(f"{type(callback).__name__}.batch_stage: {stage!r} is not a stage; use one of "
                          f"{', '.join(BATCH_STAGES)}.")
    return BATCH_STAGES.index(stage)


def callback_name(callback) -> str:
    """The name a recipe gives ``callback`` (its registered name), else its class name."""
    from .. import registry

    for name in registry.names("callback"):
        try:
            if registry.load("callback", name) is type(callback):
                return name
        except Exception:  # noqa: BLE001 - a pack whose extra is not installed names none of its callbacks here
            continue
    return type(callback).__name__
