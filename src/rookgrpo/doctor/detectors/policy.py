"""The policy: entropy, KL (runaway, spikes, its share of the gradient), clipping, and vLLM's sampler against the
trainer."""

from __future__ import annotations

import statistics

from .. import stats
from ..history import History
from .base import Finding, Thresholds, _fmt, detector


@detector("entropy")
def detect_entropy(h: History, t: Thresholds) -> list[Finding]:
    steps, e = h.curve("entropy")
    if len(e) < t.min_points:
        return []
    # The start is the first logged step's entropy: the policy before (almost) any update; a collapse can take one step.
    start, end = e[0], statistics.median(stats.tail(e))
    z, p = stats.mann_kendall(e)
    if start <= 0 or end >= t.entropy_drop * start or not (z < 0 and p < 0.01 or end < 0.2 * start):
        return []
    first = next((s for s, v in zip(steps, e) if v < (1 + t.entropy_drop) / 2 * start), steps[-1])
    return [Finding(
        "entropy_collapse", "entropy collapse", first, steps[-1], subject="entropy",
        values={"start": start, "end": end},
        message=f"the policy's per-token entropy fell from {_fmt(start)} to {_fmt(end)} nats ({end / start:.0%} of "
                f"its start; Mann-Kendall z {z:.1f}): the policy is sharpening onto a few answers and stops "
                "exploring, so groups turn identical and advantages vanish. Likely cause: a learning rate too high, "
                "positive advantages concentrating mass on one answer. Fix: lower learning_rate, raise the sampling "
                "temperature, add entropy_coef (or use_adaptive_entropy), or raise beta.")]


@detector("kl")
def detect_kl(h: History, t: Thresholds) -> list[Finding]:
    steps, k = h.curve("kl")
    if len(k) < t.min_points:
        return []
    out = []
    half = len(k) // 2
    s1 = stats.theil_sen(steps[:half], k[:half])
    s2 = stats.theil_sen(steps[half:], k[half:])
    z, p = stats.mann_kendall(k[half:])
    end = statistics.median(stats.tail(k))
    if z > 0 and p < 0.01 and s2 > t.kl_accel * max(s1, 0.0) and s2 > 0 and end > t.kl_floor:
        out.append(Finding(
            "kl_runaway", "KL runaway", steps[half], steps[-1], severity="critical", subject="kl",
            values={"slope_first_half": s1, "slope_second_half": s2, "end": end},
            message=f"the KL to the reference rose to {_fmt(end)} nats/token, {s2 / max(s1, 1e-12):.1f}x faster over "
                    f"the second half of the run than over the first (Mann-Kendall z {z:.1f}): the policy is "
                    "leaving the reference at an accelerating pace. Likely cause: a learning rate too high, or beta "
                    "too weak for the reward's scale. Fix: lower learning_rate, raise beta or add adaptive_beta "
                    "(target_kl), and restart from a checkpoint saved before the rise."))
    idx = stats.spikes(k)
    idx = [i for i in idx if i + 1 >= len(k) or k[i + 1] < k[i] / 2]  # transient: the next point comes back down
    idx = [i for i in idx if k[i] >= t.kl_spike_floor]  # a large ratio on a tiny KL is harmless
    if idx:
        out.append(Finding(
            "kl_spike", "KL spikes", steps[idx[0]], steps[idx[-1]], subject="kl",
            values={"spikes": len(idx), "largest": max(k[i] for i in idx)},
            message=f"{len(idx)} spike(s) in KL (at step(s) {', '.join(str(steps[i]) for i in idx[:5])}; largest "
                    f"{_fmt(max(k[i] for i in idx))} against a median of {_fmt(statistics.median(k))}). Likely cause: "
                    "a few completions the policy now finds far less likely than the reference did (rare tokens, a "
                    "changed format). Fix: the kl_cap callback (caps per-token log-ratios), a lower learning rate."))
    return out


