"""The drift noise floor (drift.noise): the ratio and share worked out by hand, the boundary, the warning."""

from __future__ import annotations

import math
import warnings

import pandas as pd
import pytest

from topotuner_lab.drift.noise import NOISE_RATIO_MIN, NoiseCheck, noise_check

PIDS = ["L0.q", "L0.k", "L0.v", "L0.o"]


def _table(values: list[float], metric: str = "h0_w1", pids: list[str] = PIDS) -> pd.DataFrame:
    return pd.DataFrame({"pid": pids, metric: values})


# fine-tune drift 4, 6, 1, 10: median 5. Noise draws 1, 2, 2, 3 and 2, 1, 3, 5: all eight values sorted are
# 1 1 2 2 2 3 3 5, median 2, so the ratio is 5 / 2 = 2.5. Per matrix the largest draw is 2, 2, 3, 5: L0.q (4 > 2),
# L0.k (6 > 2) and L0.o (10 > 5) stand above every draw, L0.v (1 < 3) does not: 3 of 4.
TABLE = _table([4.0, 6.0, 1.0, 10.0])
NOISE = [_table([1.0, 2.0, 2.0, 3.0]), _table([2.0, 1.0, 3.0, 5.0])]


def test_ratio_and_share_above_worked_by_hand():
    check = noise_check(TABLE, NOISE)
    assert check == NoiseCheck("h0_w1", 2.5, 0.75)
    assert not check.within_noise


def test_noise_tables_are_matched_by_pid_not_by_row_order():
    shuffled = [n.iloc[::-1].reset_index(drop=True) for n in NOISE]
    assert noise_check(TABLE, shuffled) == noise_check(TABLE, NOISE)


def test_the_median_is_over_every_draw_of_every_matrix():
    # one noise table: values 1, 1, 1, 9 -> median 1 (a mean of maxima or of means would not give 5)
    check = noise_check(TABLE, [_table([1.0, 1.0, 1.0, 9.0])])
    assert check.ratio == pytest.approx(5.0)
    assert check.share_above == pytest.approx(0.75)  # 4 > 1, 6 > 1, 1 > 1 no, 10 > 9


def test_the_metric_column_is_the_one_compared():
    table = TABLE.assign(rel_frobenius=[0.2, 0.2, 0.2, 0.2])
    noise = [n.assign(rel_frobenius=[0.1, 0.1, 0.1, 0.3]) for n in NOISE]
    check = noise_check(table, noise, "rel_frobenius")
    assert check.metric == "rel_frobenius"
    assert check.ratio == pytest.approx(2.0) and check.share_above == pytest.approx(0.75)
    assert noise_check(table, noise).metric == "h0_w1"  # the default


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # drift / the smallest float overflows
def test_a_zero_noise_floor_is_no_division_by_zero_and_not_within_noise():
    check = noise_check(TABLE, [_table([0.0, 0.0, 0.0, 0.0])])
    assert not math.isnan(check.ratio) and check.ratio > 1e300 and check.share_above == 1.0
    assert not check.within_noise


@pytest.mark.parametrize(
    "ratio, within",
    [
        pytest.param(NOISE_RATIO_MIN, False, id="at-the-minimum"),
        pytest.param(NOISE_RATIO_MIN + 1e-9, False, id="just-above"),
        pytest.param(NOISE_RATIO_MIN - 1e-9, True, id="just-below"),
        pytest.param(0.0, True, id="zero"),
        pytest.param(float("nan"), True, id="nan-is-not-trusted"),
        pytest.param(float("inf"), False, id="infinite"),
    ],
)
def test_within_noise_boundary(ratio, within):
    assert NoiseCheck("h0_w1", ratio, 0.5).within_noise is within


def test_boundary_through_noise_check():
    # drift median 5; a noise median of exactly 2.5 gives ratio 2.0: not within the noise floor
    at = noise_check(TABLE, [_table([2.5, 2.5, 2.5, 2.5])])
    assert at.ratio == NOISE_RATIO_MIN and not at.within_noise
    below = noise_check(TABLE, [_table([2.6, 2.6, 2.6, 2.6])])
    assert below.ratio < NOISE_RATIO_MIN and below.within_noise


def test_message_above_the_floor():
    message = noise_check(TABLE, NOISE).message
    assert message == (
        "noise check on h0_w1: fine-tune drift is 2.50x the noise floor (median); "
        "75% of matrices drift more than every noise draw."
    )
    assert "WARNING" not in message


def test_message_within_the_floor():
    check = noise_check(TABLE, [_table([4.0, 4.0, 4.0, 4.0])])  # ratio 5 / 4 = 1.25; 6 and 10 exceed 4: 50%
    assert check.within_noise
    assert check.message.startswith(
        "WARNING: noise check on h0_w1: fine-tune drift is 1.25x the noise floor (median); "
        "50% of matrices drift more than every noise draw. The ranking is within the noise floor (ratio < 2)"
    )
    assert "ranks noise" in check.message and "recompute the drift" in check.message


def test_warns_only_when_within_noise_and_asked():
    within = [_table([4.0, 4.0, 4.0, 4.0])]
    with pytest.warns(UserWarning, match=r"^WARNING: noise check on h0_w1: fine-tune drift is 1\.25x") as record:
        check = noise_check(TABLE, within, warn=True)
    assert len(record) == 1 and str(record[0].message) == check.message
    assert record[0].filename == __file__  # stacklevel points at the caller
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert noise_check(TABLE, within).within_noise  # warn defaults to False
        assert noise_check(TABLE, within, warn=False).within_noise
        assert not noise_check(TABLE, NOISE, warn=True).within_noise  # above the floor: nothing to warn about
