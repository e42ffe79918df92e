"""The `reference` recipe is the authors' computation: cosine row distances, ripser's H0, gudhi's Wasserstein with its
defaults (order 1, internal_p = inf). An independent script written that way gives the same drift."""

from __future__ import annotations

import json

import numpy as np
import pytest
from gudhi.wasserstein import wasserstein_distance
from ripser import ripser
from scipy.spatial.distance import pdist, squareform

from topotuner_lab._io.errors import ParameterError
from topotuner_lab.drift.cache import DriftCache
from topotuner_lab.drift.compute import drift_between
from topotuner_lab.drift.settings import DriftSettings
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
