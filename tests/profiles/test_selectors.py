"""Selectors: the gradient-magnitude selector, the authors' joint drift x magnitude selector, the matched
per-kind budget, and the rank agreement of selectors over one drift table."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from topotuner_lab._io.errors import ProfileError
from topotuner_lab.cli import main
from topotuner_lab.drift.cache import DriftCache
from topotuner_lab.drift.compute import drift_table
from topotuner_lab.drift.settings import DriftSettings
from topotuner_lab.drift.tables import save_table
from topotuner_lab.profiles.card import JOINT, STRATEGIES, ModelIdentity, ProfileCard
from topotuner_lab.profiles.compare import rank_agreement, selector_scores
from topotuner_lab.profiles.select import (
    CardSettings,
    build_profile,
    matched_per_kind,
    param_counts,
    strategy_scores,
)
from topotuner_lab.weights.projections import KINDS
from topotuner_lab.weights.snapshot import perturb_snapshot, save_snapshot

HASH = "synthetic-weights"
SIZE = 64  # every synthetic matrix is 8 x 8


def _identity(pids: list[str], extra: int = 10) -> ModelIdentity:
    return ModelIdentity("synthetic", HASH, "llama", extra * SIZE * len(pids), {p: [8, 8] for p in pids})


def _table(values: dict[str, dict[str, float]]) -> pd.DataFrame:
    """A drift table of 8 x 8 matrices with the given measure columns per projection id."""
    rows = [
        {"pid": pid, "layer": int(pid[1:].split(".")[0]), "kind": pid[-1], "rows": 8, "cols": 8, **columns}
        for pid, columns in values.items()
    ]
    table = pd.DataFrame(rows)
    table.attrs["before_hash"] = HASH
    return table


# --- the joint selector -------------------------------------------------------------------------------------------

#: layer -> quadrant (drift high/low, magnitude high/low) and its values: drift HL > HH > LL > LH, magnitude
#: HH > LH > HL > LL, so that every quadrant is in its strategy's pool (top-k drift or top-k magnitude)
QUADRANTS = {
    0: ("joint-hh", 10.0, 1.0),
    1: ("joint-hl", 11.0, 0.2),
    2: ("joint-lh", 1.0, 0.8),
    3: ("joint-ll", 2.0, 0.1),
}


@pytest.fixture
def quadrant_table() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    values = {
        f"L{layer}.{kind}": {
            "h0_w1": drift * (1 + 0.01 * rng.standard_normal()),
            "rel_frobenius": magnitude * (1 + 0.01 * rng.standard_normal()),
        }
        for layer, (_, drift, magnitude) in QUADRANTS.items()
        for kind in KINDS
    }
    return _table(values)


def _quadrant(strategy: str) -> set[str]:
    layer = next(layer for layer, (name, _, _) in QUADRANTS.items() if name == strategy)
    return {f"L{layer}.{kind}" for kind in KINDS}


@pytest.mark.parametrize("strategy", sorted(JOINT))
@pytest.mark.parametrize(
    "budget",
    [{"count": 4}, {"fraction": 4 * SIZE / (10 * SIZE * 16)}, {"per_kind": dict.fromkeys(KINDS, 1)}],
    ids=["count", "fraction", "per-kind"],
)
def test_each_joint_strategy_trains_its_quadrant(quadrant_table, strategy, budget):
    identity = _identity(list(quadrant_table["pid"]))
    card = build_profile(
        quadrant_table, identity, CardSettings(prior_task="sst2", strategy=strategy, normalization="raw", **budget)
    )
    assert set(card.trainable) == _quadrant(strategy)
    assert card.metric == "h0_w1" and card.budget == budget and card.strategy == strategy
    assert {r["pid"] for r in card.ranking[:4]} == _quadrant(strategy)  # the quadrant ranks first


def test_the_joint_pool_keeps_only_matrices_extreme_in_drift_or_magnitude():
    # C is second in both drift and magnitude: the best joint score, but in neither top-1 pool
    values = {
        "L0.q": {"h0_w1": 10.0, "rel_frobenius": 1.0},  # A: top drift
        "L1.q": {"h0_w1": 1.0, "rel_frobenius": 10.0},  # B: top magnitude
        "L2.q": {"h0_w1": 9.0, "rel_frobenius": 9.0},  # C
        "L3.q": {"h0_w1": 0.5, "rel_frobenius": 0.5},  # D
    }
    table, identity = _table(values), _identity(list(values))
    unpooled = selector_scores(table, ["joint-hh"], normalization="raw")["joint-hh"]
    assert unpooled.idxmax() == "L2.q"
    one = build_profile(
        table, identity, CardSettings(prior_task="sst2", strategy="joint-hh", count=1, normalization="raw")
    )
    assert one.trainable in (["L0.q"], ["L1.q"]) and one.ranking[-1]["pid"] == "L3.q"
    assert {r["pid"] for r in one.ranking[:2]} == {"L0.q", "L1.q"}  # the pool ranks before C
    two = build_profile(
        table, identity, CardSettings(prior_task="sst2", strategy="joint-hh", count=2, normalization="raw")
    )
    assert "L2.q" in two.trainable  # top-2 pools hold C


def _reference_joint(drift: dict[int, float], norm: dict[int, float], mode: str, k: int) -> list[int]:
    """The steps of the reference script's run_one_joint for one projection, re-stated: pools of the k layers at the
    mode's end of each ordering, their union, values over the union's sums, the mode's mean score, the first k."""
    high_w, high_n = mode[0] == "H", mode[1] == "H"
    by_w = sorted(drift, key=drift.__getitem__)
    by_n = sorted(norm, key=norm.__getitem__)
    union = sorted(set(by_w[-k:] if high_w else by_w[:k]) | set(by_n[-k:] if high_n else by_n[:k]))
    sum_w, sum_n = sum(drift[i] for i in union), sum(norm[i] for i in union)
    score = {
        i: (
            (drift[i] / sum_w if high_w else 1 - drift[i] / sum_w)
            + (norm[i] / sum_n if high_n else 1 - norm[i] / sum_n)
        )
        / 2
        for i in union
    }
    return sorted(union, key=lambda i: score[i], reverse=True)[:k]