@detector("loss/kl_grad_share")
def detect_kl_dominates(h: History, t: Thresholds) -> list[Finding]:
    steps, share = h.curve("loss/kl_grad_share")
    if len(share) < 3:
        return []
    late = share[len(share) // 2:]
    med = statistics.median(late)
    if med < t.kl_grad_share:
        return []
    _, cos = h.curve("grad/kl_policy_cos")
    cos_text = f"; the two gradients' cosine {_fmt(statistics.median(cos[len(cos) // 2:]))}" if cos else ""
    return [Finding(
        "kl_dominates", "the KL term moves the weights more than the reward", steps[len(share) // 2], steps[-1],
        subject="loss/kl_grad_share", values={"median": med},
        message=f"beta·KL's gradient was {med:.0%} of the update's (median of the second half, "
                f"loss/kl_grad_share{cos_text}): the policy is pulled back to the reference more than towards reward. "
                "Likely cause: beta too high for the reward's scale, or advantages mostly zero (flat groups) so that "
                "only the KL term moves the policy. Fix: lower beta (or adaptive_beta with a higher target_kl), "
                "zero_std_resampling for flat groups, or scale the rewards up.")]


@detector("clip_ratio/region_mean")
def detect_clipping(h: History, t: Thresholds) -> list[Finding]:
    steps, region = h.curve("clip_ratio/region_mean")
    if len(region) < t.min_points or not any(region):
        return []  # the ratio is 1 (fully on-policy): nothing is ever clipped
    out = []
    med = statistics.median(stats.tail(region))
    if med >= t.clip_share:
        out.append(Finding(
            "clipping", "many tokens clipped", steps[0], steps[-1], subject="clip_ratio/region_mean",
            values={"median": med},
            message=f"{med:.0%} of completion tokens were clipped at the trust region (median of the last quarter): "
                    "their gradient is zero, so most of the batch does not teach. Likely cause: the policy moves too "
                    "far between generation and update (num_iterations, steps_per_generation, a high learning rate). "
                    "This ratio compares the trainer with itself (the policy against the old policy's log-probs, "
                    "which the trainer recomputes), so vLLM's sampler cannot show here: a sampler/trainer mismatch "
                    "shows in TRL's sampling/* metrics (the sampler_mismatch finding). Fix: lower learning_rate or "
                    "num_iterations, or widen epsilon/epsilon_high."))
    _, low = h.curve("clip_ratio/low_mean")
    _, high = h.curve("clip_ratio/high_mean")
    if low and high:
        lo, hi = statistics.fmean(low), statistics.fmean(high)
        big, small, side = (lo, hi, "low") if lo > hi else (hi, lo, "high")
        if big >= 0.02 and big >= t.clip_asymmetry * max(small, 1e-12):
            what = ("negative-advantage tokens the policy already made less likely (epsilon_low)" if side == "low"
                    else "positive-advantage tokens the policy already made more likely (epsilon_high)")
            out.append(Finding(
                "clip_asymmetry", f"clipping one-sided ({side})", steps[0], steps[-1], subject=f"clip_ratio/{side}_mean",
                values={"low": lo, "high": hi},
                message=f"clipped tokens are mostly on the {side} side ({_fmt(lo)} low vs {_fmt(hi)} high, mean "
                        f"share): the clip stops {what}. Fix: widen that side's epsilon (epsilon_high, as DAPO's "
                        "clip-higher does, or epsilon) or lower the learning rate."))
    return out


SAMPLER_DIFF = "sampling/sampling_logp_difference/mean"
SAMPLER_RATIO = "sampling/importance_sampling_ratio/mean"


@detector(SAMPLER_DIFF, SAMPLER_RATIO)
def detect_sampler(h: History, t: Thresholds) -> list[Finding]:
    """vLLM's sampler against the trainer (TRL's ``sampling/*``, logged under ``use_vllm`` with the importance-sampling
    correction on): the log-probs of the same sampled tokens should agree up to the engines' rounding. Judged on the
    correction's own terms (how far its ratio rescales the loss, how many nats per token the two distributions are
    apart) and on the run's own trend (apart more and more: the engine's weights fall behind the trainer's)."""
    out = []
    steps, diff = h.curve(SAMPLER_DIFF)
    _, ratio = h.curve(SAMPLER_RATIO)
    causes = ("Likely causes: truncated sampling (top_p < 1, top_k or min_p: vLLM reports the log-probs of the "
              "truncated distribution it sampled from, the trainer scores the full one, so every token's ratio is "
              "below 1; measured top_p 0.9: ratio 0.11-0.15 per 24-token sequence), scoring at other positions than "
              "the sampler (an absolute-position model such as GPT-2 scored with position_ids_from_mask: false or by "
              "a plain GRPOTrainer: measured 0.078 against 0.044 nats/token), the loss at another temperature than the "
              "sampler, or precision (vLLM serves bf16 while the trainer scores fp32: the floor of the difference)")
    fixes = ("Fix: sample at top_p 1.0 (top_k 0, min_p 0) under vLLM or use a token-level "
             "vllm_importance_sampling_mode; keep position_ids_from_mask on; match dtypes (bf16: true)")
    if len(diff) >= t.min_share_points:
        med = statistics.median(stats.tail(diff, 0.5))
        rmed = statistics.median(stats.tail(ratio, 0.5)) if len(ratio) >= t.min_share_points else None
        biased = rmed is not None and rmed > 0 and not (1 / t.sampler_ratio_bias <= rmed <= t.sampler_ratio_bias)
        if med >= t.sampler_logp_diff or biased:
            what = (f"TRL's importance-sampling ratio averaged {_fmt(rmed)} (sampling/importance_sampling_ratio/mean, "
                    f"median of the second half): the correction scales the loss by that much, systematically"
                    if biased else f"vLLM's and the trainer's log-probs of the sampled tokens were {_fmt(med)} nats "
                    f"apart per token (sampling/sampling_logp_difference/mean, median of the second half)")
            out.append(Finding(
                "sampler_mismatch", "vLLM's sampler and the trainer disagree", steps[0], steps[-1],
                subject=SAMPLER_RATIO if biased else SAMPLER_DIFF, values={"median": med, "ratio": rmed},
                message=f"{what}: the completions are scored off the distribution that sampled them, and the "
                        f"importance-sampling correction pays for it in the loss. {causes}. {fixes}."))
    if len(diff) >= t.min_points:
        start, end = statistics.median(stats.head(diff)), statistics.median(stats.tail(diff))
        z, p = stats.mann_kendall(diff)
        if end >= t.sampler_drift * max(start, 1e-6) and z > 0 and p < 0.05 and end >= t.sampler_logp_diff / 2:
            out.append(Finding(
                "sampler_drift", "vLLM's sampler falls behind the trainer", steps[0], steps[-1], subject=SAMPLER_DIFF,
                values={"start": start, "end": end},
                message=f"the sampler/trainer log-prob difference rose from {_fmt(start)} to {_fmt(end)} nats per "
                        "token (sampling/sampling_logp_difference/mean, first and last quarter): vLLM is sampling "
                        "weights the trainer has left behind. Likely cause: the weights stopped reaching vLLM (server "
                        "mode: the weight-sync channel; a change of weights outside an optimizer step, such as a "
                        "restore or a resume, that nothing pushed). Fix: check that TRL's sync_weights runs every "
                        "step (its profiling shows sync_weights), restart the vLLM server, and push the weights after "
                        "any restore (rookgrpo's heldout_guard does). With truncated sampling (sampler_mismatch) the "
                        "difference also grows as the policy sharpens."))
    return out
