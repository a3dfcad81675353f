"""The doctor's detectors: each reads a run's logged curves and names one way a GRPO run fails, with its cause and fix.

Every detector judges a curve against the run's own start and trend (:mod:`rookgrpo.doctor.stats`), not against
fixed floors that misfire on small models, and needs :attr:`Thresholds.min_points` logged points before it speaks.
A detector whose metrics were not logged is listed as skipped, with the metric it needed.

Which batch a metric describes: TRL's ``reward``, ``reward_std``, ``frac_reward_zero_std`` and ``rewards/*`` describe
the batch as generated; with ``zero_std_resampling`` the ``optimised/*`` copies describe the batch that was optimised
(which is what the KL-only detector reads). ``heldout/*`` (``chess_eval``) and ``eval_*`` describe held-out rows.
"""

from __future__ import annotations

import fnmatch
import math
import re
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from ..dynamics.heldout import HeldoutScore
from . import stats
from .history import History


@dataclass
class Thresholds:
    """What counts as a finding. Shares are of logged points; ratios are against the run's own start."""

    min_points: int = 8  #: logged points a curve needs before a trend or spike detector judges it
    min_share_points: int = 4  #: ... and before a share-of-steps detector does (zero gradients, flat groups, cut-offs)
    entropy_drop: float = 0.5  #: entropy below this share of its start, with a falling trend
    kl_accel: float = 3.0  #: KL's slope over the second half this many times the first half's
    kl_floor: float = 0.05  #: ... and per-token KL above this (nats), for a runaway
    kl_grad_share: float = 0.5  #: the KL term's share of the gradient (``loss/kl_grad_share``) above this
    grad_zero_share: float = 0.2  #: share of logged steps with a gradient norm of exactly 0
    grad_growth: float = 10.0  #: gradient norm's end this many times its start, with a rising trend
    clip_share: float = 0.2  #: share of tokens clipped (ratio outside the trust region)
    clip_asymmetry: float = 3.0  #: one side clipped this many times the other
    length_growth: float = 1.5  #: mean completion length's end this many times its start
    length_reward_corr: float = 0.6  #: rank correlation of length with reward, for "lengthening to earn reward"
    truncated_share: float = 0.5  #: share of completions cut off at max_completion_length
    plateau_points: int = 20  #: logged points before a flat reward counts as a plateau
    component_dead: float = 0.02  #: a reward component's share of the summed per-component variance below this
    component_whole: float = 0.95  #: ... or above this, with 2+ components
    zero_std_share: float = 0.5  #: share of groups whose completions all earned the same reward
    kl_only_share: float = 0.25  #: share of flat groups in the optimised batch, with beta > 0
    heldout_sigmas: float = 2.0  #: held-out fall beyond this many noise standard deviations (of a difference)
    heldout_min_abs: float = 0.03  #: ... and by at least this much for a rate in [0, 1] (accuracy, share)
    heldout_min_rel: float = 0.05  #: ... or this share of its reference value for other metrics (NLL, loss, reward)
    kl_spike_floor: float = 0.1  #: a KL spike must reach this many nats/token to matter (a 40x rise from 0.002 does not)
    #: vLLM's and the trainer's log-probs of the sampled tokens apart by more than this many nats per token (mean)
    sampler_logp_diff: float = 0.05
    #: TRL's importance-sampling ratio's mean outside [1 / this, this]: the correction rescales the loss systematically
    sampler_ratio_bias: float = 1.25
    #: the log-prob difference's end this many times its start, with a rising trend: vLLM's weights fall behind
    sampler_drift: float = 3.0
    identical_share: float = 0.5  #: share of groups whose completions are all the same token sequence
    collapsed_share: float = 0.5  #: share of logged points at which a reward gave the whole batch one score
    saturated_relative: float = 1e-3  #: a reward's batch spread under this share of its magnitude: saturated
    reward_weights: dict[str, float] = field(default_factory=dict)  #: reward name -> weight (default 1)
    #: settings the recipe chose by measurement, {field: where}: no fix advises changing them (``measured_settings``)
    measured: dict[str, str] = field(default_factory=dict)
    #: the rewards that are reward models (judges), when known (``None``: not known): the live callback and
    #: ``run_info.json`` give them, ``rookgrpo doctor --judges`` too
    judges: tuple[str, ...] | None = None
    #: the run's training precision where known (``"fp16"``: a loss scaler's overflows are routine); the live callback
    #: sets it, ``run_info.json`` records it
    precision: str | None = None


