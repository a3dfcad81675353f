"""The training entry point behind ``python -m rookgrpo`` and ``accelerate launch -m rookgrpo``.

Read top to bottom: parse the recipe, load data, build the trainer (which resolves rewards and callbacks, so name
errors surface before the model loads), train, save, and write ``run_info.json`` next to the checkpoints.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

logger = logging.getLogger(__name__)


def build_trainer(argv: Sequence[str], extra_callbacks: Sequence = (), adjust=None, dataset_transform=None):
    """Parse a recipe (plus ``--field value`` overrides) and build its trainer; returns (trainer, script_args, model).

    ``adjust(script_args, training_args)`` may change the parsed settings before anything loads, and
    ``dataset_transform(dataset, model_path, training_args)`` the prepared training data (``rookgrpo preflight``:
    the worst case)."""
    from trl import get_peft_config, get_quantization_config

    from .assets import resolve_model
    from .data import load_recipe_dataset, prepare_dataset
    from .errors import ConfigError
    from .recipe import parse_recipe
    from .trainer import RookGRPOTrainer

    script_args, training_args, model_args = parse_recipe(argv)
    if adjust is not None:
        adjust(script_args, training_args)
    if not model_args.model_name_or_path:
        raise ConfigError("model_name_or_path: not set. Give a hub id, a local directory, or rookgrpo/tiny-random.")
    model_path = resolve_model(model_args.model_name_or_path)
    training_args.model_init_kwargs = {
        "revision": model_args.model_revision,
        "trust_remote_code": training_args.trust_remote_code,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
        **(training_args.model_init_kwargs or {}),
    }

    train_dataset = load_recipe_dataset(
        script_args.dataset_name,
        script_args.dataset_config,
        script_args.dataset_train_split,
        streaming=script_args.dataset_streaming,
    )
    train_dataset = prepare_dataset(train_dataset, script_args)
    if script_args.max_train_samples is not None:
        train_dataset = train_dataset.select(range(min(script_args.max_train_samples, len(train_dataset))))
    if dataset_transform is not None:
        train_dataset = dataset_transform(train_dataset, model_path, training_args)
    eval_dataset = None
    if training_args.eval_strategy != "no":
        eval_dataset = load_recipe_dataset(
            script_args.dataset_name, script_args.dataset_config, script_args.dataset_test_split
        )
        eval_dataset = prepare_dataset(eval_dataset, script_args)

    trainer = RookGRPOTrainer(
        model=model_path,
        reward_funcs=script_args.reward_funcs,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        callbacks=[*(script_args.callbacks or []), *extra_callbacks] or None,
        peft_config=get_peft_config(model_args),
        quantization_config=get_quantization_config(model_args),
    )
    if trainer.accelerator.is_main_process:
        logger.info("%s", trainable_summary(trainer.model))
    return trainer, script_args, model_path


def trainable_summary(model) -> str:
    """One line: how many parameters train, of how many (LoRA's share, or all of them).

    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    >>> _ = net[0].requires_grad_(False)
    >>> trainable_summary(net)
    'trainable parameters: 5 of 25 (20.00%)'
    """
    from .dynamics.deepspeed import numel  # a ZeRO-3 parameter's own numel() is 0 outside a forward

    total = sum(numel(p) for p in model.parameters())
    trainable = sum(numel(p) for p in model.parameters() if p.requires_grad)
    return f"trainable parameters: {trainable:,} of {total:,} ({100 * trainable / max(total, 1):.2f}%)"


def main(argv: Sequence[str]) -> int:
    from .preflight import preflight_mode, run_preflight

    mode = preflight_mode(argv)
    if mode != "off":  # the worst case's step (and a few typical ones) before anything commits to the settings
        result = run_preflight(argv, build_trainer)
        if mode == "only":
            return 0 if result.fits else 2
    trainer, script_args, model_path = build_trainer(argv)
    training_args = trainer.args
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    trainer.save_state()  # trainer_state.json with the log history (what `rookgrpo plot` reads)
    if trainer.accelerator.is_main_process:
        write_run_info(trainer, model_path, script_args)
    shutdown(trainer)
    return 0


def shutdown(trainer) -> None:
    """Release the trainer, then end trackers and the process group, in an order that cannot hang.

    Destroying the process group first (as ``trainer.end()`` alone does) leaves DDP's Reducer holding the last
    reference to the gloo group; freeing it afterwards, while the peer rank is already gone, can block forever in
    the group's destructor. So every rank drops its model references behind a barrier while the group is alive.
    """
    import gc

    accelerator = trainer.accelerator
    accelerator.wait_for_everyone()
    accelerator.free_memory()  # drops accelerate's references to the prepared (DDP-wrapped) model and optimizer
    trainer.model = trainer.model_wrapped = trainer.optimizer = trainer.lr_scheduler = None
    del trainer
    gc.collect()
    accelerator.wait_for_everyone()
    accelerator.end_training()  # trackers, then the process group


def write_run_info(trainer, model_path: str, script_args) -> Path:
    """Write ``run_info.json``: what ran (world size, versions, rewards, steps) and the last logged metrics."""
    import torch
    import transformers
    import trl

    from . import __version__
    from .rewards.registry import judge_names

    history = trainer.state.log_history
    train_logs = [h for h in history if "loss" in h]
    info = {
        "rookgrpo_version": __version__,
        "trl_version": trl.__version__,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "world_size": trainer.accelerator.num_processes,
        # fp16's loss-scaler overflows are routine: the doctor reads the precision to tell them from a fault
        "precision": "fp16" if trainer.args.fp16 else "bf16" if trainer.args.bf16 else "fp32",
        "distributed_type": str(trainer.accelerator.distributed_type),
        "model": model_path,
        "dataset": script_args.dataset_name,
        "reward_funcs": trainer.reward_func_names,
        "reward_weights": [float(w) for w in trainer.reward_weights.tolist()],
        # Rewards that are reward models (judges): the doctor names a judge's causes, not a rule's.
        "judges": list(judge_names(trainer)),
        # Settings the recipe chose by measurement: the doctor's fixes do not advise changing them.
        "measured_settings": getattr(trainer.args, "measured_settings", None) or {},
        "global_step": trainer.state.global_step,
        # Reward calls that failed (reward_isolation): the doctor names them with their first error.
        "reward_failures": trainer._isolation.summary() if getattr(trainer, "_isolation", None) else {},
        "last_log": train_logs[-1] if train_logs else None,
    }
    path = Path(trainer.args.output_dir) / "run_info.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info, indent=2, default=str))
    logger.info("wrote %s", path)
    return path
