"""Four stopping rules replayed from stored epochs: calibrated on sweep seeds, judged on result seeds."""

from __future__ import annotations

import pytest

from topotuner_lab.study.stopping import (
    RULES,
    EpochRecord,
    calibrate,
    compare_rules,
    judge_rule,
    patience_stop_epoch,
    rule_sweep,
)
from topotuner_lab.training.early_stopping import EARLIEST_STOP

BUDGET = 6


def _record(plateau: int, noise: float = 0.0) -> EpochRecord:
    """A run whose scores rise until ``plateau`` and stay; drift and distance fall, validation loss bottoms there."""
    score = [0.70 + 0.05 * min(e, plateau) + noise for e in range(1, BUDGET + 1)]
    return EpochRecord(
        normalized=[1.0 / e for e in range(1, BUDGET + 1)],
        from_pretrained=[1.0 - 0.1 * e for e in range(1, BUDGET + 1)],
        val_logloss=[1.0 - 0.1 * min(e, plateau) + (0.01 * (e - plateau) if e > plateau else 0) for e in range(1, 7)],
        val_score=score,
        test_score=[s - 0.01 for s in score],
    )


def test_patience_stops_after_that_many_epochs_without_improvement():
    assert patience_stop_epoch([1.0, 0.9, 0.95, 0.97, 0.5], 2) == 4
    assert patience_stop_epoch([1.0, 1.1, 1.2], 1) == 2
    assert patience_stop_epoch([1.0, 0.9, 0.8], 1) is None


def test_calibration_takes_the_earliest_stop_that_keeps_the_validation_score():
    runs = [_record(3), _record(3, 0.01), _record(4)]
    assert calibrate(runs, "fixed epoch", BUDGET, tolerance=0.0) == 4  # stopping at 3 loses 0.05 on one run
    assert calibrate(runs, "fixed epoch", BUDGET, tolerance=0.02) == 3  # 0.05 / 3 runs = 0.017 on average
    assert calibrate(runs, "validation-loss patience", BUDGET, tolerance=0.0) == 1  # stops one epoch after the best
    assert calibrate([_record(6)], "fixed epoch", BUDGET, tolerance=0.0) is None  # every earlier stop loses score


def test_a_rule_sitting_at_its_earliest_epoch_is_flagged_and_the_cost_is_measured_on_test_scores():
    runs = [_record(4), _record(5), _record(4, 0.02)]
    judged = judge_rule(runs, "normalized drift below a threshold", 0.9, BUDGET)  # 1/2 < 0.9: every run stops at 2
    assert judged["mean_stop"] == EARLIEST_STOP and judged["at_minimum"] == 1.0
    assert judged["early_share"] == 1.0
    assert judged["change"] == pytest.approx(-(0.10 + 0.15 + 0.10) / 3)
    assert judged["change_low"] < judged["change"] < judged["change_high"]
    kept = judge_rule(runs, "fixed epoch", None, BUDGET)  # no parameter kept the score: the whole budget
    assert kept["mean_stop"] == BUDGET and kept["change"] == 0.0 and kept["early_share"] == 0.0


def test_every_rule_is_calibrated_on_one_set_of_runs_and_judged_on_another():
    calibration, result = [_record(3), _record(3)], [_record(5), _record(5, 0.01)]
    table = compare_rules(calibration, result, BUDGET, tolerance=0.0).set_index("rule")
    assert list(table.index) == list(RULES)
    fixed = table.loc["fixed epoch"]
    assert fixed["parameter"] == 3  # calibrated where the sweep runs plateau ...
    assert fixed["change"] == pytest.approx(-0.10)  # ... and judged where the result runs had not yet


def test_a_rule_sweep_judges_the_rule_at_every_point_of_its_grid():
    runs = [_record(4), _record(5), _record(4, 0.02)]
    sweep = rule_sweep(runs, "normalized drift below a threshold", BUDGET).set_index("parameter")
    assert list(sweep.index) == [0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
    assert sweep.loc[0.9].to_dict() == {
        k: v for k, v in judge_rule(runs, "normalized drift below a threshold", 0.9, BUDGET).items() if k != "parameter"
    }
    assert sweep.loc[0.2, "mean_stop"] == 6 and sweep.loc[0.3, "mean_stop"] == 4  # 1/e < t first at e = 6, then 4
    assert (sweep["change_low"] <= sweep["change"]).all() and (sweep["early_low"] <= sweep["early_share"]).all()