@dataclass
class Finding:
    """One failure the doctor found: what, over which steps, why, and what to change.

    ``kind`` names the detector's finding (``halt_on`` names kinds); ``subject`` the metric or reward it is about.
    """

    kind: str
    title: str
    first_step: int
    last_step: int
    message: str
    severity: str = "warning"
    subject: str = ""
    values: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.subject}" if self.subject else self.kind

    def line(self) -> str:
        span = f"step {self.first_step}" if self.first_step == self.last_step else f"steps {self.first_step}-{self.last_step}"
        return f"[{self.severity}] {self.title} ({span}): {self.message}"

    def to_dict(self) -> dict:
        return asdict(self)


#: Every kind of finding, in report order (the ``doctor`` callback's ``halt_on`` names these).
KINDS = ("nonfinite", "zero_gradient", "grad_growth", "grad_spike", "entropy_collapse", "kl_runaway", "kl_spike",
         "kl_dominates", "clipping", "clip_asymmetry", "sampler_mismatch", "sampler_drift", "length_hacking", "truncation", "no_loss_tokens",
         "identical_groups", "reward_plateau", "reward_peak_fall", "reward_decline", "reward_collapsed",
         "reward_saturated", "reward_dead", "reward_dominant", "zero_std", "kl_only_groups", "heldout_drop",
         "recompile")
#: Severity tiers, most severe first: critical = not learning or broken now; warning = likely to go wrong; info =
#: worth knowing (a real change too small to matter).
SEVERITIES = ("critical", "warning", "info")

Detector = Callable[[History, Thresholds], list[Finding]]
#: kind(s) -> detector, in report order; ``needs`` names the metrics each reads, ``*`` for any part of a name (a
#: detector none of whose ``needs`` was logged is listed as skipped instead of run).
DETECTORS: dict[str, tuple[Detector, tuple[str, ...]]] = {}
#: The detectors that judge any training run (the rest judge policy-gradient runs with groups: ``History.kind``).
ANY_RUN = {"nonfinite", "gradients", "heldout"}


def detector(*needs: str):
    def register(fn: Detector) -> Detector:
        DETECTORS[fn.__name__.removeprefix("detect_")] = (fn, needs)
        return fn
    return register


def _fmt(x: float) -> str:
    return f"{x:.3g}"


# ---- numbers gone wrong ------------------------------------------------------------------------------------------

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


# ---- the policy -------------------------------------------------------------------------------------------------

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


# ---- completions ------------------------------------------------------------------------------------------------

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


def _guard_clause(h: History) -> str:
    """The fix's clause about rookgrpo's ``heldout_guard``: a run that logs it already ends with its best held-out
    score's weights (say which step's), so it is not told to add one."""
    if not h.curve("heldout_guard/score")[0]:
        return "add heldout_guard (ends the run with the best evaluation's weights)"
    _, best = h.curve("heldout_guard/best_step")
    kept = f" (step {int(best[-1])}'s)" if best else ""
    return f"the run's heldout_guard already ends it with the weights of its best held-out score{kept}"


# ---- rewards ----------------------------------------------------------------------------------------------------

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