@pytest.mark.parametrize("mode", ["HH", "HL", "LH", "LL"])
def test_a_per_kind_joint_card_picks_what_the_reference_script_picks(mode):
    rng = np.random.default_rng(7)
    layers = 12
    values = {
        f"L{layer}.{kind}": {"h0_w1": float(rng.gamma(2.0)), "rel_frobenius": float(rng.gamma(2.0) / 100)}
        for layer in range(layers)
        for kind in KINDS
    }
    table, identity = _table(values), _identity(list(values))
    card = build_profile(
        table,
        identity,
        CardSettings(
            prior_task="gsm8k", strategy=f"joint-{mode.lower()}", per_kind={"v": 5, "o": 5}, normalization="raw"
        ),
    )
    for kind in ("v", "o"):
        drift = {layer: values[f"L{layer}.{kind}"]["h0_w1"] for layer in range(layers)}
        norm = {layer: values[f"L{layer}.{kind}"]["rel_frobenius"] for layer in range(layers)}
        expected = {f"L{layer}.{kind}" for layer in _reference_joint(drift, norm, mode, 5)}
        assert {p for p in card.trainable if p.endswith(kind)} == expected
    assert len(card.trainable) == 10


def test_joint_strategies_refuse_what_they_cannot_rank(quadrant_table):
    identity = _identity(list(quadrant_table["pid"]))
    with pytest.raises(ProfileError, match="noise-z scores can be negative"):
        build_profile(
            quadrant_table,
            identity,
            CardSettings(prior_task="sst2", strategy="joint-hl", count=2, normalization="noise-z"),
        )
    with pytest.raises(ProfileError, match="(?s)no measure column 'rel_frobenius'.*without --no-magnitude"):
        build_profile(
            quadrant_table.drop(columns="rel_frobenius"),
            identity,
            CardSettings(prior_task="sst2", strategy="joint-ll", count=2),
        )
    negative = quadrant_table.assign(h0_w1=quadrant_table["h0_w1"] - 5)
    with pytest.raises(ProfileError, match="non-negative"):
        build_profile(
            negative, identity, CardSettings(prior_task="sst2", strategy="joint-hh", count=2, normalization="raw")
        )


# --- the gradient-magnitude selector ------------------------------------------------------------------------------


