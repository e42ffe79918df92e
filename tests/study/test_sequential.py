"""Seeds in blocks: the group-sequential boundaries spend alpha as stated and keep the overall error at alpha."""

from __future__ import annotations

import numpy as np
import pytest

from topotuner_lab._io.errors import ParameterError
from topotuner_lab.study.sequential import boundaries, look_level, obf_spent


def test_one_look_is_the_fixed_size_test():
    assert boundaries([1.0]) == [pytest.approx(1.959964, abs=1e-5)]
    assert look_level([1.0], 0) == pytest.approx(0.95)


def test_the_first_look_spends_exactly_the_spending_function():
    first = boundaries([0.5, 1.0])[0]
    assert first == pytest.approx(1.959964 / np.sqrt(0.5), abs=1e-4)  # P(|Z| > c1) = alpha(0.5)
    assert obf_spent(1.0) == pytest.approx(0.05)


@pytest.mark.parametrize("fractions", [[0.5, 1.0], [1 / 3, 2 / 3, 1.0], [0.5, 0.75, 1.0]])
def test_a_null_brownian_motion_crosses_some_look_with_probability_alpha(fractions):
    c = boundaries(fractions)
    assert all(a > b for a, b in zip(c, c[1:]))  # early looks are stricter
    assert c[-1] < 2.1  # the last look stays near the fixed-size test
    rng = np.random.default_rng(0)
    steps = np.diff([0.0, *fractions])
    paths = np.cumsum(rng.normal(0, 1, (200_000, len(fractions))) * np.sqrt(steps), axis=1)
    z = paths / np.sqrt(fractions)
    crossed = (np.abs(z) >= c).any(axis=1).mean()
    assert crossed == pytest.approx(0.05, abs=0.003)  # the naive rule (1.96 at every look) gives 0.08 to 0.11
    assert (np.abs(z) >= 1.959964).any(axis=1).mean() > 0.075


@pytest.mark.parametrize("fractions", [[], [0.5], [0.6, 0.4, 1.0], [0.0, 1.0], [0.5, 1.5]])
def test_a_plan_that_is_not_increasing_to_one_is_refused(fractions):
    with pytest.raises(ParameterError, match="not a group-sequential plan"):
        boundaries(fractions)


def test_a_preset_with_seed_blocks_judges_each_look_at_its_own_level():
    from dataclasses import replace

    from topotuner_lab.study.claims import ClaimRules, paired_interval
    from topotuner_lab.study.presets import get_preset

    preset = replace(get_preset("tiny"), seeds=(0, 1, 2, 3), seed_blocks=(2, 4))
    first, last = ClaimRules.of(preset, seeds_run=2).level, ClaimRules.of(preset, seeds_run=4).level
    assert first == pytest.approx(look_level([0.5, 1.0], 0)) and first > 0.99  # 2.772: about 99.4%
    assert last == pytest.approx(look_level([0.5, 1.0], 1)) and 0.95 < last < 0.953
    assert ClaimRules.of(preset, seeds_run=3).level == first  # a block not complete: still the first look
    assert ClaimRules.of(replace(preset, seed_blocks=()), seeds_run=2).level == 0.95  # one look: the fixed test
    rng = np.random.default_rng(0)
    a, b = rng.normal(0.1, 1, (2, 300)), rng.normal(0, 1, (2, 300))
    wide, plain = paired_interval(a, b, level=first), paired_interval(a, b)
    assert wide.low < plain.low and wide.high > plain.high  # an early look's interval is wider


def test_seed_blocks_must_end_at_every_seed():
    from dataclasses import replace

    from topotuner_lab.study.presets import get_preset

    with pytest.raises(ParameterError, match="seed_blocks"):
        replace(get_preset("tiny"), seed_blocks=(1, 3))  # tiny has 2 seeds


def test_the_report_says_what_each_look_decided():
    from dataclasses import replace

    from topotuner_lab.lab.report.sections import look_lines
    from topotuner_lab.study.presets import get_preset

    preset = replace(get_preset("tiny"), seeds=(0, 1, 2, 3), seed_blocks=(2, 4))
    looks = [{"seeds": 2, "level": 0.9944, "undecided": [], "adds_seeds": False}]
    lines = look_lines(preset, looks)
    assert "after 2, 4 seeds" in lines[0]
    assert lines[1] == "Look at 2 seeds (intervals at 99.44%): decided every thesis and control claim; no seeds added."
    assert look_lines(replace(preset, seed_blocks=()), looks) == []
    floor = replace(preset, seed_floor=4)  # a look before the floor decides but does not end the study
    looks = [{"seeds": 2, "level": 0.9944, "undecided": [], "adds_seeds": True, "seed_floor": 4}]
    lines = look_lines(floor, looks)
    assert "and up to 4 seeds whatever a look decides (the preset's floor)." in lines[0]
    assert lines[1] == (
        "Look at 2 seeds (intervals at 99.44%): decided every thesis and control claim; seeds added (the preset runs "
        "4 seeds whatever a look decides)."
    )
    with pytest.raises(ParameterError, match="seed_floor=5"):
        replace(preset, seed_floor=5)
