"""How many training seeds (or test examples) a paired comparison would need to decide its claim.

The difference of two arms is measured on S seeds x N shared test examples. Its variance splits into a seed part
(the spread of the per-seed mean differences beyond what example noise explains) and an example part (the spread of
the seed-averaged per-example differences): Var(mean) ~ seed_var / S + example_var / N, the two ways the two-way
bootstrap resamples. A claim is decided once the 95% half-width falls below the distance from the estimate to the
threshold; solving for S (at the same N), or for N when seeds alone cannot get there, gives the size to plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
from numpy.typing import ArrayLike

Z95 = 1.959964
#: a claim that needs this many times the examples it measured is called undecidable by size, not planned for
IMPRACTICAL = 100


@dataclass(frozen=True)
class Design:
    """The variance components of a paired difference and the size they were measured at."""

    seed_var: float
    example_var: float
    seeds: int
    examples: int

    def half_width(self, seeds: int | None = None, examples: int | None = None) -> float:
        """The 95% half-width of the mean difference at ``seeds`` x ``examples`` (default: as measured)."""
        s, n = seeds or self.seeds, examples or self.examples
        return Z95 * math.sqrt(self.seed_var / s + self.example_var / n)


def variance_components(a: ArrayLike, b: ArrayLike) -> Design:
    """The seed and example variance of ``mean(a) - mean(b)``; ``a``, ``b`` are (seeds, examples), paired.

    The seed part is the variance of the per-seed mean differences less the example noise they carry (never below
    0; 0 with one seed, where it cannot be measured).
    """
    diff = np.atleast_2d(np.asarray(a, dtype=float) - np.asarray(b, dtype=float))
    seeds, examples = diff.shape
    example_var = float(diff.mean(axis=0).var(ddof=1)) if examples > 1 else 0.0
    within = float(diff.var(axis=1, ddof=1).mean()) if examples > 1 else 0.0
    seed_var = max(0.0, float(diff.mean(axis=1).var(ddof=1)) - within / examples) if seeds > 1 else 0.0
    return Design(seed_var, example_var, seeds, examples)


def two_sided_z(alpha: float) -> float:
    """The normal quantile of a two-sided test at level ``alpha`` (1.96 at 0.05)."""
    return NormalDist().inv_cdf(1 - alpha / 2)


#: what a size says where no size decides: the estimate lies on the threshold (within ON_THRESHOLD_TOL)
ON_THRESHOLD = "not by size: the estimate sits on the threshold"
ON_THRESHOLD_TOL = 1e-12


def runs_to_decide_ratio(estimate: float, low: float, high: float, threshold: float, runs: int) -> str:
    """Runs of each method for a ratio's bootstrap interval to clear ``threshold``, in words ("" where unsized).

    The interval's side that faces the threshold, on the log scale, shrinks as 1/sqrt(runs); the estimate is assumed
    to stay where it is. ``runs`` is the rarer method's count, which bounds the interval.
    """
    if not all(math.isfinite(v) and v > 0 for v in (estimate, low, high, threshold)):
        return ""
    gap = abs(math.log(estimate / threshold))
    if gap < ON_THRESHOLD_TOL:
        return ON_THRESHOLD
    side = math.log(high / estimate) if threshold > estimate else math.log(estimate / low)
    return f"~{math.ceil(runs * (side / gap) ** 2)} runs of each method (here {runs} of the rarer)"


def size_to_decide(design: Design, estimate: float, threshold: float, z: float = Z95) -> str:
    """What it would take to decide: ``"~12 seeds"`` at the measured examples, else the examples needed, in words.

    The target half-width (``z`` standard errors; 95% two-sided by default, stricter under a multiplicity
    correction) is the distance from the estimate to the threshold (assumed to stay where it is); an estimate on the
    threshold cannot be decided by size.
    """
    gap = abs(estimate - threshold)
    if gap < ON_THRESHOLD_TOL:
        return ON_THRESHOLD
    budget = (gap / z) ** 2  # the variance of the mean difference at which the half-width equals the gap
    room = budget - design.example_var / design.examples
    if room > 0:
        need = math.ceil(design.seed_var / room) if design.seed_var > 0 else 0
        if need > design.seeds:
            return f"~{need} seeds x {design.examples} examples"
        if design.seeds == 1:
            return "more seeds: one seed cannot measure the seed noise (the example noise alone would allow a decision)"
        return (
            f"a little more than measured (~{design.seeds + 1} seeds or more): the normal approximation says "
            f"{design.seeds} seeds x {design.examples} examples would do, the bootstrap interval did not"
        )
    examples = math.ceil(2 * design.example_var / budget)  # half the budget to the examples, half to the seeds
    if examples > IMPRACTICAL * design.examples:
        return f"not practically by size: the estimate sits {gap:.2g} from the threshold (~{examples} examples)"
    seeds = math.ceil(2 * design.seed_var / budget) if design.seed_var > 0 else design.seeds
    return f"more examples than measured: ~{examples} examples (and ~{max(seeds, design.seeds)} seeds)"
