"""Early stopping judged from stored drift: the rule at any threshold, shares with exact binomial intervals."""

from __future__ import annotations

import math

import pytest

from topotuner_lab.study.stopping import (
    early_by,
    runs_to_decide_share,
    share_interval,
    stop_epoch_at,
    threshold_sweep,
)


def test_stop_epoch_at_applies_the_callbacks_rule():
    drift = [1.0, 0.6, 0.4, 0.2]
    assert stop_epoch_at(drift, 0.5) == 3 and stop_epoch_at(drift, 0.7) == 2 and stop_epoch_at(drift, 0.1) is None
    assert stop_epoch_at([1.0, 0.1], 0.5, earliest=3) is None  # never before the earliest epoch
    assert stop_epoch_at([0.1, 0.9, 0.1], 0.5) == 3  # epoch 1 is the reference, never a stop
    assert stop_epoch_at([1.0, 0.5], 0.5) is None  # strictly below


def test_share_interval_is_the_exact_binomial_one():
    all_three = share_interval(3, 3)
    assert all_three.estimate == 1.0 and all_three.high == 1.0 and all_three.low == pytest.approx(0.2924, abs=1e-4)
    none = share_interval(0, 10)
    assert none.low == 0.0 and none.high == pytest.approx(0.3085, abs=1e-4)
    assert math.isnan(share_interval(0, 0).estimate)


def test_the_runs_a_share_needs_before_any_outcome_can_decide_it():
    assert runs_to_decide_share(0.5) == 6  # 5 of 5 gives [0.478, 1]: "more than half" cannot clear 0.5
    assert share_interval(6, 6).low > 0.5 and share_interval(5, 5).low < 0.5
    # far from a half, one extreme decides early: 0 of 2 gives [0, 0.84], under 0.9; 2 of 2 gives [0.16, 1]
    assert runs_to_decide_share(0.9) == runs_to_decide_share(0.1) == 2


def test_threshold_sweep_from_stored_histories():
    runs = [
        ([1.0, 0.45, 0.3, 0.2, 0.1, 0.1], [0.70, 0.80, 0.82, 0.83, 0.84, 0.85]),
        ([1.0, 0.8, 0.6, 0.35, 0.3, 0.2], [0.60, 0.70, 0.75, 0.80, 0.80, 0.80]),
        ([1.0, 0.9, 0.9, 0.9, 0.9, 0.9], []),  # never stops below 0.9; no per-epoch accuracy
    ]
    assert early_by(6) == 3
    sweep = threshold_sweep(runs, 6, thresholds=(0.5, 0.7)).set_index("threshold")
    assert sweep.loc[0.5, "stopped_by_3"] == 1 and sweep.loc[0.7, "stopped_by_3"] == 2  # run 2 stops at 3 at 0.7
    assert sweep.loc[0.5, "median_stop"] == 4.0  # stops 2, 4 and never (6)
    assert sweep.loc[0.5, "acc_at_stop_minus_end"] == pytest.approx(((0.80 - 0.85) + (0.80 - 0.80)) / 2)
    assert sweep.loc[0.7, "share"] == pytest.approx(2 / 3) and sweep.loc[0.7, "share_low"] < 2 / 3


def test_the_authors_rule_fires_at_the_first_epoch_close_enough_to_the_pretrained_weights():
    from topotuner_lab.study.stopping import eta_grid, eta_stop_epoch

    distances = [0.9, 0.5, 0.3, 0.2]  # a rule on the distance itself, not on its epoch-to-epoch change
    assert eta_stop_epoch(distances, 0.5) == 2 and eta_stop_epoch(distances, 0.25) == 4
    assert eta_stop_epoch(distances, 0.1) is None and eta_stop_epoch([0.1, 0.9], 0.5) is None  # never at epoch 1
    assert eta_stop_epoch([0.9, None, 0.1], 0.5) == 3  # an epoch without a recorded distance never fires
    grid = eta_grid([distances, [None, 1.1]], points=5)
    assert grid[0] == 0.2 and grid[-1] == 1.1 and len(grid) == 5
    sweep = threshold_sweep([(distances, [0.5, 0.6, 0.7, 0.8])], budget=4, thresholds=(0.5, 0.25), rule=eta_stop_epoch)
    assert list(sweep["median_stop"]) == [2.0, 4.0]
    assert sweep["acc_at_stop_minus_end"].iloc[0] == pytest.approx(0.6 - 0.8)
