"""Rewards: the training reward's trend, its components (dead, dominant, collapsed, saturated)."""

from __future__ import annotations

import math
import statistics

from .. import stats
from ..history import History
from .base import Finding, Thresholds, _fmt, _guard_clause, detector


@detector("rewards/*/failed", "rewards/*/none")
def detect_reward_failures(h: History, t: Thresholds) -> list[Finding]:
    """Reward calls that failed (``reward_isolation``'s ``rewards/<name>/failed``: rows left unscorable), and a jump in
    the share of rows a reward returned ``None`` for (``rewards/<name>/none``: "does not apply", which a function that
    swallows its own errors also returns). Judged from the first failure: one failed call is worth knowing."""
    out = []
    errors = {**h.reward_errors, **t.reward_errors}
    names = sorted({n.split("/")[1] for n in h.names() if n.startswith("rewards/") and n.endswith(("/failed", "/none"))})
    for name in names:
        steps, failed = h.curve(f"rewards/{name}/failed")
        bad = [(s, v) for s, v in zip(steps, failed) if v > 0]
        if bad:
            share = statistics.fmean(failed)
            whole = [s for s, v in bad if v >= 1.0]
            severity = "critical" if share >= 0.5 or (whole and whole[-1] == steps[-1]) else \
                "warning" if share >= t.reward_failed_share else "info"
            first = f" First error: {errors[name]}." if name in errors else ""
            out.append(Finding(
                "reward_failing", f"reward {name} failing", bad[0][0], bad[-1][0], severity=severity, subject=name,
                values={"failed_share": share, "steps_failed": len(bad), "steps": len(steps), "first_error":
                        errors.get(name)},
                message=f"reward function {name} failed (raised, timed out or returned a bad result) at {len(bad)} "
                        f"of {len(steps)} logged step(s), {share:.1%} of all rows ({len(whole)} step(s) on every "
                        f"row).{first} Those rows were left out (every component, advantage 0), so the run trained "
                        "on fewer completions than it generated. Likely cause: a bug on some inputs, a judge or "
                        "sandbox that errors or is too slow for reward_timeout. Fix: read the first error; run the "
                        "function on the logged completions; raise reward_timeout for a slow one; a function that "
                        "fails on single rows returns rookgrpo.FAILED for them (not None) and keeps the rest."))
        steps, none = h.curve(f"rewards/{name}/none")
        if len(none) >= t.min_share_points:
            k = max(1, len(none) // 4)
            start, end = statistics.fmean(none[:k]), statistics.fmean(none[-k:])
            if end - start >= t.none_jump:
                out.append(Finding(
                    "reward_none_jump", f"reward {name} applies to fewer rows", steps[-k], steps[-1], subject=name,
                    values={"start": start, "end": end},
                    message=f"reward function {name} returned None (\"does not apply\") for {start:.0%} of rows at "
                            f"the start and {end:.0%} at the end: with several reward functions, TRL sums a row's "
                            "other components and scores it as if this one paid 0. Likely cause: the task mix changed "
                            "(data order, per-task sampling), or the function returns None on its own errors. Fix: "
                            "check the task column's mix; a function that fails on a row returns rookgrpo.FAILED "
                            "for it, which leaves the whole row out."))
    return out


@detector("reward", "reward_std")
def detect_reward_trend(h: History, t: Thresholds) -> list[Finding]:
    """The training reward's shape: falling (critical), rose and fell back, flat, or flat after an early gain."""
    steps, r = h.curve("reward")
    if len(r) < t.plateau_points:
        return []
    _, rstd = h.curve("reward_std")
    spread = statistics.median(rstd) if rstd else stats.mad_sigma(r)
    z, p = stats.mann_kendall(r)
    moved = stats.theil_sen(steps, r) * (steps[-1] - steps[0])
    half = len(r) // 2
    z2, p2 = stats.mann_kendall(r[half:])
    smooth = [statistics.fmean(r[i:i + 5]) for i in range(0, len(r) - 4)]
    best = max(smooth)
    end = statistics.fmean(r[-5:])
    if z2 < 0 and p2 < 0.01 and best - end > 0.5 * spread:
        return [Finding(
            "reward_decline", "training reward falling", steps[half], steps[-1], severity="critical", subject="reward",
            values={"best": best, "end": end},
            message=f"the training reward fell from {_fmt(best)} (its best 5-log mean) to {_fmt(end)} over the second "
                    f"half of the run (Mann-Kendall z {z2:.1f}): the policy is degrading on its own training task. "
                    "Likely cause: a learning rate too high, an entropy or length collapse (see those findings). "
                    "Fix: lower learning_rate, restart from the best checkpoint; " + _guard_clause(h) + ".")]
    # Rose and fell back: no net trend (so not a decline of the second half), but not flat either.
    start, peak_at = statistics.fmean(r[:5]), smooth.index(best)
    gain = best - start
    if 0.15 * len(smooth) <= peak_at <= 0.85 * len(smooth) and gain > 0.5 * spread and best - end > 0.6 * gain:
        return [Finding(
            "reward_peak_fall", "training reward rose and fell back", steps[peak_at], steps[-1], subject="reward",
            values={"start": start, "peak": best, "peak_step": steps[peak_at], "end": end},
            message=f"the training reward rose from {_fmt(start)} to {_fmt(best)} (5-log mean, by step "
                    f"{steps[peak_at]}) and fell back to {_fmt(end)} by the end, losing {(best - end) / gain:.0%} of "
                    "its gain: the run learned and then unlearned. Likely cause: a learning rate that is too high "
                    "once the easy gain is made (no decay), an entropy or KL change after the peak (see those "
                    "findings). Fix: restart from the checkpoint nearest the peak, decay the learning rate (cosine); "
                    + _guard_clause(h) + ".")]
    if p > 0.05 and abs(moved) < 0.5 * spread:
        return [Finding(
            "reward_plateau", "training reward flat", steps[0], steps[-1], subject="reward",
            values={"trend": moved, "group_spread": spread, "z": z},
            message=f"the training reward moved {moved:+.3g} over {steps[-1] - steps[0]} steps (trend line; "
                    f"Mann-Kendall z {z:.1f}), under half the spread within a group ({_fmt(spread)}): the run is "
                    "not learning what the rewards pay. Likely cause: a learning rate too low, advantages mostly "
                    "zero, the KL term holding the policy (see loss/kl_grad_share), or a reward the policy cannot "
                    "move. Fix: look at the other findings; raise learning_rate; check frac_reward_zero_std.")]
    if len(r) >= 2 * t.plateau_points:
        # Flat after an early gain: the whole run trends up, so the plateau rule above cannot see the late stall.
        z1, p1 = stats.mann_kendall(r[:half])
        moved1 = stats.theil_sen(steps[:half], r[:half]) * (steps[half - 1] - steps[0])
        moved2 = stats.theil_sen(steps[half:], r[half:]) * (steps[-1] - steps[half])
        if z1 > 0 and p1 < 0.01 and moved1 > 0.5 * spread and p2 > 0.05 and abs(moved2) < 0.25 * moved1:
            return [Finding(
                "reward_plateau", "training reward flat after an early gain", steps[half], steps[-1],
                subject="reward", values={"first_half": moved1, "second_half": moved2},
                message=f"the training reward rose {moved1:+.3g} over the first half of the run and moved "
                        f"{moved2:+.3g} over the second (Mann-Kendall z {z2:.1f}): the run stopped learning after its "
                        "early gain. Likely cause: the easy prompts are solved (groups turning flat) or the learning "
                        "rate decayed away. Fix: check frac_reward_zero_std; prompt_selection or harder data; stop "
                        "the run earlier and spend the compute elsewhere.")]
    return []


def _components(h: History) -> list[str]:
    return sorted(n[len("rewards/"):-len("/std")] for n in h.names() if n.startswith("rewards/") and n.endswith("/std"))


def infer_reward_weights(h: History, min_rows: int = 4) -> dict[str, float]:
    """The reward weights a run used, read off its log where it allows: TRL logs ``reward`` as the weighted sum of the
    components' means, so where that holds exactly on every step that logged them all, the least-squares weights are
    the run's (a component the run logged but weighted 0 gets 0). {} where the log does not determine them.

    >>> entries = [{"step": s, "reward": 0.1 * s, "rewards/a/mean": 0.1 * s, "rewards/b/mean": 0.5 + 0.01 * s * s}
    ...            for s in range(1, 9)]
    >>> infer_reward_weights(History(entries))
    {'a': 1.0, 'b': 0.0}
    """
    import numpy as np

    names = sorted(n[len("rewards/"):-len("/mean")] for n in h.names() if n.startswith("rewards/") and n.endswith("/mean"))
    rows = [([float(e[f"rewards/{n}/mean"]) for n in names], float(e["reward"])) for e in h.entries
            if "reward" in e and all(isinstance(e.get(f"rewards/{n}/mean"), (int, float)) for n in names)]
    rows = [(x, y) for x, y in rows if all(map(math.isfinite, x)) and math.isfinite(y)]
    if len(names) < 2 or len(rows) < max(min_rows, len(names) + 2):
        return {}
    x, y = np.array([r[0] for r in rows]), np.array([r[1] for r in rows])
    if np.linalg.matrix_rank(x) < len(names):  # components that move together: the weights are not determined
        return {}
    weights, *_ = np.linalg.lstsq(x, y, rcond=None)
    if np.max(np.abs(x @ weights - y)) > 1e-6 * max(1.0, float(np.max(np.abs(y)))):
        return {}
    return {n: round(float(w), 6) + 0.0 for n, w in zip(names, weights)}


@detector("rewards/*/std")
def detect_reward_components(h: History, t: Thresholds) -> list[Finding]:
    weights = t.reward_weights or infer_reward_weights(h)
    names = [n for n in _components(h) if weights.get(n, 1.0) != 0]  # logged but weighted 0: not in the reward
    if len(names) < 2:
        return []
    # a reward that scores every completion alike is named by detect_reward_spread
    collapsed = set(_collapsed(h, t)) | set(_constant(h, t))
    shares: dict[str, list[float]] = {n: [] for n in names}
    logged = 0
    for entry in h.entries:
        var = {}
        for n in names:
            v = entry.get(f"rewards/{n}/std")
            if isinstance(v, (int, float)) and v == v:
                var[n] = (weights.get(n, 1.0) * v) ** 2
        total = sum(var.values())
        if len(var) < 2 or total <= 0:
            continue
        logged += 1
        for n, v in var.items():
            shares[n].append(v / total)
    if logged < t.min_points:
        return []
    median = {n: statistics.median(s) for n, s in shares.items() if len(s) >= t.min_points // 2}
    steps = [int(e["step"]) for e in h.entries if any(f"rewards/{n}/std" in e for n in names)]
    weighted = (" (weighted)" if t.reward_weights else " (weighted as read off the log)" if weights else
                " (unweighted: give rookgrpo doctor the run's weights, --reward-weights NAME=W ...)")
    out = []
    dead = sorted(n for n, s in median.items() if s < t.component_dead and n not in collapsed)
    if dead:
        out.append(Finding(
            "reward_dead", "reward components that carry no spread", steps[0], steps[-1], subject=",".join(dead),
            values={n: median[n] for n in dead},
            message=f"{len(dead)} reward component(s) carry under {t.component_dead:.0%} of the summed per-component "
                    f"reward variance{weighted}: " + ", ".join(f"{n} {median[n]:.2%}" for n in dead) +
                    " (median over logs). They add almost nothing to the advantages; their weight buys nothing. "
                    "Likely cause: a component every completion passes or fails alike, or one on a much smaller "
                    "scale than the others. Fix: drop them, raise their weight (reward_weights), or give them partial "
                    "credit."))
    whole = [n for n, s in median.items() if s > t.component_whole]
    if whole and len(median) >= 2:
        n = whole[0]
        out.append(Finding(
            "reward_dominant", f"one reward component carries the whole spread ({n})", steps[0], steps[-1],
            subject=n, values={"share": median[n]},
            message=f"{n} carries {median[n]:.0%} of the summed per-component reward variance{weighted} (median "
                    "over logs): the advantages follow it alone and the other components do not shape the update. "
                    "Fix: rebalance reward_weights, or scale_rewards so the components compare."))
    return out


def _collapsed(h: History, t: Thresholds) -> dict[str, tuple[list[int], float]]:
    """Rewards that gave the whole batch one score (``rewards/<name>/std`` exactly 0, its mean logged) at
    ``collapsed_share`` or more of their logged points: name -> (those steps, the median score there)."""
    out = {}
    for n in _components(h):
        points = [(int(e["step"]), e[f"rewards/{n}/std"], e.get(f"rewards/{n}/mean")) for e in h.entries
                  if isinstance(e.get(f"rewards/{n}/std"), (int, float)) and e[f"rewards/{n}/std"] == e[f"rewards/{n}/std"]
                  and isinstance(e.get(f"rewards/{n}/mean"), (int, float)) and math.isfinite(e[f"rewards/{n}/mean"])]
        if len(points) < t.min_share_points:
            continue
        flat = [(s, m) for s, sd, m in points if sd == 0.0]
        if flat and len(flat) / len(points) >= t.collapsed_share:
            out[n] = ([s for s, _ in flat], statistics.median(m for _, m in flat))
    return out


COLLAPSED_JUDGE = ("Likely cause: a judge (reward model) that scores every completion alike: saturated (its output far "
                   "from 0 whatever the text) or blind to the completion (the text it sees is cut off, or the "
                   "completion part is lost in formatting). Fix: check what the judge is given "
                   "(reward_processing_classes, truncation) and its raw scores on good and bad answers.")
COLLAPSED_RULE = ("It is a rule, so every completion failed it (or passed it): the rule is too hard (or too easy) for "
                  "the model at this temperature. Fix: raise the temperature for that task (task_generation_kwargs), "
                  "give the reward partial credit, or train on prompts the model sometimes solves.")
COLLAPSED_EITHER = ("Likely cause: for a rule, every completion failed it (or passed it): too hard or too easy at this "
                    "temperature (fix: raise the temperature, give partial credit, train on prompts the model "
                    "sometimes solves); for a judge (reward model), one that is saturated or blind to the completion "
                    "(fix: check what it is given and its raw scores on good and bad answers; rookgrpo doctor "
                    "--judges NAME says which rewards are judges).")


def _constant(h: History, t: Thresholds) -> dict[str, tuple[list[int], float, str]]:
    """Reward components that gave the same score at every logged step, whatever their weight: name -> (steps, the
    score, how it shows). Where TRL logged a per-batch spread (``rewards/<name>/std``), it was exactly 0 at every step;
    where it logged only a mean (TRL before 0.17: ``rewards/<name>``), the mean never moved off one value."""
    out = {}
    names = sorted({n[len("rewards/"):-len("/mean")] for n in h.names()
                    if n.startswith("rewards/") and n.endswith("/mean") and n.count("/") == 2})
    for n in names:
        steps, means = h.curve(f"rewards/{n}/mean")
        if len(means) < t.min_share_points or len(set(means)) != 1:
            continue
        _, spreads = h.curve(f"rewards/{n}/std")
        if spreads and any(v != 0 for v in spreads):
            continue
        out[n] = (steps, means[0], f"rewards/{n}/std exactly 0" if spreads else f"rewards/{n}/mean never moved")
    return out


@detector("rewards/*/std", "rewards/*/mean")
def detect_reward_spread(h: History, t: Thresholds) -> list[Finding]:
    """A reward that gives every completion of a batch the same score (collapsed), or scores within a thousandth of
    its magnitude of each other (saturated): measured per batch by TRL (``rewards/<name>/std``), judged here. A
    component constant at every logged step is named whatever its weight, and from its mean alone where that is all
    the run logged."""
    out = []
    weights = t.reward_weights or infer_reward_weights(h)
    names = [n for n in _components(h) if weights.get(n, 1.0) != 0]  # logged but weighted 0: not in the reward
    constant = _constant(h, t)
    for n, (steps, value, shown) in constant.items():
        judge = t.judges is not None and n in t.judges
        cause = COLLAPSED_EITHER if t.judges is None else COLLAPSED_JUDGE if judge else COLLAPSED_RULE
        weight = weights.get(n)
        others = [m for m in set(names) | set(constant) if m != n]
        weight_text = ("" if weight is None else f" (weight {weight:g}" + (
            ": not in the reward, so it only watches" if weight == 0 else "") + ")")
        out.append(Finding(
            "reward_collapsed", f"reward {n!r} gives every completion the same score at every step", steps[0],
            steps[-1], subject=n,
            severity="critical" if not others and weight != 0 else "warning",
            values={"steps": len(steps), "logged": len(steps), "score": value, "judge": judge, "weight": weight},
            message=f"reward {n!r} gave every completion of the batch the same score ({_fmt(value)}) at every one of "
                    f"its {len(steps)} logged steps ({shown}){weight_text}: it is dead whatever its weight, adding "
                    f"nothing to the advantages. {cause}"))
    collapsed = _collapsed(h, t)
    for n, (steps, value) in collapsed.items():
        if n not in names or n in constant:
            continue
        total = sum(1 for e in h.entries if isinstance(e.get(f"rewards/{n}/std"), (int, float)))
        every = len(steps) == total
        judge = t.judges is not None and n in t.judges
        cause = COLLAPSED_EITHER if t.judges is None else COLLAPSED_JUDGE if judge else COLLAPSED_RULE
        sole = len(names) == 1 and every  # the only reward, flat at every step: nothing to learn from
        out.append(Finding(
            "reward_collapsed", f"reward {n!r} gives every completion the same score", steps[0], steps[-1],
            subject=n, severity="critical" if sole else "warning",
            values={"steps": len(steps), "logged": total, "score": value, "judge": judge},
            message=f"reward {n!r} gave every completion of the batch the same score (median {_fmt(value)}) at "
                    f"{len(steps)} of {total} logged steps (rewards/{n}/std exactly 0), so it adds nothing to the "
                    f"advantages there. {cause}"))
    # Saturation matters where the saturated scores are the whole reward (group scaling then divides by their tiny
    # spread): the only weighted reward, or the combined reward itself; a saturated component among others carries
    # almost no variance, which reward_dead names.
    judged = {names[0]: (f"rewards/{names[0]}/std", f"rewards/{names[0]}/mean")} if len(names) == 1 else \
        {"reward": ("reward_std", "reward")}
    for n, (std_key, mean_key) in judged.items():
        if n in collapsed:
            continue
        ratios = []
        for e in h.entries:
            sd, mean = e.get(std_key), e.get(mean_key)
            if isinstance(sd, (int, float)) and isinstance(mean, (int, float)) and math.isfinite(sd) \
                    and math.isfinite(mean) and sd > 1e-6 * max(1.0, abs(mean)):
                ratios.append((int(e["step"]), sd / abs(mean) if mean else math.inf, mean, sd))
        if len(ratios) < t.min_share_points:
            continue
        low = [r for r in ratios if r[1] < t.saturated_relative]
        if len(low) / len(ratios) < 0.5:
            continue
        center, spread = statistics.median(r[2] for r in low), statistics.median(r[3] for r in low)
        what = "the combined reward" if n == "reward" else f"reward {n!r}"
        out.append(Finding(
            "reward_saturated", f"{what} saturated", low[0][0], low[-1][0], subject=n,
            values={"center": center, "spread": spread, "steps": len(low), "logged": len(ratios)},
            message=f"{what} scored the batch within {_fmt(spread)} (standard deviation, median) around "
                    f"{_fmt(center)} at {len(low)} of {len(ratios)} logged steps: under {t.saturated_relative:g} of "
                    "its magnitude. Scaled advantages divide by the group's spread, so differences this small become "
                    "full-size advantages and the policy learns from the reward's noise. Likely cause: a judge whose "
                    "output sits far from 0 whatever the text (a logit on a sigmoid's plateau), or a task the policy "
                    "has saturated. Fix: check the judge's raw scores on good and bad answers (center or rescale "
                    "them), use scale_rewards: none, or train on harder prompts."))
    return out
