"""The doctor's detectors: each reads a run's logged curves and names one way a GRPO run fails, with its cause and fix.

Every detector judges a curve against the run's own start and trend (:mod:`rookgrpo.doctor.stats`), not against
fixed floors that misfire on small models, and needs :attr:`Thresholds.min_points` logged points before it speaks.
A detector whose metrics were not logged is listed as skipped, with the metric it needed.

Which batch a metric describes: TRL's ``reward``, ``reward_std``, ``frac_reward_zero_std`` and ``rewards/*`` describe
the batch as generated; with ``zero_std_resampling`` the ``optimised/*`` copies describe the batch that was optimised
(which is what the KL-only detector reads). ``heldout/*`` (``chess_eval``) and ``eval_*`` describe held-out rows.

The detectors live by what they read (numerics, policy, completions, rewards, groups, heldout); importing this package
registers them in report order, and :func:`diagnose` runs them.
"""

from __future__ import annotations

import fnmatch
import re

from ..history import History
from .base import ANY_RUN, DETECTORS, KINDS, SEVERITIES, Finding, Thresholds, detector

# Imported for their detectors, in report order (each registers itself with @detector):
from . import numerics, policy, completions, rewards, groups, heldout  # noqa: F401,E402  isort: skip
from .heldout import heldout_metrics
from .numerics import KERNEL_FAULT
from .rewards import infer_reward_weights

__all__ = ["ANY_RUN", "DETECTORS", "KERNEL_FAULT", "KINDS", "SEVERITIES", "Finding", "Thresholds", "detector",
           "diagnose", "heldout_metrics", "infer_reward_weights", "respect_measured"]


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
