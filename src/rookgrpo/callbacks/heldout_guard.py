"""``heldout_guard``: end the run with the weights of its best held-out evaluation, and say so when they are not the
last step's.

Why: GRPO can raise the training reward while held-out quality falls (the packaged chess model's A: answers under
`make train`'s recipe; the public RookWorld sweep). Without a guard a user gets back the last step's weights whatever
happened to them. With it, every time a held-out metric is logged (``heldout/*`` from ``heldout_eval`` or a task
pack's evaluation such as ``chess_eval``, or an evaluation's ``eval_*``) the guard scores the step (:class:`~rookgrpo.dynamics.heldout.HeldoutScore`: one metric, or a
weighted sum of several), keeps a copy of the trainable weights of the best step so far (the starting weights count,
scored by the held-out evaluation before the first step), and at the end of training loads them back and logs
one line naming the step, its score and the last evaluation's. The checkpoint saved after training then holds them.

Select on a panel of its own: the score a guard selects on is optimistic for the chosen step, so the numbers a run
reports must come from positions it did not select on (``rookgrpo/tiny-rookworld-val`` for the guard,
``rookgrpo/tiny-rookworld-eval`` for the report). The copy lives in CPU memory (the trainable parameters only: the
adapter of a PEFT model) and is saved with each checkpoint, so a resumed run keeps its best.

Several processes: every rank decides from the same numbers (the held-out evaluation hands every rank the main
process's values, and its step-0 entry is in every rank's history), so every rank restores the same step. Under
FSDP2 each rank copies and restores its own shards (``DTensor.to_local()``: 1/N of the weights per rank, never the
gathered whole). Under DeepSpeed ZeRO-1/2/3 each rank copies its share of the optimizer's fp32 master weights (its
partition: 1/N of them) and the restore writes them back into the optimizer and rebuilds the module's weights from
them, one parameter at a time (:mod:`rookgrpo.dynamics.deepspeed`), so what is saved, checkpointed and trained after
the restore is the best step's weights, master copy included. Where each rank holds its own part, the copy is saved
as a file per rank, and a run resumed on another number of ranks is refused, naming both. The start's copy is dropped
once a later step beats it: one copy per rank, of that rank's share, from then on. FSDP1 is refused (use FSDP2).
With vLLM generation (``use_vllm``) the restore also pushes the restored weights into vLLM through TRL's own weight
sync (:func:`rookgrpo.trl_compat.sync_vllm_weights`), so what generates afterwards samples them.

Logged: ``heldout_guard/score`` at each evaluated step (with a ``floor``, ``heldout_guard/below_floor``: 1 when the
floor ruled the step out), and at the end ``heldout_guard/best_step``, ``heldout_guard/restored`` (1 when the final
weights are the best step's instead of the last step's) and, with a floor, ``heldout_guard/steps_below_floor``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from ..dynamics.heldout import HeldoutScore, parse_metric
from ..dynamics import deepspeed as deepspeed_weights
from ..dynamics.sharding import is_sharded, local, reshard
from ..errors import ConfigError
from ..trl_compat import pending_log_entry, sync_vllm_weights
from .base import RookCallback
from .registry import register_callback

logger = logging.getLogger("rookgrpo.heldout_guard")
FILE = "heldout_guard_best.pt"


@register_callback("heldout_guard")
class HeldoutGuard(RookCallback):
    """Keep the weights of the best held-out evaluation and restore them at the end (see the module docstring).

    Args:
        metric: the logged metric to select on (``heldout/...`` from ``heldout_eval`` or a task pack's evaluation such
            as ``chess_eval``; ``eval_...`` from TRL's evaluation: ``eval_reward``, ``eval_rewards/NAME/mean``,
            ``eval_loss``), or a mapping of such names to weights, whose weighted sum is the score. Default: what the
            run's held-out evaluation offers (``heldout_eval``: the held-out version of the run's reward;
            ``chess_eval``: ``heldout/move_rank_reward``; TRL's evaluation: ``eval_reward``); with none, the guard
            refuses to start.
        mode: ``"max"`` (higher is better, the default) or ``"min"`` (e.g. ``eval_loss``).
        min_delta: a later step must beat the best by more than this to replace it, so evaluation noise alone does not
            move the choice.
        floor: a held-out metric (or a list of them) a step must hold to be chosen: only evaluations whose value is not
            below the first evaluation's (the start's) are eligible, and the start always is. The score still ranks
            the eligible steps. ``recipes/rookworld-tiny.yaml`` floors ``heldout/format_rate``: on the format-gate
            grid's runs it handed back the start on the seed where every later evaluation lost format
            (docs/experiments/2026-12-01-format-gate-grid-plan.md).

    Example::

        >>> from rookgrpo.callbacks import resolve_callback
        >>> cb = resolve_callback({"heldout_guard": {"metric": {"heldout/move_rank_reward": 1,
        ...                                                     "heldout/env_exact_accuracy": 1}}})
        >>> type(cb).__name__, cb.score.metric, cb.score.mode
        ('HeldoutGuard', {'heldout/move_rank_reward': 1.0, 'heldout/env_exact_accuracy': 1.0}, 'max')
    """

    state_key = "heldout_guard"

    def __init__(self, metric: str | Mapping[str, float] | None = None, mode: str = "max", min_delta: float = 0.0,
                 floor: str | list[str] | None = None):
        # Without a metric, bind() asks the run's held-out evaluation what to select on (default_metric).
        self.score = HeldoutScore(parse_metric(metric) if metric is not None else {}, mode=mode,
                                  min_delta=float(min_delta), floor=floor)
        self.start = None  # the trainable weights before the first step
        self.best_weights = None  # the trainable weights of score.best_step
        self.last_evaluated: int | None = None

    def bind(self, trainer) -> None:
        super().bind(trainer)
        if getattr(trainer, "is_fsdp_enabled", False) and int(
                getattr(trainer.accelerator.state.fsdp_plugin, "fsdp_version", 1) or 1) < 2:
            raise ConfigError("heldout_guard: FSDP1 flattens the weights into buffers the guard cannot copy or "
                              "restore. Use FSDP2 (fsdp_version: 2, as accelerate_config: fsdp does); the guard keeps "
                              "each rank's shards there.")
        if not self.score.metric:
            self.score.metric = default_metric(trainer)
        names = list(self.score.metric) + list(self.score.floor)
        if any(n.startswith("eval_") for n in names) and str(trainer.args.eval_strategy) in ("no", "IntervalStrategy.NO"):
            raise ConfigError(f"heldout_guard: metric {names} needs evaluations, but eval_strategy is 'no'. Set "
                              "eval_strategy (and an eval_dataset), or select on a held-out evaluation's heldout/* "
                              "metrics (heldout_eval, chess_eval).")
        from .heldout_eval import HeldoutEval

        if any(n.startswith("heldout/") for n in names) and not any(
                isinstance(cb, HeldoutEval) for cb in trainer.callback_handler.callbacks):
            logger.warning("%s is logged by a held-out evaluation (heldout_eval, or a task pack's such as "
                           "chess_eval), which this run does not have; unless another callback logs it, the guard "
                           "will keep the last step's weights.", names)

    # ---- the weights ----------------------------------------------------------------------------------------------

    def _named_params(self) -> list:
        """The trainable parameters as this rank holds them: whole, or this rank's shard (FSDP2's DTensors); under
        DeepSpeed the module's parameters, whose fp32 master the optimizer keeps."""
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        if not self._deepspeed:
            reshard(model)  # FSDP2's root keeps its weights gathered after a forward: copy and restore the shards
        return [(name, p) for name, p in model.named_parameters() if p.requires_grad]

    def _copy(self) -> dict:
        if self._deepspeed:
            return deepspeed_weights.copy_master(self._named_params())
        return {name: local(p).detach().to("cpu", copy=True) for name, p in self._named_params()}

    def _restore(self, weights: dict) -> None:
        import torch

        if self._deepspeed:
            deepspeed_weights.restore_master(self._named_params(), weights)
            return
        params = {name: local(p) for name, p in self._named_params()}
        with torch.no_grad():
            for name, value in weights.items():
                params[name].copy_(value.to(params[name].device))

    @property
    def _deepspeed(self) -> bool:
        return getattr(self.trainer, "is_deepspeed_enabled", False)

    @property
    def _per_rank(self) -> bool:
        """Whether each rank holds a part of its own (FSDP2 shards, DeepSpeed's master partitions), saved per rank."""
        return self._deepspeed or is_sharded(self.trainer.accelerator.unwrap_model(self.trainer.model))

    # ---- events ---------------------------------------------------------------------------------------------------

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step == 0:
            self.start = self._copy()

    def before_log(self, trainer, logs: dict) -> None:
        """Score this log entry's held-out metrics at the current step, whose weights the model still holds: those
        in ``logs`` and those TRL is about to average into it (``heldout/*`` from a held-out evaluation; TRL's own
        evaluation's ``eval_reward``, ``eval_rewards/NAME/mean``; transformers' ``eval_loss``), at step 0 too when
        TRL evaluates on start."""
        self._observe_start(trainer.state)
        entry = {**logs, **pending_log_entry(trainer)}  # TRL's own eval_* merge in its log()
        value = self.score.score_of(entry)
        step = trainer.state.global_step
        if value is None or step in self.score.scores:
            return
        self.score.scores[step] = value
        self.last_evaluated = step
        if self.score.eligible(step, entry) and self.score.better(value):
            self.score.take(step, value)
            self.best_weights = self.start if step == 0 and self.start is not None else self._copy()
            if step:
                self.start = None  # beaten: one copy per rank from here on
        logs["heldout_guard/score"] = value
        if self.score.floor:
            logs["heldout_guard/below_floor"] = int(step in self.score.below_floor)

    def _observe_start(self, state) -> None:
        """Score the starting weights from the held-out evaluation before the first step (logged at step 0); with none
        to score, the start's copy is dropped."""
        if self.start is None or 0 in self.score.scores:
            return
        for step, value in self.score.update([e for e in state.log_history if e.get("step") == 0]):
            if self.last_evaluated is None:
                self.last_evaluated = step
            if self.score.better(value):
                self.score.take(step, value)
                self.best_weights = self.start
        if state.global_step > 0 and 0 not in self.score.scores:
            self.start = None  # the start was never evaluated, so it can never be chosen

    def on_train_end(self, args, state, control, **kwargs):
        self._observe_start(state)
        best, step = self.score.best_step, state.global_step
        say = logger.warning if state.is_world_process_zero else logger.debug  # once, not once per rank
        if best is None or self.best_weights is None:
            say("no held-out evaluation of %s was logged, so the final weights are the last step's (%d).",
                list(self.score.metric), step)
            return
        restored = best != step
        if restored:
            self._restore(self.best_weights)  # on every rank: collective under DeepSpeed
            # vLLM holds its own copy of the weights, which TRL pushes only when the step moves: push the restored
            # ones now (TRL's own sync, colocate or server), or trainer.evaluate() and any later generation would
            # sample the discarded last step's.
            if sync_vllm_weights(self.trainer):
                logger.debug("vLLM's weights synced to the restored step %d's", best)
            last = self.score.scores.get(self.last_evaluated)
            say(
                "the final weights are step %d's, not step %d's: held-out score %.4f there (%s), the best "
                "of %d evaluations%s; the last evaluation (step %s) scored %s.", best, step, self.score.best,
                " + ".join(f"{w:g} x {n}" for n, w in self.score.metric.items()), len(self.score.scores),
                self._floor_text(), self.last_evaluated, "n/a" if last is None else f"{last:.4f}")
        else:
            logger.info("the last step (%d) is the best held-out evaluation (score %.4f); kept.", step,
                        self.score.best)
        state.log_history.append({"step": step, "heldout_guard/best_step": best,  # every rank's, as transformers'
                                  "heldout_guard/best_score": self.score.best, "heldout_guard/restored": int(restored),
                                  **({"heldout_guard/steps_below_floor": len(self.score.below_floor)}
                                     if self.score.floor else {})})

    def _floor_text(self) -> str:
        """What the floor ruled out, for the end-of-run line ("" without a floor)."""
        if not self.score.floor:
            return ""
        start = ", ".join(f"{n} {v:.4f}" for n, v in (self.score.floor_start or {}).items())
        out = self.score.below_floor
        ruled = f"step{'s' if len(out) > 1 else ''} {', '.join(map(str, out))}" if out else "none"
        return f" held to the floor ({start or ', '.join(self.score.floor)}), which ruled out {ruled}"

    # ---- checkpoints ----------------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return self.score.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.score.load_state_dict(state)

    def _file(self, folder: str) -> str:
        """The copy's file: one per rank where each holds its own part."""
        if self._per_rank:
            return os.path.join(folder, FILE.replace(".pt", f".rank{self.trainer.accelerator.process_index}.pt"))
        return os.path.join(folder, FILE)

    def save_files(self, folder: str) -> None:
        import torch

        if self.best_weights is not None and (self._per_rank or self.trainer.args.should_save):
            os.makedirs(folder, exist_ok=True)  # a rank may get here before the main process made the folder
            torch.save({"step": self.score.best_step, "weights": self.best_weights}, self._file(folder))

    def load_files(self, folder: str) -> None:
        import torch

        path = self._file(folder)
        size = self.trainer.accelerator.num_processes
        saved_parts = _saved_parts(folder)  # None: saved whole (or nothing saved)
        if saved_parts is not None and (not self._per_rank or saved_parts != size):
            raise ConfigError(f"heldout_guard: the checkpoint {folder} holds the guard's best weights as "
                              f"{saved_parts} ranks' parts (a file per rank), and this run "
                              f"{f'has {size} rank(s)' if self._per_rank else 'keeps whole weights'}. Resume it in the "
                              f"layout it was saved in ({saved_parts} processes, the same sharding), or delete the "
                              f"guard's files ({FILE.replace('.pt', '.rank*.pt')}) there to let it start choosing again.")
        if saved_parts is None and self._per_rank and os.path.exists(os.path.join(folder, FILE)):
            raise ConfigError(f"heldout_guard: the checkpoint {folder} holds the guard's best weights whole "
                              f"({FILE}), and this run keeps a part of them on each of its {size} ranks (FSDP2 or "
                              "DeepSpeed). Resume it in the layout it was saved in, or delete that file there to let the "
                              "guard start choosing again.")
        if os.path.exists(path):
            saved = torch.load(path, map_location="cpu", weights_only=True)
            if saved["step"] == self.score.best_step:
                self.best_weights = saved["weights"]
                return
        self.best_weights = None
        self.score.best_step = self.score.best = None  # the best's weights are gone: start choosing again


