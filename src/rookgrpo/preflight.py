"""``rookgrpo preflight RECIPE`` (and ``preflight: on`` in a recipe): the run's worst-case step before the run commits.

Why: a GRPO run that fits its first batches can die hours later on the longest prompt with the longest completion.
The preflight runs that batch first, in the first minute:

1. **The worst case.** A trainer built from the recipe exactly as training builds it (same code paths: the recipe's
   callbacks, rewards, vLLM where it uses it, the launch's processes), on the dataset's longest prompts (by token
   count, through the chat template where prompts are conversations), every completion forced to
   ``max_completion_length`` tokens (``min_new_tokens``; vLLM: ``min_tokens``), at the recipe's batch and generation
   settings. It trains two steps; the peak memory (CUDA: the allocator's peak per device; CPU: the process's peak
   resident set, ``VmHWM``) and the second step's time (the first also warms up) are the worst case's.
2. **Where it does not fit** (an out-of-memory error in any phase), the run stops here (:class:`PreflightFailed`),
   naming the shape, the phase and the allocation that failed, after measuring smaller settings the same way: the
   per-device batch halved with gradient accumulation doubled (the same completions per optimizer step; the
   generation batch shrinks with it), then shorter completions. The first that fits is named with its measured peak.
3. **The estimate.** A second fresh trainer runs the recipe's own first steps (its data, its sampling):
   the mean step time after the first, times the run's steps, plus its held-out evaluations (``timing/heldout`` of the
   evaluation before the first step, times the evaluations the run will make) and the first step's warm-up. TRL's own
   evaluation (``eval_strategy``) and checkpoint saves are not in it.

Both trainers are built fresh and dropped afterwards, so the real run starts from the recipe's model and a fresh
optimizer: nothing the preflight trained reaches it. Its figures go to ``<output_dir>/preflight.json``.

    rookgrpo preflight recipes/rookworld-tiny.yaml            # report, exit 2 if the worst case does not fit
    rookgrpo train recipes/rookworld-tiny.yaml --preflight on  # the same, then the run
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .callbacks.base import RookCallback
from .errors import ConfigError

logger = logging.getLogger(__name__)

#: Steps of the typical phase (the first warms up; the rest give the mean step time).
TYPICAL_STEPS = 8
#: Smaller per-device batches tried, as divisors, where the worst case does not fit.
BATCH_DIVISORS = (2, 4, 8)
#: Shorter completions tried after that, as shares of max_completion_length.
LENGTH_SHARES = (0.75, 0.5)
MIB = 1024 * 1024


class PreflightFailed(ConfigError):
    """The worst-case step ran out of memory. The message names the shape, the phase, the failed allocation and the
    settings that fit (measured), where any did."""


@dataclass
class Attempt:
    """One worst-case measurement: the settings it changed, whether it fit, its peak and step time."""

    settings: dict
    fits: bool
    peak_mib: float | None = None
    step_seconds: float | None = None
    phase: str | None = None  #: where it ran out of memory
    error: str | None = None


@dataclass
class PreflightResult:
    """What ``rookgrpo preflight`` measured (``preflight.json``)."""

    fits: bool
    shape: dict  #: the worst case: prompt and completion tokens, batch settings, processes
    memory_kind: str  #: "cuda_max_allocated" (per device, max over devices) or "cpu_peak_rss" (per process)
    peak_mib: float | None  #: the largest over processes
    limit: dict  #: the memory the process may use, where known: {"bytes", "source"}
    worst_step_seconds: float | None
    typical_step_seconds: float | None = None  #: the mean of the typical steps after the first
    step_seconds: float | None = None  #: the run's expected step: the typical one read at the run's mean batch width
    run_steps: int | None = None
    evaluations: int = 0
    evaluation_seconds: float | None = None
    estimate_seconds: float | None = None
    attempts: list[Attempt] = field(default_factory=list)
    preflight_seconds: float | None = None
    peak_mib_per_process: list = field(default_factory=list)  #: the worst case's peak of each process, rank order

    def to_dict(self) -> dict:
        return asdict(self)

    def report(self) -> str:
        s = self.shape
        lines = [f"preflight: worst case {s['prompts_per_step']} prompt(s) x {s['num_generations']} completions per "
                 f"step ({s['per_device_train_batch_size']} per device per micro-batch, gradient accumulation "
                 f"{s['gradient_accumulation_steps']}, {s['processes']} process(es)), prompts up to "
                 f"{s['prompt_tokens']} tokens, every completion {s['completion_tokens']} tokens"
                 + (f" (task {s['task']}: its worst case is the slowest of the recipe's tasks)" if s.get("task") else "")]
        worst = self.attempts[0] if self.attempts else None
        if worst is not None and worst.fits:
            lines.append(f"  fits: peak memory {self.peak_mib:.0f} MiB ({_kind_text(self.memory_kind)})"
                         f"{_limit_text(self.limit, self.peak_mib)}; worst-case step {self.worst_step_seconds:.2f} s")
        elif worst is not None:
            lines.append(f"  does not fit: out of memory in {worst.phase or 'the step'} ({worst.error})"
                         f"{_limit_text(self.limit, None)}")
            fitting = next((a for a in self.attempts[1:] if a.fits), None)
            for attempt in self.attempts[1:]:
                state = (f"fits, peak {attempt.peak_mib:.0f} MiB, step {attempt.step_seconds:.2f} s" if attempt.fits
                         else f"out of memory in {attempt.phase or 'the step'}")
                lines.append(f"  tried {_settings_text(attempt.settings)}: {state}")
            if fitting is None:
                lines.append("  no setting tried fits: use a smaller model, LoRA, or more memory per process")
        if self.estimate_seconds is not None:
            lines.append(f"  step {self.step_seconds:.2f} s (typical steps {self.typical_step_seconds:.2f} s, read at "
                         f"the dataset's mean batch width) x {self.run_steps} steps"
                         + (f" + {self.evaluations} held-out evaluation(s) x {self.evaluation_seconds:.1f} s"
                            if self.evaluations else "")
                         + f": the run's training should take about {_duration(self.estimate_seconds)}")
        if self.preflight_seconds is not None:
            lines.append(f"  (preflight took {self.preflight_seconds:.0f} s)")
        return "\n".join(lines)


def _kind_text(kind: str) -> str:
    return {"cuda_max_allocated": "CUDA allocator's peak, largest device",
            "cpu_peak_rss": "peak resident memory of the process"}.get(kind, kind)


def _limit_text(limit: dict, peak_mib: float | None) -> str:
    if not limit:
        return ""
    text = f"; limit {limit['bytes'] / MIB:.0f} MiB ({limit['source']})"
    if peak_mib is not None and limit.get("comparable", True):
        text += f", {100 * peak_mib * MIB / limit['bytes']:.0f}% of it"
    return text


def _settings_text(settings: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in settings.items()) or "the recipe's settings"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min" if seconds < 7200 else \
        f"{seconds / 3600:.1f} h"


# ---- the recipe's mode -----------------------------------------------------------------------------------------

def preflight_mode(argv: Sequence[str]) -> str:
    """The recipe's ``preflight``: ``off``, ``on`` or ``only`` (``true``/``false`` accepted), read from the flags
    (the last ``--preflight`` wins) or the recipe file, without building the configs (whose checks log notices)."""
    import yaml

    from .recipe import normalize_argv

    argv = normalize_argv(argv)
    value = None
    for i, arg in enumerate(argv):
        if arg == "--preflight" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--preflight="):
            value = arg.split("=", 1)[1]
    if value is None and "--config" in argv:
        with open(argv[argv.index("--config") + 1]) as fh:
            value = (yaml.safe_load(fh) or {}).get("preflight", "off")
    return normalize_mode("off" if value is None else value)


class _SayOnce(logging.Filter):
    """Lets each message through once per process: the preflight builds the recipe's configs several times, and
    their notices (training on CPU without a GPU, ...) are the run's, said once."""

    def __init__(self):
        super().__init__()
        self.said: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in self.said:
            return False
        self.said.add(message)
        return True


