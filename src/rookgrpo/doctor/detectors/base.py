"""The detectors' shared parts: thresholds, the finding, every kind in report order, and the registry a detector joins
with :func:`detector`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from ..history import History


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
    #: reward name -> its first failure, live (the ``doctor`` callback reads the trainer's ``reward_isolation``)
    reward_errors: dict[str, str] = field(default_factory=dict)
    reward_failed_share: float = 0.05  #: share of a reward's rows whose call failed, over the run, for a warning
    none_jump: float = 0.25  #: a reward's share of None rows up by this much from its start (absolute)


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
         "identical_groups", "reward_failing", "reward_none_jump", "reward_plateau", "reward_peak_fall", "reward_decline", "reward_collapsed",
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


def _guard_clause(h: History) -> str:
    """The fix's clause about rookgrpo's ``heldout_guard``: a run that logs it already ends with its best held-out
    score's weights (say which step's), so it is not told to add one."""
    if not h.curve("heldout_guard/score")[0]:
        return "add heldout_guard (ends the run with the best evaluation's weights)"
    _, best = h.curve("heldout_guard/best_step")
    kept = f" (step {int(best[-1])}'s)" if best else ""
    return f"the run's heldout_guard already ends it with the weights of its best held-out score{kept}"
