"""Uncertainty for method comparisons: paired bootstrap intervals and three-way verdicts.

Methods are scored on the same test examples (the test draw does not depend on the seed), so a
difference in accuracy is bootstrapped over examples, each example's correctness averaged over seeds.
A claim *held* when its whole interval clears the threshold, *did not hold* when the whole interval
is on the wrong side, and is *inconclusive* when the interval covers the threshold.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

N_BOOT = 10_000
LEVEL = 0.95
HELD, NOT_HELD, INCONCLUSIVE = "held", "did not hold", "inconclusive"
#: the setup cannot show the claim either way (e.g. a threshold the rule can never reach)
UNTESTABLE = "not testable here"


@dataclass(frozen=True)
class Interval:
    """A point estimate with a percentile bootstrap interval at ``level``."""

    estimate: float
    low: float
    high: float
    level: float = LEVEL

    def __str__(self) -> str:
        return f"{self.estimate:+.3f} [{self.low:+.3f}, {self.high:+.3f}]"


def _interval(estimate: float, draws: np.ndarray, level: float) -> Interval:
    """The percentile bootstrap interval of ``draws`` around ``estimate``."""
    tail = (1 - level) / 2
    return Interval(float(estimate), float(np.quantile(draws, tail)), float(np.quantile(draws, 1 - tail)), level)


def _per_example(correct: ArrayLike) -> np.ndarray:
    arr = np.asarray(correct, dtype=float)
    return arr.mean(axis=0) if arr.ndim == 2 else arr


def paired_bootstrap(
    a: ArrayLike, b: ArrayLike, *, n_boot: int = N_BOOT, level: float = LEVEL, seed: int = 0
) -> Interval:
    """Accuracy of ``a`` minus accuracy of ``b`` on the same examples, with a paired bootstrap interval.

    ``a`` and ``b`` are per-example correctness (0/1), either one run each (n,) or several seeds (seeds, n),
    which are averaged per example first.
    """
    x, y = _per_example(a), _per_example(b)
    if x.shape != y.shape or x.size == 0:
        raise ValueError(
            f"paired bootstrap needs the same non-empty examples on both sides, got {x.shape} and {y.shape}"
        )
    diff = x - y
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, diff.size, size=(n_boot, diff.size))].mean(axis=1)
    return _interval(diff.mean(), means, level)


def bootstrap_ratio(
    a: Sequence[float],
    b: Sequence[float],
    *,
    stat: Callable[[np.ndarray], float] = np.median,
    n_boot: int = N_BOOT,
    level: float = LEVEL,
    seed: int = 0,
) -> Interval:
    """stat(a) / stat(b) of two independent samples (e.g. seconds per epoch of two methods), each resampled."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.size == 0 or y.size == 0:
        raise ValueError("bootstrap_ratio needs values on both sides")
    rng = np.random.default_rng(seed)
    ratios = np.array(
        [stat(x[rng.integers(0, x.size, x.size)]) / stat(y[rng.integers(0, y.size, y.size)]) for _ in range(n_boot)]
    )
    return _interval(stat(x) / stat(y), ratios, level)


def bootstrap_stat(
    values: Sequence[float],
    *,
    stat: Callable[[np.ndarray], float] = np.median,
    n_boot: int = N_BOOT,
    level: float = LEVEL,
    seed: int = 0,
) -> Interval:
    """stat(values) with a bootstrap interval (e.g. the median stop epoch over runs)."""
    x = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    draws = np.array([stat(x[rng.integers(0, x.size, x.size)]) for _ in range(n_boot)])
    return _interval(stat(x), draws, level)


def verdict(interval: Interval, threshold: float = 0.0, *, higher_is_better: bool = True) -> str:
    """The verdict of an interval against ``threshold``.

    ``held`` if the interval lies beyond ``threshold`` on the good side, ``did not hold`` if wholly on the bad side,
    else ``inconclusive``.
    """
    low, high = (interval.low, interval.high) if higher_is_better else (-interval.high, -interval.low)
    bound = threshold if higher_is_better else -threshold
    if low > bound:
        return HELD
    if high < bound:
        return NOT_HELD
    return INCONCLUSIVE
