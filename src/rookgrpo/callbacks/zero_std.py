"""``ZeroStdResampling``: replace groups whose completions all earned the same reward with freshly drawn prompts.

Why: a group whose ``G`` completions all got the same reward has advantage 0 everywhere and teaches nothing; when
most groups are like that (RookWorld ``A:`` prompts whose completions were identical, a reward everyone fails) the
loss is exactly 0 and the run "does nothing". After TRL scores a generation batch, this callback finds those groups
and replaces them with groups of new prompts, for up to ``max_rounds`` extra generation rounds. Groups still without
signal after the cap are kept (and counted).

Distributed: every rank decides from the rewards TRL gathers over all ranks, and draws replacement prompts from a
generator seeded by (seed, step, round), so all ranks take the same decisions without extra communication. Each
round every rank generates the same number of groups (the largest number any rank needs), so TRL's collectives
(reward gather, vLLM server generation) stay aligned. A group must live on one rank: the trainer refuses
configurations where the per-rank generation batch is not a multiple of ``num_generations``.

Advantages: with per-group scaling (``scale_rewards: group`` or ``none``) each kept group carries the advantages TRL
computed for it. Under ``scale_rewards: batch`` or ``multi_objective_aggregation: normalize_then_sum`` advantages
depend on the whole batch, so they are recomputed over the final batch. The loss normaliser
(``num_items_in_batch``) is recounted, and the reference/old-policy log-probs are recomputed on the final padding
for the rows whose padding changed, together with the vLLM importance-sampling ratio (see :func:`_rescore_logps`).
Cost: replaced groups were fully scored (generation, log-probs, rewards) before being dropped;
``resample/extra_completions`` reports what the extra rounds generated, ``resample/rescored_rows`` the no-grad rows
recomputed after splicing.
"""

from __future__ import annotations

import hashlib

import torch
from trl.trainer.utils import nanstd

from ..dynamics import batch as B
from ..errors import ConfigError
from ..trl_compat import completion_table, pending_metrics, rewrite_completion_table, widen_completion_table
from .base import RookCallback
from .registry import register_callback