def _say_config_notices_once() -> None:
    config_logger = logging.getLogger("rookgrpo.config")
    if not any(isinstance(f, _SayOnce) for f in config_logger.filters):
        config_logger.addFilter(_SayOnce())


def normalize_mode(value) -> str:
    text = str(value).strip().lower()
    mode = {"true": "on", "yes": "on", "1": "on", "false": "off", "no": "off", "0": "off", "none": "off"}.get(text, text)
    if mode not in ("off", "on", "only"):
        raise ConfigError(f"preflight: {value!r} is not a mode; use on (check the worst case, then train), only (check "
                          "it and stop: rookgrpo preflight RECIPE) or off.")
    return mode


# ---- memory ----------------------------------------------------------------------------------------------------

def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation failure (CUDA's, the CPU allocator's under a memory limit, Python's)."""
    import torch

    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(
        marker in text for marker in ("can't allocate memory", "out of memory", "Cannot allocate memory",
                                      "bad_alloc", "DefaultCPUAllocator"))


def memory_limit() -> dict:
    """The tightest memory limit this process is under, where one is known: {"bytes", "source", "comparable"}
    (``comparable``: a limit on resident memory, which the CPU peak can be set against; an address-space limit is
    not)."""
    limits = []
    for name, what in (("RLIMIT_AS", "address space"), ("RLIMIT_DATA", "data segment")):
        soft, _ = resource.getrlimit(getattr(resource, name))
        if soft not in (resource.RLIM_INFINITY, -1):
            limits.append({"bytes": int(soft), "source": f"{name} ({what})", "comparable": False})
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            limits.append({"bytes": int(text), "source": f"cgroup {path}", "comparable": True})
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                limits.append({"bytes": int(line.split()[1]) * 1024, "source": "MemTotal", "comparable": True})
    except OSError:
        pass
    return min(limits, key=lambda x: x["bytes"]) if limits else {}


def _device_limit(trainer) -> dict:
    import torch

    device = trainer.accelerator.device
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        return {"bytes": int(total), "source": f"{torch.cuda.get_device_name(device)} memory", "comparable": True}
    return memory_limit()


# ---- the worst case's data and settings --------------------------------------------------------------------------

def prompt_lengths(prompts: list, tokenizer) -> list[int]:
    """Token counts of prompts as the trainer tokenizes them (conversations through the chat template)."""
    if not prompts:
        return []
    if isinstance(prompts[0], str):
        return [len(ids) for ids in tokenizer(prompts, add_special_tokens=False)["input_ids"]]
    return [len(tokenizer.apply_chat_template(p, tokenize=True, add_generation_prompt=True)) for p in prompts]


def longest_prompts(dataset, tokenizer, n: int):
    """The ``n`` rows of ``dataset`` with the longest prompts (by tokens), longest first, repeated where the dataset
    has fewer rows. Large datasets are cut to their 4·n longest prompts by characters before tokenizing."""
    prompts = dataset["prompt"]
    order = list(range(len(prompts)))
    if len(order) > 4 * n and len(order) > 2000:
        order = sorted(order, key=lambda i: -len(str(prompts[i])))[:max(4 * n, 2000)]
    lengths = prompt_lengths([prompts[i] for i in order], tokenizer)
    ranked = [i for _, i in sorted(zip(lengths, order), key=lambda x: -x[0])]
    picked = (ranked * math.ceil(n / len(ranked)))[:n]
    return dataset.select(picked), max(lengths)


def _force_length(training_args, length: int) -> None:
    """Every completion ``length`` tokens: EOS suppressed until then (transformers' ``min_new_tokens``, vLLM's
    ``min_tokens``), on top of the recipe's ``generation_kwargs``."""
    kwargs = training_args.generation_kwargs or {}
    if isinstance(kwargs, str):
        kwargs = json.loads(kwargs)
    kwargs = dict(kwargs)
    kwargs["min_tokens" if training_args.use_vllm else "min_new_tokens"] = int(length)
    training_args.generation_kwargs = kwargs


def _overrides(output_dir: str, steps: int) -> list[str]:
    return ["--max_steps", str(steps), "--logging_steps", "1", "--save_strategy", "no", "--report_to", "none",
            "--eval_strategy", "no", "--push_to_hub", "false", "--output_dir", output_dir,
            "--load_best_model_at_end", "false"]


# ---- one measured phase ------------------------------------------------------------------------------------------

class _BatchWidths(RookCallback):
    """Records the padded width (prompt tokens, completion tokens) of each training generation batch, where the step's
    work is set: TRL pads a process's generation batch to its longest prompt and completion."""

    state_key = "preflight_widths"

    def __init__(self):
        self.widths: list[tuple[int, int]] = []

    def on_scored_batch(self, trainer, scored):
        if trainer.model.training:
            out = scored.output
            self.widths.append((int(out["prompt_ids"].shape[1]), int(out["completion_ids"].shape[1])))


def expected_max(lengths: list[int], n: int) -> float:
    """The expected longest of ``n`` prompts drawn at random (with replacement) from ``lengths``.

    >>> expected_max([10, 10, 10, 1000], 1)
    257.5
    >>> round(expected_max([10] * 63 + [1000], 2), 1)
    40.7
    """
    ordered = sorted(lengths)
    total = len(ordered)
    return sum(value * (((k + 1) / total) ** n - (k / total) ** n) for k, value in enumerate(ordered))


def _length_sample(dataset, tokenizer, limit: int = 20000) -> list[int]:
    import random

    indices = list(range(len(dataset)))
    if len(indices) > limit:
        indices = sorted(random.Random(0).sample(indices, limit))
    prompts = dataset.select(indices)["prompt"] if len(indices) < len(dataset) else dataset["prompt"]
    return prompt_lengths(list(prompts), tokenizer)

@dataclass
class _Measured:
    fits: bool
    peak_mib: float | None
    step_seconds: list
    log_history: list
    phase: str | None = None
    error: str | None = None
    shape: dict | None = None
    limit: dict | None = None
    run_steps: int | None = None
    evaluators: list | None = None
    memory_kind: str = ""
    peak_per_process: list = field(default_factory=list)  #: in rank order (CUDA: each process's device)
    widths: list = field(default_factory=list)  #: (prompt, completion) padded widths per generation batch
    prompt_lengths: list = field(default_factory=list)  #: the training prompts' token counts (a sample)


def _measure(build_trainer, argv: Sequence[str], output_dir: str, steps: int, worst: bool, settings: dict,
             task: str | None = None) -> _Measured:
    """Build the recipe's trainer (the worst case's when ``worst``; of one ``task``'s rows where the recipe samples
    per task) with ``settings`` changed, train ``steps`` steps, and free it."""
    import torch

    shape: dict = {}

    def adjust(script_args, training_args):
        for key, value in settings.items():
            setattr(training_args, key, value)
        if worst:
            _force_length(training_args, training_args.max_completion_length)
        if task is not None:  # batches are task-homogeneous: each task's worst case on its own
            training_args.task_generation_kwargs = {task: training_args.task_generation_kwargs[task]}

    lengths: list[int] = []

    def transform(dataset, model_path, training_args):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=training_args.trust_remote_code)
        if not worst:
            if hasattr(dataset, "__len__"):
                lengths.extend(_length_sample(dataset, tokenizer))
            return dataset
        n = max(1, training_args.generation_batch_size // training_args.num_generations)
        if task is not None:
            column = training_args.task_column
            dataset = dataset.filter(lambda row: str(row[column]) == task)
        rows, longest = longest_prompts(dataset, tokenizer, n)
        shape.update(prompt_tokens=longest, prompts_per_step=n, **({"task": task} if task is not None else {}))
        return rows

    argv = [*argv, *_overrides(output_dir, steps), "--preflight", "off"]
    trainer = None
    widths = _BatchWidths()
    try:
        trainer, _, _ = build_trainer(argv, extra_callbacks=[widths], adjust=adjust, dataset_transform=transform)
        args = trainer.args
        shape.update(completion_tokens=args.max_completion_length, num_generations=args.num_generations,
                     per_device_train_batch_size=args.per_device_train_batch_size,
                     gradient_accumulation_steps=args.gradient_accumulation_steps,
                     steps_per_generation=args.steps_per_generation, processes=trainer.accelerator.num_processes)
        meter = trainer.measure_phases()
        cuda = trainer.accelerator.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(trainer.accelerator.device)
        measured = _Measured(True, None, [], [], shape=shape, limit=_device_limit(trainer),
                             memory_kind="cuda_max_allocated" if cuda else "cpu_peak_rss",
                             evaluators=_evaluators(trainer), run_steps=None if worst else _epoch_steps(trainer))
        try:
            trainer.train()
        except Exception as exc:  # noqa: BLE001 - only an allocation failure is the preflight's to report
            if not is_out_of_memory(exc):
                raise
            measured.fits, measured.phase = False, meter.last_started
            measured.error = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            exc.__traceback__ = None
        meter._note_process_peak()
        peak = torch.cuda.max_memory_allocated(trainer.accelerator.device) / MIB if cuda else meter.process_peak_mib
        measured.peak_per_process = _per_rank(trainer, peak)
        measured.peak_mib = max(measured.peak_per_process)
        measured.log_history = list(trainer.state.log_history)
        measured.widths, measured.prompt_lengths = list(widths.widths), lengths
        shortest = [h["completions/min_length"] for h in measured.log_history if "completions/min_length" in h]
        if worst and shortest:  # the forced length took: every completion max_completion_length tokens
            shape["completion_tokens_min"] = int(min(shortest))
        measured.step_seconds = [h["step_time"] for h in measured.log_history if "step_time" in h]
        return measured
    finally:
        if trainer is not None:
            from .vllm_compat import release_engine

            release_engine(trainer)  # a colocated engine's memory, before the next trainer builds its own
            trainer.model = trainer.model_wrapped = trainer.optimizer = trainer.lr_scheduler = None
            trainer.accelerator.free_memory()
        del trainer
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _per_rank(trainer, value: float) -> list[float]:
    """``value`` of every process, in rank order (every process calls it)."""
    accelerator = trainer.accelerator
    if accelerator.num_processes < 2:
        return [float(value)]
    import torch

    return accelerator.gather(torch.tensor([float(value)], device=accelerator.device)).tolist()


def _evaluators(trainer) -> list[int]:
    """The ``every`` of each held-out evaluator among the trainer's callbacks (one evaluation before the first step,
    then one each ``every`` steps)."""
    from .callbacks.heldout_eval import HeldoutEval

    return [int(cb.every) for cb in trainer.callback_handler.callbacks if isinstance(cb, HeldoutEval)]


def _epoch_steps(trainer) -> int | None:
    """The optimizer steps a run of ``num_train_epochs`` epochs makes (transformers' count: dataloader batches per
    epoch over gradient accumulation), for a recipe without ``max_steps``."""
    try:
        batches = len(trainer.get_train_dataloader())
    except TypeError:  # an iterable dataset has no length
        return None
    args = trainer.args
    return math.ceil(args.num_train_epochs * max(batches // args.gradient_accumulation_steps, 1))


def _candidates(shape: dict) -> list[dict]:
    """Smaller settings with the same completions per optimizer step: the per-device batch divided (gradient
    accumulation multiplied, the generation batch divided with it), then shorter completions."""
    pdb, ga, spg = (shape["per_device_train_batch_size"], shape["gradient_accumulation_steps"],
                    shape["steps_per_generation"])
    out = []
    for f in BATCH_DIVISORS:
        if pdb % f == 0 and (pdb // f * shape["processes"] * spg) % shape["num_generations"] == 0:
            out.append({"per_device_train_batch_size": pdb // f, "gradient_accumulation_steps": ga * f,
                        "steps_per_generation": spg})
    smallest = out[-1] if out else {}
    for share in LENGTH_SHARES:
        out.append({**smallest, "max_completion_length": max(1, int(shape["completion_tokens"] * share))})
    return out


def run_preflight(argv: Sequence[str], build_trainer, typical_steps: int = TYPICAL_STEPS,
                  search: bool = True) -> PreflightResult:
    """Measure the recipe in ``argv`` (a recipe path and ``--field value`` overrides) as the module docstring says,
    with trainers built by ``build_trainer`` (:func:`rookgrpo.train.build_trainer`); raises :class:`PreflightFailed`
    where the worst case does not fit. Every process of a launch calls it."""
    from .recipe import parse_recipe

    _say_config_notices_once()
    started = time.perf_counter()
    training_args = parse_recipe(list(argv))[1]
    output_dir = training_args.output_dir
    tasks = sorted(training_args.task_generation_kwargs or {}) or [None]
    with tempfile.TemporaryDirectory(prefix="rookgrpo-preflight-") as tmp:
        # The worst case of each task where batches are task-homogeneous: the first that does not fit, else the one
        # whose step is the slowest (the estimate reads its width)
        worst = None
        for task in tasks:
            measured = _measure(build_trainer, argv, f"{tmp}/worst", 2, worst=True, settings={}, task=task)
            if worst is not None and measured.peak_per_process and worst.peak_per_process:  # the tasks' larger peak
                measured.peak_per_process = [max(a, b) for a, b in zip(measured.peak_per_process,
                                                                       worst.peak_per_process)]
                measured.peak_mib = max(measured.peak_per_process)
            if worst is None or not measured.fits or (worst.fits and _last(measured.step_seconds) >
                                                      _last(worst.step_seconds)):
                worst = measured
            if not worst.fits:
                break
        attempts = [Attempt({}, worst.fits, worst.peak_mib, _last(worst.step_seconds), worst.phase, worst.error)]
        result = PreflightResult(fits=worst.fits, shape=worst.shape, memory_kind=worst.memory_kind,
                                 peak_mib=worst.peak_mib if worst.fits else None, limit=worst.limit or {},
                                 worst_step_seconds=attempts[0].step_seconds, attempts=attempts,
                                 peak_mib_per_process=worst.peak_per_process if worst.fits else [])
        if not worst.fits:
            for settings in (_candidates(worst.shape) if search else []):
                tried = _measure(build_trainer, argv, f"{tmp}/try", 1, worst=True, settings=settings,
                                 task=worst.shape.get("task"))
                attempts.append(Attempt(settings, tried.fits, tried.peak_mib, _last(tried.step_seconds), tried.phase,
                                        tried.error))
                if tried.fits:
                    break
        else:
            typical = _measure(build_trainer, argv, f"{tmp}/typical", typical_steps, worst=False, settings={})
            max_steps = training_args.max_steps  # else the typical trainer counts the epochs' steps
            _estimate(result, typical, worst, int(max_steps) if max_steps and max_steps > 0 else None)
    result.preflight_seconds = time.perf_counter() - started
    _write(result, output_dir)
    if not result.fits:
        raise PreflightFailed(_failure_message(result))
    return result


def _last(values: list) -> float | None:
    return values[-1] if values else None


def _estimate(result: PreflightResult, typical: _Measured, worst: _Measured, run_steps: int | None) -> None:
    """The run's time: a step's time as a line through the typical steps' (mean time, mean padded width) and the worst
    case's, read at the width the run's batches have on average (the expected longest prompt of a process's
    generation batch, drawn from the dataset's prompt lengths, plus the typical completions' width); times the run's
    steps, plus the first step's warm-up and the held-out evaluations."""
    times = typical.step_seconds
    if not times:
        return
    steady = times[1:] or times
    mean = statistics.fmean(steady)
    steps = run_steps or typical.run_steps or len(times)
    per_step = mean
    if typical.widths and worst.widths and typical.prompt_lengths and result.worst_step_seconds:
        w_typical = statistics.fmean(p + c for p, c in typical.widths)
        w_worst = statistics.fmean(p + c for p, c in worst.widths)
        s = typical.shape
        n = max(1, s["per_device_train_batch_size"] * s["steps_per_generation"] // s["num_generations"])
        w_run = expected_max(typical.prompt_lengths, n) + statistics.fmean(c for _, c in typical.widths)
        if w_worst > w_typical:
            slope = (result.worst_step_seconds - mean) / (w_worst - w_typical)
            per_step = min(max(mean + slope * (w_run - w_typical), min(steady)), max(result.worst_step_seconds, mean))
    result.typical_step_seconds, result.step_seconds, result.run_steps = mean, per_step, steps
    heldout = [h["timing/heldout"] for h in typical.log_history if h.get("step") == 0 and "timing/heldout" in h]
    estimate = per_step * steps + (times[0] - mean if len(times) > 1 else 0.0)  # the first step's warm-up, once
    if heldout and typical.evaluators:
        result.evaluations = sum(1 + steps // every for every in typical.evaluators)
        result.evaluation_seconds = heldout[0]
        estimate += result.evaluations * heldout[0]
    result.estimate_seconds = estimate


def _failure_message(result: PreflightResult) -> str:
    worst = result.attempts[0]
    s = result.shape
    fitting = next((a for a in result.attempts[1:] if a.fits), None)
    limit = f" under a limit of {result.limit['bytes'] / MIB:.0f} MiB ({result.limit['source']})" if result.limit \
        else ""
    text = (f"preflight: the worst-case step does not fit{limit}: {s['prompts_per_step']} prompt(s) of up to "
            f"{s['prompt_tokens']} tokens x {s['num_generations']} completions of {s['completion_tokens']} tokens, "
            f"per_device_train_batch_size {s['per_device_train_batch_size']}, gradient_accumulation_steps "
            f"{s['gradient_accumulation_steps']}, steps_per_generation {s['steps_per_generation']}, "
            f"{s['processes']} process(es): out of memory in {worst.phase or 'the step'} at "
            f"{worst.peak_mib or 0:.0f} MiB {'allocated' if result.memory_kind.startswith('cuda') else 'resident'} "
            f"({worst.error}). ")
    if fitting is not None:
        text += (f"Measured to fit: {_settings_text(fitting.settings)} (peak {fitting.peak_mib:.0f} MiB, "
                 f"worst-case step {fitting.step_seconds:.2f} s); set these in the recipe.")
    else:
        tried = "; ".join(_settings_text(a.settings) for a in result.attempts[1:]) or "none"
        text += (f"No smaller setting tried fits ({tried}): use a smaller model or LoRA (peft), gradient "
                 "checkpointing, or more memory per process.")
    return text


def _write(result: PreflightResult, output_dir: str | None) -> None:
    if int(os.environ.get("RANK", "0")) != 0:
        return
    logger.warning("%s", result.report())
    if output_dir:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        (Path(output_dir) / "preflight.json").write_text(json.dumps(result.to_dict(), indent=1))
