"""The `reference` recipe is the authors' computation: cosine row distances, ripser's H0, gudhi's Wasserstein with its
defaults (order 1, internal_p = inf). An independent script written that way gives the same drift."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest
from gudhi.wasserstein import wasserstein_distance
from ripser import ripser
from scipy.spatial.distance import pdist, squareform

from topotuner_lab._io.errors import ParameterError
from topotuner_lab.drift.cache import DriftCache
from topotuner_lab.drift.compute import drift_between
from topotuner_lab.drift.settings import COSINE_H1_SUBSAMPLE, RECIPES, DriftSettings
from topotuner_lab.topology.distances import wasserstein


def _reference_h0(matrix: np.ndarray) -> np.ndarray:
    """H0 of the rows under the cosine distance, as the reference scripts compute it (ripser on pdist)."""
    dgm = ripser(squareform(pdist(matrix.astype(np.float64), metric="cosine")), distance_matrix=True, maxdim=0)
    h0 = dgm["dgms"][0]
    return h0[np.isfinite(h0[:, 1])]


def test_the_reference_recipe_equals_an_independent_ripser_and_gudhi_script():
    rng = np.random.default_rng(7)
    before = {
        f"L{i}.{k}": rng.normal(0, 0.05, (48 if k in "qo" else 24, 32)).astype(np.float32)
        for i in range(2)
        for k in "qkvo"
    }
    after = {pid: (m + rng.normal(0, 0.01, m.shape)).astype(np.float32) for pid, m in before.items()}
    table = drift_between(before, after, DriftSettings.recipe("reference"), n_jobs=1, cache=DriftCache(None))
    expected = {pid: wasserstein_distance(_reference_h0(before[pid]), _reference_h0(after[pid])) for pid in before}
    ours = dict(zip(table["pid"], table["h0_w1"]))
    assert ours == pytest.approx(expected, rel=1e-6)
    # far apart (independent matrices) the optimal matchings use the diagonal, where the lab's default L2 ground
    # metric charges sqrt(2) times what gudhi's default (L-infinity) does
    other = {pid: rng.normal(0, 0.05, m.shape).astype(np.float32) for pid, m in before.items()}
    cosine = DriftSettings(maxdim=0, metric="cosine", orders=(1.0,))
    l2 = drift_between(before, other, cosine, n_jobs=1, cache=DriftCache(None))["h0_w1"]
    linf = drift_between(before, other, DriftSettings.recipe("reference"), n_jobs=1, cache=DriftCache(None))["h0_w1"]
    assert (l2 > linf).any() and (l2 >= linf - 1e-12).all()


@pytest.mark.parametrize("internal_p", [1.0, 2.0, np.inf], ids=["L1", "L2", "Linf"])
@pytest.mark.parametrize("order", [1, 2])
def test_the_ground_metric_matches_gudhi(internal_p, order):
    rng = np.random.default_rng(3)
    a, b = np.sort(rng.random((30, 2)), axis=1), np.sort(rng.random((25, 2)), axis=1)
    h0a, h0b = np.column_stack([np.zeros(40), rng.random(40)]), np.column_stack([np.zeros(35), rng.random(35)])
    for x, y in ((a, b), (h0a, h0b)):
        expected = wasserstein_distance(x, y, order=order, internal_p=internal_p)
        assert wasserstein(x, y, order, "assignment", internal_p=internal_p) == pytest.approx(expected, rel=1e-9)
        assert wasserstein(x, y, order, internal_p=internal_p) == pytest.approx(expected, rel=1e-9)


def test_recipes_are_named_recorded_and_keep_old_cache_keys():
    reference = DriftSettings.recipe("reference")
    assert reference.recipe_name == "reference" and DriftSettings().recipe_name == "default"
    assert DriftSettings(maxdim=0).recipe_name == "custom"
    assert "internal_p" not in DriftSettings().key()  # caches of the default settings stay valid
    assert DriftSettings.from_key(json.loads(json.dumps(reference.key()))) == reference
    with pytest.raises(ParameterError, match="unknown drift recipe 'paper'"):
        DriftSettings.recipe("paper")
    with pytest.raises(ParameterError, match="internal_p=0.5 is not"):
        DriftSettings(internal_p=0.5)


def test_the_subsample_setting_keeps_every_earlier_cache_key():
    # digests of DriftCache row keys and diagram keys computed by the code before `subsample` existed: tables and
    # diagrams cached then stay valid
    from topotuner_lab._io.json_files import json_digest
    from topotuner_lab.drift.settings import CACHE_VERSION

    cache, a, b = DriftCache(None), "0" * 32, "1" * 32
    assert cache.row_key(a, b, DriftSettings()) == "2cadaf677617f14944ca3cada4cff03d"
    assert cache.row_key(a, b, DriftSettings.recipe("reference")) == "60f3eb5cbb8fb6fc5eedd58c2661fc8e"
    assert cache.row_key(a, b, DriftSettings(metric="cosine", n_perm=64, seed=3)) == "5c6ff6a3fcb3385fde526b4e0e0a7f7a"
    assert json_digest([a, DriftSettings().persistence().key(), CACHE_VERSION]) == "add69d9ebf8ea983971e4c8fcfc1f484"
    reference = DriftSettings.recipe("reference").persistence()
    assert json_digest([a, reference.key(), CACHE_VERSION]) == "f105d8f1a1acf64aaecff1adef37152f"
    assert "subsample" not in DriftSettings().key()
    chosen = DriftSettings(maxdim=1, metric="cosine", subsample=COSINE_H1_SUBSAMPLE)
    assert chosen.key()["subsample"] == COSINE_H1_SUBSAMPLE and chosen.persistence().subsample == COSINE_H1_SUBSAMPLE
    assert DriftSettings.from_key(json.loads(json.dumps(chosen.key()))) == chosen
    assert cache.row_key(a, b, chosen) != cache.row_key(a, b, DriftSettings(maxdim=1, metric="cosine"))


def test_the_reference_recipe_stays_h0_only():
    # the authors' scripts compute H0 only; the recipe equals them (first test), so it gains no H1 and no subsample
    reference = DriftSettings.recipe("reference")
    assert reference.maxdim == 0 and reference.subsample is None
    assert DriftSettings(**{**RECIPES["reference"], "maxdim": 1, "subsample": 256}).recipe_name == "custom"


def test_cosine_h1_on_a_row_subsample_is_seeded_and_recorded():
    rng = np.random.default_rng(11)
    before = {f"L0.{k}": rng.normal(0, 0.05, (60, 16)).astype(np.float32) for k in "qkvo"}
    after = {pid: (m + rng.normal(0, 0.005, m.shape)).astype(np.float32) for pid, m in before.items()}
    settings = DriftSettings(maxdim=1, metric="cosine", subsample=24, seed=2, magnitude=False)

    def table(settings, after=after):
        return drift_between(before, after, settings, n_jobs=1, cache=DriftCache(None)).set_index("pid")

    one, again = table(settings), table(settings)
    pd.testing.assert_frame_equal(one, again)
    other = table(DriftSettings(maxdim=1, metric="cosine", subsample=24, seed=3, magnitude=False))
    assert not np.allclose(one["h1_w1"], other["h1_w1"])
    assert (one["n_h1_before"] <= table(DriftSettings(maxdim=1, metric="cosine", magnitude=False))["n_h1_before"]).all()
    np.testing.assert_array_equal(one["h0_w1"], other["h0_w1"])  # H0 is exact on every row
    # both matrices keep the same rows: a matrix against itself drifts by exactly 0
    assert (table(settings, after=before)["h1_w1"] == 0).all()


@pytest.mark.parametrize("value", [1, -1, 2.0, "all", False])
def test_a_bad_subsample_names_the_field(value):
    with pytest.raises(ParameterError, match=r"drift settings: subsample=.* is not a row count >= 3, or None"):
        DriftSettings(subsample=value)
    with pytest.raises(ParameterError, match="subsample=32 and n_perm=16 are both set"):
        DriftSettings(subsample=32, n_perm=16)


def test_exact_cosine_h1_on_big_matrices_warns_with_the_subsample_to_use():
    rng = np.random.default_rng(5)
    big = {"L0.q": rng.normal(0, 1, (COSINE_H1_SUBSAMPLE + 4, 3)).astype(np.float32)}
    changed = {pid: m + np.float32(0.01) for pid, m in big.items()}
    cosine_h1 = DriftSettings(maxdim=1, metric="cosine", orders=(1.0,), bottleneck=False, magnitude=False)
    with pytest.warns(UserWarning, match=f"exact cosine H1 of 1 matrices .*subsample={COSINE_H1_SUBSAMPLE}"):
        drift_between(big, changed, cosine_h1, n_jobs=1, cache=DriftCache(None))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning with a subsample, for Euclidean H1, or for cosine H0
        for settings in (
            DriftSettings(**{**cosine_h1.to_dict(), "subsample": COSINE_H1_SUBSAMPLE}),
            DriftSettings(**{**cosine_h1.to_dict(), "metric": "euclidean"}),
            DriftSettings(**{**cosine_h1.to_dict(), "maxdim": 0}),
        ):
            drift_between(big, changed, settings, n_jobs=1, cache=DriftCache(None))
