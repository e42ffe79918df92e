"""Property tests (hypothesis) of the topology engine."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy.sparse.csgraph import minimum_spanning_tree
from scipy.spatial.distance import pdist, squareform
from scipy.stats import ortho_group

from topotuner_lab.topology.distances import bottleneck, wasserstein
from topotuner_lab.topology.persistence import diagrams

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def diagram(draw, h0=False):
    n = draw(st.integers(0, 12))
    births = np.zeros(n) if h0 else np.array(draw(st.lists(st.floats(0, 5), min_size=n, max_size=n)))
    lengths = np.array(draw(st.lists(st.floats(1e-3, 5), min_size=n, max_size=n)))
    return np.column_stack([births, births + lengths]).reshape(-1, 2)


def clouds(min_rows=3, max_rows=14, dim=4):
    return st.integers(min_rows, max_rows).flatmap(
        lambda n: arrays(np.float64, (n, dim), elements=st.floats(-3, 3, allow_nan=False, width=32), unique=True)
    )


DISTANCES = [
    ("w1", lambda a, b: wasserstein(a, b, 1)),
    ("w2", lambda a, b: wasserstein(a, b, 2)),
    ("bottleneck", bottleneck),
]


@pytest.mark.parametrize("name, dist", DISTANCES)
@pytest.mark.parametrize("h0", [False, True])
@FAST
@given(data=st.data())
def test_metric_axioms(name, dist, h0, data):
    a, b, c = (data.draw(diagram(h0)) for _ in range(3))
    assert dist(a, a) == pytest.approx(0, abs=1e-9)
    assert dist(a, b) == pytest.approx(dist(b, a), rel=1e-9, abs=1e-9)
    assert dist(a, c) <= dist(a, b) + dist(b, c) + 1e-7


@FAST
@given(x=clouds())
def test_h0_deaths_are_mst_edge_lengths(x):
    dist = squareform(pdist(x))
    tree = minimum_spanning_tree(dist).toarray()
    edges = np.sort(tree[tree > 0])
    ours = diagrams(x, settings=None)[0][:, 1]
    ours = np.sort(ours[ours > 0])
    np.testing.assert_allclose(ours, edges, rtol=1e-9, atol=1e-12)


@FAST
@given(x=clouds(), seed=st.integers(0, 2**16))
def test_invariant_to_row_order_and_rotation(x, seed):
    rng = np.random.default_rng(seed)
    ref = diagrams(x)
    permuted = diagrams(x[rng.permutation(len(x))])
    rotated = diagrams(x @ ortho_group.rvs(x.shape[1], random_state=seed))
    for other in (permuted, rotated):
        for dim in (0, 1):
            assert bottleneck(ref[dim], other[dim]) < 1e-6


@FAST
@given(x=clouds(), noise=arrays(np.float64, (14, 4), elements=st.floats(-0.5, 0.5, width=32)))
def test_rips_stability(x, noise):
    y = x + noise[: len(x)]
    bound = 2 * np.linalg.norm(x - y, axis=1).max()
    dx, dy = diagrams(x), diagrams(y)
    for dim in (0, 1):
        assert bottleneck(dx[dim], dy[dim]) <= bound + 1e-6
