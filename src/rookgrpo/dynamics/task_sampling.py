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

import functools
import types
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from trl.trainer.utils import RepeatSampler

from ..errors import ConfigError

SETTINGS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def parse_task_generation_kwargs(value: Any) -> dict[str, dict[str, Any]] | None:
    """Validate ``task_generation_kwargs`` (a mapping, or its JSON text from the command line)."""
    from ..registry import json_mapping

    value = json_mapping(value, "task_generation_kwargs (a mapping task → settings)",
                         '{"P": {"temperature": 0.5, "top_p": 0.9}, "A": {"temperature": 0.95}}')
    if value is None:
        return None
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


def repeat_chunks(chunks: Iterable[Sequence[int]], repeat_count: int, mini_repeat_count: int) -> Iterator[int]:
    """TRL's ``RepeatSampler`` order for given chunks: each chunk ``repeat_count`` times, each index in it
    ``mini_repeat_count`` times in a row."""
    for chunk in chunks:
        for _ in range(repeat_count):
            for index in chunk:
                for _ in range(mini_repeat_count):
                    yield index


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
        return repeat_chunks(self._chunks(), self.repeat_count, self.mini_repeat_count)

    def __len__(self) -> int:
        n_chunks = sum(len(idx) // self.batch_size for idx in self.by_task.values())
        return n_chunks * self.batch_size * self.mini_repeat_count * self.repeat_count


def batch_task(inputs: Sequence[dict], column: str) -> str | None:
    """The task of a generation batch, or ``None`` when it mixes tasks (evaluation batches may)."""
    tasks = {row.get(column) for row in inputs}
    return tasks.pop() if len(tasks) == 1 else None


class TaskSettings:
    """Puts one task's sampling settings on a trainer: generation (transformers or vLLM) and the loss temperature.

    The loss temperature follows the batch being optimised, not the last generation call: the task of the latest
    *training* generation batch is remembered, and :meth:`before_loss` sets its temperature before every training
    loss (evaluation batches, generated between two optimizer steps that reuse buffered chunks of one training batch,
    set their own temperature for their own loss and leave the training batch's alone).
    """

    def __init__(self, trainer, per_task: dict[str, dict[str, Any]]):
        self.per_task = per_task
        self.base = {k: getattr(trainer, k, None) for k in SETTINGS}
        self.current: str | None = None
        self.batch_task: dict[str, str | None] = {"train": None, "eval": None}
        temperatures = {float(self.settings_for(t)["temperature"]) for t in [None, *per_task]}
        self.loss_temperature = LossTemperature(trainer, temperatures)

    def settings_for(self, task: str | None) -> dict[str, Any]:
        return {**self.base, **self.per_task.get(task, {})} if task is not None else dict(self.base)

    def apply(self, trainer, task: str | None) -> None:
        """Before generating a batch of ``task``: its sampling settings, and its temperature for the loss."""
        settings = self.settings_for(task)
        self.current = task
        self.batch_task["train" if trainer.model.training else "eval"] = task
        for key, value in settings.items():
            if hasattr(trainer, key):
                setattr(trainer, key, value)
            for holder in (getattr(trainer, "generation_config", None), getattr(trainer, "vllm_generation", None)):
                if holder is not None and hasattr(holder, key):
                    setattr(holder, key, value)
            kwargs = getattr(trainer, "generation_kwargs", None)
            if isinstance(kwargs, dict) and key in kwargs:
                kwargs[key] = value
        self.loss_temperature.set(trainer, float(settings["temperature"]))

    def before_loss(self, trainer) -> None:
        """Before a loss: the temperature that sampled the batch being optimised (train) or evaluated (eval)."""
        task = self.batch_task["train" if trainer.model.training else "eval"]
        self.loss_temperature.set(trainer, float(self.settings_for(task)["temperature"]))


def models_in_use(trainer):
    """(role, model) for the models GRPO's log-probs come from: the policy, and the reference when there is one."""
    yield "policy", trainer.model
    if getattr(trainer, "ref_model", None) is not None:
        yield "reference", trainer.ref_model


def innermost_model(model):
    """The model TRL patched, inside whatever wraps it: DDP/DeepSpeed/FSDP1 ``.module``, ``torch.compile``'s
    ``_orig_mod``, PEFT's base model. TRL puts its fused LM head on that object's ``forward``."""
    seen = set()
    while id(model) not in seen:
        seen.add(id(model))
        if hasattr(model, "get_base_model"):
            model = model.get_base_model()
        elif isinstance(getattr(model, "module", None), torch.nn.Module):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        elif isinstance(getattr(model, "_fsdp_wrapped_module", None), torch.nn.Module):
            model = model._fsdp_wrapped_module
        else:
            break
    return model


class LossTemperature:
    """The temperature GRPO's per-token log-probs divide logits by, switchable per batch, for every model in use.

    TRL up to 1.10 divides by ``trainer.temperature`` at each call. Newer TRL bakes the temperature into a fused LM
    head (``add_fused_lm_head``) that it puts on the policy and the reference model at start-up. For each temperature
    the tasks use, this builds one more fused forward with TRL's own ``add_fused_lm_head`` on the same model object,
    and installs one dispatching ``forward`` that calls the one for the current temperature. Accelerate, DeepSpeed or
    FSDP may wrap that forward later (autocast, output casting); :meth:`set` only changes which temperature the
    dispatcher uses, on every model in use (policy and reference, found inside any wrapper). A model in use without
    TRL's fused head, or replaced after start, is an error, never a silent mismatch: the KL term would compare
    policy and reference at different temperatures.
    """

    ATTR = "_rookgrpo_loss_temperature"

    def __init__(self, trainer, temperatures: set[float]):
        self.temperatures = sorted(temperatures)
        self.fused = _trl_bakes_temperature()
        if not self.fused:
            return
        from trl.trainer.utils import add_fused_lm_head

        cast = bool(getattr(trainer.args, "cast_lm_head_to_fp32", False))
        for role, model in models_in_use(trainer):
            inner = innermost_model(model)
            base = vars(inner).get("forward")
            if base is None:
                raise ConfigError(
                    f"task_generation_kwargs: the {role} model ({type(inner).__name__}) has no fused LM head from "
                    "TRL, so its log-probs could not follow the per-task temperature. Use one temperature, or a TRL "
                    "version whose GRPOTrainer patches the model with add_fused_lm_head (1.11-1.16)."
                )
            outputs = ("log_probs", "entropy") if role == "policy" else ("log_probs",)  # as GRPOTrainer asks
            forwards = {}
            for temperature in self.temperatures:
                add_fused_lm_head(inner, temperature=temperature, cast_lm_head_to_fp32=cast, outputs=outputs)
                forwards[temperature] = inner.forward
                inner.forward = base
            setattr(inner, self.ATTR, {"forwards": forwards, "temperature": float(trainer.temperature)})
            inner.forward = types.MethodType(_dispatching_forward(type(inner)), inner)

    def set(self, trainer, temperature: float) -> None:
        """Make the policy's and the reference's log-probs divide logits by ``temperature``."""
        trainer.temperature = temperature
        if not self.fused:
            return
        for role, model in models_in_use(trainer):
            inner = innermost_model(model)
            state = getattr(inner, self.ATTR, None)
            if state is None or temperature not in state["forwards"]:
                raise ConfigError(
                    f"task_generation_kwargs: the {role} model ({type(inner).__name__}) was replaced after the "
                    f"trainer was built, or temperature {temperature} was not prepared; its log-probs would not use "
                    "the batch's sampling temperature."
                )
            state["temperature"] = temperature

    @classmethod
    def of(cls, model) -> float | None:
        """The temperature ``model``'s log-probs currently use (``None`` when it has no dispatcher)."""
        state = getattr(innermost_model(model), cls.ATTR, None)
        return None if state is None else state["temperature"]


def _dispatching_forward(model_class):
    # Keep the model class's signature: `generate` validates its keyword arguments against it, as in TRL.
    @functools.wraps(model_class.forward)
    def forward(self, *args, **kwargs):
        state = getattr(self, LossTemperature.ATTR)
        return state["forwards"][state["temperature"]](*args, **kwargs)

    return forward


def _trl_bakes_temperature() -> bool:
    import trl.trainer.utils as trl_utils

    return hasattr(trl_utils, "add_fused_lm_head")
