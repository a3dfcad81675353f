"""Completions: lengths growing with the reward, and completions cut off at max_completion_length."""

from __future__ import annotations

import statistics

from .. import stats
from ..history import History
from .base import Finding, Thresholds, _fmt, detector


@detector("completions/mean_length", "completions/clipped_ratio")
def detect_length(h: History, t: Thresholds) -> list[Finding]:
    out = []
    steps, length = h.curve("completions/mean_length")
    if len(length) >= t.min_points:
        start, end = statistics.median(stats.head(length)), statistics.median(stats.tail(length))
        z, p = stats.mann_kendall(length)
        r_steps, reward = h.curve("reward")
        by_step = dict(zip(r_steps, reward))
        pairs = [(v, by_step[s]) for s, v in zip(steps, length) if s in by_step]
        corr = stats.spearman([a for a, _ in pairs], [b for _, b in pairs])
        if start > 0 and end >= t.length_growth * start and z > 0 and p < 0.01 and corr >= t.length_reward_corr:
            out.append(Finding(
                "length_hacking", "completions lengthening to earn reward", steps[0], steps[-1],
                subject="completions/mean_length", values={"start": start, "end": end, "spearman": corr},
                message=f"mean completion length grew from {_fmt(start)} to {_fmt(end)} tokens ({end / start:.1f}x) "
                        f"and moves with the reward (rank correlation {corr:.2f}): the policy earns reward by writing "
                        "more, not better. Likely cause: a reward (or judge) that pays for length, or a format reward "
                        "that long answers satisfy more often. Fix: check the rewards on short and long answers of "
                        "equal quality (rookgrpo rewards audit), add a length penalty, use loss_type: dr_grpo."))
    steps, cut = h.curve("completions/clipped_ratio")
    if len(cut) >= t.min_share_points:
        start, end = statistics.median(stats.head(cut)), statistics.median(stats.tail(cut))
        # Run-on collapse is fast (a run of rookgrpo's selection benchmark: 0% cut off for 20 steps, 26% for 5, 73%
        # for the last 2): a start under half the threshold and the last two points over it name it as it happens.
        rose = start < t.truncated_share / 2 and min(cut[-2:]) >= t.truncated_share
        if rose or end >= t.truncated_share:
            first = next(s for s, v in zip(steps, cut) if v >= t.truncated_share)
            out.append(Finding(
                "truncation", "completions ending at max_completion_length", first, steps[-1],
                subject="completions/clipped_ratio", values={"start": start, "end": cut[-1] if rose else end},
                severity="critical" if rose else "warning",
                message=(f"{cut[-1]:.0%} of completions were cut off at max_completion_length at step {steps[-1]}, "
                         f"against {start:.0%} at the start: the policy is collapsing into run-on text that never "
                         "ends, and the rewards score cut-off, malformed answers from here. Fix: lower learning_rate, "
                         "set beta > 0 or add adaptive_beta, and restart from a checkpoint saved before the rise "
                         f"(step {first} is the first over {t.truncated_share:.0%})." if rose else
                         f"{end:.0%} of completions were cut off at max_completion_length ({start:.0%} from the start): "
                         "the limit is too short for the task, or the model never learned to stop. Fix: raise "
                         "max_completion_length, check that the model ends answers with eos, or set "
                         "mask_truncated_completions.")))
    return out
