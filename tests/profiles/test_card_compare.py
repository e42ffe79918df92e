"""Comparing two profile cards: on one model id by id, across models by kind and depth."""

import pytest

from topotuner_lab.drift.cache import DriftCache
from topotuner_lab.drift.compute import drift_table
from topotuner_lab.drift.tables import save_table
from topotuner_lab.lab.plots import card_comparison
from topotuner_lab.lab.workbench import card_pair
from topotuner_lab.profiles.apply import identity_of
from topotuner_lab.profiles.compare import compare_cards
from topotuner_lab.profiles.select import CardSettings, build_profile
from topotuner_lab.weights.extract import extract_snapshot
from topotuner_lab.weights.models import build_tiny_model
from topotuner_lab.weights.snapshot import perturb_snapshot


def _table_and_identity(loaded):
    snap = extract_snapshot(loaded)
    table = drift_table(snap, perturb_snapshot(snap, 0.05), n_jobs=1, cache=DriftCache(None))
    return table, identity_of(loaded.model, loaded.name)


@pytest.fixture
def llama_cards(tiny_llama):
    table, identity = _table_and_identity(tiny_llama)
    make = lambda strategy: build_profile(table, identity, CardSettings(prior_task="sst2", strategy=strategy, count=3))
    return table, make


def test_a_card_against_itself_overlaps_fully(llama_cards):
    _, make = llama_cards
    high = make("high-drift")
    same = compare_cards(high, high)
    assert same.same_model and same.jaccard == 1.0 and same.rank_spearman == pytest.approx(1.0)
    assert same.both == sorted(high.trainable) and not same.only_a and not same.only_b


def test_high_and_low_drift_are_disjoint_and_rank_in_opposite_order(llama_cards):
    _, make = llama_cards
    high, low = make("high-drift"), make("low-drift")
    result = compare_cards(high, low, ("high", "low"))
    assert result.jaccard == 0.0 and not result.both
    assert set(result.only_a) == set(high.trainable) and set(result.only_b) == set(low.trainable)
    assert result.rank_spearman == pytest.approx(-1.0)  # same drift scores, opposite picks: disagreement, not +1
    assert result.kind_share.sum().round(9).tolist() == [1.0, 1.0]


def test_topology_against_magnitude_agrees_with_the_tables_rank_correlation(llama_cards):
    table, make = llama_cards
    result = compare_cards(make("high-drift"), make("magnitude"))
    # both rank largest first (the card by per-point H0 W1): positions agree as scores do
    per_point = table["h0_w1"] / table["n_h0_before"]
    expected = per_point.rank().corr(table["rel_frobenius"].rank())
    assert result.rank_spearman == pytest.approx(expected)


def test_cards_of_two_models_compare_by_kind_and_depth(llama_cards):
    _, make = llama_cards
    qwen = build_tiny_model("tiny-qwen2", seed=1)
    table, identity = _table_and_identity(qwen)
    other = build_profile(table, identity, CardSettings(prior_task="agnews", count=2))
    result = compare_cards(make("high-drift"), other)
    assert not result.same_model and result.jaccard is None and result.rank_spearman is None
    assert len(result.only_a) == 3 and len(result.only_b) == 2
    assert all(0.0 <= depth <= 1.0 for depth in result.mean_depth)
    assert "same model" in result.summary().index


def test_figure_shows_every_selected_projection(llama_cards):
    _, make = llama_cards
    result = compare_cards(make("high-drift"), make("random"), ("topology", "random"))
    fig = card_comparison(result)
    scatter = [t for t in fig.data if t.type == "scatter"]
    assert sum(len(t.x) for t in scatter) == len(result.both) + len(result.only_a) + len(result.only_b)
    assert [t.name for t in fig.data if t.type == "bar"] == ["topology", "random"]


def test_default_pair_is_the_notebook_card_against_the_magnitude_control(llama_cards, tmp_path):
    table, make = llama_cards
    (tmp_path / "cards").mkdir()
    make("high-drift").save(tmp_path / "cards" / "profile.json")
    save_table(table, tmp_path / "drift-sst2.parquet")
    a, b, labels = card_pair(tmp_path)
    assert (a.strategy, b.strategy) == ("high-drift", "magnitude") and b.budget == a.budget
    assert labels[0] != labels[1]


def test_rank_agreement_of_selectors_equals_the_cards_rank_correlation(llama_cards):
    from topotuner_lab.profiles.compare import rank_agreement, selector_scores

    table, make = llama_cards
    agreement = rank_agreement(selector_scores(table, ["high-drift", "low-drift", "magnitude"]))
    for a, b in [("high-drift", "magnitude"), ("low-drift", "magnitude"), ("high-drift", "low-drift")]:
        assert agreement.loc[a, b] == pytest.approx(compare_cards(make(a), make(b)).rank_spearman)
    # a joint card pools at its budget (3 here), so its picks follow the unpooled scores only when it trains all 8
    joint = build_profile(table, make("random").model, CardSettings(prior_task="sst2", strategy="joint-lh", count=8))
    high = make("high-drift")
    assert agreement.loc["high-drift", "high-drift"] == 1.0
    assert rank_agreement(selector_scores(table, ["high-drift", "joint-lh"])).iloc[0, 1] == pytest.approx(
        compare_cards(high, joint).rank_spearman
    )
