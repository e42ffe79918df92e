"""The size of a study, read from its pilot: margins from each target's gain, seeds from the measured variances.

A pilot runs every target's full FT and its cards on a few seeds. For each target and claim measure it gives the
zero-shot -> full FT gain (the margin is a share of it, fixed before the study's result runs), and for each paired
difference of arms (card against card at one budget, card against full FT) the seed and example variance of the
difference (:func:`~topotuner_lab.study.power.variance_components`). A difference is *decided at margin m* when its
95% interval either excludes 0 or lies inside +-m; where the true difference is 0, that happens with probability
:data:`POWER` once the standard error is at most ``m / (z + z_power)``, so the seeds to plan solve
``seed_var / S + example_var / N <= (m / (z + z_power))**2`` at the pilot's test examples N.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
import pandas as pd

from topotuner_lab.study.claims import measure_values, runs_at_chosen_rate
from topotuner_lab.study.plan import plan, run_owner
from topotuner_lab.study.power import Z95, Design, variance_components
from topotuner_lab.study.presets import CLAIM_MEASURES, DEFAULT_MARGIN_SHARE, Preset

#: the chance that a difference of 0 is decided (its interval inside the band) at the planned size
POWER = 0.8
#: the fewest seeds planned for a card-against-card claim: a seed-level t interval on fewer is too wide to use
MIN_SEEDS = 10
Reader = Callable[[str, str], Any]


@dataclass(frozen=True)
class Size:
    """What one paired difference on one target needs to be decided at its margin."""

    target: str
    measure: str
    comparison: str
    gain: float
    margin: float
    estimate: float
    seeds: int
    examples: int
    seed_sd: float
    example_sd: float
    half_width: float
    seeds_needed: int | None
    examples_needed: int | None


def power_z(power: float = POWER) -> float:
    """The normal quantile that lands a zero difference inside the band with probability ``power`` (two-sided)."""
    return NormalDist().inv_cdf(0.5 + power / 2)


def gain(group: pd.DataFrame, read: Reader, measure: str) -> float:
    """Full FT's mean test value over seeds minus the zero-shot model's, on one target's runs at the chosen rate."""
    full = [str(d) for d in group.loc[group["method"] == "full", "run_dir"]]
    if not full:
        raise KeyError("no full FT arm to measure the gain from")
    after = np.mean([measure_values(read, d, measure).mean() for d in full])
    return float(after - measure_values(read, full[0], measure, before=True).mean())


def seeds_to_decide(design: Design, margin: float, power: float = POWER) -> tuple[int | None, int | None]:
    """Seeds (at the design's examples) that decide a zero difference at ``margin``; else ``(None, examples)``.

    Where example noise alone is wider than the target, no number of seeds decides: the examples that would (with
    half the variance budget left to the seeds) are returned instead. ``margin`` 0 decides nothing: ``(None, None)``.
    """
    if margin <= 0:
        return None, None
    budget = (margin / (Z95 + power_z(power))) ** 2
    room = budget - design.example_var / design.examples
    if room <= 0:
        return None, math.ceil(2 * design.example_var / budget)
    return max(2, math.ceil(design.seed_var / room)), None


def _pairs(group: pd.DataFrame) -> list[tuple[str, str]]:
    """Every card against every other card at its budget, then every card against full FT."""
    cards = group[group["method"] == "profile"].drop_duplicates("run").sort_values(["budget", "run"])
    pairs = [
        (str(a), str(b))
        for _, same in cards.groupby("budget")
        for i, a in enumerate(same["run"])
        for b in list(same["run"])[i + 1 :]
    ]
    if (group["method"] == "full").any():
        pairs += [(str(card), "full") for card in cards["run"]]
    return pairs


def _stacked(group: pd.DataFrame, name: str, seeds: Sequence[int], read: Reader, measure: str) -> np.ndarray:
    rows = group[group["run"] == name].set_index("seed").loc[list(seeds)]
    return np.array([measure_values(read, str(d), measure) for d in rows["run_dir"]])


def study_sizes(
    results: pd.DataFrame,
    read: Reader,
    *,
    margin_share: float = DEFAULT_MARGIN_SHARE,
    measures: Sequence[str] = CLAIM_MEASURES,
    power: float = POWER,
) -> pd.DataFrame:
    """One row (:class:`Size`) per target, measure and paired difference of a pilot's runs at the chosen rates.

    ``read(run_dir, key)`` returns a key of a run's verified ``results.json`` (as the claims read them). A measure
    a target's runs did not record (log-probability on generation tasks, or runs without zero-shot log-loss) is
    left out of that target's rows.
    """
    rows = []
    for target, group in runs_at_chosen_rate(results).groupby("target", sort=False):
        for measure in measures:
            try:
                target_gain = gain(group, read, measure)
            except KeyError:
                continue
            margin = margin_share * max(target_gain, 0.0)
            for a, b in _pairs(group):
                seeds = sorted(set(group.loc[group["run"] == a, "seed"]) & set(group.loc[group["run"] == b, "seed"]))
                x, y = _stacked(group, a, seeds, read, measure), _stacked(group, b, seeds, read, measure)
                design = variance_components(x, y)
                needed, examples = seeds_to_decide(design, margin, power)
                rows.append(
                    Size(
                        str(target),
                        measure,
                        f"{a} - {b}",
                        target_gain,
                        margin,
                        float((x - y).mean()),
                        design.seeds,
                        design.examples,
                        math.sqrt(design.seed_var),
                        math.sqrt(design.example_var),
                        design.half_width(),
                        needed,
                        examples,
                    )
                )
    return pd.DataFrame([asdict(r) for r in rows], columns=list(Size.__dataclass_fields__))


def minutes_per_finetune(results: pd.DataFrame) -> pd.Series:
    """Median wall minutes of one fine-tune (training and evaluation) per target and method, as the pilot ran them."""
    timed = results.dropna(subset=["wall_sec"])
    return timed.groupby(["target", "method"], sort=False)["wall_sec"].median() / 60


def planned_seeds(sizes: pd.DataFrame, measure: str, min_seeds: int = MIN_SEEDS) -> dict[str, int | None]:
    """Per target, the seeds that decide every card-against-card difference on ``measure`` (at least ``min_seeds``).

    ``None`` where some difference cannot be decided by seeds at the pilot's test size (see ``examples_needed``).
    """
    out: dict[str, int | None] = {}
    cards = sizes[(sizes["measure"] == measure) & ~sizes["comparison"].str.endswith(" - full")]
    for target, rows in cards.groupby("target", sort=False):
        needed = rows["seeds_needed"]
        out[str(target)] = None if needed.isna().any() else max(min_seeds, int(needed.max()))
    return out


def planned_hours(preset: Preset, minutes: pd.Series) -> float:
    """CPU-hours of every fine-tune ``preset`` plans, at the pilot's ``minutes`` per (target, method).

    Runs on shared folders count once (:func:`~topotuner_lab.study.plan.run_owner`); a (target, method) the pilot did
    not time takes the median of its target's methods (e.g. LoRA at the cards' time), and a target the pilot did not
    run raises ``KeyError``.
    """
    runs = {(run_owner(preset, s), s.target, s.seed, s.key, s.role, s.lr) for s in plan(preset)}
    total = 0.0
    for _, target, _, key, _, _ in runs:
        per_method = minutes[target]
        total += float(per_method.get(key.family, per_method.median()))
    return total / 60