@register_callback("zero_std_resampling")
class ZeroStdResampling(RookCallback):
    """Replace zero-std groups of each training generation batch, up to ``max_rounds`` extra rounds.

    Logs per generation batch: ``resample/rounds``, ``resample/frac_zero_std_before``,
    ``resample/frac_zero_std_after``, ``resample/extra_completions``.

    ``oversample: k`` (k >= 2) turns it into DAPO's dynamic sampling as verl runs it, for comparisons: each extra
    round draws a fixed number of groups (k - 1 batches' worth, then k), not as many as are flat.

    Args:
        max_rounds: extra generation rounds per generation batch at most; flat groups left after them are kept.
        seed: seed of the replacement draws (default: the config's ``seed``); every rank draws the same prompts.
        oversample: 0 (replace as many groups as are flat) or k >= 2 (DAPO-style fixed rounds, above).

    Example::

        >>> from rookgrpo.callbacks import resolve_callback
        >>> cb = resolve_callback({"zero_std_resampling": {"max_rounds": 2}})
        >>> type(cb).__name__, cb.max_rounds, cb.batch_stage
        ('ZeroStdResampling', 2, 'change_rows')
    """

    state_key = "zero_std_resampling"
    batch_stage = "change_rows"

    def __init__(self, max_rounds: int = 2, seed: int | None = None, oversample: int = 0):
        if int(max_rounds) < 0:
            raise ConfigError(f"zero_std_resampling.max_rounds: got {max_rounds}; use 0 (off) or more extra rounds.")
        if int(oversample) == 1 or int(oversample) < 0:
            raise ConfigError(f"zero_std_resampling.oversample: got {oversample}; use 0 (draw as many groups as are "
                              "flat) or a generation batch factor of 2 or more (DAPO-style).")
        self.max_rounds = int(max_rounds)
        # DAPO-style fixed rounds (verl's filter_groups, as a baseline): a generation batch `oversample` times the
        # trained one, so the first extra round draws (oversample - 1) batches' worth of groups and each later one
        # `oversample` batches' worth, whatever the number of flat groups; informative groups fill the flat slots in
        # generation order and the excess is dropped.
        self.oversample = int(oversample)
        self.seed = seed
        self.totals = {"batches": 0, "rounds": 0, "extra_completions": 0, "groups_replaced": 0, "groups_kept": 0}
        self._draws = 0
        self.rescored_rows = 0  # rows whose log-probs were recomputed after splicing (this process)

    def bind(self, trainer) -> None:
        super().bind(trainer)
        args = trainer.args
        G = trainer.num_generations
        per_rank = args.per_device_train_batch_size * args.steps_per_generation
        if per_rank % G:
            raise ConfigError(
                f"zero_std_resampling: each process generates per_device_train_batch_size × steps_per_generation = "
                f"{args.per_device_train_batch_size} × {args.steps_per_generation} = {per_rank} completions, not a "
                f"multiple of num_generations={G}, so a group would span processes and could not be replaced as a "
                f"whole. Make per_device_train_batch_size × steps_per_generation a multiple of {G}."
            )
        dataset = trainer.train_dataset
        if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")) or type(dataset).__name__ == "IterableDataset":
            raise ConfigError(
                "zero_std_resampling: draws replacement prompts by index, so train_dataset must be a map-style "
                "datasets.Dataset (not streaming). Load it without streaming=True or remove the callback."
            )

    # The trainer calls this after TRL scored a training generation batch (see RookGRPOTrainer).
    def on_scored_batch(self, trainer, scored) -> None:
        if not trainer.model.training or self.max_rounds == 0:
            return
        unsupported = B.unsupported_keys(scored.output)
        if unsupported:
            raise ConfigError(f"zero_std_resampling: cannot splice batches with {unsupported} (multimodal inputs); "
                              "remove the callback for this dataset.")
        G = trainer.num_generations
        world, rank = trainer.accelerator.num_processes, trainer.accelerator.process_index
        n_local = len(scored.inputs) // G
        zero = self._no_signal(trainer, scored.output, scored.rewards_per_func).view(world, n_local).tolist()
        before = sum(map(sum, zero)) / (world * n_local)
        outputs, rewards, widths, rows_per_round = [scored.output], [scored.rewards_per_func], [n_local], [scored.inputs]
        restore_logs = widen_completion_table(trainer, world * max(n_local, self.oversample * n_local) * G)
        tables = [completion_table(trainer, world * n_local * G)]
        slots = [[(0, g) for g in range(n_local)] for _ in range(world)]
        metrics = pending_metrics(trainer)
        saved_lengths = {k: len(v) for k, v in metrics.items()}
        rounds = extra = replaced = 0
        rescored_before = self.rescored_rows
        pool = trainer._replacement_pool(scored.inputs)
        weights = trainer._replacement_weights(pool)
        while rounds < self.max_rounds:
            need = max(sum(z) for z in zero)
            if need == 0:
                break
            if self.oversample:
                need = (self.oversample - (1 if rounds == 0 else 0)) * n_local
            rounds += 1
            drawn = self._draw(trainer, len(pool), world * need, weights)  # every rank's picks, rank-major
            picks = drawn[rank * need:(rank + 1) * need]
            rows = [dict(trainer.train_dataset[int(pool[i])]) for i in picks for _ in range(G)]
            out, rpf = scored.score(rows)
            tables.append(completion_table(trainer, world * need * G))
            rows_per_round.append(rows)
            outputs.append(out)
            rewards.append(rpf)
            widths.append(need)
            extra += world * need * G
            fresh_flat = self._no_signal(trainer, out, rpf)
            trainer._observe_replacements([int(pool[i]) for i in drawn], fresh_flat.tolist(), rpf)
            fresh_zero = fresh_flat.view(world, need).tolist()
            for r in range(world):
                fresh = [j for j in range(need) if not fresh_zero[r][j]]
                for g in range(n_local):
                    if zero[r][g] and fresh:
                        slots[r][g] = (rounds, fresh.pop(0))
                        zero[r][g] = False
                        replaced += 1
        after = sum(map(sum, zero)) / (world * n_local)
        if rounds:
            # TRL logged reward/length metrics for the extra rounds too; keep the logs about the batch the policy
            # produced for the sampled prompts (round 0) and report the extra rounds under resample/*.
            for key in list(metrics):
                if key not in saved_lengths:
                    del metrics[key]
                else:
                    del metrics[key][saved_lengths[key]:]
            scored.output, scored.rewards_per_func = self._assemble(trainer, outputs, rewards, widths, slots)
            scored.inputs = [rows_per_round[k][j * G + t] for k, j in slots[rank] for t in range(G)]
            order = [(k, (r * widths[k] + j) * G + t) for r in range(world) for k, j in slots[r] for t in range(G)]
            rewrite_completion_table(trainer, tables, order, scored)
        restore_logs()
        self._log_optimised(trainer, scored, metrics)
        metrics["resample/rounds"].append(float(rounds))
        metrics["resample/frac_zero_std_before"].append(before)
        metrics["resample/frac_zero_std_after"].append(after)
        metrics["resample/extra_completions"].append(float(extra))
        metrics["resample/rescored_rows"].append(float(self.rescored_rows - rescored_before))
        kept = sum(map(sum, zero))
        self.totals["batches"] += 1
        self.totals["rounds"] += rounds
        self.totals["extra_completions"] += extra
        self.totals["groups_replaced"] += replaced
        self.totals["groups_kept"] += kept

    @staticmethod
    def _no_signal(trainer, output: dict, rewards_per_func: torch.Tensor) -> torch.Tensor:
        return no_signal_groups(trainer, output, rewards_per_func)

    @staticmethod
    def _log_optimised(trainer, scored, metrics) -> None:
        """The reward numbers of the batch that is optimised (after resampling), under ``optimised/*``.

        TRL's own ``reward``, ``reward_std``, ``frac_reward_zero_std``, ``rewards/*`` and ``completions/*`` describe
        the batch sampled for the drawn prompts (round 0); ``kl``, ``entropy`` and ``clip_ratio/*`` come from the
        loss, so they describe the optimised batch. docs/dynamics.md has the full list.
        """
        G = trainer.num_generations
        rpf = scored.rewards_per_func
        aggregation = _aggregation(trainer)
        rewards = B.combined_rewards(rpf, trainer.reward_weights)
        metrics["optimised/reward"].append(torch.nanmean(rewards).item())
        metrics["optimised/reward_std"].append(nanstd(rewards).item())
        # TRL's definition, so it compares with TRL's frac_reward_zero_std of the sampled batch; the resampler's own
        # (no spread beyond float noise, or no loss token) is resample/frac_zero_std_after.
        metrics["optimised/frac_reward_zero_std"].append(
            B.trl_frac_zero_std(rpf, trainer.reward_weights, G, aggregation, trainer.scale_rewards))
        for i, name in enumerate(trainer.reward_func_names):
            metrics[f"optimised/rewards/{name}/mean"].append(torch.nanmean(rpf[:, i]).item())
            metrics[f"optimised/rewards/{name}/std"].append(nanstd(rpf[:, i]).item())
        lengths = trainer.accelerator.gather(scored.output["completion_mask"].sum(dim=1).float())
        metrics["optimised/completions/mean_length"].append(lengths.mean().item())

    def _draw(self, trainer, pool_size: int, n: int, weights: list[float] | None = None) -> list[int]:
        """``n`` indices into the pool, identical on every rank: seeded by (seed, step, draw counter).

        Uniform, or in proportion to ``weights`` (a selector's keep probabilities, identical on every rank) when they
        are given and not all zero.
        """
        if pool_size == 0:
            raise ConfigError("zero_std_resampling: no prompts to draw replacements from (empty pool).")
        seed = trainer.args.seed if self.seed is None else self.seed
        key = f"{seed}-{trainer.state.global_step}-{self._draws}".encode()
        self._draws += 1
        generator = torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(key).digest()[:8], "little"))
        if weights is not None and sum(weights) > 0:
            w = torch.tensor(weights, dtype=torch.float64)
            return torch.multinomial(w, n, replacement=True, generator=generator).tolist()
        return torch.randint(pool_size, (n,), generator=generator).tolist()

    def _assemble(self, trainer, outputs, rewards, widths, slots):
        """The final local batch and the final gathered rewards, from the groups each slot now points to."""
        G = trainer.num_generations
        rank, world = trainer.accelerator.process_index, trainer.accelerator.num_processes
        picks = [(k, j * G + t) for k, j in slots[rank] for t in range(G)]
        merged = B.take_rows(outputs, picks, trainer._tokenizer.pad_token_id, trainer.pad_to_multiple_of,
                             per_sequence=B.per_sequence_keys(getattr(trainer, "vllm_importance_sampling_mode", None)))
        final = torch.cat([
            rewards[k][(r * widths[k] + j) * G:(r * widths[k] + j + 1) * G] for r in range(world) for k, j in slots[r]
        ])
        aggregation = _aggregation(trainer)
        if trainer.scale_rewards == "batch" or aggregation == "normalize_then_sum":
            advantages = B.batch_advantages(final, trainer.reward_weights, G, trainer.scale_rewards, aggregation)
            local = len(picks)
            merged["advantages"] = advantages[rank * local:(rank + 1) * local].to(merged["advantages"].device)
        merged["num_items_in_batch"] = B.count_loss_tokens(merged, trainer.accelerator)
        width = merged["prompt_ids"].size(1)
        shifted = [i for i, (k, _) in enumerate(picks) if outputs[k]["prompt_ids"].size(1) != width]
        self.rescored_rows += _rescore_logps(trainer, merged, shifted)
        return merged, final

    def state_dict(self) -> dict:
        return {"totals": dict(self.totals), "draws": self._draws}

    def load_state_dict(self, state: dict) -> None:
        self.totals.update(state.get("totals", {}))
        self._draws = int(state.get("draws", 0))


