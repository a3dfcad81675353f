"""Held-out quality: held-out metrics falling beyond their noise."""

from __future__ import annotations

import statistics

from ...dynamics.heldout import HeldoutScore
from .. import stats
from ..history import History
from .base import Finding, Thresholds, _fmt, _guard_clause, detector


#: Substrings of a held-out metric's name that mark "lower is better".
LOWER_IS_BETTER = ("loss", "nll", "perplexity", "ppl", "broken", "error", "top_move_share")
#: Words that make an ``eval_*`` metric a quality score (not an eval copy of a training diagnostic).
EVAL_SCORE_WORDS = ("reward", "accuracy", "acc", "score", "pass", "exact", "loss", "f1", "bleu")


def heldout_metrics(h: History) -> list[str]:
    """The held-out quality metrics a run logged: ``heldout/*``, and ``eval_*`` quality scores (reward, accuracy,
    loss, ...) but not evaluation copies of diagnostics (eval_kl, eval_entropy, eval_runtime, */std)."""
    out = []
    for name in sorted(h.names()):
        if name.startswith("heldout/"):
            out.append(name)
        elif name.startswith("eval_") and not name.endswith(("/std", "_std", "runtime", "per_second")):
            rest = name[len("eval_"):]
            if any(w in rest for w in EVAL_SCORE_WORDS) and not rest.startswith(("completions", "clip", "kl", "entropy")):
                out.append(name)
    return out


#: Evaluations after its best a held-out metric needs before "worse ever since" counts without a trend.
PERSISTENT_AFTER = 5
#: Held-out metrics that are proxies or symptoms rather than quality (the reference answers' NLL, one answer's
#: share, copied or broken answers): beyond their noise and floor they are a warning, never critical.
HELDOUT_SYMPTOMS = ("nll", "perplexity", "ppl", "top_move_share", "copied", "broken")


@detector("heldout/*", "eval_*")
def detect_heldout(h: History, t: Thresholds) -> list[Finding]:
    """Held-out quality falling: against the first evaluation, or after the best one (an overfitting run's eval loss
    falls, then rises). Judged by noise (the curve's own step-to-step noise) and by size: a change under
    ``heldout_min_abs`` (rates in [0, 1]) or ``heldout_min_rel`` of the reference value (NLL, loss, reward) is ``info``;
    a symptom metric (:data:`HELDOUT_SYMPTOMS`) is at most a ``warning``; a quality metric's fall that matters is
    ``critical``."""
    out = []
    r_steps, reward = h.curve("reward")
    for name in heldout_metrics(h):
        mode = "min" if any(w in name for w in LOWER_IS_BETTER) else "max"
        score = HeldoutScore({name: 1.0}, mode=mode)
        points = score.update(h.entries)
        if len(points) < 3:
            continue
        for step, value in points:
            if score.better(value):
                score.take(step, value)
        steps, values = [s for s, _ in points], [v for _, v in points]
        sign = 1.0 if mode == "max" else -1.0
        good = [sign * v for v in values]  # higher is better
        diffs = sorted({abs(b - a) for a, b in zip(values, values[1:]) if b != a})
        sigma = max(stats.noise_sigma(values), diffs[0] if diffs else 0.0, 1e-9)
        threshold = t.heldout_sigmas * sigma * 2 ** 0.5
        z, p = stats.mann_kendall(good)
        best_i = good.index(max(good))
        from_start = good[0] - good[-1] > threshold and good[-2] < good[0] - sigma and z < 0 and p < 0.2
        # After the best: two or more evaluations after it, falling, and the mean of the last two below the mean
        # around the best (it and its neighbours) beyond noise. A single high evaluation is the maximum of noisy
        # values, optimistic by selection: the neighbourhood's mean is what the best stands for.
        around = good[max(best_i - 1, 0): best_i + 2]
        after_best = (0 < best_i < len(good) - 2 and statistics.fmean(around) - statistics.fmean(good[-2:]) > threshold
                      and good[-2] < good[best_i] - sigma and stats.mann_kendall(good[best_i:])[0] < 0)
        # Worse after its best and staying there: at least PERSISTENT_AFTER evaluations after the best, their median
        # worse than the best by twice the noise threshold, 5.7 sigma (no trend needed: an eval loss that jumps up once
        # and stays up is as much a fall as one that climbs). The best of 25 noisy evaluations sits about 2 sigma from
        # the median of the rest: on 400 pure-noise curves this rule adds no finding (tests/test_doctor.py).
        later = good[best_i + 1:]
        persistent = (len(later) >= PERSISTENT_AFTER and good[best_i] - statistics.median(later) > 2 * threshold
                      and max(later) < good[best_i])
        if not (from_start or after_best or persistent):
            continue
        ref = 0 if from_start and (not (after_best or persistent) or good[0] >= good[best_i] - sigma) else best_i
        fall = good[ref] - good[-1]
        bounded = all(0.0 <= v <= 1.0 for v in values) and not any(w in name for w in ("nll", "loss", "ppl"))
        size = fall if bounded else fall / max(abs(values[ref]), 1e-9)
        floor = t.heldout_min_abs if bounded else t.heldout_min_rel
        symptom = any(w in name for w in HELDOUT_SYMPTOMS)
        severity = "info" if size < floor else "warning" if symptom else "critical"
        size_text = (f"{fall:.3g}" if bounded else f"{size:.1%}") + (
            f", under the {floor:g}{'' if bounded else ' (relative)'} that matters" if size < floor else "")
        span = [v for s, v in zip(r_steps, reward) if steps[ref] <= s <= steps[-1]]
        if len(span) >= 3:
            rz, _ = stats.mann_kendall(span)
            trend = stats.theil_sen([s for s in r_steps if steps[ref] <= s <= steps[-1]], span) * (steps[-1] - steps[ref])
            context = (f" while the training reward {'rose' if rz > 1.96 else 'fell' if rz < -1.96 else 'stayed flat'} "
                       f"({trend:+.3g} over the same steps, z {rz:.1f})")
        else:
            context = ""
        where = (f"from {_fmt(values[0])} (step {steps[0]})" if ref == 0 else
                 f"after its best, {_fmt(values[ref])} at step {steps[ref]},")
        if severity == "info":
            consequence = ": a real but small drift, worth watching, not a reason to stop."
        elif h.kind == "grpo":
            guard = "lower learning_rate, add sft_anchor on that task; " + _guard_clause(h) + "."
            consequence = (": the training is making the model worse on rows it does not train on. Likely cause: "
                           "updates that raise the training reward by damaging what the reward does not check (a "
                           "learning rate too high; wrong answers' tokens pushed down as a whole). Fix: " + guard)
        else:
            consequence = (": the model is fitting its training data at the expense of held-out data (overfitting). "
                           f"Fix: keep the checkpoint of step {score.best_step} (load_best_model_at_end with "
                           "metric_for_best_model), fewer epochs, a lower learning rate or more regularisation.")
        out.append(Finding(
            "heldout_drop", f"held-out {name} getting worse", steps[ref], steps[-1], severity=severity, subject=name,
            values={"first": values[0], "last": values[-1], "reference_step": steps[ref], "best_step": score.best_step,
                    "noise": sigma, "change": fall, "size": size},
            message=f"held-out {name} went {where} to {_fmt(values[-1])} (step {steps[-1]}), {fall / sigma:.1f} noise "
                    f"sigmas worse, a change of {size_text}{context}{consequence}"))
    return out
