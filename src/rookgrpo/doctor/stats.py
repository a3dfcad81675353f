"""Trend and outlier statistics for logged training curves: small, exact, dependency-free.

The doctor judges a curve against its own start and trend, never against fixed floors: a 124M chess model's entropy
(0.3-0.6 nats) is a collapse for a 7B chat model and healthy here. These are the tools it does it with.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def theil_sen(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Median of the slopes between every pair of points: a line fit that a few outliers do not move.

    >>> theil_sen([0, 1, 2, 3, 4], [0, 1, 2, 3, 40])
    1.0
    """
    if len(xs) < 2:
        return 0.0
    step = max(1, len(xs) // 200)  # at most ~20k pairs: the slope of a thinned curve
    xs, ys = list(xs)[::step], list(ys)[::step]
    slopes = [(ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(len(xs)) for j in range(i + 1, len(xs))
              if xs[j] != xs[i]]
    return statistics.median(slopes) if slopes else 0.0


def mann_kendall(ys: Sequence[float]) -> tuple[float, float]:
    """Mann-Kendall trend test: (z, two-sided p). z > 0 for a rising curve; ties lower the variance as usual.

    >>> z, p = mann_kendall([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    >>> round(z, 2), p < 0.001
    (3.94, True)
    >>> mann_kendall([1, 1, 1, 1])
    (0.0, 1.0)
    """
    ys = list(ys)[::max(1, len(ys) // 300)]  # at most ~600 points: the test of a thinned curve (O(n^2) pairs)
    n = len(ys)
    if n < 3:
        return 0.0, 1.0
    s = sum((ys[j] > ys[i]) - (ys[j] < ys[i]) for i in range(n) for j in range(i + 1, n))
    ties: dict[float, int] = {}
    for y in ys:
        ties[y] = ties.get(y, 0) + 1
    var = (n * (n - 1) * (2 * n + 5) - sum(t * (t - 1) * (2 * t + 5) for t in ties.values())) / 18
    if var <= 0:
        return 0.0, 1.0
    z = (s - math.copysign(1, s)) / math.sqrt(var) if s else 0.0
    return z, math.erfc(abs(z) / math.sqrt(2))


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Rank correlation of two equally long sequences (average ranks for ties); 0 when either is constant.

    >>> spearman([1, 2, 3, 4], [10, 20, 30, 25])
    0.8
    """
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    if len(xs) < 3:
        return 0.0
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else 0.0


def mad_sigma(values: Sequence[float]) -> float:
    """Robust standard deviation: 1.4826 x the median absolute deviation from the median.

    >>> mad_sigma([1, 2, 3, 4, 100])
    1.4826
    """
    if not values:
        return 0.0
    med = statistics.median(values)
    return 1.4826 * statistics.median(abs(v - med) for v in values)


def noise_sigma(values: Sequence[float]) -> float:
    """The step-to-step noise of a curve: the robust spread of its successive differences over sqrt(2), so a steady
    trend does not count as noise.

    >>> round(noise_sigma([0.0, 1.0, 2.0, 3.0, 4.0]), 3)  # a straight line: no noise
    0.0
    """
    diffs = [b - a for a, b in zip(values, values[1:])]
    return mad_sigma(diffs) / math.sqrt(2) if len(diffs) >= 2 else 0.0


def spikes(values: Sequence[float], window: int = 10, z: float = 8.0, ratio: float = 3.0) -> list[int]:
    """Indexes of points that jump above the curve so far: more than ``z`` robust standard deviations above the
    median of the ``window`` points before them, more than ``ratio`` times that median, and more than 1.5 times the
    highest of them (a curve that rises steadily from 0, as KL does, has no spike).

    >>> spikes([1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0, 9.0, 1.0])
    [7]
    >>> spikes([0.0, 0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.012])
    []
    """
    out = []
    for i in range(max(3, window // 2), len(values)):
        before = values[max(0, i - window):i]
        med = statistics.median(before)
        sigma = max(mad_sigma(before), 1e-3 * abs(med), 1e-12)
        if values[i] > med + z * sigma and values[i] > ratio * med and values[i] > 1.5 * max(before) and med >= 0:
            out.append(i)
    return out


def head(values: Sequence[float], share: float = 0.25, least: int = 3) -> list[float]:
    """The first ``share`` of a curve (at least ``least`` points): its start, to judge the rest against."""
    return list(values[:max(least, int(len(values) * share))])


def tail(values: Sequence[float], share: float = 0.25, least: int = 3) -> list[float]:
    """The last ``share`` of a curve (at least ``least`` points)."""
    return list(values[-max(least, int(len(values) * share)):])
