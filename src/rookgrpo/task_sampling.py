"""Task-conditional sampling: per-task generation settings and task-homogeneous generation batches.

Why: RookWorld mixes two tasks that want different sampling. ``P:`` (pick a move) profits from a cooler temperature,
while ``A:`` (predict the next state) completions at a low temperature are often all identical, so the group has no
reward spread. With ``task_generation_kwargs: {P: {temperature: 0.5, top_p: 0.9}, A: {temperature: 0.95}}``:

- the sampler builds every generation batch (all processes together) from one task, so one sampling setting
  applies to the whole batch, as TRL's generation backends (transformers, vLLM) require;
- before a batch is generated its task's settings are put on the trainer (``temperature``, ``top_p``, ``top_k``,
  ``min_p``, ``repetition_penalty``), and the log-probabilities in the loss use the same temperature, since
  GRPO's per-token log-probs must come from the distribution that sampled the tokens.

Tasks not named keep the recipe's settings. Chunks of the same generation batch keep its temperature for every
optimisation step that reuses them (``steps_per_generation``, ``num_iterations``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import torch
from trl.trainer.utils import RepeatSampler

from .errors import ConfigError

SETTINGS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def parse_task_generation_kwargs(value: Any) -> dict[str, dict[str, Any]] | None:
    """Validate ``task_generation_kwargs`` (a mapping, or its JSON text from the command line)."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"task_generation_kwargs: not valid JSON ({exc}). Example: "
                              '\'{"P": {"temperature": 0.5}, "A": {"temperature": 0.95}}\'.') from exc
    if not isinstance(value, dict) or not value:
        raise ConfigError("task_generation_kwargs: expected a mapping task → settings, e.g. "
                          "{P: {temperature: 0.5, top_p: 0.9}, A: {temperature: 0.95}}.")
    out = {}
    for task, settings in value.items():
        if not isinstance(settings, dict):
            raise ConfigError(f"task_generation_kwargs.{task}: expected a mapping of settings, got {settings!r}.")
        unknown = sorted(set(settings) - set(SETTINGS))
        if unknown:
            raise ConfigError(f"task_generation_kwargs.{task}: unknown setting(s) {unknown}; allowed: {list(SETTINGS)}.")
        if "temperature" in settings and not float(settings["temperature"]) > 0:
            raise ConfigError(f"task_generation_kwargs.{task}.temperature: got {settings['temperature']}; must be > 0.")
        out[str(task)] = dict(settings)
    return out


def indices_by_task(tasks: Sequence[str]) -> dict[str, list[int]]:
    """Row indices per task, in row order."""
    by_task: dict[str, list[int]] = {}
    for i, task in enumerate(tasks):
        by_task.setdefault(task, []).append(i)
    return by_task


class TaskGroupedRepeatSampler(RepeatSampler):
    """TRL's ``RepeatSampler`` with every chunk (one global generation batch of unique prompts) drawn from one task.

    Each task's rows are shuffled and cut into chunks of ``batch_size`` (incomplete chunks are dropped, as TRL
    does), then the chunks of all tasks are shuffled together, so tasks appear in proportion to their data.
    """

    def __init__(self, data_source, tasks: Sequence[str], mini_repeat_count: int, batch_size: int = 1,
                 repeat_count: int = 1, shuffle: bool = True, seed: int | None = None):
        super().__init__(data_source, mini_repeat_count, batch_size, repeat_count, shuffle, seed)
        self.tasks = list(tasks)
        self.by_task = by_task = indices_by_task(self.tasks)
        short = [t for t, idx in by_task.items() if len(idx) < batch_size]
        if len(short) == len(by_task):
            raise ConfigError(
                f"task_generation_kwargs: every task has fewer than {batch_size} prompts, the number of distinct "
                "prompts in one generation batch, so no task-homogeneous batch can be formed. Use more data or a "
                "smaller generation batch."
            )

    def _chunks(self) -> list[list[int]]:
        chunks = []
        for task in sorted(self.by_task):
            idx = self.by_task[task]
            if self.shuffle:
                idx = [idx[i] for i in torch.randperm(len(idx), generator=self.generator).tolist()]
            chunks += [idx[i:i + self.batch_size] for i in range(0, len(idx) - self.batch_size + 1, self.batch_size)]
        if self.shuffle:
            chunks = [chunks[i] for i in torch.randperm(len(chunks), generator=self.generator).tolist()]
        return chunks

    def __iter__(self):
        for chunk in self._chunks():
            for _ in range(self.repeat_count):
                for index in chunk:
                    for _ in range(self.mini_repeat_count):
                        yield index

    def __len__(self) -> int:
        n_chunks = sum(len(idx) // self.batch_size for idx in self.by_task.values())
        return n_chunks * self.batch_size * self.mini_repeat_count * self.repeat_count


def batch_task(inputs: Sequence[dict], column: str) -> str | None:
    """The task of a generation batch, or ``None`` when it mixes tasks (evaluation batches may)."""
    tasks = {row.get(column) for row in inputs}
    return tasks.pop() if len(tasks) == 1 else None


class TaskSettings:
    """Puts one task's sampling settings on a trainer: generation (transformers or vLLM) and the loss temperature."""

    def __init__(self, trainer, per_task: dict[str, dict[str, Any]]):
        self.per_task = per_task
        self.base = {k: getattr(trainer, k, None) for k in SETTINGS}
        self.current: str | None = None

    def settings_for(self, task: str | None) -> dict[str, Any]:
        return {**self.base, **self.per_task.get(task, {})} if task is not None else dict(self.base)

    def apply(self, trainer, task: str | None) -> None:
        settings = self.settings_for(task)
        self.current = task
        for key, value in settings.items():
            if hasattr(trainer, key):
                setattr(trainer, key, value)
            for holder in (getattr(trainer, "generation_config", None), getattr(trainer, "vllm_generation", None)):
                if holder is not None and hasattr(holder, key):
                    setattr(holder, key, value)
            kwargs = getattr(trainer, "generation_kwargs", None)
            if isinstance(kwargs, dict) and key in kwargs:
                kwargs[key] = value
        set_logprob_temperature(trainer, float(settings["temperature"]))


def set_logprob_temperature(trainer, temperature: float) -> None:
    """Make the trainer's per-token log-probs divide logits by ``temperature``.

    TRL up to 1.10 divides by ``trainer.temperature`` at each call. Newer TRL bakes the temperature into the fused
    LM head it puts on the policy (and reference) model at start-up; its value lives in that head's closure, so it
    is updated there. If a TRL version hides it elsewhere, this fails loudly rather than train with a mismatch.
    """
    trainer.temperature = temperature
    models = [getattr(trainer, "model", None), getattr(trainer, "ref_model", None)]
    fused_found = False
    for model in models:
        if model is None:
            continue
        model = model.get_base_model() if hasattr(model, "get_base_model") else model
        forward = getattr(model, "forward", None)
        func = getattr(forward, "__func__", None)
        code = getattr(func, "__code__", None)
        if code is None or "temperature" not in code.co_freevars or getattr(func, "__closure__", None) is None:
            continue
        func.__closure__[code.co_freevars.index("temperature")].cell_contents = temperature
        fused_found = True
    if not fused_found and _trl_bakes_temperature():
        raise ConfigError(
            "task_generation_kwargs: this TRL version keeps the loss temperature where rookgrpo cannot set it per "
            "batch; per-task temperatures would train on mismatched log-probs. Use one temperature or TRL <= 1.16."
        )


def _trl_bakes_temperature() -> bool:
    import trl.trainer.utils as trl_utils

    return hasattr(trl_utils, "add_fused_lm_head")
