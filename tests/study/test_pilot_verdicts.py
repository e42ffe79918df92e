"""A verdict resting on one seed or on fewer than three prior seeds reads *pilot* in any report, never held; one of a
group-sequential study between its looks reads *interim*."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tests.study.test_claims import _results  # the claims tests' ledger: two seeds, every arm, paired rows
from topotuner_lab.lab.report import sections
from topotuner_lab.lab.report.inputs import judged_claims
from topotuner_lab.study.claims import pilot_labels
from topotuner_lab.study.presets import PRESETS
from topotuner_lab.study.stats import HELD, INTERIM, NOT_HELD, PILOT, UNTESTABLE


@pytest.fixture(scope="module")
def ledger():
    """Two seeds where the card is clearly worse than full FT and LoRA clearly worse than the card."""
    rng = np.random.default_rng(1)
    full = (rng.random(600) < 0.8).astype(int)
    card = full.copy()
    card[:90] = 0
    lora = (rng.random(600) < 0.3).astype(int)
    return _results(card, full, lora, control_correct=full)


def _decided(claims):
    return [c for c in claims if c.verdict in (HELD, NOT_HELD)]


def test_the_synthetic_ledger_decides_claims_at_two_seeds_and_three_prior_seeds(ledger):
    results, correct = ledger
    preset = replace(PRESETS["tiny"], prior_seeds=(0, 1, 2))
    claims = judged_claims(results, correct, [], preset)
    assert _decided(claims) and PILOT not in {c.verdict for c in claims}  # the rule leaves a decided study alone


@pytest.mark.parametrize("prior_seeds", [(0,), (0, 1)])
def test_fewer_than_three_prior_seeds_make_every_verdict_a_pilot(ledger, prior_seeds):
    results, correct = ledger
    claims = judged_claims(results, correct, [], replace(PRESETS["tiny"], prior_seeds=prior_seeds))
    assert not _decided(claims)
    labelled = [c for c in claims if c.verdict != UNTESTABLE]
    assert labelled and all(c.verdict == PILOT for c in labelled)
    assert all(f"3 prior seeds or more (here {len(prior_seeds)})" in c.to_decide for c in labelled)
    text = sections.claims_section(claims)
    assert "**held**" not in text and "**did not hold**" not in text and "**pilot**" in text


def test_one_training_seed_makes_every_verdict_a_pilot_ratios_and_shares_too(ledger):
    results, correct = ledger
    one_seed = results[results["seed"] == 0]
    preset = replace(PRESETS["tiny"], prior_seeds=(0, 1, 2))
    claims = judged_claims(one_seed, correct, [], preset)
    unpaired = [c for c in claims if c.design is None and c.verdict != UNTESTABLE]
    assert unpaired  # the time ratios and the stopping share: no paired design, one seed all the same
    assert not _decided(claims) and all(c.verdict == PILOT for c in claims if c.verdict != UNTESTABLE)
    # claims about the drift rankings judge the prior seeds themselves: the training seeds do not make them pilots
    assert pilot_labels(unpaired, prior_seeds=None, seeds=None) == unpaired


@pytest.mark.parametrize(
    "blocks, looked, after",
    [((2, 4), (), 2), ((2, 4), (2,), None), ((1, 4), (1,), 4)],
    ids=["look-not-yet-taken", "at-a-look", "next-block-begun"],
)
def test_a_sequential_study_decides_only_at_a_look_it_has_taken(ledger, blocks, looked, after):
    """Seeds 0-1 of a study with looks at ``blocks`` seeds: judged at a look recorded, interim before the next one."""
    results, correct = ledger
    preset = replace(PRESETS["tiny"], prior_seeds=(0, 1, 2), seeds=(0, 1, 2, 3), seed_blocks=blocks)
    claims = judged_claims(results, correct, [], preset, looked)
    testable = [c for c in claims if c.verdict != UNTESTABLE]
    if after is None:
        assert _decided(claims) and INTERIM not in {c.verdict for c in claims}
        return
    assert testable and all(c.verdict == INTERIM for c in testable)
    assert all(c.to_decide == f"judged at the pre-registered look after {after} seeds (2 begun)" for c in testable)
    text = sections.claims_section(claims)
    assert "**held**" not in text and "**did not hold**" not in text and "reads *interim*" in text
