import gudhi
import numpy as np
import pytest
import ripser

from topotuner_lab._io.errors import InvalidMatrixError, ParameterError
from topotuner_lab.topology.persistence import (
    PersistenceSettings,
    diagrams,
    distance_matrix,
    greedy_permutation,
    h0_diagram,
    subsample_rows,
)


def _structured(rng):
    low_rank = rng.standard_normal((120, 4)) @ rng.standard_normal((4, 40))
    clusters = np.repeat(rng.standard_normal((6, 30)) * 5, 20, axis=0) + rng.standard_normal((120, 30)) * 0.1
    duplicates = np.vstack([rng.standard_normal((50, 16))] * 2)
    grid = np.round(rng.standard_normal((100, 32)) * 4) / 4  # quantised, many ties
    return {"low_rank": low_rank, "clusters": clusters, "duplicates": duplicates, "grid": grid}


def _ripser_h0(x):
    dgm = ripser.ripser(x, maxdim=0)["dgms"][0]
    return np.sort(dgm[np.isfinite(dgm[:, 1]), 1])


def _positive(deaths):
    """Bars longer than float32 noise: ripser drops (or blurs) the zero-length bars of duplicate rows."""
    return np.sort(deaths[deaths > 1e-6])


def test_h0_matches_ripser_on_random_matrices(rng):
    for n, d in [(2, 3), (10, 5), (192, 64), (576, 96)]:
        x = rng.standard_normal((n, d)).astype(np.float32)
        ours = diagrams(x, PersistenceSettings(maxdim=0))[0]
        assert np.all(ours[:, 0] == 0)
        np.testing.assert_allclose(ours[:, 1], _ripser_h0(x), rtol=1e-6, atol=1e-6)


def test_h0_matches_ripser_and_gudhi_on_structured_matrices(rng):
    for name, x in _structured(rng).items():
        ours = h0_diagram(x)[:, 1]
        assert len(ours) == len(x) - 1  # one bar per MST edge, zero-length ones included
        np.testing.assert_allclose(_positive(ours), _positive(_ripser_h0(x)), rtol=1e-6, atol=1e-6, err_msg=name)
        tree = gudhi.RipsComplex(points=x).create_simplex_tree(max_dimension=1)
        ref = np.sort([d for dim, (b, d) in tree.persistence() if dim == 0 and np.isfinite(d)])
        np.testing.assert_allclose(np.sort(ours), np.pad(ref, (len(ours) - len(ref), 0)), atol=1e-9, err_msg=name)


def test_h1_matches_ripser(rng):
    for x in [rng.standard_normal((80, 8)), _structured(rng)["clusters"]]:
        ours = diagrams(x)[1]
        ref = ripser.ripser(x, maxdim=1)["dgms"][1]
        assert len(ours) == len(ref)
        np.testing.assert_allclose(np.sort(ours, axis=0), np.sort(ref, axis=0), rtol=1e-5, atol=1e-5)


def test_circle_has_one_long_h1_bar():
    t = np.linspace(0, 2 * np.pi, 60, endpoint=False)
    circle = np.column_stack([np.cos(t), np.sin(t)])
    h1 = diagrams(circle)[1]
    lifetimes = h1[:, 1] - h1[:, 0]
    assert lifetimes.max() > 1.0 and np.sum(lifetimes > 0.5) == 1


def test_cosine_metric_ignores_row_scale(rng):
    x = rng.standard_normal((40, 10))
    scaled = x * rng.uniform(0.5, 3.0, size=(40, 1))
    a = diagrams(x, PersistenceSettings(metric="cosine"))
    b = diagrams(scaled, PersistenceSettings(metric="cosine"))
    np.testing.assert_allclose(a[0], b[0], atol=1e-12)
    assert not np.allclose(diagrams(x)[0], diagrams(scaled)[0])


def test_greedy_permutation_is_farthest_point_sampling(rng):
    x = rng.standard_normal((100, 5))
    dist = distance_matrix(x)
    idx = greedy_permutation(dist, 10, seed=3)
    assert len(set(idx)) == 10
    np.testing.assert_array_equal(greedy_permutation(dist, 10, seed=3), idx)
    other = greedy_permutation(dist, 10, seed=4)  # the seed picks the start point
    assert other[0] != idx[0] and list(other) != list(idx)
    for k in range(1, 10):  # each pick is the farthest point from those already chosen
        reach = dist[idx[:k]].min(axis=0)
        assert reach[idx[k]] == pytest.approx(reach.max())
    sub = diagrams(x, PersistenceSettings(n_perm=30))
    assert len(sub[0]) == 99  # H0 is always exact on all rows