@detector("groups/identical_frac")
def detect_identical_groups(h: History, t: Thresholds) -> list[Finding]:
    """Groups whose completions are all the same token sequence (``groups/identical_frac``, rookgrpo's diagnostics):
    sampling leaves no room to explore."""
    steps, share = h.curve("groups/identical_frac")
    if len(share) < t.min_share_points:
        return []
    med = statistics.median(share)
    if med < t.identical_share:
        return []
    every = min(share) >= 1.0
    return [Finding(
        "identical_groups", "every group's completions are identical" if every else "most groups' completions are "
        "identical", steps[0], steps[-1], subject="groups/identical_frac", values={"median": med},
        severity="critical" if every else "warning",
        message=f"a median {med:.0%} of groups had completions that are all the same token sequence "
                "(groups/identical_frac): such a group has no reward spread and teaches nothing. Likely cause: "
                "sampling too cold for this task, or a collapsed policy. Fix: raise temperature/top_p for that task "
                "(task_generation_kwargs), lower the learning rate, or raise beta / use adaptive_beta to hold the "
                "policy near the reference.")]


@detector("completions/loss_tokens")
def detect_no_loss_tokens(h: History, t: Thresholds) -> list[Finding]:
    """Generation batches of which the loss sees no token (``completions/loss_tokens`` 0, rookgrpo's diagnostics)."""
    steps, tokens = h.curve("completions/loss_tokens")
    empty = [s for s, v in zip(steps, tokens) if v == 0]
    if not empty:
        return []
    every = len(empty) == len(tokens) and len(tokens) >= t.min_share_points
    return [Finding(
        "no_loss_tokens", "batches with no token to learn from", empty[0], empty[-1], subject="completions/loss_tokens",
        severity="critical" if every or len(empty) / len(tokens) >= t.grad_zero_share and
        len(tokens) >= t.min_share_points else "warning", values={"steps": len(empty), "logged": len(tokens)},
        message=f"at {len(empty)} of {len(tokens)} logged steps every completion was masked out of the loss, so the "
                "step had no token to learn from. Likely cause: every completion was cut off at "
                "max_completion_length with mask_truncated_completions on, or a tool/completion mask that covers "
                "everything. Fix: raise max_completion_length, turn mask_truncated_completions off, or check the "
                "masks.")]


@detector("compile/graphs")
def detect_recompile(h: History, t: Thresholds) -> list[Finding]:
    """``torch.compile`` compiling again after the first step (``compile/graphs``, rookgrpo's diagnostics): the
    "second iteration 5x slower" failure."""
    steps, graphs = h.curve("compile/graphs")
    again = [(s, g) for s, g in list(zip(steps, graphs))[1:] if g > 0]
    if not again:
        return []
    _, step_time = h.curve("timing/step")
    return [Finding(
        "recompile", "torch.compile compiling again after the first step", again[0][0], again[-1][0],
        subject="compile/graphs", values={"steps": len(again), "graphs": sum(g for _, g in again)},
        message=f"torch.compile compiled {sum(g for _, g in again):g} new graph(s) at {len(again)} logged step(s) "
                f"after the first (first at step {again[0][0]}), each paid again whenever it recurs"
                f"{' (timing/step shows the cost)' if step_time else ''}. Likely cause: recompilation on a new input "
                "shape (prompts and completions of varying length) or a failed guard. Fix: pad to fixed lengths "
                "(pad_to_multiple_of, a fixed max_completion_length), compile with dynamic=True, or raise "
                "torch._dynamo.config.cache_size_limit; run with TORCH_LOGS=recompiles to see which guard failed.")]


@detector("frac_reward_zero_std")
def detect_zero_std(h: History, t: Thresholds) -> list[Finding]:
    steps, z = h.curve("frac_reward_zero_std")
    if len(z) < t.min_share_points:
        return []
    med = statistics.median(z)
    if med < t.zero_std_share:
        return []
    _, best = h.curve("groups/flat_best_frac")
    _, worst = h.curve("groups/flat_worst_frac")
    if best and worst:
        b, w = statistics.fmean(best), statistics.fmean(worst)
        split = (f" Of all groups, {b:.0%} were flat at the best reward seen (all pass: too easy) and {w:.0%} at the "
                 f"worst (all fail: too hard), mean over logs.")
        fix = ("Fix: train on harder prompts (prompt_selection)" if b > w else
               "Fix: train on prompts the model sometimes solves (prompt_selection), give the reward partial credit")
    else:
        split, fix = "", "Fix: prompt_selection, partial-credit rewards"
    every = min(z) >= 1.0  # no group ever had a spread: nothing was learned from the reward
    return [Finding(
        "zero_std", "no group ever had a reward spread" if every else "most groups have no reward spread", steps[0],
        steps[-1], subject="frac_reward_zero_std", values={"median": med}, severity="critical" if every else "warning",
        message=f"a median {med:.0%} of groups earned the same reward on every completion (frac_reward_zero_std, the "
                f"batch as generated): their advantages are 0 and they teach nothing.{split} {fix}, raise the "
                "sampling temperature, or add zero_std_resampling.")]


