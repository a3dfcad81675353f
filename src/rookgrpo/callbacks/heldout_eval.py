"""``heldout_eval``: held-out numbers next to the training reward, for any task, every ``every`` steps, greedy.

A rising reward says the policy found more of what the rewards pay; only held-out prompts say whether the model got
better. Every ``every`` optimizer steps (and once before the first), the policy completes a fixed set of held-out
prompts greedily, and an *evaluator* scores them. Logged in the same log entry as that step's training metrics (the
one before training as its own entry at step 0), under ``heldout/``, which is what the ``heldout_guard`` selects on.

The evaluator, by default, is the run's own reward functions: ``heldout/<reward name>`` is the mean reward of the
greedy completions (rows a reward returns ``None`` for are left out of its mean), and ``heldout/nll`` the
teacher-forced NLL per token of the rows' reference ``completion`` when the data has one (it moves before greedy
answers do). ``rewards`` names other reward functions instead; ``evaluator`` replaces the scoring with your own: a
callable ``(model, tokenizer, rows) -> {metric: value}`` (or a class taking the recipe's arguments, whose instances
are such callables), named in the registry's grammar (``my_task.py:exact_eval``, ``{name: ..., arg: 1}``). A task
pack registers its evaluator as a callback of its own (the chess pack's ``chess_eval``).

Greedy decoding draws no random numbers, so turning the callback on does not change the training run, only its time
(``timing/heldout``: seconds per evaluation).

Example recipe entry (a task of your own, docs/howto.md "A task of your own")::

    callbacks:
      - {name: heldout_eval, data: val.jsonl, every: 10}
      - {name: heldout_guard, metric: heldout/exact}
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from ..dynamics.sharding import reshard
from ..errors import ConfigError
from ..trl_compat import log_metric
from .base import RookCallback
from .registry import register_callback

logger = logging.getLogger(__name__)


@register_callback("heldout_eval")
class HeldoutEval(RookCallback):
    """Evaluate held-out prompts every ``every`` steps (see the module docstring).

    Args:
        data: the held-out rows (a packaged name, file, directory or hub id), read with ``format``; they need a
            ``prompt`` column, and a ``completion`` column for ``heldout/nll``. Other columns reach the rewards as
            keyword arguments, as in training.
        format: the dataset format of ``data`` (``auto``, ``prompt``, a pack's such as ``rookworld``, or your own).
        tasks: keep these tasks' rows, for formats with several.
        rewards: reward functions that score the completions (``reward_funcs``'s grammar); default: the run's own.
        evaluator: instead of rewards, a callable ``(model, tokenizer, rows) -> {metric: value}`` (module docstring).
        every: steps between evaluations; a multiple of ``logging_steps`` so each lands in a logged step.
        n: evaluate the first ``n`` distinct prompts (default: all).
        batch_size: prompts per greedy generation call.
        max_new_tokens: default: 1.25 x the longest reference completion's tokens, plus 4 (with no references, the
            run's ``max_completion_length``).

    Example::

        >>> from rookgrpo.callbacks import resolve_callback
        >>> cb = resolve_callback({"heldout_eval": {"data": "val.jsonl", "every": 10, "n": 64}})
        >>> type(cb).__name__, cb.data, cb.every, cb.n
        ('HeldoutEval', 'val.jsonl', 10, 64)
    """

    state_key = "heldout_eval"

    def __init__(self, data: str | None = None, format: Any = "auto", tasks: list[str] | None = None,
                 rewards: list | None = None, evaluator: Any = None, every: int = 20, n: int | None = None,
                 batch_size: int = 64, max_new_tokens: int | None = None):
        if int(every) < 1:
            raise ConfigError(f"{self.state_key}: every must be >= 1, got {every}.")
        if rewards is not None and evaluator is not None:
            raise ConfigError(f"{self.state_key}: give rewards or an evaluator, not both.")
        self.data, self.format, self.tasks = data, format, tasks
        self.reward_specs, self.evaluator_spec = rewards, evaluator
        self.every, self.n, self.batch_size, self.max_new_tokens = int(every), n, int(batch_size), max_new_tokens
        self.rows: list[dict] = []

    # ---- set-up ---------------------------------------------------------------------------------------------------

    def bind(self, trainer) -> None:
        super().bind(trainer)
        if self.every % max(int(trainer.args.logging_steps), 1):
            raise ConfigError(f"{self.state_key}: every ({self.every}) must be a multiple of logging_steps "
                              f"({trainer.args.logging_steps}), so each evaluation lands in a logged step.")
        self.rows = self.load_rows()
        if not self.rows:
            raise ConfigError(f"{self.state_key}: {self.data!r} has no rows to evaluate.")
        tok = trainer.processing_class
        if self.max_new_tokens is None:
            refs = [r["completion"] for r in self.rows if isinstance(r.get("completion"), str)]
            self.max_new_tokens = (int(max(len(tok(c, add_special_tokens=False)["input_ids"]) for c in refs) * 1.25) + 4
                                   if refs else int(getattr(trainer.args, "max_completion_length", None) or 256))
        self.setup(trainer)

    def load_rows(self) -> list[dict]:
        """The held-out rows: ``data`` read with ``format``, the first copy of each prompt, at most ``n``."""
        if not self.data:
            raise ConfigError(f"{self.state_key}: data is required: the held-out rows (a file, directory, hub id or "
                              "packaged name) with a prompt column.")
        from ..data import apply_format, load_recipe_dataset

        dataset = apply_format(load_recipe_dataset(self.data), self.format, "prompt", self.tasks)
        if "prompt" not in (dataset.column_names or []):
            raise ConfigError(f"{self.state_key}: {self.data!r} has no prompt column after format {self.format!r} "
                              f"(columns: {', '.join(dataset.column_names or [])}).")
        seen, rows = set(), []
        for row in dataset:
            key = repr(row["prompt"])
            if key not in seen:
                seen.add(key)
                rows.append(dict(row))
        return rows[: self.n] if self.n else rows

    def setup(self, trainer) -> None:
        """Resolve the evaluator: the named one, the named rewards, or the run's own reward functions."""
        from ..registry import bind, call_with, load, split_spec

        self.reward_funcs, self.reward_names, self.evaluator = [], [], None
        if self.evaluator_spec is not None:
            name, kwargs = split_spec(self.evaluator_spec, "evaluator")
            obj = load("evaluator", name) if isinstance(name, str) else name
            self.evaluator = call_with(obj, kwargs, "evaluator", str(name)) if isinstance(obj, type) else \
                bind(obj, kwargs, "evaluator", str(name))
            return
        if self.reward_specs is None:
            funcs, names = list(trainer.reward_funcs), list(trainer.reward_func_names)
        else:
            from ..rewards.registry import resolve_reward_func
            from ..trainer import _setup_reward

            funcs = [_setup_reward(resolve_reward_func(s), trainer.args) for s in self.reward_specs]
            names = [getattr(f, "__name__", type(f).__name__) for f in funcs]
        for func, name in zip(funcs, names):
            if not callable(func) or _is_module(func):  # a reward model: TRL's scoring path, not a callable
                continue
            self.reward_funcs.append(func)
            self.reward_names.append(name)
        if not self.reward_funcs and not any("completion" in r for r in self.rows):
            raise ConfigError(f"{self.state_key}: nothing to measure: no callable reward function and no reference "
                              "completion column. Name rewards or an evaluator.")

    def guard_metric(self, trainer) -> dict[str, float] | None:
        """What ``heldout_guard`` selects on when its recipe names no metric: the held-out version of the run's reward
        (``heldout/<reward name>`` weighted by the run's ``reward_weights``), or ``None`` where an ``evaluator`` or
        other ``rewards`` decide what is logged (the guard then asks for a metric)."""
        if self.evaluator_spec is not None or self.reward_specs is not None:
            return None
        metric = {f"heldout/{name}": float(w) for name, w, f in
                  zip(trainer.reward_func_names, trainer.reward_weights.tolist(), trainer.reward_funcs)
                  if callable(f) and not _is_module(f) and w}
        return metric or None

    # ---- scoring --------------------------------------------------------------------------------------------------

    def score(self, model, tokenizer) -> dict[str, float]:
        """The metrics of one evaluation (without the ``heldout/`` prefix)."""
        if self.evaluator is not None:
            return dict(self.evaluator(model, tokenizer, self.rows))
        from ..evaluation import complete, reference_nll

        prompts = [r["prompt"] for r in self.rows]
        texts = _as_text(prompts, tokenizer)
        completions = complete(model, tokenizer, texts, self.max_new_tokens, self.batch_size)
        if prompts and not isinstance(prompts[0], str):  # conversational data: completions in the same form
            completions = [[{"role": "assistant", "content": c}] for c in completions]
        columns = {k: [r.get(k) for r in self.rows] for k in self.rows[0] if k not in ("prompt", "completion")}
        ids = [tokenizer(c if isinstance(c, str) else c[0]["content"], add_special_tokens=False)["input_ids"]
               for c in completions]
        out = {}
        args = getattr(getattr(self, "trainer", None), "args", None)
        isolated = getattr(args, "reward_isolation", False)
        for func, name in zip(self.reward_funcs, self.reward_names):
            if isolated:  # as in training (reward_isolation): a failing call costs this metric, not the run
                from ..rewards.isolation import call_isolated

                values, failure = call_isolated(func, name, args.reward_timeout, prompts=prompts,
                                                completions=completions, completion_ids=ids, **columns)
                if failure is not None:
                    logger.warning("%s: reward function %r failed on the held-out rows (%s); heldout/%s is left out "
                                   "of this evaluation.", self.state_key, name, failure.summary, name)
                    continue
            else:
                values = func(prompts=prompts, completions=completions, completion_ids=ids, **columns)
            kept = [float(v) for v in values if v is not None and not math.isnan(float(v))]
            if kept:
                out[name] = sum(kept) / len(kept)
        refs = [(t, r["completion"]) for t, r in zip(texts, self.rows) if isinstance(r.get("completion"), str)]
        if refs:
            values = reference_nll(model, tokenizer, [p for p, _ in refs], [c for _, c in refs], self.batch_size)
            kept = [v for v in values if not math.isnan(v)]
            if kept:
                out["nll"] = sum(kept) / len(kept)
        return out

    def evaluate(self) -> dict[str, float]:
        """One evaluation of the model as it is now, as ``heldout/*`` metrics (the model's mode is restored)."""
        trainer = self.trainer
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        model.eval()
        try:
            metrics = self.score(model, trainer.processing_class)
        finally:
            model.train(was_training)
            reshard(model)  # FSDP2: the next training forward gathers its own weights (rookgrpo.dynamics.sharding)
        return {f"heldout/{k}": float(v) for k, v in metrics.items()}

    def _timed(self) -> dict[str, float]:
        """One evaluation, timed; the main process's numbers on every rank.

        Every rank evaluates (a sharded model's forward needs every rank: FSDP2 gathers each layer's weights from
        all of them), and every rank then takes the main process's values, so that a callback deciding from them
        (``heldout_guard``, the live ``doctor``) decides the same on every rank even where kernels differ in the
        last bit."""
        start = time.perf_counter()
        values = self.evaluate()
        values["timing/heldout"] = time.perf_counter() - start
        accelerator = self.trainer.accelerator
        if accelerator.num_processes > 1:
            from accelerate.utils import broadcast_object_list

            values = broadcast_object_list([values], from_process=0)[0]
        return values

    # ---- events ---------------------------------------------------------------------------------------------------

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step == 0:
            # On every rank, as transformers keeps its log history: a callback reading the history (the guard's
            # start) must find the same entries on each.
            state.log_history.append({"step": 0, **self._timed()})

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every == 0:
            for key, value in self._timed().items():
                log_metric(self.trainer, key, value)


def _as_text(prompts: list, tokenizer) -> list[str]:
    """Prompts as the model reads them: strings as they are, conversations through the chat template."""
    if not prompts or isinstance(prompts[0], str):
        return list(prompts)
    return [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]


def _is_module(obj) -> bool:
    import torch

    return isinstance(obj, torch.nn.Module)
