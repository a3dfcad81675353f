"""``prompt_selection``: choose each generation batch's prompts before generating, skipping predicted-flat ones.

The rules, the history and the sampler are in :mod:`rookgrpo.dynamics.selection`; this callback owns their state, hands the
trainer the sampler, and records what every drawn prompt's group did. Named in recipes like the other callbacks::

    callbacks:
      - {name: prompt_selection, rule: greso, target_flat: 0.25}
      - {name: zero_std_resampling, max_rounds: 2}     # for the groups that still come out flat

Logged per generation batch: ``select/flat_share`` (share of the drawn groups that were flat: no reward spread, or
no token to learn from; the batch as sampled, before any resampling), ``select/skipped`` and ``select/kept`` (prompts
the sampler passed over and chose since the previous generation batch), ``select/predicted_flat_precision`` (share of
the skipped prompts whose group was flat when last drawn; logged when some were skipped), the rule's own numbers
(GRESO: ``select/p_low``, ``select/p_high``; passrate with ``target_flat``: ``select/signal_threshold``), and how
predictable flatness is in this run: ``select/flat_after_flat`` and ``select/flat_after_signal``, the share of
redrawn prompts whose group came out flat again, among those whose last group was flat and among those whose last
group had signal (cumulative). Selection can only help where the first is well above the second.

With ``zero_std_resampling``, the resampler draws its replacement prompts in proportion to the same keep
probabilities (:meth:`PromptSelection.replacement_weights`), so both skip what the history predicts flat.
"""

from __future__ import annotations

import torch

from ..dynamics.batch import combined_rewards
from ..errors import ConfigError
from ..trl_compat import pending_metrics
from ..dynamics.selection import RULES, STREAK, PromptHistory, SelectingSampler, SelectionState, flat_side
from .base import RookCallback
from .registry import register_callback
from .zero_std import no_signal_groups

PROMPT_ID_COLUMN = "rookgrpo_prompt_id"