def test_the_gradient_strategy_ranks_by_grad_norm_and_the_card_records_the_task(tmp_path):
    rng = np.random.default_rng(3)
    values = {
        f"L{layer}.{kind}": {"h0_w1": 1.0, "grad_norm": float(rng.random())} for layer in range(3) for kind in KINDS
    }
    table, identity = _table(values), _identity(list(values))
    table.attrs["gradient_task"] = "agnews"
    card = build_profile(table, identity, CardSettings(prior_task="sst2", strategy="gradient", count=3))
    expected = table.sort_values("grad_norm", ascending=False)["pid"].tolist()
    assert [r["pid"] for r in card.ranking] == expected and set(card.trainable) == set(expected[:3])
    assert card.metric == "grad_norm" and card.normalization == "raw" and card.gradient_task == "agnews"
    assert ProfileCard.load(card.save(tmp_path / "card.json")).gradient_task == "agnews"
    untold = table.copy()
    untold.attrs.pop("gradient_task")
    with pytest.raises(ProfileError, match="records no task"):
        build_profile(untold, identity, CardSettings(prior_task="sst2", strategy="gradient", count=3))
    with pytest.raises(ProfileError, match="with_gradient_signal"):
        build_profile(
            table.drop(columns="grad_norm"), identity, CardSettings(prior_task="sst2", strategy="gradient", count=3)
        )
    with pytest.raises(ProfileError, match="gradient task exactly when"):
        ProfileCard.from_dict({**card.to_dict(), "gradient_task": None})


# --- the matched per-kind budget ----------------------------------------------------------------------------------


def _worst_case(shapes: dict[str, list[int]], per_kind: dict[str, int]) -> int:
    """Parameters of the largest matrices a per-kind card could pick."""
    sizes = param_counts(shapes)
    return sum(
        sum(sorted((n for p, n in sizes.items() if p.endswith(kind)), reverse=True)[:c]) for kind, c in per_kind.items()
    )


@pytest.mark.parametrize("seed", range(30))
def test_the_matched_per_kind_budget_never_exceeds_the_fraction_and_is_maximal(seed):
    rng = np.random.default_rng(seed)
    layers = int(rng.integers(2, 9))
    uniform = seed % 2 == 0  # the usual models; odd seeds vary shapes per layer
    rows = {kind: int(rng.integers(4, 64)) for kind in KINDS}
    shapes = {
        f"L{layer}.{kind}": [rows[kind] if uniform else int(rng.integers(4, 64)), 32]
        for layer in range(layers)
        for kind in KINDS
    }
    total = 4 * sum(r * c for r, c in shapes.values())
    fraction = float(rng.uniform(0.01, 0.3))
    try:
        matched = matched_per_kind(shapes, total, fraction)
    except ProfileError as exc:
        assert "below one matrix of each kind" in str(exc)
        assert _worst_case(shapes, dict.fromkeys(KINDS, 1)) > fraction * total
        return
    (n,) = set(matched.values())
    assert set(matched) == set(KINDS) and n >= 1
    assert _worst_case(shapes, matched) <= fraction * total
    assert n == layers or _worst_case(shapes, dict.fromkeys(KINDS, n + 1)) > fraction * total


def test_a_matched_per_kind_card_stays_within_the_global_budget(tiny_snapshot):
    table = drift_table(
        tiny_snapshot, perturb_snapshot(tiny_snapshot, 0.05), DriftSettings(maxdim=0), n_jobs=1, cache=DriftCache(None)
    )
    identity = ModelIdentity.from_snapshot(tiny_snapshot)  # q, o: 4,096 parameters; k, v: 2,048; 139,584 in all
    assert matched_per_kind(identity.shapes, identity.total_params, 0.10) == dict.fromkeys(KINDS, 1)
    assert matched_per_kind(identity.shapes, identity.total_params, 0.18) == dict.fromkeys(KINDS, 2)
    assert matched_per_kind(identity.shapes, identity.total_params, 0.10, kinds=["v", "o"]) == {"v": 2, "o": 2}
    card = build_profile(table, identity, CardSettings(prior_task="sst2", fraction=0.10, per_kind_budget=True))
    assert card.budget == {"per_kind": dict.fromkeys(KINDS, 1)} and card.trainable_fraction <= 0.10
    assert sorted(p[-1] for p in card.trainable) == sorted(KINDS)
    with pytest.raises(ProfileError, match="below one matrix of each kind"):
        build_profile(table, identity, CardSettings(prior_task="sst2", fraction=0.05, per_kind_budget=True))
    shapes = {f"L{layer}.{kind}": [8, 8] for layer in range(4) for kind in KINDS}
    assert matched_per_kind(shapes, 2048, 0.25) == dict.fromkeys(KINDS, 2)  # 8 matrices of 64 fill 512 exactly
    with pytest.raises(ProfileError, match="no fraction was given"):
        CardSettings(prior_task="sst2", count=2, per_kind_budget=True)


