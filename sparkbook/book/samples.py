"""Judging times and rates by their samples, so that one slow request cannot fail a step.

On a busy machine (two shared cores, a neighbour's build) any single request, round trip or poll
can be delayed by seconds. A p99 of nine requests is the slowest of them; a mean of a hundred
all-reduces moves with one stall. So every check that judges a latency, rate, drift or lateness
uses one of these, states how many samples it judged, and says "too few samples to judge" (a
WARN, never a FAIL) below the count where its statistic holds:

* :func:`slower`: whether a later group of samples is slower than an earlier one: the ratio of
  their medians and a one-sided Mann-Whitney rank test (a drift must be both large and
  consistent, not one request);
* :func:`high`: a high percentile that one outlier cannot set (at most the second-largest value);
* :func:`ratio_interval`: paired ratios (one tool against another, run by run) as a geometric mean
  with its 95 % confidence interval.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

import numpy as np

ALPHA = 0.01  # a drift is called when the rank test's p-value is below this
MIN_GROUP = 8  # samples in each group for the rank test: at 8 and 8 it can reach p < 1e-3


@dataclass(frozen=True)
class Slower:
    """How much slower ``later`` ran than ``earlier``: the ratio of their medians and the rank
    test's one-sided p-value (the chance of a rank sum this high if both came from one
    distribution)."""

    earlier_median: float
    later_median: float
    n_earlier: int
    n_later: int
    p: float

    @property
    def ratio(self) -> float:
        return self.later_median / self.earlier_median if self.earlier_median > 0 else math.inf

    @property
    def enough(self) -> bool:
        return min(self.n_earlier, self.n_later) >= MIN_GROUP

    def significant(self, limit: float) -> bool:
        """Slower by more than ``limit`` times at the median, and consistently so (p < ALPHA)."""
        return self.enough and self.ratio > limit and self.p < ALPHA


def slower(earlier: Sequence[float], later: Sequence[float]) -> Slower | None:
    """The medians of both groups and the one-sided Mann-Whitney U test that ``later`` tends to
    be larger (normal approximation with the tie and continuity corrections; None when a group is
    empty)."""
    if not earlier or not later:
        return None
    return Slower(statistics.median(earlier), statistics.median(later), len(earlier), len(later),
                  rank_p(earlier, later))


def rank_p(earlier: Sequence[float], later: Sequence[float]) -> float:
    """One-sided p-value of the Mann-Whitney U test, H1: ``later`` is stochastically larger."""
    n1, n2 = len(earlier), len(later)
    values = np.concatenate([np.asarray(earlier, float), np.asarray(later, float)])
    ranks = _ranks(values)
    u = ranks[n1:].sum() - n2 * (n2 + 1) / 2  # U of the later group
    n = n1 + n2
    _, counts = np.unique(values, return_counts=True)
    ties = float((counts ** 3 - counts).sum())
    var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1))) if n > 1 else 0.0
    if var <= 0:
        return 1.0
    z = (u - n1 * n2 / 2 - 0.5) / math.sqrt(var)
    return 0.5 * math.erfc(z / math.sqrt(2))


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties given their mean rank."""
    order = values.argsort(kind="mergesort")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    for v in np.unique(values):
        same = values == v
        if same.sum() > 1:
            ranks[same] = ranks[same].mean()
    return ranks


def high(values: Sequence[float], q: float = 99) -> float | None:
    """The ``q``-th percentile, never above the second-largest value: one outlier cannot set it
    (with a hundred samples or more the p99 already lies below it). None without values; the only
    value when there is one."""
    if not values:
        return None
    a = np.sort(np.asarray(values, float))
    p = float(np.percentile(a, q))
    return min(p, float(a[-2])) if len(a) > 1 else p


# Student's t, two-sided 95 %, by degrees of freedom 1-30 (any statistics table); 1.96 beyond
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)


def ratio_interval(ratios: Sequence[float]) -> tuple[float, float, float] | None:
    """The geometric mean of paired ratios (A/B of one pair each) and its 95 % confidence interval,
    a t interval on their logarithms: (mean, low, high). None below 2 ratios, or with one not
    positive."""
    if len(ratios) < 2 or min(ratios) <= 0:
        return None
    logs = [math.log(r) for r in ratios]
    m, half = statistics.fmean(logs), statistics.stdev(logs) / math.sqrt(len(logs))
    t = T975[len(logs) - 2] if len(logs) - 1 <= len(T975) else 1.96
    return math.exp(m), math.exp(m - t * half), math.exp(m + t * half)
