"""Prompt selection before generation: skip prompts whose next group is predicted flat, from each prompt's history.

A flat group (every completion of a prompt scored alike) costs a full rollout and teaches nothing. Resampling
(``zero_std_resampling``) replaces such groups after paying for them; selection avoids drawing them at all, from what
each prompt did the last times it was drawn. The pieces:

- :class:`PromptHistory`: per prompt (dataset row), how often it was drawn, how often its group was flat, its current
  run of consecutive flat groups (``streak``), on which side it was flat (``high``: at or above the batch's mean
  reward, the all-pass side of a binary reward; ``low``: below, all-fail), and the step it was last drawn at.
- Rules, each ``keep_probability(record) -> float``:

  - :class:`GresoRule`, GRESO's (arXiv 2506.02177): a prompt flat in its last ``k`` draws is kept with probability
    ``p**k`` (so skipped with ``1 - p**k``); ``p`` per side (high/low) moves by ``step`` after every generation batch,
    down when the batch's flat share exceeds ``target_flat``, up otherwise, within ``[p_min, 1]``.
  - :class:`PosteriorRule`: the prompt's chance of a flat group from a Beta posterior over its discounted flat
    history (prior: the run's flat share so far), kept with probability ``1 - P(flat)``, at least ``explore``.
  - :class:`PassRateRule`, for binary rewards: a Beta posterior over the prompt's pass rate ``q`` from its discounted
    pass counts, and the chance that all ``G`` completions of its next group agree, ``E[q**G + (1 - q)**G]``; kept
    with probability one minus that, at least ``explore``. It tells a prompt that passed 1 of 8 (likely flat next
    time) from one that passed 4 of 8, which a flat/not-flat history cannot. With ``target_flat`` set it keeps a
    prompt only when that chance of signal is at least a threshold, and moves the threshold after every generation
    batch to hold the flat share at ``target_flat`` (GRESO's controller on the pass-rate posterior).

- :class:`SelectingSampler`: TRL's ``RepeatSampler`` structure (each chosen prompt ``G`` times, each generation batch
  ``steps_per_generation x num_iterations`` times), with the prompts of each generation batch chosen by walking a
  shuffled pass over the data and asking the rule. A prompt skipped ``max_skips`` times in a row is kept the next
  time, so a prompt that has become informative is drawn again within ``max_skips + 1`` passes. The sampler yields
  as many indices per epoch as TRL's (the trainer's step accounting holds); its passes over the data run on across
  epochs. With ``task_generation_kwargs`` every generation batch stays task-homogeneous.

Every decision depends only on the seed and on the history, which every process updates from gathered rewards in
the same order, so every rank chooses the same prompts.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from trl.trainer.utils import RepeatSampler

from .task_sampling import indices_by_task, repeat_chunks

# record fields: drawn, flat, streak, side (0 none, 1 low, 2 high), last_step, skips (consecutive), discounted flat,
# discounted drawn, discounted pass rate (sum of the groups' pass rates, each older one times the discount)
DRAWN, FLAT, STREAK, SIDE, LAST, SKIPS, DFLAT, DDRAWN, DPASS = range(9)
NEW_RECORD = (0, 0, 0, 0, -1, 0, 0.0, 0.0, 0.0)
SIDES = {None: 0, "low": 1, "high": 2}


class PromptHistory:
    """What each prompt's groups did when drawn (see the module docstring); plain lists, so it checkpoints as JSON."""

    def __init__(self, discount: float = 0.7, group_size: int | None = None):
        self.discount = float(discount)
        self.group_size = group_size  # completions per group (the trainer's num_generations), set when training starts
        self.records: dict[int, list[float]] = {}
        self.flat_total = 0
        self.drawn_total = 0

    def record(self, prompt_id: int) -> list[float] | None:
        return self.records.get(int(prompt_id))

    def observe(self, prompt_id: int, flat: bool, side: str | None, step: int, pass_rate: float = 0.0) -> None:
        """Record one group of ``prompt_id``: flat or not, on which side, at which step, and the share of its
        completions that passed (used by :class:`PassRateRule`)."""
        rec = self.records.setdefault(int(prompt_id), list(NEW_RECORD))
        rec[DRAWN] += 1
        rec[FLAT] += int(flat)
        rec[STREAK] = rec[STREAK] + 1 if flat else 0
        rec[SIDE] = SIDES[side if flat else None]
        rec[LAST] = int(step)
        rec[DFLAT] = rec[DFLAT] * self.discount + float(flat)
        rec[DDRAWN] = rec[DDRAWN] * self.discount + 1.0
        rec[DPASS] = rec[DPASS] * self.discount + float(pass_rate)
        self.flat_total += int(flat)
        self.drawn_total += 1

    def state_dict(self) -> dict:
        return {"records": {str(k): v for k, v in self.records.items()}, "flat_total": self.flat_total,
                "drawn_total": self.drawn_total, "discount": self.discount}

    def load_state_dict(self, state: dict) -> None:
        # Records saved before a field existed get its starting value.
        self.records = {int(k): list(v) + list(NEW_RECORD[len(v):]) for k, v in state.get("records", {}).items()}
        self.flat_total = int(state.get("flat_total", 0))
        self.drawn_total = int(state.get("drawn_total", 0))
        self.discount = float(state.get("discount", self.discount))


