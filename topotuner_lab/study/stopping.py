"""Early stopping judged from what the runs stored: stop epochs at any threshold, shares with binomial intervals.

Every card run in observe mode keeps its normalized epoch-to-epoch drift (``drift_history``) and, when it evaluates
each epoch, its test accuracy per epoch. The stop epoch at another threshold is then a lookup, not a retraining
(:func:`stop_epoch_at` applies the callback's own rule), so a threshold sweep costs nothing
(:func:`threshold_sweep`). "Stops early" is judged as a share of runs with an exact binomial interval
(:func:`share_interval`).

Two rules are replayed: the callback's own (normalized epoch-to-epoch drift below a threshold, :func:`stop_epoch_at`)
and the authors' (``FDataLab/TopoTuner``, ``codes/utils/plot_topology_stopping_eta.py``: the first epoch t >= 2 whose
mean H0 W1 distance from the pretrained weights is <= eta, :func:`eta_stop_epoch`), each over a grid of its
thresholds (:func:`threshold_sweep` with ``rule``; :func:`eta_grid` spans the distances the runs recorded), and
:func:`rule_sweep` judges either at every point of its grid with intervals.

:func:`compare_rules` sets both beside fixed-epoch stopping and validation-loss patience: each rule's parameter is
calibrated on the sweep seeds' runs (:func:`calibrate`: the earliest average stop that keeps the validation score
within a tolerance) and judged on the result seeds' runs (:func:`judge_rule`), from their stored per-epoch records.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from topotuner_lab.study.stats import Interval, seed_level_interval
from topotuner_lab.training.early_stopping import EARLIEST_STOP

#: thresholds of the sweep the report shows (normalized drift starts at 1.0)
SWEEP_THRESHOLDS: tuple[float, ...] = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def stop_epoch_at(normalized: Sequence[float], threshold: float, earliest: int = EARLIEST_STOP) -> int | None:
    """The epoch the rule fires at ``threshold``: the first from ``earliest`` on whose drift is below it (1-based)."""
    for epoch, value in enumerate(normalized, start=1):
        if epoch >= earliest and value < threshold:
            return epoch
    return None


def eta_stop_epoch(distances: Sequence[float | None], eta: float, earliest: int = EARLIEST_STOP) -> int | None:
    """The authors' rule: the first epoch from ``earliest`` on whose distance from the pretrained weights is <= eta.

    Epochs with no recorded distance (a resumed run) never fire.
    """
    for epoch, value in enumerate(distances, start=1):
        if epoch >= earliest and value is not None and value <= eta:
            return epoch
    return None


def eta_grid(runs: Sequence[Sequence[float | None]], points: int = 100) -> tuple[float, ...]:
    """``points`` values of eta evenly spaced over the distances the runs recorded (the authors sweep 100)."""
    values = [v for run in runs for v in run if v is not None and np.isfinite(v)]
    if not values:
        return ()
    return tuple(float(x) for x in np.linspace(min(values), max(values), points))


def share_interval(hits: int, runs: int, level: float = 0.95) -> Interval:
    """The share ``hits / runs`` with its exact (Clopper-Pearson) binomial interval."""
    from scipy.stats import binomtest

    if runs == 0:
        return Interval(float("nan"), float("nan"), float("nan"), level)
    ci = binomtest(hits, runs).proportion_ci(confidence_level=level, method="exact")
    return Interval(hits / runs, float(ci.low), float(ci.high), level)


def runs_to_decide_share(threshold: float, level: float = 0.95, most: int = 1000) -> int:
    """The fewest runs at which a share could be decided against ``threshold``: all (or none) of them clears it.

    With fewer, even the most extreme outcome leaves the exact interval covering the threshold (5 of 5 runs give
    [0.48, 1] at 95%, so "more than half" needs 6 runs).
    """
    for runs in range(1, most + 1):
        if share_interval(runs, runs, level).low > threshold or share_interval(0, runs, level).high < threshold:
            return runs
    return most + 1


def early_by(budget: int) -> int:
    """The epoch "early" means for a budget: half of it, rounded down ("2-3 of 6 epochs" -> by epoch 3)."""
    return budget // 2


StopRule = Callable[[Sequence[float], float], "int | None"]


def threshold_sweep(
    runs: Sequence[tuple[Sequence[float], Sequence[float]]],
    budget: int,
    thresholds: Sequence[float] = SWEEP_THRESHOLDS,
    rule: StopRule = stop_epoch_at,
) -> pd.DataFrame:
    """Per threshold: stop epochs from the stored drift, the share stopping early, accuracy at stop minus at the end.

    Early is by :func:`early_by` of ``budget``. ``runs`` holds per run the signal ``rule`` reads per epoch (normalized
    drift for :func:`stop_epoch_at`, the distance from the pretrained weights for :func:`eta_stop_epoch`) and its
    test accuracy per epoch (empty when the run did not evaluate each epoch: its accuracy change is left out). A run
    that never stops counts as not early, accuracy change 0.
    """
    rows = []
    by = early_by(budget)
    for threshold in thresholds:
        stops = [rule(signal, threshold) for signal, _ in runs]
        early = sum(s is not None and s <= by for s in stops)
        share = share_interval(early, len(runs))
        changes = [
            (acc[stop - 1] if stop is not None else acc[-1]) - acc[-1] for stop, (_, acc) in zip(stops, runs) if acc
        ]
        rows.append(
            {
                "threshold": threshold,
                "runs": len(runs),
                "median_stop": float(np.median([s if s is not None else budget for s in stops])) if runs else np.nan,
                f"stopped_by_{by}": early,
                "share": share.estimate,
                "share_low": share.low,
                "share_high": share.high,
                "acc_at_stop_minus_end": float(np.mean(changes)) if changes else np.nan,
            }
        )
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class EpochRecord:
    """What one card run stored per epoch: the signals the stopping rules read and the scores that judge them.

    Lists run over epochs 1..n: ``normalized`` epoch-to-epoch drift (the callback's rule), ``from_pretrained`` the
    distance from the pretrained weights (the authors' eta rule; None where not recorded), ``val_logloss`` (the
    patience rule), ``val_score`` (calibration reads it) and ``test_score`` (the judgement reads it).
    """

    normalized: Sequence[float]
    from_pretrained: Sequence[float | None]
    val_logloss: Sequence[float]
    val_score: Sequence[float]
    test_score: Sequence[float]


def patience_stop_epoch(losses: Sequence[float], patience: float) -> int | None:
    """Validation-loss patience: the first epoch by which the loss has not improved for ``patience`` epochs."""
    best = 0
    for epoch in range(1, len(losses)):
        if losses[epoch] < losses[best]:
            best = epoch
        elif epoch - best >= patience:
            return epoch + 1
    return None


#: each rule: what it reads from a run and the stop epoch it gives at a parameter (None: it never fires)
RULES: dict[str, Callable[[EpochRecord, float], int | None]] = {
    "normalized drift below a threshold": lambda r, t: stop_epoch_at(r.normalized, t),
    "distance from pretrained <= eta": lambda r, eta: eta_stop_epoch(r.from_pretrained, eta),
    "validation-loss patience": lambda r, p: patience_stop_epoch(r.val_logloss, p),
    "fixed epoch": lambda r, k: int(k) if k < len(r.test_score) else None,
}


def rule_grid(rule: str, records: Sequence[EpochRecord], budget: int) -> tuple[float, ...]:
    """The parameters a rule is calibrated over: the sweep's thresholds, eta over the recorded distances, epochs."""
    if rule == "normalized drift below a threshold":
        return SWEEP_THRESHOLDS
    if rule == "distance from pretrained <= eta":
        return eta_grid([r.from_pretrained for r in records])
    return tuple(float(k) for k in range(1, budget))


def _stops(records: Sequence[EpochRecord], rule: str, parameter: float) -> list[int]:
    """Each run's stop epoch under ``rule`` at ``parameter``; a rule that never fires runs the whole budget."""
    return [RULES[rule](r, parameter) or len(r.test_score) for r in records]


def calibrate(records: Sequence[EpochRecord], rule: str, budget: int, tolerance: float) -> float | None:
    """The parameter that stops earliest on average while losing at most ``tolerance`` validation score on average.

    Calibrated on the sweep seeds' runs, so the judgement on the other seeds is out of sample. None: no parameter
    keeps the score (the rule is then not used: those runs train the whole budget).
    """
    best: tuple[float, float] | None = None
    for parameter in rule_grid(rule, records, budget):
        stops = _stops(records, rule, parameter)
        loss = np.mean([r.val_score[s - 1] - r.val_score[-1] for r, s in zip(records, stops)])
        if loss >= -tolerance and (best is None or np.mean(stops) < best[1]):
            best = (parameter, float(np.mean(stops)))
    return None if best is None else best[0]


def judge_rule(
    records: Sequence[EpochRecord], rule: str, parameter: float | None, budget: int, level: float = 0.95
) -> dict[str, object]:
    """A calibrated rule on the result seeds: stop epochs, the share stopping early, the test score it costs.

    The change is test score at the stop minus at the end, with a Student-t interval over the runs. ``at_minimum`` is
    the share of runs that stop at the earliest epoch the rule allows: a rule that sits there says nothing about
    when training has converged, so "stops early" counts only where it is not 1.
    """
    stops = _stops(records, rule, parameter) if parameter is not None else [len(r.test_score) for r in records]
    changes = np.array([r.test_score[s - 1] - r.test_score[-1] for r, s in zip(records, stops)], dtype=float)
    nan = float("nan")
    cost = (  # one run per row: the t interval over the runs
        seed_level_interval(changes[:, None], np.zeros((changes.size, 1)), level=level)
        if changes.size
        else Interval(nan, nan, nan, level)
    )
    earliest = 1 if rule in ("fixed epoch", "validation-loss patience") else EARLIEST_STOP
    early = share_interval(sum(s <= early_by(budget) for s in stops), len(stops), level)
    return {
        "rule": rule,
        "parameter": parameter,
        "runs": len(records),
        "mean_stop": float(np.mean(stops)) if stops else float("nan"),
        "early_share": early.estimate,
        "early_low": early.low,
        "early_high": early.high,
        "at_minimum": float(np.mean([s == earliest for s in stops])) if stops else float("nan"),
        "change": cost.estimate,
        "change_low": cost.low,
        "change_high": cost.high,
    }


#: the rules that read a drift signal against a threshold: the report draws each over its whole grid
THRESHOLD_RULES: tuple[str, ...] = ("normalized drift below a threshold", "distance from pretrained <= eta")


def rule_sweep(
    records: Sequence[EpochRecord],
    rule: str,
    budget: int,
    grid: Sequence[float] | None = None,
    level: float = 0.95,
) -> pd.DataFrame:
    """``rule`` judged at every parameter of ``grid`` on ``records``: score at stop minus end, share stopping early.

    One :func:`judge_rule` row per parameter, so each point carries its intervals: the curve of accuracy against
    threshold the report draws, beside the one parameter :func:`calibrate` picks. ``grid`` defaults to the rule's
    own over ``records`` (:func:`rule_grid`); pass the grid over the calibration runs too, so the calibrated
    parameter lies on the curve.
    """
    grid = rule_grid(rule, records, budget) if grid is None else grid
    return pd.DataFrame([judge_rule(records, rule, p, budget, level) for p in grid])


def compare_rules(
    calibration: Sequence[EpochRecord], result: Sequence[EpochRecord], budget: int, tolerance: float
) -> pd.DataFrame:
    """Every rule calibrated on ``calibration`` (sweep seeds) within ``tolerance``, judged on ``result`` seeds."""
    return pd.DataFrame(
        [judge_rule(result, rule, calibrate(calibration, rule, budget, tolerance), budget) for rule in RULES]
    )