def default_metric(trainer) -> dict[str, float]:
    """What the guard selects on when the recipe names no metric: the first held-out evaluation's choice
    (``heldout_eval``: the held-out version of the run's reward; a task pack's its own, e.g. ``chess_eval``'s
    ``heldout/move_rank_reward``), else TRL's own evaluation's ``eval_reward`` where the run evaluates an
    ``eval_dataset``; otherwise a :class:`~rookgrpo.errors.ConfigError` naming the field."""
    from .heldout_eval import HeldoutEval

    for cb in trainer.callback_handler.callbacks:
        if isinstance(cb, HeldoutEval):
            metric = cb.guard_metric(trainer)
            if metric:
                return metric
            raise ConfigError(f"heldout_guard: metric is not set, and {cb.state_key} scores with its own evaluator or "
                              "rewards, so the guard cannot tell which of its heldout/* metrics to select on. Name one: "
                              "metric: heldout/NAME, or {heldout/A: 1, heldout/B: 1}.")
    if str(trainer.args.eval_strategy) not in ("no", "IntervalStrategy.NO") and \
            getattr(trainer, "eval_dataset", None) is not None:
        return {"eval_reward": 1.0}
    raise ConfigError("heldout_guard: metric is not set, and this run logs no held-out evaluation to select on. Add "
                      "one (heldout_eval, a task pack's such as chess_eval, or TRL's: an eval_dataset with "
                      "eval_strategy: steps), and name what to select on if it is not the default: metric: "
                      "heldout/NAME or eval_NAME.")


def _saved_parts(folder: str) -> int | None:
    """How many ranks' files the guard saved in a checkpoint folder (``None``: none; whole weights or nothing)."""
    import glob

    files = glob.glob(os.path.join(folder, FILE.replace(".pt", ".rank*.pt")))
    return len(files) or None