@register_callback("prompt_selection")
class PromptSelection(RookCallback):
    """Skip prompts whose next group is predicted flat (see :mod:`rookgrpo.dynamics.selection`).

    Args:
        rule: ``"greso"`` (GRESO's ``p**k`` rule, ``p`` adapted to ``target_flat``), ``"posterior"`` (a posterior
            over the prompt's flat rate) or ``"passrate"`` (binary rewards: a posterior over its pass rate).
        max_skips: a prompt skipped this many times in a row is drawn the next time.
        discount: weight of a prompt's older draws per newer draw, for the posterior rule.
        **rule_kwargs: the rule's own settings (GRESO: ``target_flat``, ``p_start``, ``step``, ``p_min``;
            posterior: ``prior_weight``, ``explore``; passrate: ``prior``, ``explore``, ``pass_threshold``, and
            ``target_flat``, ``step``, ``max_threshold`` for its threshold mode).

    Example::

        >>> from rookgrpo.callbacks import resolve_callback
        >>> cb = resolve_callback({"prompt_selection": {"rule": "greso", "max_skips": 4}})
        >>> type(cb).__name__, cb.max_skips, cb.needs_prompt_ids, cb.batch_stage
        ('PromptSelection', 4, True, 'first_round')
    """

    state_key = "prompt_selection"
    needs_prompt_ids = True  # the trainer adds PROMPT_ID_COLUMN to the training data
    batch_stage = "first_round"  # runs before resampling: it judges the prompts it chose, as generated

    def __init__(self, rule: str = "greso", max_skips: int = 4, discount: float = 0.7, **rule_kwargs):
        if rule not in RULES:
            raise ConfigError(f"prompt_selection: rule {rule!r} is not one of {sorted(RULES)}.")
        if int(max_skips) < 0:
            raise ConfigError(f"prompt_selection: max_skips must be >= 0, got {max_skips}.")
        try:
            self.rule = RULES[rule](**rule_kwargs)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"prompt_selection: {exc} (rule {rule!r}).") from None
        self.max_skips = int(max_skips)
        self.history = PromptHistory(discount)
        self.rule.bind(self.history)
        self.state: SelectionState | None = None
        # How predictable flatness is: redraws of prompts whose last group was flat / had signal, and how many of those
        # came out flat again (cumulative since training began).
        self.redraws = {"flat": [0, 0], "signal": [0, 0]}

    def bind(self, trainer) -> None:
        super().bind(trainer)
        data = trainer.train_dataset
        if not hasattr(data, "__len__") or PROMPT_ID_COLUMN not in (getattr(data, "column_names", None) or ()):
            raise ConfigError("prompt_selection: needs a map-style train_dataset (an indexed Dataset, not streaming), "
                              "to keep a history per prompt.")
        self.state = SelectionState(trainer.args.seed)
        self.history.group_size = trainer.num_generations
        # The sampler's position is part of the checkpoint; replaying the skipped batches on resume would move it on.
        trainer.args.ignore_data_skip = True

    def make_sampler(self, trainer, dataset, tasks=None) -> SelectingSampler:
        return SelectingSampler(dataset, self.history, self.rule, self.state, mini_repeat_count=trainer.num_generations,
                                batch_size=trainer.args.generation_batch_size // trainer.num_generations,
                                repeat_count=trainer.num_iterations * trainer.args.steps_per_generation,
                                shuffle=getattr(trainer, "shuffle_dataset", True), seed=trainer.args.seed, tasks=tasks,
                                max_skips=self.max_skips)

    def replacement_weights(self, pool: list[int]) -> list[float]:
        """Keep probability of each pool prompt (dataset index = prompt id): the resampler draws replacements in
        proportion, so it passes over predicted-flat prompts as the sampler does (with the same exploration)."""
        return [self.rule.keep_probability(self.history.record(i)) for i in pool]

    def on_scored_batch(self, trainer, scored) -> None:
        if not trainer.model.training:
            return
        G = trainer.num_generations
        ids = torch.tensor([int(row[PROMPT_ID_COLUMN]) for row in scored.inputs], device=trainer.accelerator.device)
        ids = trainer.accelerator.gather(ids).cpu().tolist()
        flat = no_signal_groups(trainer, scored.output, scored.rewards_per_func).cpu().tolist()
        self._observe(trainer, ids[::G], flat, scored.rewards_per_func)
        share = sum(flat) / max(len(flat), 1)
        self._log_batch(trainer, share)

    def observe_replacements(self, trainer, prompt_ids: list[int], flat: list[bool], rewards_per_func) -> None:
        """Record the groups ``zero_std_resampling`` drew as replacements (identical on every rank: the prompt ids
        come from its seeded draw, the rewards are gathered), so the history learns from every group generated."""
        if trainer.model.training:
            self._observe(trainer, prompt_ids, flat, rewards_per_func)

    def _observe(self, trainer, prompt_ids: list[int], flat: list[bool], rewards_per_func) -> None:
        """Update each prompt's history from its group: flat or not, and on which side of the round's mean."""
        rewards = combined_rewards(rewards_per_func, trainer.reward_weights).view(-1, trainer.num_generations)
        batch_mean = torch.nanmean(rewards).nan_to_num(0.0).item()
        group_means = torch.nanmean(rewards, dim=1).nan_to_num(batch_mean).tolist()  # unscored groups: the batch's
        threshold = self.rule.pass_threshold
        pass_rates = ((rewards >= threshold).float().mean(dim=1).tolist() if threshold is not None
                      else [0.0] * len(flat))  # unscored (nan) completions count as not passed
        step = trainer.state.global_step
        for g, is_flat in enumerate(flat):
            before = self.history.record(prompt_ids[g])
            if before is not None:
                counts = self.redraws["flat" if before[STREAK] > 0 else "signal"]
                counts[0] += 1
                counts[1] += int(is_flat)
            self.history.observe(prompt_ids[g], bool(is_flat), flat_side(group_means[g], batch_mean), step,
                                 pass_rate=pass_rates[g])

    def _log_batch(self, trainer, share: float) -> None:
        self.rule.after_batch(share, self.history)
        skipped, skipped_flat, kept = self.state.take_counts()
        metrics = pending_metrics(trainer)
        metrics["select/flat_share"].append(share)
        metrics["select/skipped"].append(float(skipped))
        metrics["select/kept"].append(float(kept))
        if skipped:
            metrics["select/predicted_flat_precision"].append(skipped_flat / skipped)
        for key, value in self.rule.metrics().items():
            metrics[key].append(value)
        for kind, (drawn, again) in self.redraws.items():
            if drawn:
                metrics[f"select/flat_after_{kind}"].append(again / drawn)

    def state_dict(self) -> dict:
        return {"history": self.history.state_dict(), "rule": self.rule.state_dict(), "redraws": self.redraws,
                "sampler": self.state.state_dict() if self.state else {}}

    def load_state_dict(self, state: dict) -> None:
        self.history.load_state_dict(state.get("history", {}))
        self.rule.load_state_dict(state.get("rule", {}))
        self.redraws = {k: list(v) for k, v in state.get("redraws", self.redraws).items()}
        if self.state is not None:
            self.state.load_state_dict(state.get("sampler", {}))
