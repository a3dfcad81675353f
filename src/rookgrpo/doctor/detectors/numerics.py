"""Numbers gone wrong: non-finite values, gradients that vanish, grow or spike."""

from __future__ import annotations

import math
import statistics

from .. import stats
from ..history import History
from .base import Finding, Thresholds, _fmt, detector


#: What a NaN gradient with a finite loss most often is, and what to do (the finding's text and docs/howto.md).
KERNEL_FAULT = ("the backward pass made NaN from finite activations: a kernel fault, most often cuDNN's SDPA backward "
                "on H100/H200 GPUs with a left-padded batch whose width is 64 mod 128 (pytorch/pytorch#196678, "
                "huggingface/trl#7181). Fix: RookGRPOTrainer guards it by default (no_fully_masked_rows, "
                "allow_cudnn_attention: false, skip_nonfinite_updates); with a plain TRL trainer, call "
                "torch.backends.cuda.enable_cudnn_sdp(False) before training or set attn_implementation: eager")


def _skipped_at(h: History, steps: list[int]) -> bool:
    """Whether the run logged skipping the updates of every step in ``steps`` (rookgrpo's ``skipped_updates``, a
    running count: it rose by at least one per such step by the entry that logged it)."""
    s_steps, counts = h.curve("skipped_updates")
    if not counts:
        return False
    by_step = dict(zip(s_steps, counts))
    return all(by_step.get(s, 0) >= i for i, s in enumerate(sorted(steps), 1))