def no_signal_groups(trainer, output: dict, rewards_per_func: torch.Tensor) -> torch.Tensor:
    """One bool per group of the gathered batch (rank-major): no reward spread under the trainer's aggregation, or no
    completion token left to learn from (every completion masked, e.g. ``mask_truncated_completions``)."""
    G = trainer.num_generations
    flat = B.zero_std_groups(rewards_per_func, trainer.reward_weights, G, _aggregation(trainer))
    mask = B.loss_mask(output)
    tokens = trainer.accelerator.gather(mask.reshape(-1, G * mask.size(1)).sum(dim=1))
    return flat | (tokens == 0).to(flat.device)


def _aggregation(trainer) -> str:
    """How the trainer combines reward functions into advantages (older TRL has only ``sum_then_normalize``)."""
    return getattr(trainer, "multi_objective_aggregation", "sum_then_normalize")


def _rescore_logps(trainer, merged: dict, rows: list[int]) -> int:
    """Recompute the old-policy and reference log-probs, and the vLLM importance-sampling ratio, of the rows of a
    spliced batch whose padding changed; returns the number of rows recomputed on this process.

    Why: models without explicit position ids (GPT-2, and every model TRL scores, since it passes none) number
    positions from the left edge, padding included. Splicing rounds left-pads prompts to the widest round's width,
    which shifts the positions of rows from narrower rounds, so log-probs TRL computed on the round's own padding no
    longer match what the loss computes: the KL term would compare two different positions (we saw KL jump from
    0.005 to 9 nats/token), and the vLLM ratio would correct against stale old log-probs. Rows from the widest round
    keep their positions (extra padding on the right of a completion changes nothing before it) and keep TRL's
    values. Every process runs the same number of passes (the largest row count any process needs, padded with
    rows that need none), so sharded models (ZeRO-3, FSDP) stay in step.
    """
    import torch
    from trl.trainer import grpo_trainer

    count = torch.tensor([len(rows)], device=merged["prompt_ids"].device)
    most = int(trainer.accelerator.gather(count).max())
    if most == 0:
        return 0
    need = set(rows)
    rows = sorted(need | set([i for i in range(merged["prompt_ids"].size(0)) if i not in need][: most - len(need)]))
    index = torch.tensor(rows, device=merged["prompt_ids"].device)
    ids = torch.cat([merged["prompt_ids"][index], merged["completion_ids"][index]], dim=1)
    mask = torch.cat([merged["prompt_mask"][index], merged["completion_mask"][index]], dim=1)
    keep = merged["completion_ids"].size(1)
    batch_size = trainer.args.per_device_train_batch_size
    with torch.no_grad():
        if "old_per_token_logps" in merged:
            merged["old_per_token_logps"][index], _, _ = trainer._get_per_token_logps_and_entropies(
                trainer.model, ids, mask, keep, batch_size)
        if "ref_per_token_logps" in merged:
            if trainer.ref_model is not None:
                merged["ref_per_token_logps"][index], _, _ = trainer._get_per_token_logps_and_entropies(
                    trainer.ref_model, ids, mask, keep, batch_size)
            else:  # PEFT: the reference is the base model (adapter off), or a saved "ref" adapter, as in TRL
                model = trainer.accelerator.unwrap_model(trainer.model)
                with grpo_trainer.use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
                    merged["ref_per_token_logps"][index], _, _ = trainer._get_per_token_logps_and_entropies(
                        trainer.model, ids, mask, keep, batch_size)
        if "importance_sampling_ratio" in merged and "sampling_per_token_logps" in merged:
            merged["importance_sampling_ratio"][index] = B.vllm_importance_sampling_ratio(
                merged["old_per_token_logps"][index], merged["sampling_per_token_logps"][index],
                B.loss_mask(merged)[index],
                trainer.vllm_importance_sampling_mode, trainer.vllm_importance_sampling_clip_min,
                trainer.vllm_importance_sampling_clip_max)
    return len(rows)
