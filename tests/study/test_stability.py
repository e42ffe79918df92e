"""Card stability across prior seeds and the model-dependence claim (study/stability.py), on synthetic cards."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from topotuner_lab.drift.cache import DriftCache
from topotuner_lab.drift.compute import drift_table
from topotuner_lab.drift.settings import DriftSettings
from topotuner_lab.profiles.card import ModelIdentity
from topotuner_lab.profiles.select import CardSettings, build_profile
from topotuner_lab.study.stability import (
    drift_over_seeds,
    jaccard,
    kind_counts,
    model_dependence_claims,
    prior_seeds_to_decide,
    random_jaccard,
    stability_claim,
    stability_sentence,
    stability_table,
    value_output_share,
)
from topotuner_lab.weights.snapshot import perturb_snapshot


@pytest.fixture
def cards_by_seed(tiny_snapshot):
    """High-drift cards from three 'prior runs': seeds 0 and 1 the same perturbation, seed 2 another."""
    identity = ModelIdentity.from_snapshot(tiny_snapshot)
    settings, cache = DriftSettings(maxdim=0), DriftCache(None)

    def card(noise_seed: int):
        after = perturb_snapshot(tiny_snapshot, 0.05, seed=noise_seed)
        table = drift_table(tiny_snapshot, after, settings, n_jobs=1, cache=cache)
        return build_profile(table, identity, CardSettings(prior_task="sst2", count=3))

    return {0: card(0), 1: card(0), 2: card(7)}


def test_jaccard_counts_shared_over_all_picks():
    assert jaccard(["a", "b"], ["a", "b"]) == 1.0
    assert jaccard(["a", "b"], ["c"]) == 0.0
    assert jaccard(["a", "b", "c"], ["b", "c", "d"]) == pytest.approx(0.5)


def test_random_jaccard_matches_its_closed_form_for_single_picks():
    # two single random picks of n share the pick with probability 1/n: expected Jaccard 1/n
    assert random_jaccard(10, 1, 1) == pytest.approx(0.1, abs=0.01)
    assert random_jaccard(10, 10, 10) == 1.0


def test_stability_table_has_one_row_per_seed_pair(cards_by_seed):
    table = stability_table(cards_by_seed)
    assert list(zip(table["seed_a"], table["seed_b"])) == [(0, 1), (0, 2), (1, 2)]
    assert table.loc[0, "jaccard"] == 1.0  # the same prior run picks the same matrices
    assert (table["random_jaccard"] < 1).all()


def test_rank_agreement_and_per_matrix_intervals_over_prior_seeds(cards_by_seed):
    first = cards_by_seed[0]
    ids = [first.trainable[0], *first.frozen[:2]]  # one matrix seed 0's card picks, two it freezes

    def ranked(scores):
        return [{"pid": pid, "score": score} for pid, score in zip(ids, scores)]

    cards = {
        0: replace(cards_by_seed[0], ranking=ranked([3.0, 2.0, 1.0])),
        1: replace(cards_by_seed[1], ranking=ranked([5.0, 4.0, 0.0])),  # the same order: Spearman +1
        2: replace(cards_by_seed[2], ranking=ranked([1.0, 2.0, 3.0])),  # reversed: -1
    }
    table = stability_table(cards)
    assert table["spearman"].tolist() == pytest.approx([1.0, -1.0, -1.0])
    over = drift_over_seeds(cards)
    assert over.index.tolist() == ids  # by mean: 3.0, 2.67, 1.33
    first_row = over.loc[ids[0]]
    # mean 3, sd 2 over 3 seeds: half-width t(0.975, 2) * 2 / sqrt(3) = 4.303 * 1.1547
    assert first_row["mean"] == pytest.approx(3.0)
    assert first_row["high"] - first_row["mean"] == pytest.approx(4.3027 * 2 / np.sqrt(3), 1e-4)
    assert over["picked_by"].to_dict() == {pid: sum(pid in c.trainable for c in cards.values()) for pid in ids}
    assert over.loc[ids[0], "picked_by"] >= 1
    assert np.isnan(drift_over_seeds({0: cards[0]})["low"]).all()  # one seed: no interval


def test_stability_sentence_reads_both_tables(cards_by_seed):
    pairs, over = stability_table(cards_by_seed), drift_over_seeds(cards_by_seed)
    every = int((over["picked_by"] == 3).sum())
    sentence = stability_sentence(pairs, over)
    assert sentence.startswith("Across 3 prior runs the picks share a Jaccard index of ")
    assert (
        f"{pairs['jaccard'].min():.2f}-1.00" in sentence and f"{every} of {(over['picked_by'] > 0).sum()}" in sentence
    )
    one = {0: cards_by_seed[0]}
    assert stability_sentence(stability_table(one), drift_over_seeds(one)).startswith("One prior run only: 3 matrices")


def test_identical_cards_are_stable_and_disjoint_ones_are_not(cards_by_seed):
    same = stability_table({0: cards_by_seed[0], 1: cards_by_seed[1], 2: cards_by_seed[0]})
    assert stability_claim(same, "x").verdict == "held"
    all_ids = cards_by_seed[0].trainable + cards_by_seed[0].frozen
    assert len(all_ids) >= 6
    from dataclasses import replace

    a = replace(cards_by_seed[0], trainable=all_ids[:3], frozen=all_ids[3:])
    b = replace(cards_by_seed[0], trainable=all_ids[3:6], frozen=all_ids[:3] + all_ids[6:])
    disjoint = stability_table({0: a, 1: b, 2: a, 3: b})
    assert (disjoint["jaccard"].isin([0.0, 1.0])).all()
    assert stability_claim(disjoint, "x").verdict != "held"
    two = stability_table({0: cards_by_seed[0], 1: cards_by_seed[1]})
    assert stability_claim(two, "x").verdict == "not testable here"  # one pair of two seeds decides nothing


def test_an_inconclusive_stability_claim_names_the_prior_seeds_that_would_decide_it():
    # cpu-grid's three pairs: 0.2, 0.5, 0.2 (mean 0.3, sd 0.173) against the noise-only null 0.47: gap 0.17, so
    # (1.96 x 0.173 / 0.17)^2 = 3.98 -> 4 pairs, which 4 seeds (6 pairs) give
    pairs = pd.DataFrame(
        {"seed_a": [0, 0, 1], "seed_b": [1, 2, 2], "jaccard": [0.2, 0.5, 0.2], "random_jaccard": [0.47] * 3}
    )
    claim = stability_claim(pairs, "x")
    assert claim.verdict == "inconclusive" and claim.threshold == pytest.approx(0.47)
    assert claim.to_decide == "~4 prior seeds or more (6 pairs; pairs share seeds, so this is a floor)"
    assert prior_seeds_to_decide([0.2, 0.5, 0.2], 0.3, 0.46, 3).startswith("~4 prior seeds")
    # a gap of 0.05: (1.96 x 0.173 / 0.05)^2 = 46.1 -> 47 pairs, which 10 seeds (45) do not give and 11 (55) do
    assert prior_seeds_to_decide([0.2, 0.5, 0.2], 0.3, 0.35, 3).startswith("~11 prior seeds")
    assert prior_seeds_to_decide([0.3, 0.4], 0.35, 0.35, 3) == "not by size: the estimate sits on the threshold"
    decided = pairs.assign(jaccard=[0.9, 0.95, 0.9])
    assert stability_claim(decided, "x").verdict == "held" and stability_claim(decided, "x").to_decide == ""


def test_kind_counts_and_value_output_share(cards_by_seed):
    card = cards_by_seed[0]
    counts = kind_counts(card)
    assert sum(counts.values()) == len(card.trainable) and set(counts) == {"q", "k", "v", "o"}
    assert value_output_share(card) == pytest.approx((counts["v"] + counts["o"]) / len(card.trainable))


#: a second checkpoint of each family the paper places, so a difference between checkpoints may stand for the families
SECOND_CHECKPOINTS = {"tinyllama": ("llama", [0.6, 0.6, 0.65]), "qwen-b": ("qwen2", [0.3, 0.3, 0.35])}


def test_model_dependence_claim_follows_the_papers_direction():
    shares = {"smol": ("llama", [0.8, 0.7, 0.75]), "qwen": ("qwen2", [0.2, 0.3, 0.25]), **SECOND_CHECKPOINTS}
    claim = model_dependence_claims(shares)[0]
    assert claim.verdict == "held" and claim.estimate == pytest.approx(0.5)
    assert "not a paper claim" not in claim.claim
    # the main model a Qwen: the claim still reads LLaMA minus Qwen
    flipped = model_dependence_claims({"qwen": shares["qwen"], "smol": shares["smol"], **SECOND_CHECKPOINTS})[0]
    assert flipped.estimate == pytest.approx(0.5) and flipped.verdict == "held"
    # the opposite data: did not hold
    (against, *_) = model_dependence_claims(
        {"smol": ("llama", [0.2, 0.25]), "qwen": ("qwen2", [0.7, 0.8]), **SECOND_CHECKPOINTS}
    )
    assert against.verdict == "not testable here"  # two prior seeds per model: no verdict
    (against, *_) = model_dependence_claims(
        {"smol": ("llama", [0.2, 0.25, 0.2]), "qwen": ("qwen2", [0.7, 0.8, 0.75]), **SECOND_CHECKPOINTS}
    )
    assert against.verdict == "did not hold"


def test_one_checkpoint_per_family_makes_the_family_claim_a_pilot():
    shares = {"smol": ("llama", [0.8, 0.7, 0.75]), "qwen": ("qwen2", [0.2, 0.3, 0.25])}
    (claim,) = model_dependence_claims(shares)  # the interval clears 0, but over one checkpoint's prior seeds
    assert claim.verdict == "pilot" and claim.low > 0
    assert claim.to_decide == "2 checkpoints or more per family (here 1 LLaMA, 1 Qwen)"
    (claim,) = model_dependence_claims({**shares, "qwen-b": SECOND_CHECKPOINTS["qwen-b"]})[:1]
    assert claim.to_decide == "2 checkpoints or more per family (here 1 LLaMA)"  # Qwen has two


def test_model_dependence_against_a_family_the_paper_does_not_place_is_not_a_paper_claim():
    (claim, _) = model_dependence_claims(
        {
            "smol": ("llama", [0.5, 0.5, 0.55]),
            "gemma": ("gemma3_text", [0.5, 0.6, 0.55]),
            "gemma-b": ("gemma3_text", [0.5, 0.5, 0.55]),
            "tinyllama": SECOND_CHECKPOINTS["tinyllama"],
        }
    )[:2]
    assert "not a paper claim" in claim.claim and claim.verdict == "inconclusive"
    assert np.isfinite(claim.low) and claim.low <= claim.estimate <= claim.high