@pytest.mark.parametrize(
    "matrix, message",
    [
        (np.array([[1.0, np.nan], [0.0, 1.0]]), "NaN/Inf"),
        (np.array([[1.0, np.inf], [0.0, 1.0]]), "NaN/Inf"),
        (np.ones((1, 4)), "1 row"),
        (np.ones((0, 4)), "0 row"),
        (np.ones(4), "not a 2-D matrix"),
    ],
)
def test_bad_matrices_get_clear_errors(matrix, message):
    with pytest.raises(InvalidMatrixError, match=message):
        diagrams(matrix)


def test_bad_settings():
    with pytest.raises(ParameterError, match="maxdim"):
        PersistenceSettings(maxdim=2)
    with pytest.raises(ParameterError, match="metric"):
        PersistenceSettings(metric="manhattan")
    with pytest.raises(ParameterError, match="n_perm"):
        PersistenceSettings(n_perm=1)


def test_near_duplicate_rows_keep_their_tiny_distances(rng):
    from scipy.sparse.csgraph import minimum_spanning_tree
    from scipy.spatial.distance import pdist, squareform

    base = rng.standard_normal((40, 32)) * 10  # large norms: the Gram trick alone would give ~1e-7 noise
    x = np.vstack([base, base + rng.standard_normal(base.shape) * 1e-7])
    tree = minimum_spanning_tree(squareform(pdist(x))).toarray()
    np.testing.assert_allclose(h0_diagram(x)[:, 1], np.sort(tree[tree > 0]), rtol=1e-9)


def test_row_subsample_is_seeded_and_the_same_rows_for_every_matrix_of_a_shape(rng):
    idx = subsample_rows(100, 30, seed=3)
    assert len(idx) == len(set(idx)) == 30 and list(idx) == sorted(idx)
    np.testing.assert_array_equal(subsample_rows(100, 30, seed=3), idx)
    assert list(subsample_rows(100, 30, seed=4)) != list(idx)
    np.testing.assert_array_equal(subsample_rows(20, 30, seed=3), np.arange(20))  # fewer rows: all of them
    x = rng.standard_normal((100, 12))
    one = diagrams(x, PersistenceSettings(subsample=30, seed=3))
    again = diagrams(x, PersistenceSettings(subsample=30, seed=3))
    other = diagrams(x, PersistenceSettings(subsample=30, seed=4))
    np.testing.assert_array_equal(one[1], again[1])
    assert one[1].shape != other[1].shape or not np.array_equal(one[1], other[1])
    np.testing.assert_array_equal(one[0], diagrams(x, PersistenceSettings(maxdim=0))[0])  # H0 uses every row
    # H1 is that of the chosen rows, whatever the other rows hold: a changed copy is cut to the same rows
    ref = ripser.ripser(x[idx], maxdim=1)["dgms"][1]
    np.testing.assert_allclose(np.sort(one[1], axis=0), np.sort(ref, axis=0), rtol=1e-5, atol=1e-5)
    changed = x.copy()
    changed[np.setdiff1d(np.arange(100), idx)] += 5.0
    np.testing.assert_allclose(diagrams(changed, PersistenceSettings(subsample=30, seed=3))[1], one[1], atol=1e-12)


def test_no_subsample_is_the_exact_path_and_keeps_the_cache_key(rng):
    x = rng.standard_normal((60, 8))
    exact = diagrams(x)
    for settings in (PersistenceSettings(subsample=None), PersistenceSettings(subsample=60, seed=5)):
        got = diagrams(x, settings)
        np.testing.assert_array_equal(got[0], exact[0])
        np.testing.assert_array_equal(got[1], exact[1])
    # the key of settings without a subsample is the key from before the setting (cached diagrams stay valid)
    assert PersistenceSettings().key() == {"maxdim": 1, "metric": "euclidean", "n_perm": None, "seed": 0}
    assert PersistenceSettings(subsample=256).key()["subsample"] == 256


@pytest.mark.parametrize("value", [2, 0, -5, 3.5, "256", True])
def test_bad_subsample_is_refused_naming_the_field(value):
    with pytest.raises(ParameterError, match=r"subsample=.* is not a row count >= 3"):
        PersistenceSettings(subsample=value)


def test_subsample_and_greedy_permutation_are_exclusive():
    with pytest.raises(ParameterError, match="subsample=64 and n_perm=32 are both set"):
        PersistenceSettings(subsample=64, n_perm=32)