def _nudged(value: float, step: float, flat_share: float, target_flat: float, low: float, high: float) -> float:
    """The controller GRESO's rule and the pass-rate threshold share: ``value + step`` when the batch's flat share was
    above ``target_flat`` (at the target counts as not above), ``value - step`` otherwise, within ``[low, high]``."""
    return min(high, max(low, value + (step if flat_share > target_flat else -step)))


class Rule:
    """What every rule has: the history it reads (bound by the callback), and hooks that a rule with no state of its
    own leaves as they are. ``pass_threshold``: the reward at which a completion counts as passed, for a rule that
    reads pass rates (None: the history records none)."""

    history: PromptHistory | None = None
    pass_threshold: float | None = None

    def bind(self, history: PromptHistory) -> None:
        self.history = history

    def after_batch(self, flat_share: float, history: PromptHistory) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class GresoRule(Rule):
    """GRESO's rule: keep a prompt flat in its last ``k`` draws with probability ``p_side ** k``; ``p`` adapts.

    >>> rule = GresoRule(p_start=0.5)
    >>> rule.keep_probability([3, 2, 2, 2, 7, 0, 0.0, 0.0])  # flat twice in a row, on the high (all-pass) side
    0.25
    >>> rule.keep_probability(None)  # never drawn
    1.0
    """

    name = "greso"

    def __init__(self, target_flat: float = 0.25, p_start: float = 0.5, step: float = 0.01, p_min: float = 0.05):
        self.target_flat, self.step, self.p_min = float(target_flat), float(step), float(p_min)
        self.p = {1: float(p_start), 2: float(p_start)}

    def keep_probability(self, rec: list[float] | None) -> float:
        if rec is None or rec[STREAK] == 0:
            return 1.0
        return self.p[int(rec[SIDE]) or 1] ** int(rec[STREAK])

    def after_batch(self, flat_share: float, history: PromptHistory) -> None:
        for side in self.p:  # more flat than the target: keep previously flat prompts less often
            self.p[side] = _nudged(self.p[side], -self.step, flat_share, self.target_flat, self.p_min, 1.0)

    def metrics(self) -> dict[str, float]:
        return {"select/p_low": self.p[1], "select/p_high": self.p[2]}

    def state_dict(self) -> dict:
        return {"p": {str(k): v for k, v in self.p.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.p = {int(k): float(v) for k, v in state.get("p", {}).items()} or self.p


class PosteriorRule(Rule):
    """Keep with probability ``1 - P(flat)``, ``P(flat)`` the posterior mean of the prompt's discounted flat rate.

    The prior is Beta with mean the run's flat share so far and weight ``prior_weight`` draws, so an unseen prompt is
    kept with probability ``1 - flat share`` and a prompt's own draws take over as they accumulate; old draws count
    ``discount`` times less per newer draw, so a prompt that turns informative is believed quickly.

    >>> from rookgrpo.dynamics.selection import PromptHistory
    >>> history = PromptHistory(); rule = PosteriorRule(explore=0.05); rule.bind(history)
    >>> rule.keep_probability(None)  # nothing known yet: keep
    1.0
    >>> history.observe(7, True, "low", 1); history.observe(7, True, "low", 2)
    >>> round(rule.keep_probability(history.record(7)), 3)  # flat twice, prior mean 1.0 from this run so far
    0.05
    """

    name = "posterior"

    def __init__(self, prior_weight: float = 2.0, explore: float = 0.1):
        self.prior_weight, self.explore = float(prior_weight), float(explore)

    def keep_probability(self, rec: list[float] | None) -> float:
        h = self.history
        prior = h.flat_total / h.drawn_total if h is not None and h.drawn_total else 0.0
        flat = (rec[DFLAT] if rec else 0.0) + prior * self.prior_weight
        drawn = (rec[DDRAWN] if rec else 0.0) + self.prior_weight
        return max(self.explore, 1.0 - flat / drawn)


class PassRateRule(Rule):
    """For binary rewards: keep with probability one minus the chance that the prompt's next group is flat.

    The prompt's pass rate ``q`` has a Beta posterior: a prior of ``prior`` passes and ``prior`` fails (Jeffreys' at
    0.5) plus its discounted history, each group counting ``G`` completions (the history's ``group_size``), older
    groups ``discount`` times less per newer one. A group of ``G`` is flat when all pass or all fail, so
    ``P(flat) = E[q**G] + E[(1 - q)**G]``, both exact Beta moments. The keep probability is ``1 - P(flat)``, at
    least ``explore``. A completion passes when its reward (the weighted sum of the reward functions) is at least
    ``pass_threshold``; for a reward that is not binary the rule still runs, on that threshold, but a group can then
    have spread without crossing it.

    ``target_flat`` (default None: off) makes the decision a threshold: a prompt whose chance of signal
    ``1 - P(flat)`` is at least ``signal_threshold`` is kept, any other with probability ``explore``. The threshold
    starts at 0 (every prompt kept) and moves by ``step`` after every generation batch: up when the batch's flat
    share was above ``target_flat``, down otherwise, within ``[0, max_threshold]``. Without it, a prompt whose next
    group is flat with probability 0.7 is still drawn three times in ten, whatever else is on offer; the threshold
    spends the draws on the prompts likeliest to have signal, as far as the history allows.

    >>> from rookgrpo.dynamics.selection import PromptHistory
    >>> history = PromptHistory(group_size=8); rule = PassRateRule(); rule.bind(history)
    >>> history.observe(1, True, "low", 1, pass_rate=0.0)     # 0 of 8 passed
    >>> history.observe(2, False, None, 1, pass_rate=0.125)   # 1 of 8
    >>> history.observe(3, False, None, 1, pass_rate=0.5)     # 4 of 8
    >>> [round(rule.keep_probability(history.record(i)), 2) for i in (1, 2, 3)]
    [0.29, 0.65, 0.95]
    >>> target = PassRateRule(target_flat=0.25, step=0.5, explore=0.05); target.bind(history)
    >>> target.after_batch(0.5, history)  # half the batch was flat, above the target: the threshold rises
    >>> target.signal_threshold, [target.keep_probability(history.record(i)) for i in (1, 2, 3)]
    (0.5, [0.05, 1.0, 1.0])
    """

    name = "passrate"

    def __init__(self, prior: float = 0.5, explore: float = 0.05, pass_threshold: float = 1.0,
                 target_flat: float | None = None, step: float = 0.05, max_threshold: float = 0.95):
        if float(prior) <= 0:
            raise ValueError(f"prior must be > 0, got {prior}")
        if target_flat is not None and not 0.0 <= float(target_flat) <= 1.0:
            raise ValueError(f"target_flat must be in [0, 1] (or None: off), got {target_flat}")
        if float(step) <= 0 or not 0.0 <= float(max_threshold) <= 1.0:
            raise ValueError(f"step must be > 0 and max_threshold in [0, 1], got {step} and {max_threshold}")
        self.prior, self.explore, self.pass_threshold = float(prior), float(explore), float(pass_threshold)
        self.target_flat = None if target_flat is None else float(target_flat)
        self.step, self.max_threshold = float(step), float(max_threshold)
        self.signal_threshold = 0.0

    def signal_chance(self, rec: list[float] | None) -> float:
        """``1 - P(flat)``: the posterior chance that the prompt's next group of ``G`` has both passes and fails."""
        G = self.history.group_size if self.history is not None else None
        if rec is None or not G:
            return 1.0
        passes, fails = G * rec[DPASS], G * (rec[DDRAWN] - rec[DPASS])
        a, b = self.prior + passes, self.prior + max(fails, 0.0)
        all_pass = all_fail = 1.0
        for i in range(G):  # E[q**G] and E[(1-q)**G] under Beta(a, b)
            all_pass *= (a + i) / (a + b + i)
            all_fail *= (b + i) / (a + b + i)
        return max(0.0, 1.0 - all_pass - all_fail)  # never below 0 from rounding, so threshold 0 keeps every prompt

    def keep_probability(self, rec: list[float] | None) -> float:
        signal = self.signal_chance(rec)
        if self.target_flat is None:
            return max(self.explore, signal)
        return 1.0 if signal >= self.signal_threshold else self.explore

    def after_batch(self, flat_share: float, history: PromptHistory) -> None:
        if self.target_flat is None:
            return
        self.signal_threshold = _nudged(self.signal_threshold, self.step, flat_share, self.target_flat, 0.0,
                                        self.max_threshold)

    def metrics(self) -> dict[str, float]:
        return {} if self.target_flat is None else {"select/signal_threshold": self.signal_threshold}

    def state_dict(self) -> dict:
        return {} if self.target_flat is None else {"signal_threshold": self.signal_threshold}

    def load_state_dict(self, state: dict) -> None:
        self.signal_threshold = float(state.get("signal_threshold", self.signal_threshold))


RULES = {"greso": GresoRule, "posterior": PosteriorRule, "passrate": PassRateRule}


class SelectionState:
    """Where the sampler is in its passes over the data, and what it decided since the metrics were last taken."""

    def __init__(self, seed: int):
        self.generator = torch.Generator()
        self.generator.manual_seed(int(seed))
        self.queues: dict[str, list[int]] = {}
        self.passes: dict[str, int] = {}
        self.skipped = 0
        self.skipped_flat_when_last_seen = 0
        self.kept = 0

    def take_counts(self) -> tuple[int, int, int]:
        counts = (self.skipped, self.skipped_flat_when_last_seen, self.kept)
        self.skipped = self.skipped_flat_when_last_seen = self.kept = 0
        return counts

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state().tolist(), "queues": self.queues, "passes": self.passes}

    def load_state_dict(self, state: dict) -> None:
        if "generator" in state:
            self.generator.set_state(torch.tensor(state["generator"], dtype=torch.uint8))
        self.queues = {k: list(v) for k, v in state.get("queues", {}).items()}
        self.passes = {k: int(v) for k, v in state.get("passes", {}).items()}


class SelectingSampler(RepeatSampler):
    """TRL's ``RepeatSampler`` with each generation batch's prompts chosen by a rule (see the module docstring).

    ``tasks``: one task name per row for task-homogeneous generation batches (``None``: one pool).
    """

    def __init__(self, data_source, history: PromptHistory, rule, state: SelectionState, mini_repeat_count: int,
                 batch_size: int = 1, repeat_count: int = 1, shuffle: bool = True, seed: int | None = None,
                 tasks: Sequence[str] | None = None, max_skips: int = 4):
        super().__init__(data_source, mini_repeat_count, batch_size, repeat_count, shuffle, seed)
        self.history, self.rule, self.state, self.max_skips = history, rule, state, int(max_skips)
        # String keys: the sampler's queues are saved per task in JSON checkpoints.
        self.by_task = indices_by_task([str(t) for t in tasks] if tasks is not None else [""] * self.num_samples)
        self.n_chunks = {t: len(idx) // batch_size for t, idx in self.by_task.items()}
        if not any(self.n_chunks.values()):
            raise ValueError(f"prompt_selection: no task has {batch_size} prompts, one generation batch's worth.")

    def __len__(self) -> int:
        return sum(self.n_chunks.values()) * self.batch_size * self.mini_repeat_count * self.repeat_count

    def _next_prompt(self, task: str) -> int:
        queue = self.state.queues.get(task)
        if not queue:
            idx = self.by_task[task]
            order = torch.randperm(len(idx), generator=self.state.generator).tolist() if self.shuffle else range(len(idx))
            queue = self.state.queues[task] = [idx[i] for i in order]
            self.state.passes[task] = self.state.passes.get(task, 0) + 1
        return queue.pop(0)

    def _choose(self, task: str) -> list[int]:
        chosen: list[int] = []
        budget = (self.max_skips + 2) * len(self.by_task[task])  # every prompt is kept within max_skips + 1 passes
        while len(chosen) < self.batch_size and budget > 0:
            budget -= 1
            index = self._next_prompt(task)
            if index in chosen:
                continue
            rec = self.history.record(index)
            forced = rec is None or rec[SKIPS] >= self.max_skips  # never drawn: nothing to predict from
            keep = forced or torch.rand((), generator=self.state.generator).item() < self.rule.keep_probability(rec)
            if keep:
                chosen.append(index)
                self.state.kept += 1
                if rec is not None:
                    rec[SKIPS] = 0
            else:
                self.state.skipped += 1
                self.state.skipped_flat_when_last_seen += int(rec is not None and rec[STREAK] > 0)
                rec[SKIPS] += 1
        while len(chosen) < self.batch_size:  # never a short generation batch (TRL's groups and ranks need it full)
            index = self._next_prompt(task)
            if index not in chosen:
                chosen.append(index)
                self.state.kept += 1
        return chosen

    def __iter__(self):
        plan = [t for t in sorted(self.by_task) for _ in range(self.n_chunks[t])]
        if self.shuffle:
            plan = [plan[i] for i in torch.randperm(len(plan), generator=self.state.generator).tolist()]
        chunks = (self._choose(task) for task in plan)  # lazily: each chosen when the data loader reaches it
        return repeat_chunks(chunks, self.repeat_count, self.mini_repeat_count)


def flat_side(value: float, batch_mean: float) -> str:
    return "high" if value >= batch_mean - 1e-9 else "low"
