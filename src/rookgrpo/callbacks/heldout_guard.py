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
gathered whole), and saves them as a file per rank. FSDP1 and DeepSpeed ZeRO-3 are refused (untested here): use FSDP2,
or ZeRO-2, whose weights are whole on every rank.

Logged: ``heldout_guard/score`` at each evaluated step, and at the end ``heldout_guard/best_step`` and
``heldout_guard/restored`` (1 when the final weights are the best step's instead of the last step's).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from ..dynamics.heldout import HeldoutScore, parse_metric
from ..dynamics.sharding import is_sharded, local, reshard
from ..errors import ConfigError
from ..trl_compat import pending_metrics
from .base import RookCallback
from .registry import register_callback

logger = logging.getLogger("rookgrpo.heldout_guard")
FILE = "heldout_guard_best.pt"


@register_callback("heldout_guard")
class HeldoutGuard(RookCallback):
    """Keep the weights of the best held-out evaluation and restore them at the end (see the module docstring).

    Args:
        metric: the logged metric to select on (``heldout/...`` from ``heldout_eval`` or ``chess_eval``, ``eval_...``
            from an evaluation), or a mapping of such names to weights, whose weighted sum is the score.
        mode: ``"max"`` (higher is better, the default) or ``"min"`` (e.g. ``eval_loss``).
        min_delta: a later step must beat the best by more than this to replace it, so evaluation noise alone does not
            move the choice.

    Example::

        >>> from rookgrpo.callbacks import resolve_callback
        >>> cb = resolve_callback({"heldout_guard": {"metric": {"heldout/move_rank_reward": 1,
        ...                                                     "heldout/env_exact_accuracy": 1}}})
        >>> type(cb).__name__, cb.score.metric, cb.score.mode
        ('HeldoutGuard', {'heldout/move_rank_reward': 1.0, 'heldout/env_exact_accuracy': 1.0}, 'max')
    """

    state_key = "heldout_guard"

    def __init__(self, metric: str | Mapping[str, float] = "heldout/move_rank_reward", mode: str = "max",
                 min_delta: float = 0.0):
        self.score = HeldoutScore(parse_metric(metric), mode=mode, min_delta=float(min_delta))
        self.start = None  # the trainable weights before the first step
        self.best_weights = None  # the trainable weights of score.best_step
        self.last_evaluated: int | None = None

    def bind(self, trainer) -> None:
        super().bind(trainer)
        if getattr(trainer, "is_deepspeed_enabled", False) and trainer.accelerator.state.deepspeed_plugin.zero_stage == 3:
            raise ConfigError("heldout_guard: DeepSpeed ZeRO-3 partitions the weights in its own buffers, which the "
                              "guard cannot copy or restore. Use FSDP2 (accelerate_config: fsdp; the guard keeps each "
                              "rank's shards) or ZeRO-2, or transformers' load_best_model_at_end with "
                              "metric_for_best_model (an eval_* metric).")
        if getattr(trainer, "is_fsdp_enabled", False) and int(
                getattr(trainer.accelerator.state.fsdp_plugin, "fsdp_version", 1) or 1) < 2:
            raise ConfigError("heldout_guard: FSDP1 flattens the weights into buffers the guard cannot copy or "
                              "restore. Use FSDP2 (fsdp_version: 2, as accelerate_config: fsdp does); the guard keeps "
                              "each rank's shards there.")
        names = list(self.score.metric)
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

    def _params(self):
        """The trainable parameters as this rank holds them: whole, or this rank's shard (FSDP2's DTensors)."""
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        reshard(model)  # FSDP2's root keeps its weights gathered after a forward: copy and restore the shards
        return {name: local(p) for name, p in model.named_parameters() if p.requires_grad}

    def _copy(self) -> dict:
        return {name: p.detach().to("cpu", copy=True) for name, p in self._params().items()}

    def _restore(self, weights: dict) -> None:
        import torch

        params = self._params()
        with torch.no_grad():
            for name, value in weights.items():
                params[name].copy_(value.to(params[name].device))

    @property
    def _sharded(self) -> bool:
        return is_sharded(self.trainer.accelerator.unwrap_model(self.trainer.model))

    # ---- events ---------------------------------------------------------------------------------------------------

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step == 0:
            self.start = self._copy()

    def before_log(self, trainer, logs: dict) -> None:
        """Score this log entry's held-out metrics (an evaluation's ``eval_*`` in ``logs``, or ``heldout/*`` values
        that TRL is about to average into it) at the current step, whose weights the model still holds."""
        self._observe_start(trainer.state)
        pending = pending_metrics(trainer)
        entry = {**{k: sum(v) / len(v) for k, v in pending.items() if k in self.score.metric and v}, **logs}
        value = self.score.score_of(entry)
        step = trainer.state.global_step
        if value is None or step in self.score.scores:
            return
        self.score.scores[step] = value
        self.last_evaluated = step
        if self.score.better(value):
            self.score.take(step, value)
            self.best_weights = self._copy()
        logs["heldout_guard/score"] = value

    def _observe_start(self, state) -> None:
        """Score the starting weights from the held-out evaluation before the first step (logged at step 0)."""
        if self.start is None or 0 in self.score.scores:
            return
        for step, value in self.score.update([e for e in state.log_history if e.get("step") == 0]):
            if self.last_evaluated is None:
                self.last_evaluated = step
            if self.score.better(value):
                self.score.take(step, value)
                self.best_weights = self.start

    def on_train_end(self, args, state, control, **kwargs):
        self._observe_start(state)
        best, step = self.score.best_step, state.global_step
        if best is None or self.best_weights is None:
            logger.warning("no held-out evaluation of %s was logged, so the final weights are the last "
                           "step's (%d).", list(self.score.metric), step)
            return
        restored = best != step
        if restored:
            self._restore(self.best_weights)
            last = self.score.scores.get(self.last_evaluated)
            logger.warning(
                "the final weights are step %d's, not step %d's: held-out score %.4f there (%s), the best "
                "of %d evaluations; the last evaluation (step %s) scored %s.", best, step, self.score.best,
                " + ".join(f"{w:g} x {n}" for n, w in self.score.metric.items()), len(self.score.scores),
                self.last_evaluated, "n/a" if last is None else f"{last:.4f}")
        else:
            logger.info("the last step (%d) is the best held-out evaluation (score %.4f); kept.", step,
                        self.score.best)
        state.log_history.append({"step": step, "heldout_guard/best_step": best,  # every rank's, as transformers'
                                  "heldout_guard/best_score": self.score.best, "heldout_guard/restored": int(restored)})

    # ---- checkpoints ----------------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return self.score.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.score.load_state_dict(state)

    def _file(self, folder: str) -> str:
        """The copy's file: one per rank where each holds its own shards."""
        if self._sharded:
            return os.path.join(folder, FILE.replace(".pt", f".rank{self.trainer.accelerator.process_index}.pt"))
        return os.path.join(folder, FILE)

    def save_files(self, folder: str) -> None:
        import torch

        if self.best_weights is not None and (self._sharded or self.trainer.args.should_save):
            torch.save({"step": self.score.best_step, "weights": self.best_weights}, self._file(folder))

    def load_files(self, folder: str) -> None:
        import torch

        path = self._file(folder)
        if os.path.exists(path):
            saved = torch.load(path, map_location="cpu", weights_only=True)
            if saved["step"] == self.score.best_step:
                self.best_weights = saved["weights"]
                return
        self.best_weights = None
        self.score.best_step = self.score.best = None  # the best's weights are gone: start choosing again

