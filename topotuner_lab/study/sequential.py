"""Seeds in pre-registered blocks: a group-sequential rule with O'Brien-Fleming-type alpha spending.

A claim may be looked at after each block of seeds, and more seeds added only while it is undecided; looking more
than once at a fixed 95% interval would decide falsely more often than 5%. At look ``k`` (information fraction
``t_k``: seeds so far over the cap) the interval uses the critical value ``c_k`` instead of 1.96, chosen so that the
chance of crossing at any look when the true difference is at the threshold is ``alpha`` in all. The alpha is spent
by Lan and DeMets' O'Brien-Fleming-type function ``alpha(t) = 2 - 2 Phi(z_{alpha/2} / sqrt(t))``: almost nothing at
the early looks, so the last look's critical value stays close to a single fixed-size test's.

References: K. K. G. Lan and D. L. DeMets, "Discrete sequential boundaries for clinical trials", Biometrika 70
(1983) 659-663; C. Jennison and B. W. Turnbull, *Group Sequential Methods* (2000), ch. 7.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import replace
from statistics import NormalDist
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from scipy.optimize import brentq
from scipy.stats import multivariate_normal

from topotuner_lab._io.errors import ParameterError
from topotuner_lab.study.claim_ids import ClaimId
from topotuner_lab.study.plan import claim_budget
from topotuner_lab.study.stats import EQUIVALENT, HELD, NOT_HELD

if TYPE_CHECKING:
    from topotuner_lab.study.claims import ClaimResult
    from topotuner_lab.study.presets import Preset

ALPHA = 0.05
_NORMAL = NormalDist()


def obf_spent(fraction: float, alpha: float = ALPHA) -> float:
    """The two-sided alpha spent by information ``fraction`` (0 < t <= 1) under the O'Brien-Fleming-type function."""
    return 2 - 2 * _NORMAL.cdf(_NORMAL.inv_cdf(1 - alpha / 2) / np.sqrt(fraction))


def _stays_inside(bounds: Sequence[float], fractions: Sequence[float]) -> float:
    """P(|Z_j| < bounds[j] at every look) for the score statistics of a Brownian motion seen at ``fractions``."""
    t = np.asarray(fractions, dtype=float)
    if len(t) == 1:
        return 2 * _NORMAL.cdf(bounds[0]) - 1
    cov = np.sqrt(np.minimum.outer(t, t) / np.maximum.outer(t, t))
    upper = np.asarray(bounds, dtype=float)
    dist = multivariate_normal(mean=np.zeros(len(t)), cov=cov, seed=0, maxpts=50_000 * len(t), abseps=1e-6, releps=1e-6)
    return float(dist.cdf(upper, lower_limit=-upper))


def _excess(c: float, found: list[float], fractions: Sequence[float], target: float) -> float:
    """P(no crossing up to the last look, whose bound is ``c``) - ``target``: 0 where the look spends its alpha."""
    return _stays_inside([*found, c], fractions) - target


def check_fractions(fractions: Sequence[float]) -> list[float]:
    """Information fractions as floats, refused unless strictly increasing in (0, 1] and ending at 1 (the cap)."""
    t = [float(x) for x in fractions]
    if not t or any(b <= a for a, b in zip(t, t[1:])) or t[0] <= 0 or abs(t[-1] - 1) > 1e-12:
        raise ParameterError(
            f"looks at information fractions {t} are not a group-sequential plan",
            "give strictly increasing fractions in (0, 1] ending at 1, e.g. seeds so far / the seed cap per block",
        )
    return t


def boundaries(fractions: Sequence[float], alpha: float = ALPHA) -> list[float]:
    """The two-sided critical value of each look at ``fractions``, spending ``alpha`` in all (O'Brien-Fleming type).

    One look at fraction 1 gives the fixed-size test's value (1.96 at 0.05); two equally spaced looks give 2.772 and
    1.979, three 3.395, 2.407 and 2.015 (close to the classic O'Brien-Fleming constants 2.797, 1.977 and 3.471,
    2.454, 2.004, which fix the number of looks in advance instead of spending by information).
    """
    t = check_fractions(fractions)
    found: list[float] = []
    inside = 1.0  # P(no crossing at the looks so far)
    for k in range(len(t)):
        spend = obf_spent(t[k], alpha) - (obf_spent(t[k - 1], alpha) if k else 0.0)

        found.append(float(brentq(_excess, 0.5, 12.0, args=(found, t[: k + 1], inside - spend), xtol=1e-6)))
        inside = _stays_inside(found, t[: k + 1])
    return found


@functools.lru_cache(maxsize=32)
def _plan_boundaries(fractions: tuple[float, ...], alpha: float) -> tuple[float, ...]:
    """:func:`boundaries` of one plan, computed once per process (a report judges every claim at the same look)."""
    return tuple(boundaries(fractions, alpha))


def look_level(fractions: Sequence[float], look: int, alpha: float = ALPHA) -> float:
    """The confidence level of the two-sided interval at look ``look`` (0-based) of the plan ``fractions``."""
    c = _plan_boundaries(tuple(float(x) for x in fractions), alpha)[look]
    return 2 * _NORMAL.cdf(c) - 1


#: each look of a group-sequential study: its seeds, level, undecided claims and whether seeds were added
LOOKS_FILE = "looks.json"
#: the claims whose decision ends a group-sequential study early: the thesis and topology against the controls
SEQUENTIAL_CLAIMS = (ClaimId.THESIS, ClaimId.BEATS_CONTROLS)
#: verdicts that decide a claim (the interval clears its threshold or sits inside its band)
DECIDED = (HELD, NOT_HELD, EQUIVALENT)


def looks(preset: Preset) -> list[int]:
    """The seed counts after which a study's claims are judged: its ``seed_blocks``, else one look at every seed."""
    return list(preset.seed_blocks) or [len(preset.seeds)]


def at_look(preset: Preset, seeds: int) -> Preset:
    """``preset`` cut to its first ``seeds`` seeds: the runs a look plans (a prefix of the whole plan; no floor)."""
    return replace(preset, seeds=preset.seeds[:seeds], seed_blocks=(), seed_floor=0)


def look_rows(preset: Preset, table: pd.DataFrame) -> pd.DataFrame:
    """The runs a look judges: every arm but the cards (and matched LoRA) of budgets outside ``claim_budgets``."""
    if "budget" not in table:
        return table
    return table[[pd.isna(budget) or claim_budget(preset, budget) for budget in table["budget"]]]


def open_claims(claims: Sequence[ClaimResult]) -> list[ClaimResult] | None:
    """The sequential claims a look leaves undecided; None where the look judges none (then no look stops early)."""
    judged = [c for c in claims if c.claim in SEQUENTIAL_CLAIMS]
    return [c for c in judged if c.verdict not in DECIDED] if judged else None