@detector("kl", "optimised/frac_reward_zero_std")
def detect_kl_only(h: History, t: Thresholds) -> list[Finding]:
    name = "optimised/frac_reward_zero_std" if "optimised/frac_reward_zero_std" in h.names() else "frac_reward_zero_std"
    steps, z = h.curve(name)
    _, kl = h.curve("kl")
    if len(z) < t.min_share_points or not kl:  # TRL logs kl only when beta > 0
        return []
    med = statistics.median(z)
    if med < t.kl_only_share:
        return []
    after = " after resampling" if name.startswith("optimised/") else ""
    return [Finding(
        "kl_only_groups", "flat groups moved by the KL term alone", steps[0], steps[-1], subject=name,
        values={"median": med},
        message=f"a median {med:.0%} of the optimised batch's groups were flat{after} ({name}) while beta > 0: their "
                "advantages are 0, so their only gradient is the KL term, which pulls the policy towards the "
                "reference on those prompts whatever the reward (trl#5588). Fix: zero_std_resampling (with enough "
                "rounds), prompt_selection, or a lower beta.")]


# ---- held-out quality -------------------------------------------------------------------------------------------

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


#: How a fix advises changing a setting: "raise learning_rate", "lower beta (and warm it up)".
_CHANGE = r"(?:raise|lower|increase|decrease|reduce|widen)"


def respect_measured(finding: Finding, measured: dict[str, str]) -> Finding:
    """A finding whose fix advises changing a setting the recipe chose by measurement says to keep it instead, and
    where it was measured: one run's log does not outweigh a measured grid (``measured_settings``).

    >>> f = Finding("reward_plateau", "flat", 1, 9, "Fix: look at the other findings; raise learning_rate; check x.")
    >>> respect_measured(f, {"learning_rate": "docs/my_grid.md"}).message
    "Fix: look at the other findings; keep learning_rate (the recipe's value was measured: docs/my_grid.md); check x."
    """
    for name, where in measured.items():
        pattern = re.compile(rf"\b{_CHANGE} (?:the )?{re.escape(name)}\b(?: \([^)]*\))?")
        if pattern.search(finding.message):
            finding.message = pattern.sub(f"keep {name} (the recipe's value was measured: {where})", finding.message)
            finding.values.setdefault("kept_measured", []).append(name)
    return finding


def diagnose(history: History, thresholds: Thresholds | None = None,
             only: list[str] | None = None) -> tuple[list[Finding], dict[str, str]]:
    """Run the detectors on a run's history: (findings in report order, {detector: why it was skipped}).

    Example (a run whose entropy collapses):
        >>> entries = [{"step": s, "entropy": 0.8 * 0.9 ** s} for s in range(1, 31)]
        >>> findings, skipped = diagnose(History(entries))
        >>> [f.kind for f in findings], "kl" in skipped
        (['entropy_collapse'], True)
    """
    t = thresholds or Thresholds()
    names = history.names()
    kind = history.kind
    findings, skipped = [], {}
    for name, (fn, needs) in DETECTORS.items():
        if only and name not in only:
            continue
        if kind != "grpo" and name not in ANY_RUN:
            skipped[name] = f"judges GRPO-style runs; this log is {kind}"
            continue
        if needs and not any(fnmatch.filter(names, n) for n in needs):
            skipped[name] = f"needs {' or '.join(needs)}, not logged"
            continue
        found = fn(history, t)
        findings.extend(found)
    measured = {**history.measured, **t.measured}
    if measured:
        findings = [respect_measured(f, measured) for f in findings]
    return findings, skipped
