"""Configuration: ``RookGRPOConfig`` (a ``GRPOConfig`` with the plugin's fields) and the recipe-level arguments.

Every field carries ``metadata={"help": ...}`` so ``python -m rookgrpo --help`` documents it, as TRL's configs do.
With every rookgrpo field at its default, ``RookGRPOConfig`` is a plain ``GRPOConfig``: same defaults, same checks,
except these. On a machine without a GPU a recipe written for GPUs trains on CPU without mixed precision, with a
one-line notice, instead of stopping with transformers' "Your setup doesn't support bf16/gpu". And
``position_ids_from_mask`` is on: the loss scores a left-padded completion at the positions that sampled it
(:mod:`rookgrpo.dynamics.positions`), which TRL does not do for models with absolute position embeddings. And three
numerical guards are on (:mod:`rookgrpo.dynamics.attention`, :mod:`rookgrpo.dynamics.nonfinite`): no attention row is
fully masked, cuDNN's SDPA backend stays out of the training loss's forward and backward on CUDA, and a NaN gradient
skips its optimizer step.

Which numbers the defaults change against TRL's, in a run with no NaN: ``position_ids_from_mask`` changes the loss's
log-probs (and so the loss, KL and gradients) of a left-padded completion on models with learned absolute positions
(GPT-2); on rotary models only by rounding. ``no_fully_masked_rows`` changes only the outputs of pad query rows, which
no loss, reward or real token reads: every logged number is TRL's, on CPU and on CUDA. ``allow_cudnn_attention: false``
changes nothing on CPU; on CUDA the training loss's forward and backward run on flash, memory-efficient or math SDPA
kernels instead of cuDNN's, so the loss and gradients differ from TRL's by those kernels' rounding, and the step time
by their speed (``benchmarks/bench_gpu_check.py``); generation, the reference's and the old policy's scoring and
evaluation keep every backend. ``skip_nonfinite_updates`` changes nothing in a finite run. ``reward_isolation`` (on)
changes nothing while every reward call succeeds; a failing call's rows are left out instead of ending the run
(:mod:`rookgrpo.rewards.isolation`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from trl import GRPOConfig, ScriptArguments

from .errors import ConfigError

logger = logging.getLogger(__name__)


@dataclass
class RookGRPOConfig(GRPOConfig):
    """``GRPOConfig`` plus rookgrpo's fields. Features are off unless a field switches them on, except one
    correction of TRL's scoring, ``position_ids_from_mask``.

    The checks here run before TRL's own so that common mistakes get a message that names the field and the fix.
    """

    stockfish_path: str | None = field(
        default=None,
        metadata={
            "help": "Stockfish binary for the chess rewards. Default: $ROOKGRPO_STOCKFISH, `stockfish` on PATH, then "
            "/usr/games/stockfish. A missing binary is an error at trainer start."
        },
    )
    stockfish_depth: int | None = field(
        default=10,
        metadata={"help": "Search depth per analysis (deterministic with the hash cleared per request)."},
    )
    stockfish_nodes: int | None = field(
        default=None,
        metadata={"help": "Node limit per analysis, instead of or with stockfish_depth (also deterministic)."},
    )
    stockfish_workers: int | None = field(
        default=None,
        metadata={"help": "Stockfish processes per training process. Default: min(CPU cores, 4)."},
    )

    code_sandbox_isolation: str = field(
        default="full",
        metadata={
            "help": "What the code reward (code_exec) requires before it runs a model-written program. 'full': "
            "bubblewrap with user namespaces; on a machine without them the trainer refuses to start, naming the "
            "package or setting to fix. 'reduced': run the programs without bubblewrap, on purpose, under the layers "
            "docs/sandbox.md lists for that mode (as root: namespaces rookgrpo makes itself)."
        },
    )

    task_generation_kwargs: dict | str | None = field(
        default=None,
        metadata={
            "help": "Per-task sampling settings, e.g. {P: {temperature: 0.5, top_p: 0.9}, A: {temperature: 0.95}} "
            "(JSON on the command line). Generation batches become task-homogeneous (by task_column) and the loss "
            "uses the temperature that sampled each batch. Allowed keys: temperature, top_p, top_k, min_p, "
            "repetition_penalty. Tasks not named keep the recipe's settings."
        },
    )
    task_column: str = field(
        default="task",
        metadata={"help": "Dataset column naming each row's task, for task_generation_kwargs (RookWorld: P or A)."},
    )
    position_ids_from_mask: bool = field(
        default=True,
        metadata={
            "help": "Score completions at the positions generation used: forwards of the policy and reference that "
            "bring no position_ids get them from the attention mask, as transformers' generate does. Without it, "
            "models with learned absolute position embeddings (GPT-2, RookWorld-LM) score each completion of a "
            "left-padded prompt shifted by its pad count, so the loss's log-probs and KL are not those of the "
            "distribution that sampled it (TRL passes no position_ids). No effect on rotary models beyond rounding; "
            "multimodal models are left alone. On by default; false reproduces TRL's scoring."
        },
    )

    no_fully_masked_rows: bool = field(
        default=True,
        metadata={
            "help": "SDPA attention masks with no fully masked query row: a left-padded prompt's pad rows attend to "
            "themselves. Exact for real tokens (they still never see pad keys; pad rows get zero gradient). Without "
            "it, the cuDNN SDPA backward on H100/H200 returns NaN gradients for any left-padded batch whose width is "
            "64 mod 128 (pytorch/pytorch#196678; docs/howto.md). On by default; false builds transformers' masks."
        },
    )
    allow_cudnn_attention: bool = field(
        default=False,
        metadata={
            "help": "Let SDPA pick its cuDNN backend in the training loss's forward (and so its backward) on CUDA. "
            "Off by default: its backward returns NaN gradients for rows with a very negative logsumexp "
            "(pytorch/pytorch#196678, huggingface/trl#7181); flash, memory-efficient and math kernels stay available, "
            "and generation and the no-grad scoring passes keep every backend. No effect on CPU."
        },
    )
    skip_nonfinite_updates: bool = field(
        default=True,
        metadata={
            "help": "Skip an optimizer step whose gradient norm or loss is NaN/inf: its gradients are dropped before "
            "the step (no weight, moment or weight-decay change; under DeepSpeed ZeRO inside the engine's step, its "
            "fp32 master weights included), the same on every rank, and the step is counted in the logged "
            "skipped_updates. Under fp16 a loss scaler's routine overflow (finite loss, scale above 1) is left to the "
            "scaler and not counted. On by default; false applies such steps as transformers does."
        },
    )

    reward_isolation: bool = field(
        default=True,
        metadata={
            "help": "Isolate every reward function call (rookgrpo.rewards.isolation): exceptions caught, a timeout "
            "(reward_timeout), a result of the wrong length or a non-number treated as a failed call. A failed call's "
            "rows are unscorable for the whole row (every component NaN: TRL leaves them out of the group baseline, "
            "advantage 0), counted in rewards/<name>/failed; None keeps TRL's meaning (does not apply), counted in "
            "rewards/<name>/none. On by default; false lets a reward's exception end the run as TRL does."
        },
    )
    reward_timeout: float | None = field(
        default=300.0,
        metadata={
            "help": "Seconds one reward function call may take before it counts as failed (reward_isolation). A "
            "synchronous call that times out is abandoned in its thread (it runs on, its result discarded); an async "
            "one is cancelled. null: no timeout (exceptions are still caught)."
        },
    )
    reward_failure_patience: int = field(
        default=3,
        metadata={
            "help": "Stop the run (RewardFunctionError, with the function's name and traceback) once a reward function "
            "has failed on every row of this many consecutive training batches: a bug stops the run within its first "
            "batches, a flaky call (a judge that times out now and then) does not. 0: never stop."
        },
    )

    measured_settings: dict | str | None = field(
        default=None,
        metadata={
            "help": "Settings of this recipe chosen by a measured experiment: {field: where the measurement is}, "
            "e.g. {learning_rate: docs/experiments/my_grid.md} (JSON on the command line). The doctor's fixes never "
            "advise changing them on one run's log alone; they say where they were measured. Recorded in "
            "run_info.json."
        },
    )

    def __post_init__(self):
        from .dynamics.task_sampling import parse_task_generation_kwargs

        _check_num_generations(self.num_generations)
        if self.code_sandbox_isolation not in ("full", "reduced"):
            raise ConfigError(f"code_sandbox_isolation: {self.code_sandbox_isolation!r} is not an isolation mode; use "
                              "'full' (bubblewrap, the default) or 'reduced' (without bubblewrap, on purpose; "
                              "docs/sandbox.md).")
        self.task_generation_kwargs = parse_task_generation_kwargs(self.task_generation_kwargs)
        _check_generation_kwargs_overlap(self.task_generation_kwargs, self.generation_kwargs)
        self.measured_settings = _parse_measured(self.measured_settings)
        _check_reward_isolation(self)
        _fall_back_to_cpu(self)
        _match_deepspeed_precision(self)
        _skip_deepspeed_cpu_kernel(self)
        super().__post_init__()


def _has_accelerator() -> bool:
    import torch

    if torch.cuda.is_available():
        return True
    for name in ("xpu", "npu", "mps"):
        backend = getattr(torch, name, None) or getattr(torch.backends, name, None)
        try:
            if backend is not None and backend.is_available():
                return True
        except Exception:  # noqa: BLE001 (a backend that cannot even answer is not available)
            pass
    return False


def _check_generation_kwargs_overlap(per_task: dict | None, generation_kwargs) -> None:
    """Refuse ``generation_kwargs`` that set a sampling setting ``task_generation_kwargs`` also sets.

    The two would disagree on which wins: TRL's vLLM backend applies ``generation_kwargs`` to SamplingParams after the
    per-task values (so they would lose under ``use_vllm``), while transformers' generation takes the per-task values.
    One place for each setting keeps the loss's temperature that of the sampler on either backend.
    """
    import json

    if not per_task or not generation_kwargs:
        return
    if isinstance(generation_kwargs, str):
        try:
            generation_kwargs = json.loads(generation_kwargs)
        except ValueError:
            return  # TRL's own parsing says what is wrong with it
    if not isinstance(generation_kwargs, dict):
        return
    both = sorted({key for settings in per_task.values() for key in settings} & set(generation_kwargs))
    if both:
        raise ConfigError(
            f"generation_kwargs sets {both}, which task_generation_kwargs also sets per task: TRL's vLLM backend would "
            f"let generation_kwargs override the per-task values (and the loss would use a temperature that did not "
            f"sample the batch). Set {', '.join(both)} in one place: the recipe's own field (temperature: ..., "
            f"top_p: ...) for tasks not named, task_generation_kwargs for each task."
        )


def _fall_back_to_cpu(args) -> None:
    """A recipe written for GPUs, run where there is none: train on CPU without mixed precision (the weights keep the
    recipe's ``dtype``), with one line saying so.

    Without this, transformers stops with "Your setup doesn't support bf16/gpu" (TRL turns bf16 on by default)
    before any check of ours runs. Where an accelerator is present, or ``use_cpu`` is set, nothing changes.
    """
    if args.use_cpu or _has_accelerator():
        return
    changed = ["use_cpu: true"]
    if args.bf16 is not False:
        args.bf16 = False
        changed.append("bf16: false")
    if args.fp16:
        args.fp16 = False
        changed.append("fp16: false")
    args.use_cpu = True
    logger.warning("no GPU here: training on CPU without mixed precision (%s). Set these in the recipe to silence this "
                   "notice.",
                   ", ".join(changed))


def _accelerate_deepspeed() -> bool:
    """Whether ``accelerate launch`` started this process for DeepSpeed (a ``distributed_type: DEEPSPEED`` config)."""
    import os

    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() in ("1", "true", "yes")


def _match_deepspeed_precision(args) -> None:
    """Under DeepSpeed launched from an accelerate config, train in the trainer's precision (the recipe's ``bf16`` /
    ``fp16``, after the CPU fallback), with one line where the config said otherwise.

    Why: accelerate hands DeepSpeed the config's ``mixed_precision``, and transformers refuses to start when it differs
    from the trainer's ("ds bf16.enabled=True vs hf bf16|bf16_full_eval=False"): a packaged ``zero2``/``zero3`` config
    (bf16, for GPUs) with a CPU recipe, or on a machine where the CPU fallback turned bf16 off. TRL stops there; here
    the recipe decides, as it does on one process. A DeepSpeed JSON config of the user's own (``deepspeed``) is left
    to transformers, which fills its ``auto`` values from the trainer.
    """
    import os

    if args.deepspeed or not _accelerate_deepspeed():
        return
    bf16 = args.bf16 if args.bf16 is not None else not args.fp16  # TRL's default: bf16 unless fp16
    wanted = "fp16" if args.fp16 else "bf16" if bf16 else "no"
    given = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    if given != wanted:
        os.environ["ACCELERATE_MIXED_PRECISION"] = wanted
        if int(os.environ.get("RANK", "0")) == 0:
            logger.warning("DeepSpeed: the accelerate config's mixed_precision is %s, the trainer's is %s (bf16: %s, "
                           "fp16: %s); training in the trainer's. Set the same in both to silence this notice.",
                           given, wanted, str(bool(bf16)).lower(), str(bool(args.fp16)).lower())


def _skip_deepspeed_cpu_kernel(args) -> None:
    """A DeepSpeed run on CPU processes starts without compiling DeepSpeed's shared-memory inference kernel, which
    only tensor-parallel inference uses (:func:`rookgrpo.dynamics.deepspeed.skip_cpu_inference_kernel`): no minute of
    gcc on the first run, and no C++ compiler needed. Runs on GPUs, and runs without DeepSpeed, are untouched."""
    if (args.deepspeed or _accelerate_deepspeed()) and args.use_cpu and not _has_accelerator():
        from .dynamics.deepspeed import skip_cpu_inference_kernel

        skip_cpu_inference_kernel()


def _check_reward_isolation(args) -> None:
    if args.reward_timeout is not None:
        try:
            args.reward_timeout = float(args.reward_timeout)
        except (TypeError, ValueError):
            args.reward_timeout = None if str(args.reward_timeout).lower() in ("none", "null") else args.reward_timeout
    if args.reward_timeout is not None and (not isinstance(args.reward_timeout, float) or not args.reward_timeout > 0):
        raise ConfigError(f"reward_timeout: {args.reward_timeout!r} is not a number of seconds above 0; give the "
                          "longest one reward call may take (e.g. 300), or null for no timeout.")
    if int(args.reward_failure_patience) < 0:
        raise ConfigError(f"reward_failure_patience: {args.reward_failure_patience} is negative; give the number of "
                          "consecutive all-failing batches after which the run stops (3 by default), or 0 for never.")


def _parse_measured(value) -> dict[str, str] | None:
    """``measured_settings`` as {config field: where it was measured}; a field no config has is a typo, refused."""
    from .registry import json_mapping

    value = json_mapping(value, "measured_settings", '{"learning_rate": "docs/experiments/my_grid.md"}')
    if value is None:
        return None
    import dataclasses

    known = {f.name for f in dataclasses.fields(RookGRPOConfig)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ConfigError(f"measured_settings: {unknown} are not config fields; name the fields the measurement "
                          "chose (e.g. learning_rate, beta).")
    return {str(k): str(v) for k, v in value.items()}


def _check_num_generations(num_generations) -> None:
    if num_generations is not None and int(num_generations) < 2:
        raise ConfigError(
            f"num_generations: got {num_generations}, but GRPO compares the completions of one prompt with each other, "
            "so it needs at least 2 per prompt (a group of 1 always has advantage 0 and trains nothing). "
            "Set num_generations to 2 or more (8 is a common choice), keeping generation_batch_size divisible by it."
        )


@dataclass
class RookScriptArguments(ScriptArguments):
    """Recipe keys that are not trainer settings: data, rewards, callbacks and how to launch.

    ``dataset_name`` accepts a hub id, a local file (``.jsonl``/``.json``/``.csv``/``.parquet``/``.txt``), a local
    directory (``save_to_disk`` output or data files), or a packaged short name such as ``rookgrpo/smoke-prompts``.
    """

    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "Dataset to train on: a hub id, a local data file or directory, or a packaged short name "
            "(e.g. `rookgrpo/smoke-prompts`)."
        },
    )
    dataset_prompt_column: str = field(
        default="prompt",
        metadata={"help": "Column holding the prompts. Renamed to `prompt` (what TRL reads) when it differs."},
    )
    dataset_format: str = field(
        default="auto",
        metadata={
            "help": "How rows become prompts: `prompt` (rows have a prompt column), a format a task pack registers "
            "(`rookworld`: a `text` column of RookWorld P:/A: lines, split into prompt/completion/task/fen; "
            "`open-r1`: code problems with `verification_info`, turned into `tests`), or your own as "
            "`pkg.module:function` / `file.py:function`. `auto`: `prompt` when the prompt column is there, else the "
            "pack format whose columns match (rookworld: a `text` column)."
        },
    )
    dataset_tasks: list[str] | None = field(
        default=None,
        metadata={"help": "Tasks to keep, for formats with several (RookWorld: `[P]` for the policy task only). "
                          "Default: all."},
    )
    reward_funcs: list[str] | None = field(
        default=None,
        metadata={
            "help": "Reward functions: registered names (see `rookgrpo rewards`), `pkg.module:function`, "
            "`path/to/file.py:function`, or a reward-model id / directory. In a recipe an entry can take arguments: "
            "`- {name: my_rewards.py:length_penalty, target: 40}`."
        },
    )
    callbacks: list[str] | None = field(
        default=None,
        metadata={
            "help": "Training callbacks: registered names, `pkg.module:Class` or `file.py:Class`. In a recipe an entry can be a "
            "mapping with arguments, e.g. `- {name: my_callback, arg: 1}` or `- my_callback: {arg: 1}`."
        },
    )
    accelerate_config: str | None = field(
        default=None,
        metadata={
            "help": "Used by `rookgrpo train`: an accelerate config file, or the name of one packaged with rookgrpo "
            "(`cpu-ddp`, `ddp`, `zero2`, `zero3`, `fsdp`; `rookgrpo recipes` lists them) or bundled with TRL."
        },
    )
    num_processes: int | None = field(
        default=None,
        metadata={"help": "Used by `rookgrpo train`: number of processes for `accelerate launch`."},
    )
    max_train_samples: int | None = field(
        default=None,
        metadata={"help": "Keep only the first N training rows (quick experiments)."},
    )
    preflight: str = field(
        default="off",
        metadata={
            "help": "Before training, run the worst-case step (rookgrpo.preflight: the dataset's longest prompts, "
            "every completion max_completion_length tokens, the recipe's batch settings and code paths) and a few "
            "typical steps, in fresh trainers: print the peak memory, the step times and an estimate of the run's "
            "time, and stop before the real run, with the settings that fit, where the worst case does not. "
            "`on` (or true): then train; `only`: stop after it (`rookgrpo preflight RECIPE`); `off` (false)."
        },
    )
