"""What ``rookgrpo doctor RUN`` prints and draws: the findings with the steps they span, and the curves they came from."""

from __future__ import annotations

import textwrap
from pathlib import Path

from .detectors import Finding, Thresholds, heldout_metrics
from .history import History


def too_few(history: History, thresholds: Thresholds) -> str:
    """Why ``history`` is too short for any detector to judge ('' when it is not): fewer logged training steps than
    the fewest any detector needs (:attr:`Thresholds.min_share_points`)."""
    steps = {int(e["step"]) for e in history.entries if any(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                            for k, v in e.items() if k != "step")}
    need = thresholds.min_share_points
    if len(steps) >= need:
        return ""
    return (f"too few to judge: {len(history.entries)} log entries over {len(steps)} logged step(s); the detectors "
            f"need at least {need} logged steps ({thresholds.min_points} for trends and spikes, "
            f"{thresholds.plateau_points} for a plateau). Log more often (logging_steps) or train longer.")


def format_report(history: History, findings: list[Finding], skipped: dict[str, str], short: str = "") -> str:
    """The findings as text: one block per finding (severity, title, steps, cause and fix), then the skipped
    detectors and what they needed; for a log too short to judge, that (``short``, from :func:`too_few`)."""
    lines = [f"rookgrpo doctor: {history.source} ({len(history.entries)} log entries, last step {history.last_step})"]
    if history.note:
        lines.append(f"How the log was read: {history.note}.")
    lines.append("")
    if short:
        lines.append(f"Not judged: {short}")
        return "\n".join(lines).rstrip() + "\n"
    if not findings:
        lines.append("No finding: none of the detectors found a failure in the logged curves.")
    for number, f in enumerate(findings, 1):
        span = f"step {f.first_step}" if f.first_step == f.last_step else f"steps {f.first_step}-{f.last_step}"
        lines.append(f"{number}. [{f.severity}] {f.kind}: {f.title} ({span})")
        lines.extend(textwrap.wrap(f.message, 110, initial_indent="   ", subsequent_indent="   "))
        lines.append("")
    if skipped:
        lines.append("Not checked (metric not logged): " + "; ".join(f"{k} ({v})" for k, v in skipped.items()))
    return "\n".join(lines).rstrip() + "\n"


# Curves drawn, in order, when logged; held-out metrics are added after them.
CURVES = ["reward", "kl", "entropy", "grad_norm", "loss/kl_grad_share", "completions/mean_length",
          "frac_reward_zero_std", "clip_ratio/region_mean"]


def plot_findings(history: History, findings: list[Finding], out: str | Path) -> Path:
    """Draw each logged curve the detectors read, one panel each, with every finding about it shaded over the steps it
    spans (and findings about the whole run on the reward panel)."""
    from ..plot import pyplot

    plt = pyplot("rookgrpo doctor --plot")
    flagged = {part for f in findings for part in f.subject.split(",")}
    held = sorted(heldout_metrics(history), key=lambda n: n not in flagged)[:6]  # the ones with findings first
    names = [n for n in CURVES if any(history.curve(n)[1])] + held
    if not names:
        raise ValueError("no curve to draw: the run logged none of " + ", ".join(CURVES))
    cols = 2
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(12, 2.6 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        steps, values = history.curve(name)
        ax.plot(steps, values, lw=1.2, marker="o" if len(steps) < 30 else None, ms=3)
        ax.set_title(name, fontsize=9)
        ax.tick_params(labelsize=8)
        for f in findings:
            about = f.subject == name or name in f.subject.split(",") or (name == "reward" and f.subject.startswith("rewards/"))
            if about:
                color = "tab:red" if f.severity == "critical" else "tab:orange"
                ax.axvspan(f.first_step, max(f.last_step, f.first_step + 0.5), color=color, alpha=0.15)
                ax.text(0.01, 0.95, f.kind, transform=ax.transAxes, fontsize=8, color=color, va="top")
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.suptitle(f"rookgrpo doctor: {len(findings)} finding(s)", fontsize=10)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