def test_matched_per_kind_budget_from_the_command_line(tmp_path, tiny_snapshot):
    table = drift_table(
        tiny_snapshot, perturb_snapshot(tiny_snapshot, 0.05), DriftSettings(maxdim=0), n_jobs=1, cache=DriftCache(None)
    )
    save_table(table, tmp_path / "t.parquet")
    save_snapshot(tiny_snapshot, tmp_path / "pre.safetensors")
    argv = [
        "profile",
        str(tmp_path / "t.parquet"),
        "--pretrained",
        str(tmp_path / "pre.safetensors"),
        "--prior-task",
        "sst2",
    ]
    assert (
        main([*argv, "--budget", "18", "--per-kind-budget", "--strategy", "joint-hl", "-o", str(tmp_path / "c.json")])
        == 0
    )
    card = ProfileCard.load(tmp_path / "c.json")
    assert card.budget == {"per_kind": dict.fromkeys(KINDS, 2)} and card.strategy == "joint-hl"
    assert card.recipe == "custom" and card.aggregation == "final"


# --- rank agreement across selectors ------------------------------------------------------------------------------


@pytest.fixture
def drift_and_signals(tiny_snapshot):
    from topotuner_lab.drift.signals import with_relchange, with_signals

    after = perturb_snapshot(tiny_snapshot, 0.05)
    table = drift_table(tiny_snapshot, after, DriftSettings(maxdim=0), n_jobs=1, cache=DriftCache(None))
    table = with_relchange(with_signals(table, tiny_snapshot), tiny_snapshot, after)
    table["grad_norm"] = np.random.default_rng(5).random(len(table))
    table.attrs["gradient_task"] = "agnews"
    return table, ModelIdentity.from_snapshot(tiny_snapshot)


def test_rank_agreement_of_a_selector_with_itself_is_one_and_with_its_reverse_minus_one(drift_and_signals):
    table, _ = drift_and_signals
    names = ["high-drift", "low-drift", "magnitude", "joint-hh", "joint-ll", "kappa"]
    scores = selector_scores(table, names)
    assert list(scores.columns) == names
    assert scores.index.name == "pid" and list(scores.index) == list(table["pid"])
    for method in ("spearman", "kendall"):
        agreement = rank_agreement(scores, method)
        assert agreement.shape == (6, 6) and np.allclose(np.diag(agreement), 1.0)
        assert agreement.loc["high-drift", "low-drift"] == pytest.approx(-1.0)
        assert agreement.loc["joint-hh", "joint-ll"] == pytest.approx(-1.0)  # unpooled, LL's score is 1 - HH's
        assert np.allclose(agreement, agreement.T)
    reverse = pd.DataFrame({"a": scores["magnitude"], "b": -scores["magnitude"], "c": scores["magnitude"] ** 3})
    agreement = rank_agreement(reverse)
    assert agreement.loc["a", "b"] == pytest.approx(-1.0) and agreement.loc["a", "c"] == pytest.approx(1.0)
    with pytest.raises(ProfileError, match="unknown rank correlation"):
        rank_agreement(scores, "pearsonr")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_selector_scores_order_the_projections_as_a_card_ranks_them(drift_and_signals, strategy):
    table, identity = drift_and_signals
    oriented = selector_scores(table, [strategy], seed=3)[strategy]
    card = build_profile(table, identity, CardSettings(prior_task="sst2", strategy=strategy, count=len(table), seed=3))
    assert [r["pid"] for r in card.ranking] == list(oriented.sort_values(ascending=False, kind="stable").index)
    ranking = strategy_scores(table, strategy, seed=3)
    assert np.allclose([r["score"] for r in card.ranking], ranking.scores[[r["pid"] for r in card.ranking]])
