"""``rookgrpo inspect RECIPE``: one real training step on one batch, shown phase by phase.

Why: hand-written debug scripts re-implement generation, rewards and the loss, and their numbers drift from the
trainer's. Inspect builds the recipe's own trainer and runs ``trainer.train()`` for exactly one optimizer step with
an observer attached, so every number it prints (rewards, advantages, loss, grad norm) is the one training computed.
Afterwards it samples the same prompts again with the updated policy and scores them the same way.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Sequence
from typing import Any

from .callbacks.base import RookCallback
from .trl_compat import pending_metrics
from .callbacks.diagnostics import kl_share, kl_term
from .evaluation import mean_se


class StepRecorder(RookCallback):
    """Records what the trainer did in its first generation batch and its first logged step."""

    state_key = "inspect_recorder"

    def __init__(self):
        self.batch: dict[str, Any] | None = None
        self.step: dict[str, float] | None = None

    def bind(self, trainer) -> None:
        super().bind(trainer)
        self.meter = trainer.measure_phases()

    def on_scored_batch(self, trainer, scored) -> None:
        if self.batch is not None or not trainer.model.training:
            return
        from .dynamics.batch import combined_rewards

        tokenizer = trainer.processing_class
        out = scored.output
        completions = tokenizer.batch_decode(out["completion_ids"].masked_fill(out["completion_mask"] == 0,
                                                                               tokenizer.pad_token_id),
                                             skip_special_tokens=True)
        rank, n = trainer.accelerator.process_index, len(scored.inputs)
        local = scored.rewards_per_func[rank * n:(rank + 1) * n]  # the final rows, after any resampling
        self.batch = {
            "inputs": [dict(row) for row in scored.inputs],
            "prompts": [row["prompt"] for row in scored.inputs],
            "completions": completions,
            "reward_names": list(trainer.reward_func_names),
            "rewards_per_func": local.tolist(),
            "rewards": combined_rewards(local, trainer.reward_weights).tolist(),
            "advantages": out["advantages"].tolist(),
            "phase_times": self.meter.pending(),
        }

    def before_log(self, trainer, logs: dict) -> None:
        if self.step is None and "loss" in logs:
            metrics = pending_metrics(trainer)
            self.step = {k: sum(v) / len(v) for k, v in metrics.items() if v and isinstance(v[0], (int, float))}
            self.step.update({k: float(v) for k, v in logs.items() if isinstance(v, (int, float))})
            self.step["beta"] = float(trainer.beta)
            self.step["loss_type"] = trainer.loss_type


def inspect_recipe(argv: Sequence[str]) -> dict[str, Any]:
    """Run one step of the recipe in ``argv`` (recipe path + overrides) and return the report as a dict."""
    from trl import GRPOTrainer

    from .dynamics.batch import combined_rewards
    from .train import build_trainer

    recorder = StepRecorder()
    with tempfile.TemporaryDirectory(prefix="rookgrpo-inspect-") as tmp:
        overrides = ["--max_steps", "1", "--logging_steps", "1", "--save_strategy", "no", "--report_to", "none",
                     "--output_dir", tmp]
        trainer, _, model_path = build_trainer([*argv, *overrides], extra_callbacks=[recorder])
        trainer.train()
        if recorder.batch is None or recorder.step is None:
            raise RuntimeError("inspect: the training step produced no batch or no log; nothing to show.")
        # Same prompts, updated policy, scored by TRL's own code path (no resampling hooks).
        trainer.model.train()
        GRPOTrainer._generate_and_score_completions(trainer, recorder.batch["inputs"])
        after = combined_rewards(trainer._last_rewards_per_func, trainer.reward_weights).tolist()
    batch = recorder.batch
    G = trainer.num_generations
    return {
        "model": model_path,
        "num_generations": G,
        "batch": {k: v for k, v in batch.items() if k != "inputs"},
        "step": recorder.step,
        "reward_before": mean_se(batch["rewards"]) if batch["rewards"] is not None else None,
        "reward_after": mean_se(after[:len(batch["prompts"])]),
    }


def _short(text: str, width: int = 72) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 1] + "…"


def format_report(report: dict[str, Any], max_groups: int = 4) -> str:
    """The report as text, phase by phase (prompts, completions and rewards, groups, loss, timing, before/after)."""
    batch, step, G = report["batch"], report["step"], report["num_generations"]
    n_groups = len(batch["prompts"]) // G
    lines = [f"model {report['model']}: one step on {n_groups} prompts × {G} completions", ""]
    lines.append("1. prompts")
    for g in range(min(n_groups, max_groups)):
        lines.append(f"  [{g}] {_short(batch['prompts'][g * G])}")
    if n_groups > max_groups:
        lines.append(f"  ... {n_groups - max_groups} more")
    lines += ["", "2. completions, reward per component, advantage (per group: mean ± std)"]
    names = batch["reward_names"]
    for g in range(min(n_groups, max_groups)):
        rows = range(g * G, (g + 1) * G)
        if batch["rewards"] is not None:
            vals = [batch["rewards"][i] for i in rows if not math.isnan(batch["rewards"][i])]
            mean = sum(vals) / len(vals) if vals else float("nan")
            std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
            lines.append(f"  group {g}: reward {mean:.3f} ± {std:.3f}" + ("   (zero std: no signal)" if std == 0 else ""))
        for i in rows:
            parts = ""
            if batch["rewards_per_func"] is not None:
                parts = " ".join(f"{n}={v:.2f}" for n, v in zip(names, batch["rewards_per_func"][i])
                                 if not math.isnan(v))
                parts = f" [{parts}]"
            lines.append(f"    adv {batch['advantages'][i]:+.3f}{parts} {_short(batch['completions'][i], 56)!r}")
    beta, kl, loss = step.get("beta", 0.0), step.get("kl"), step.get("loss", float("nan"))
    lines += ["", "3. loss"]
    loss_type = step.get("loss_type", "dapo")
    term = kl_term(loss_type, beta, kl)
    if term is not None:
        share = kl_share(loss, term)
        lines.append(f"  loss {loss:.6f} = policy term {loss - term:.6f} + beta·KL {term:.6f} "
                     f"(beta {beta:g}, per-token KL {kl:.6f}; KL share {share:.0%}; loss_type {loss_type})")
    elif kl is not None:
        lines.append(f"  loss {loss:.6f} (beta {beta:g}, per-token KL {kl:.6f}); loss_type {loss_type} weights tokens "
                     "per sequence or by a fixed length, so beta·KL is not its KL term and no split is shown")
    else:
        lines.append(f"  loss {loss:.6f} (beta 0: no KL term)")
    lines.append(f"  grad norm {step.get('grad_norm', float('nan')):.4f}")
    for key in ("frac_reward_zero_std", "resample/rounds", "resample/frac_zero_std_after", "groups/identical_frac"):
        if key in step:
            lines.append(f"  {key} {step[key]:.3f}")
    lines += ["", "4. timing (seconds)"]
    times = {**batch.get("phase_times", {}), **{k[len("timing/"):]: v for k, v in step.items() if k.startswith("timing/")}}
    if "step_time" in step:
        times.setdefault("step", step["step_time"])
    lines.append("  " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(times.items())))
    peaks = {k[len("memory/"):]: v for k, v in step.items() if k.startswith("memory/")}
    if peaks:
        lines.append("  peak memory (MiB): " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(peaks.items())))
    lines += ["", "5. mean reward on the same prompts (sampled), before → after the step"]
    before, after = report["reward_before"], report["reward_after"]
    if before is not None:
        lines.append(f"  {before[0]:.4f} ± {before[1]:.4f} → {after[0]:.4f} ± {after[1]:.4f} (± standard error)")
    else:
        lines.append(f"  after: {after[0]:.4f} ± {after[1]:.4f}")
    return "\n".join(lines)
