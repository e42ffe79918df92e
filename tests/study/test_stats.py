"""The two-way (seed x example) bootstrap, p-values, Holm's correction and the equivalence verdict, on synthetic data
whose right answer is known."""

from __future__ import annotations

import numpy as np
import pytest

from topotuner_lab.study.stats import (
    EQUIVALENT,
    HELD,
    INCONCLUSIVE,
    NOT_HELD,
    Interval,
    holm,
    p_value,
    paired_bootstrap,
    two_way_bootstrap,
    two_way_draws,
    verdict,
)


def _scores(rng: np.random.Generator, effect: float, seed_sd: float, n_seeds: int, n_examples: int) -> np.ndarray:
    """Per-example scores of two arms that differ by ``effect`` on average, each trained model (seed) shifted by
    its own random amount (training noise) and each example by its own difficulty (shared by the arms)."""
    difficulty = rng.normal(0.0, 1.0, n_examples)
    arm = lambda mean: (
        mean + difficulty + rng.normal(0.0, seed_sd, (n_seeds, 1)) + rng.normal(0, 1, (n_seeds, n_examples))
    )
    return np.stack([arm(effect), arm(0.0)])


@pytest.mark.parametrize("n_seeds, least", [pytest.param(20, 0.9, id="20-seeds"), pytest.param(5, 0.8, id="5-seeds")])
def test_the_two_way_interval_covers_the_truth_where_the_example_only_one_does_not(n_seeds, least):
    # measured here over 200 trials: 93.5% (20 seeds), 86.5% (5 seeds) for a nominal 95%; the percentile bootstrap
    # over few seeds undercovers, which is why the decisive preset runs several seeds
    rng = np.random.default_rng(0)
    covered = {"two-way": 0, "examples": 0}
    trials = 120
    for trial in range(trials):
        a, b = _scores(rng, effect=0.3, seed_sd=0.5, n_seeds=n_seeds, n_examples=200)
        two_way = two_way_bootstrap(a, b, n_boot=400, seed=trial)
        examples = paired_bootstrap(a, b, n_boot=400, seed=trial)
        covered["two-way"] += two_way.low <= 0.3 <= two_way.high
        covered["examples"] += examples.low <= 0.3 <= examples.high
    # with training noise, seeds averaged per example and examples alone resampled miss the truth far too often
    assert covered["two-way"] / trials >= least and covered["examples"] / trials < 0.5, covered


def test_without_training_noise_the_two_way_interval_is_close_to_the_example_one():
    rng = np.random.default_rng(1)
    a, b = _scores(rng, effect=0.3, seed_sd=0.0, n_seeds=1, n_examples=400)
    two_way, examples = two_way_bootstrap(a, b, n_boot=2000), paired_bootstrap(a, b, n_boot=2000)
    assert two_way.estimate == pytest.approx(examples.estimate)
    assert (two_way.high - two_way.low) == pytest.approx(examples.high - examples.low, rel=0.15)


def test_two_way_draws_are_paired_and_seeded():
    a = np.array([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    assert np.all(two_way_draws(a, a, n_boot=50) == 0.0)  # identical arms: every paired draw is 0
    b = a - 0.25
    assert np.allclose(two_way_draws(a, b, n_boot=50), 0.25)
    c = np.array([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    same, other = two_way_draws(a, c, seed=3), two_way_draws(a, c, seed=4)
    assert np.array_equal(same, two_way_draws(a, c, seed=3)) and not np.array_equal(same, other)
    with pytest.raises(ValueError, match="same \\(seeds, examples\\)"):
        two_way_draws(a, a[:, :2])


def test_p_values_are_the_share_of_draws_on_the_wrong_side():
    draws = np.array([-0.1, 0.05, 0.2, 0.3])
    assert p_value(draws, 0.0) == pytest.approx(2 / 5)
    assert p_value(draws, 0.25, higher_is_better=False) == pytest.approx(2 / 5)
    assert 0 < p_value(np.full(999, 1.0), 0.0) == pytest.approx(1 / 1000)


@pytest.mark.parametrize(
    "p_values, rejected",
    [
        pytest.param([0.01, 0.04, 0.03, 0.2], [True, False, False, False], id="stops-at-the-second"),
        pytest.param([0.001, 0.012, 0.02, 0.04], [True, True, True, True], id="all-clear-their-bounds"),
        pytest.param([0.2, 0.01], [False, True], id="order-free"),
        pytest.param([0.03, 0.03], [False, False], id="ties-need-alpha-over-m"),
    ],
)
def test_holm_step_down(p_values, rejected):
    assert holm(p_values, alpha=0.05) == rejected


@pytest.mark.parametrize(
    "interval, expected",
    [
        pytest.param(Interval(0.0, -0.01, 0.02), EQUIVALENT, id="covers-the-threshold-inside-the-band"),
        pytest.param(Interval(0.01, 0.005, 0.02), HELD, id="clears-the-threshold-inside-the-band"),
        pytest.param(Interval(0.05, 0.02, 0.08), HELD, id="beyond-the-band-and-the-threshold"),
        pytest.param(Interval(-0.05, -0.08, -0.04), NOT_HELD, id="wholly-below"),
        pytest.param(Interval(0.0, -0.04, 0.04), INCONCLUSIVE, id="wider-than-the-band"),
    ],
)
def test_equivalence_is_an_interval_inside_the_stated_band(interval, expected):
    assert verdict(interval, 0.0, band=(-0.03, 0.03)) == expected
    if expected != EQUIVALENT:
        assert verdict(interval, 0.0) == expected  # without a band the verdict is the threshold's
