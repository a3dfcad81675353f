"""``rookgrpo plot RUN_DIR``: training curves from the trainer's own log history.

Reads ``trainer_state.json`` (written at the end of training and in every checkpoint) and draws reward (total and per
component), held-out chess and the reference answers' NLL (``chess_eval``), KL, beta, the share of zero-std groups and
resampling rounds over steps, whichever were logged, with a dashed line at the step whose weights ``heldout_guard``
handed back when they were not the last step's. Also
renders a compact text table so a terminal shows the curve without opening the PNG.
"""

from __future__ import annotations

import math
from pathlib import Path

from .errors import ConfigError

# (panel title, metric keys or key prefix) in display order; panels with no logged data are skipped.
PANELS = [
    ("reward", ["reward"], "rewards/"),
    ("held-out chess (chess_eval, greedy)", ["heldout/best_move_accuracy", "heldout/format_rate",
                                             "heldout/top5_accuracy", "heldout/legal_move_rate",
                                             "heldout/env_exact_accuracy",
                                             "heldout/move_rank_reward", "heldout/top_move_share",
                                             "heldout/env_broken_rate"], None),
    ("held-out reference NLL (nats/token)", ["heldout/nll_P", "heldout/nll_A"], None),
    ("KL", ["kl"], None),
    ("beta", ["beta"], None),
    ("zero-std group share", ["frac_reward_zero_std", "resample/frac_zero_std_after"], None),
    ("resample rounds", ["resample/rounds"], None),
]


def load_log_history(run_dir: str | Path) -> list[dict]:
    """Training log entries of a run: ``RUN_DIR/trainer_state.json``, else the newest checkpoint's (read as
    ``rookgrpo doctor`` reads them, :func:`rookgrpo.doctor.load_history`)."""
    from .doctor.history import load_history

    return load_history(run_dir).entries


def series(history: list[dict], key: str) -> tuple[list[int], list[float]]:
    steps, values = [], []
    for h in history:
        value = h.get(key)
        if isinstance(value, (int, float)) and not math.isnan(value):
            steps.append(h["step"])
            values.append(float(value))
    return steps, values


def pyplot(what: str):
    """``matplotlib.pyplot`` on the file-only Agg backend, or a one-line ConfigError naming the package ``what``
    needs."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigError(f"{what} draws with matplotlib, which is not installed here: pip install matplotlib.") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def panel_series(history: list[dict]) -> list[tuple[str, list[str]]]:
    """The panels a run's curves get: (title, the logged keys drawn in it), in :data:`PANELS` order, those with no
    logged data left out.

    >>> panel_series([{"step": 0, "heldout/format_rate": 0.9}, {"step": 5, "reward": 1.0, "rewards/fmt/mean": 0.5}])
    [('reward', ['reward', 'rewards/fmt/mean']), ('held-out chess (chess_eval, greedy)', ['heldout/format_rate'])]
    """
    panels = []
    for title, keys, prefix in PANELS:
        names = [k for k in keys if series(history, k)[0]]
        if prefix:
            names += sorted({k for h in history for k in h if k.startswith(prefix) and k.endswith("/mean")})
        if names:
            panels.append((title, names))
    return panels


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the curves of ``run_dir`` to ``out`` (default ``RUN_DIR/training_curves.png``) and return its path."""
    plt = pyplot("rookgrpo plot")

    history = load_log_history(run_dir)
    panels = panel_series(history)
    if not panels:
        raise ConfigError(f"plot: the log history in {run_dir} has no reward, KL or beta entries to plot.")
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.6 * len(panels)), sharex=True, squeeze=False)
    _, restored = series(history, "heldout_guard/restored")
    _, best = series(history, "heldout_guard/best_step")
    for ax, (title, names) in zip(axes[:, 0], panels):
        for name in names:
            ax.plot(*series(history, name), marker=".", label=name)
        if restored and restored[-1] and best:  # the step whose weights heldout_guard handed back
            ax.axvline(best[-1], color="black", linestyle="--", linewidth=1,
                       label=f"heldout_guard: weights of step {best[-1]:.0f}")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    out = Path(out) if out else Path(run_dir) / "training_curves.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def text_curve(history: list[dict], key: str = "reward", width: int = 40) -> str:
    """A small text table of ``key`` over steps with a bar per logged step."""
    steps, values = series(history, key)
    if not values:
        return f"(no '{key}' in the log history)"
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    lines = [f"{'step':>6}  {key:>10}"]
    for step, value in zip(steps, values):
        lines.append(f"{step:>6}  {value:>10.4f}  " + "#" * (1 + int((value - lo) / span * (width - 1))))
    return "\n".join(lines)
