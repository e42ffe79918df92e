"""The stability of a card's picks is judged against cards from noise-only drift tables, not random cards.

Synthetic drift tables where the answer is known: the picks of every table are set by its ``h0_w1`` column.
"""

from __future__ import annotations

import numpy as np
import pytest

from topotuner_lab.drift.cache import DriftCache
from topotuner_lab.drift.compute import drift_table
from topotuner_lab.drift.settings import DriftSettings
from topotuner_lab.profiles.card import ModelIdentity
from topotuner_lab.profiles.select import CardSettings, build_profile
from topotuner_lab.study.stability import noise_null, noise_null_sentence, stability_claim, stability_table
from topotuner_lab.study.stats import HELD, NOT_HELD
from topotuner_lab.weights.snapshot import perturb_snapshot


@pytest.fixture(scope="module")
def make_card(tiny):
    """Card of three picks from a drift table whose ``h0_w1`` is ``scores`` (one per matrix, in table order)."""
    identity = ModelIdentity.from_snapshot(tiny)
    template = drift_table(
        tiny, perturb_snapshot(tiny, 0.05), DriftSettings(maxdim=0), n_jobs=1, cache=DriftCache(None)
    )

    def make(scores: np.ndarray):
        table = template.assign(h0_w1=scores)
        return build_profile(table, identity, CardSettings(prior_task="sst2", count=3, normalization="raw"))

    make.n = len(template)
    return make


@pytest.fixture(scope="module")
def tiny():
    """The tiny model's snapshot, once for the module."""
    from topotuner_lab.weights.extract import extract_snapshot
    from topotuner_lab.weights.models import build_tiny_model

    return extract_snapshot(build_tiny_model("tiny-llama", seed=0))


def _structure(n: int, third: int) -> np.ndarray:
    """Matrices 0 and 1 always rank first; ``third`` ranks third; the rest below."""
    scores = np.linspace(1.0, 0.1, n)
    scores[[0, 1]] = [100.0, 99.0]
    scores[third] = 50.0
    return scores


def test_picks_that_agree_less_than_noise_only_cards_do_not_hold_though_they_beat_random_cards(make_card):
    # four prior runs share two picks and differ in the third: every pair shares 2 of 4, Jaccard 0.5
    cards = {seed: make_card(_structure(make_card.n, third=2 + seed)) for seed in range(4)}
    # five noise-only tables carry the same structure (the matrices' own): their cards agree exactly
    noise = {seed: make_card(_structure(make_card.n, third=2)) for seed in range(5)}
    pairs, null = stability_table(cards), noise_null(cards, noise)
    assert pairs["jaccard"].tolist() == [0.5] * 6
    assert null.loc[null["pair"] == "noise-noise", "jaccard"].tolist() == [1.0] * 10
    cross = null.loc[null["pair"] == "card-noise", "jaccard"]
    assert len(cross) == 20 and set(cross) == {1.0, 0.5}  # seed 0's card is the noise card
    against_noise = stability_claim(pairs, "synthetic", null)
    assert against_noise.threshold == 1.0 and against_noise.verdict == NOT_HELD
    assert "cards from noise-only drift tables, mean over 10 pairs" in against_noise.measure
    # against random cards of the same size (the old null, kept where no noise tables exist) the same picks "held"
    against_random = stability_claim(pairs, "synthetic")
    assert against_random.threshold < 0.5 and against_random.verdict == HELD
    assert "0.50-1.00 with the prior seeds' cards" in noise_null_sentence(null)
    assert "share a Jaccard index of 1.00-1.00 with each other (mean 1.00)" in noise_null_sentence(null)


def test_picks_that_agree_beyond_noise_only_cards_hold(make_card):
    rng = np.random.default_rng(0)
    cards = {seed: make_card(_structure(make_card.n, third=2)) for seed in range(3)}  # one real signal
    noise = {seed: make_card(rng.random(make_card.n)) for seed in range(5)}  # noise tables without structure
    null = noise_null(cards, noise)
    inner = null.loc[null["pair"] == "noise-noise", "jaccard"]
    assert inner.mean() < 1.0
    claim = stability_claim(stability_table(cards), "synthetic", null)
    assert claim.threshold == pytest.approx(inner.mean()) and claim.verdict == HELD


def test_without_noise_tables_the_null_is_empty_and_says_nothing(make_card):
    cards = {seed: make_card(_structure(make_card.n, third=2)) for seed in range(3)}
    null = noise_null(cards, {})
    assert null.empty and list(null.columns) == ["pair", "seed_a", "seed_b", "jaccard"]
    assert noise_null_sentence(null) == ""
    claim = stability_claim(stability_table(cards), "synthetic", null)
    assert "random cards of the same size, no noise tables" in claim.measure