@detector("loss", "grad_norm", "reward")
def detect_nonfinite(h: History, t: Thresholds) -> list[Finding]:
    names = ["loss", "grad_norm", "reward", "kl", "entropy"] + sorted(
        n for n in h.names() if n.startswith("rewards/") and n.endswith("/mean"))
    out = []
    loss_steps, losses = h.curve("loss", finite=False)
    loss_at = dict(zip(loss_steps, losses))
    _, loss_skips = h.curve("skipped_updates/nonfinite_loss")
    for name in names:
        steps, values = h.curve(name, finite=False)
        bad = [s for s, v in zip(steps, values) if v != v or v in (float("inf"), float("-inf"))]
        if not bad:
            continue
        # A NaN gradient with a finite loss at the same steps: a backward kernel's fault, not the data's or the step
        # size's. (transformers' logging_nan_inf_filter, on by default, logs a NaN loss as the running average:
        # rookgrpo's skipped_updates/nonfinite_loss says whether a loss was NaN; without it the log cannot tell.)
        kernel = (name == "grad_norm" and all(math.isfinite(loss_at.get(s, float("nan"))) for s in bad)
                  and not (loss_skips and max(loss_skips) > 0))
        skipped = name == "grad_norm" and _skipped_at(h, bad)
        # A gradient norm that was NaN at a few steps of a run whose loss stayed finite after them: those steps were
        # skipped (a mixed-precision scaler, a trainer that drops non-finite updates); the weights were not hit.
        after = [v for s, v in zip(loss_steps, losses) if s > bad[-1]]
        isolated = (name == "grad_norm" and (skipped or len(bad) <= max(1, len(values) // 10)) and bad[-1] < steps[-1]
                    and len(after) >= 2 and all(math.isfinite(v) for v in after))
        where = f"{name} was NaN/inf at {len(bad)} of {len(values)} logged step(s), first at step {bad[0]}"
        if kernel and not skipped and (t.precision or h.precision) == "fp16":
            # fp16: the loss scaler skips a step whose scaled gradients overflowed and lowers its scale: routine while
            # it finds its scale (rookgrpo's skipped_updates counts only what the scaler does not explain), and it is
            # over once the gradients are finite again.
            ended = bad[-1] < steps[-1] and len(after) >= 2 and all(math.isfinite(v) for v in after)
            out.append(Finding(
                "nonfinite", f"{name} overflowed under fp16's loss scaler", bad[0], bad[-1],
                severity="info" if ended else "warning", subject=name,
                values={"steps": len(bad), "carried_on": ended, "cause": "loss_scale", "skipped": False},
                message=f"{where}, with a finite loss, in an fp16 run: the loss scaler's overflows, each step skipped "
                        "by the scaler and its scale lowered" + (
                            "; routine while it finds its scale." if ended else
                            ", and they go on to the end: the scale keeps falling and the updates are skipped. Fix: "
                            "use bf16 over fp16, keep max_grad_norm > 0, lower learning_rate.")))
            continue
        if kernel:
            text = (f"{where}, while the loss was finite at every one of them: {KERNEL_FAULT}."
                    + (" The trainer skipped those updates (skipped_updates), so the weights were not hit."
                       if skipped else ""))
            out.append(Finding(
                "nonfinite", f"{name} NaN with a finite loss (a backward kernel)", bad[0], bad[-1],
                severity="warning" if isolated else "critical", subject=name,
                values={"steps": len(bad), "carried_on": isolated, "cause": "gradient", "skipped": skipped},
                message=text))
            continue
        if isolated:
            out.append(Finding(
                "nonfinite", f"{name} was NaN or infinite at isolated steps", bad[0], bad[-1], severity="warning",
                subject=name, values={"steps": len(bad), "carried_on": True, "cause": "loss", "skipped": skipped},
                message=f"{where}, and the loss stayed finite on every logged step after: those updates were "
                        "skipped, the weights were not hit. Likely cause: an fp16 overflow (the loss scaler skips the "
                        "step) or one extreme batch. Fix, if it recurs: use bf16 over fp16, keep max_grad_norm > 0, "
                        "lower learning_rate."))
            continue
        out.append(Finding(
            "nonfinite", f"{name} is NaN or infinite", bad[0], bad[-1], severity="critical", subject=name,
            values={"steps": len(bad), "carried_on": False, "cause": "loss"},
            message=f"{where}. Likely cause: the data, the step size or an overflow: an update that diverged "
                    "(learning rate too high, no gradient clipping, fp16 overflow), a NaN in the inputs, or a reward "
                    "that returned NaN for a completion. Fix: lower learning_rate, keep max_grad_norm > 0, use bf16 "
                    "over fp16, and make every reward return its floor, not NaN, on a bad completion."))
    return out


@detector("grad_norm")
def detect_gradients(h: History, t: Thresholds) -> list[Finding]:
    steps, g = h.curve("grad_norm")
    if len(g) < t.min_share_points:
        return []
    out = []
    zero = [s for s, v in zip(steps, g) if v == 0.0]
    if len(zero) >= 2 and len(zero) / len(g) >= t.grad_zero_share:
        _, losses = h.curve("loss")
        zero_loss = sum(1 for v in losses if v == 0.0)
        every = len(zero) == len(g)  # the run has not learned at all: critical
        out.append(Finding(
            "zero_gradient", "every step had an exactly-zero gradient" if every else
            "steps with an exactly-zero gradient", zero[0], zero[-1], subject="grad_norm",
            severity="critical" if every else "warning",
            values={"zero_steps": len(zero), "logged": len(g), "zero_loss": zero_loss},
            message=f"{len(zero)} of {len(g)} logged steps had a gradient norm of exactly 0 ({zero_loss} a loss of "
                    "exactly 0): the weights did not move on them. Likely cause: every advantage of the batch was 0 "
                    "(every completion of each prompt earned the same reward) and beta is 0, or every completion was "
                    "masked out of the loss. Fix: add zero_std_resampling, give the reward partial credit, train on "
                    "prompts the model sometimes solves, or raise the sampling temperature."))
    if len(g) < t.min_points:
        return out
    start, end = statistics.median(stats.head(g)), statistics.median(stats.tail(g))
    z, p = stats.mann_kendall(g)
    if start > 0 and end >= t.grad_growth * start and z > 0 and p < 0.01:
        first = next(s for s, v in zip(steps, g) if v >= 3 * start)
        out.append(Finding(
            "grad_growth", "gradient norm growing without bound", first, steps[-1], severity="critical",
            subject="grad_norm", values={"start": start, "end": end},
            message=f"the gradient norm rose from {_fmt(start)} at the start to {_fmt(end)} at the end "
                    f"({end / start:.0f}x, Mann-Kendall z {z:.1f}): the updates are diverging. Likely cause: a "
                    "learning rate too high for the model, or an objective the policy can push without limit. "
                    "Fix: lower learning_rate (and warm it up), keep max_grad_norm > 0, raise beta."))
    idx = stats.spikes(g)
    if idx:
        out.append(_grad_spike(h, steps, g, idx))
    return out


#: A run whose median share of flat groups is at least this has almost no reward signal: its gradient-norm spikes are
#: the few groups with a spread landing in a batch (docs/doctor.md, "How the spike rule was chosen").
MOSTLY_FLAT = 0.9


def _grad_spike(h: History, steps: list[int], g: list[float], idx: list[int]) -> Finding:
    """The spike finding, read against the flat-group share: in a run whose groups are mostly flat, the steps with a
    non-flat group carry the whole update, so their norms stand out without anything being wrong with them."""
    where = f"{', '.join(str(steps[i]) for i in idx[:5])}{'...' if len(idx) > 5 else ''}"
    values = {"spikes": len(idx), "largest": max(g[i] for i in idx)}
    z_steps, z = h.curve("frac_reward_zero_std")
    flat = dict(zip(z_steps, z))
    at_spikes = [flat[steps[i]] for i in idx if steps[i] in flat]
    if len(z) >= 4 and statistics.median(z) >= MOSTLY_FLAT:
        return Finding(
            "grad_spike", "gradient-norm spikes in a run of flat groups", steps[idx[0]], steps[idx[-1]],
            severity="info", subject="grad_norm", values={**values, "flat_median": statistics.median(z)},
            message=f"{len(idx)} spike(s) in the gradient norm (at step(s) {where}), in a run where a median "
                    f"{statistics.median(z):.0%} of groups were flat: its gradient is the KL term's and that of the "
                    "few groups with any reward spread (with scale_rewards: group, also groups whose rewards differ "
                    "by float noise, scaled up to full-size advantages), so the norm jumps whenever such a group "
                    "lands in a batch. Not a learning-rate problem; the flat-group finding is the one to act on.")
    if h.kind != "grpo" and len(idx) == 1:
        return Finding(
            "grad_spike", "one gradient-norm spike", steps[idx[0]], steps[idx[0]], severity="info",
            subject="grad_norm", values=values,
            message=f"one spike in the gradient norm (step {where}; {_fmt(max(g[i] for i in idx))} against a median "
                    f"of {_fmt(statistics.median(g))}) in a {h.kind} run: a single unusual batch, not a trend "
                    "(grad_growth watches for one). Worth a look at that batch if it recurs.")
    if at_spikes and len(z) >= 4 and statistics.median(z) >= 0.5 and \
            statistics.fmean(at_spikes) < statistics.median(z) - 0.1:
        return Finding(
            "grad_spike", "gradient-norm spikes at the steps with signal", steps[idx[0]], steps[idx[-1]],
            severity="info", subject="grad_norm", values={**values, "flat_at_spikes": statistics.fmean(at_spikes)},
            message=f"{len(idx)} spike(s) in the gradient norm (at step(s) {where}), at steps whose batches had fewer "
                    f"flat groups ({statistics.fmean(at_spikes):.0%}) than the run's median "
                    f"({statistics.median(z):.0%}): with most groups flat, the few steps with a reward spread carry "
                    "the whole update, so their norms stand out. Not a learning-rate problem; see the flat-group "
                    "finding (zero_std_resampling, prompt_selection).")
    advice = ("use scale_rewards: batch or none, " if h.kind == "grpo" else "")
    cause = ("a batch with extreme advantages or a few tokens with extreme log-ratios" if h.kind == "grpo" else
             "a batch unlike the others (very long, or with rare tokens)")
    return Finding(
        "grad_spike", "gradient-norm spikes", steps[idx[0]], steps[idx[-1]], subject="grad_norm", values=values,
        message=f"{len(idx)} spike(s) in the gradient norm (at step(s) {where}; largest "
                f"{_fmt(max(g[i] for i in idx))}, against a median of {_fmt(statistics.median(g))}). Likely cause: "
                f"{cause}. Fix: keep max_grad_norm > 0 (the logged norm is before clipping), lower learning_rate, "
                f"{advice}and look at the batches of those steps.")
