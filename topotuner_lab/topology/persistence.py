"""Persistence diagrams of a matrix seen as the point cloud of its rows (Vietoris–Rips).

H0 is computed exactly by our own route: H0 of a Rips filtration is the minimum spanning
tree of the complete distance graph, so one float64 distance matrix (a single BLAS product)
plus an O(n²) Prim gives every death time. H1 comes from giotto-ph on the same distance
matrix. Both are tested against ripser.py / gudhi.

H1 can be computed on a seeded random subsample of the rows (``subsample``): exact cosine H1 of SmolLM2-135M's
deep ``o`` projections takes minutes to tens of minutes per matrix, 256 of their 576 rows about a second
(benchmarks/bench_cosine_h1.py). The rows kept depend only on the row count and the seed, so a pretrained matrix and
its fine-tuned copy are cut to the same rows and their drift measures the weights' change, not the sampling.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from topotuner_lab._io.config import NON_NEGATIVE_INT, POSITIVE_INT, Check, Config, is_int, opt, optional
from topotuner_lab._io.errors import InvalidMatrixError, ParameterError

Metric = Literal["euclidean", "cosine"]
METRICS: tuple[str, ...] = ("euclidean", "cosine")
AT_LEAST_3_ROWS = Check(lambda v: is_int(v) and v >= 3, "a row count >= 3")


@dataclass(frozen=True)
class PersistenceSettings(Config):
    """How a diagram is computed; part of every cache key.

    Parameters
    ----------
    maxdim : {1, 0}
        Highest homology dimension: 0 for H0 only, 1 for H0 and H1.
    metric : {"euclidean", "cosine"}
        Distance between rows; ``"cosine"`` is 1 - cos (a row of zero norm is at distance 1 from every other).
    n_perm : int or None
        H1 on a greedy-permutation (farthest-point) subsample of this many rows, at least 3, as ripser.py's
        ``n_perm``; None: every row.
    seed : int
        Start point of the greedy permutation, and seed of the ``subsample`` draw (>= 0).
    n_threads : int
        Threads for H1 (giotto-ph); never changes a diagram, so it is not part of :meth:`key`.
    subsample : int or None
        H1 on this many rows (at least 3) drawn at random by ``seed``: the same rows for every matrix of one shape,
        so a pretrained matrix and its fine-tuned copy keep the same rows; None: every row. H0 always uses every row.

    Raises
    ------
    ParameterError
        A field out of its range or choices, or both ``n_perm`` and ``subsample`` given.

    See Also
    --------
    diagrams : the diagrams these settings describe.
    DriftSettings.persistence : the settings a drift table computes its diagrams with.

    References
    ----------
    .. [1] U. Bauer, "Ripser: efficient computation of Vietoris–Rips persistence barcodes", Journal of Applied and
       Computational Topology 5, 391–423 (2021).
    .. [2] J. Burella Pérez, S. Hauke, U. Lupo, M. Caorsi, A. Dassatti, "giotto-ph: a Python library for
       high-performance computation of persistent homology of Vietoris–Rips filtrations", arXiv:2107.05412 (2021).
    .. [3] Erol et al., TopoTuner (2026): the Vietoris–Rips diagrams of attention projections' row clouds; code
       https://github.com/FDataLab/TopoTuner.

    Examples
    --------
    >>> from topotuner_lab import PersistenceSettings
    >>> PersistenceSettings(maxdim=0, metric="cosine").key()
    {'maxdim': 0, 'metric': 'cosine', 'n_perm': None, 'seed': 0}
    >>> PersistenceSettings(subsample=2)
    Traceback (most recent call last):
    topotuner_lab._io.errors.ParameterError: persistence settings: subsample=2 is not a row count >= 3, or None
      How to fix: give subsample as a row count >= 3, or None
    """

    label = "persistence settings"

    maxdim: int = opt(1, "highest homology dimension: 0 (H0) or 1 (H0 and H1)", choices=(0, 1))
    metric: Metric = opt("euclidean", "distance between rows", choices=METRICS)
    n_perm: int | None = opt(
        None, "greedy-permutation subsample size for H1 (None: all rows)", check=optional(AT_LEAST_3_ROWS)
    )
    seed: int = opt(0, "start point of the greedy permutation", check=NON_NEGATIVE_INT)
    n_threads: int = opt(1, "threads for H1 (giotto-ph)", check=POSITIVE_INT)
    subsample: int | None = opt(
        None, "rows kept for H1: a seeded random subsample (None: all rows)", check=optional(AT_LEAST_3_ROWS)
    )

    def check(self) -> None:
        """One H1 subsample at a time: the random rows (``subsample``) or the greedy permutation (``n_perm``)."""
        if self.n_perm is not None and self.subsample is not None:
            self.fail(
                f"subsample={self.subsample} and n_perm={self.n_perm} are both set",
                "give one: subsample (seeded random rows, the same rows for a matrix and its fine-tuned copy) or "
                "n_perm (greedy permutation)",
            )

    def key(self) -> dict[str, object]:
        """Settings that change the diagram (threads do not); ``subsample`` only when set (old keys stay valid)."""
        key: dict[str, object] = {"maxdim": self.maxdim, "metric": self.metric, "n_perm": self.n_perm}
        key["seed"] = self.seed
        if self.subsample is not None:
            key["subsample"] = self.subsample
        return key


@dataclass
class Diagrams:
    """Finite persistence pairs per homology dimension: ``dgms[k]`` is an (m, 2) birth/death array.

    The single infinite H0 bar is left out: every diagram has exactly one, born at 0, so it never
    contributes to a distance.

    Parameters
    ----------
    dgms : list of numpy.ndarray
        ``dgms[k]``: the (m, 2) float64 array of the finite (birth, death) pairs of dimension ``k``, in the row
        metric's units. ``len(diagrams)`` is the number of dimensions computed.

    Raises
    ------
    IndexError
        ``diagrams[k]`` for a dimension that was not computed.

    See Also
    --------
    diagrams : computes them from a matrix.
    wasserstein, bottleneck : distances between two diagrams of one dimension.

    Examples
    --------
    >>> import numpy as np
    >>> from topotuner_lab import Diagrams
    >>> dgms = Diagrams([np.array([[0.0, 1.0], [0.0, 2.0]])])
    >>> len(dgms), dgms[0].shape
    (1, (2, 2))
    """

    dgms: list[np.ndarray] = field(default_factory=list)

    def __getitem__(self, dim: int) -> np.ndarray:
        return self.dgms[dim]

    def __len__(self) -> int:
        return len(self.dgms)


def validate_matrix(matrix: np.ndarray, name: str = "matrix") -> np.ndarray:
    """Return ``matrix`` as float64 2-D, or raise a clear error for NaN/Inf or too few rows."""
    arr = np.asarray(matrix)
    if arr.ndim != 2:
        raise InvalidMatrixError(
            f"{name} has shape {arr.shape}, not a 2-D matrix", "pass a weight matrix (rows x columns)"
        )
    if arr.shape[0] < 2:
        raise InvalidMatrixError(
            f"{name} has {arr.shape[0]} row(s); a point cloud needs at least 2 rows for any persistence pair",
            "pass a matrix with 2 or more rows (check you did not select a bias vector or a single row)",
        )
    arr = arr.astype(np.float64, copy=False)
    if not np.isfinite(arr).all():
        bad = int((~np.isfinite(arr)).sum())
        raise InvalidMatrixError(
            f"{name} contains {bad} NaN/Inf value(s)",
            "the weights are corrupt or training diverged: re-extract the snapshot from a healthy checkpoint",
        )
    return arr


def distance_matrix(points: np.ndarray, metric: Metric = "euclidean") -> np.ndarray:
    """Pairwise row distances in float64 via one matrix product (Gram trick).

    ``cosine`` is 1 - cos(x_i, x_j) (rows of zero norm count as distance 1 from everything).
    """
    x = validate_matrix(points)
    if metric == "cosine":
        norms = np.linalg.norm(x, axis=1, keepdims=True)
        x = np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)
        dist = 1.0 - x @ x.T
        np.clip(dist, 0.0, 2.0, out=dist)
    elif metric == "euclidean":
        sq = np.einsum("ij,ij->i", x, x)
        dist = x @ x.T
        dist *= -2.0
        dist += sq[:, None]
        dist += sq[None, :]
        np.maximum(dist, 0.0, out=dist)
        np.sqrt(dist, out=dist)
    else:
        raise ParameterError(f"unknown metric {metric!r}", f"use one of {', '.join(METRICS)}")
    np.fill_diagonal(dist, 0.0)
    return dist


def mst_edges(dist: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A minimum spanning tree of the complete graph ``dist`` by dense Prim, O(n²).

    Returns ``(parent, child, length)`` arrays of the n-1 tree edges. Zero-length edges
    (duplicate rows) are kept, unlike scipy's sparse MST.
    """
    n = dist.shape[0]
    in_tree = np.zeros(n, dtype=bool)
    best = dist[0].copy()
    nearest = np.zeros(n, dtype=np.int64)
    in_tree[0] = True
    best[0] = np.inf
    parent = np.empty(n - 1, dtype=np.int64)
    child = np.empty(n - 1, dtype=np.int64)
    for k in range(n - 1):
        j = int(np.argmin(best))
        parent[k], child[k] = nearest[j], j
        in_tree[j] = True
        closer = dist[j] < best
        best[closer] = dist[j][closer]
        nearest[closer] = j
        best[in_tree] = np.inf
    return parent, child, dist[parent, child]


def exact_pair_distances(points: np.ndarray, i: np.ndarray, j: np.ndarray, metric: Metric = "euclidean") -> np.ndarray:
    """Distances of the row pairs (i, j) computed from differences, free of the Gram trick's cancellation."""
    a, b = np.asarray(points)[i].astype(np.float64), np.asarray(points)[j].astype(np.float64)
    if metric == "cosine":
        na, nb = np.linalg.norm(a, axis=1, keepdims=True), np.linalg.norm(b, axis=1, keepdims=True)
        a = np.divide(a, na, out=np.zeros_like(a), where=na > 0)
        b = np.divide(b, nb, out=np.zeros_like(b), where=nb > 0)
        zero = ((na[:, 0] == 0) | (nb[:, 0] == 0)) & (i != j)
        return np.where(zero, 1.0, 0.5 * np.einsum("ij,ij->i", a - b, a - b))
    return np.linalg.norm(a - b, axis=1)


def h0_diagram(points: np.ndarray, dist: np.ndarray | None = None, metric: Metric = "euclidean") -> np.ndarray:
    """Finite H0 pairs (birth 0, death = MST edge length), sorted by death.

    The tree is found on the fast Gram-trick distances. Their error in d^2 is about
    eps * (|x_i|^2 + |x_j|^2), which matters only for edges much shorter than the rows' norms;
    those edges (d^2 < 1e-6 of the squared norms: near-duplicate rows) are recomputed exactly from
    row differences, so every death is accurate to ~1e-10 relative.
    """
    dist = distance_matrix(points, metric) if dist is None else dist
    parent, child, lengths = mst_edges(dist)
    x = np.asarray(points)
    if metric == "cosine":
        scale = np.full(len(lengths), 2.0)
    else:
        sq = np.einsum("ij,ij->i", x, x, dtype=np.float64)
        scale = sq[parent] + sq[child]
    redo = lengths**2 < 1e-6 * scale
    if redo.any():
        lengths = lengths.copy()
        lengths[redo] = exact_pair_distances(x, parent[redo], child[redo], metric)
    deaths = np.sort(lengths)
    return np.column_stack([np.zeros_like(deaths), deaths])


def greedy_permutation(dist: np.ndarray, n_perm: int, seed: int = 0) -> np.ndarray:
    """Indices of a farthest-point (greedy permutation) subsample of size ``n_perm``."""
    n = dist.shape[0]
    if n_perm >= n:
        return np.arange(n)
    start = int(np.random.default_rng(seed).integers(n))
    idx = np.empty(n_perm, dtype=np.int64)
    idx[0] = start
    reach = dist[start].copy()
    for k in range(1, n_perm):
        nxt = int(np.argmax(reach))
        idx[k] = nxt
        np.minimum(reach, dist[nxt], out=reach)
    return idx


def subsample_rows(n_rows: int, size: int, seed: int = 0) -> np.ndarray:
    """Sorted indices of ``size`` of ``n_rows`` rows drawn without replacement by ``seed`` (all when fewer).

    The draw depends only on ``(n_rows, size, seed)``, never on the values: two matrices of one shape (pretrained and
    fine-tuned) keep the same rows.
    """
    if size >= n_rows:
        return np.arange(n_rows)
    return np.sort(np.random.default_rng(seed).choice(n_rows, size, replace=False))


def h1_diagram(dist: np.ndarray, n_threads: int = 1) -> np.ndarray:
    """Finite H1 pairs of the Rips filtration of a precomputed distance matrix (giotto-ph)."""
    from gph import ripser_parallel

    # Beyond the enclosing radius (the smallest row maximum) the Rips complex is a cone, so stopping there is exact.
    # Given no threshold, giotto-ph computes that radius itself and keeps its dense solver; passing the same radius
    # as ``thresh`` switches it to its sparse solver: the identical diagram, but 1.1-1.5x slower on SmolLM2-135M's
    # cosine row clouds and 1.4-2.8x under Euclidean (bench_cosine_h1.py), where nearly every edge is under it.
    out = ripser_parallel(dist, maxdim=1, metric="precomputed", n_threads=n_threads)
    dgm = np.asarray(out["dgms"][1], dtype=np.float64).reshape(-1, 2)
    return dgm[np.isfinite(dgm[:, 1])]


def diagrams(matrix: np.ndarray, settings: PersistenceSettings | None = None) -> Diagrams:
    """Persistence diagrams (H0 and, if ``maxdim=1``, H1) of the rows of ``matrix``.

    The Vietoris–Rips filtration of the rows. H0 is computed exactly as the minimum spanning tree of the complete
    distance graph (one float64 distance matrix, dense Prim; near-duplicate rows recomputed from their differences);
    H1 by giotto-ph (a parallel Ripser) on the same distance matrix. Both are tested against ripser.py and gudhi.

    Parameters
    ----------
    matrix : array_like, shape (rows, cols)
        A weight matrix in ``nn.Linear`` layout; its rows are the points. Finite, at least 2 rows.
    settings : PersistenceSettings, optional
        Homology dimension, row metric (``"euclidean"`` or ``"cosine"``), optional H1 subsample (``subsample``:
        seeded random rows; ``n_perm``: greedy permutation). Default ``PersistenceSettings()``: H0 and H1, Euclidean,
        every row.

    Returns
    -------
    Diagrams
        ``dgms[0]`` the (rows - 1, 2) finite H0 pairs (birth 0, death = MST edge length, sorted), and ``dgms[1]`` the
        (m, 2) finite H1 pairs; values are row distances (the metric's units).

    Raises
    ------
    InvalidMatrixError
        ``matrix`` is not 2-D, has fewer than 2 rows, or holds NaN/Inf.

    See Also
    --------
    wasserstein, bottleneck : distances between two diagrams.
    drift_table : the diagrams' drift over every attention matrix of two snapshots.

    References
    ----------
    .. [1] U. Bauer, "Ripser: efficient computation of Vietoris–Rips persistence barcodes", Journal of Applied and
       Computational Topology 5, 391–423 (2021).
    .. [2] J. Burella Pérez, S. Hauke, U. Lupo, M. Caorsi, A. Dassatti, "giotto-ph: a Python library for
       high-performance computation of persistent homology of Vietoris–Rips filtrations", arXiv:2107.05412 (2021).
    .. [3] Erol et al., TopoTuner (2026): the Vietoris–Rips diagrams of attention projections' row clouds; code
       https://github.com/FDataLab/TopoTuner.

    Examples
    --------
    The corners of a unit square: three H0 deaths at the side length, one loop born at 1 and filled at the diagonal.

    >>> import numpy as np
    >>> from topotuner_lab import PersistenceSettings, diagrams
    >>> square = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    >>> dgms = diagrams(square)
    >>> dgms[0]
    array([[0., 1.],
           [0., 1.],
           [0., 1.]])
    >>> dgms[1].round(4)
    array([[1.    , 1.4142]])
    >>> len(diagrams(square, PersistenceSettings(maxdim=0, metric="cosine")))
    1
    """
    settings = settings or PersistenceSettings()
    dist = distance_matrix(matrix, settings.metric)
    result = Diagrams([h0_diagram(matrix, dist, settings.metric)])
    if settings.maxdim >= 1:
        if settings.subsample is not None:
            idx = subsample_rows(dist.shape[0], settings.subsample, settings.seed)
            dist = dist[np.ix_(idx, idx)]
        elif settings.n_perm is not None:
            idx = greedy_permutation(dist, settings.n_perm, settings.seed)
            dist = dist[np.ix_(idx, idx)]
        result.dgms.append(h1_diagram(dist, settings.n_threads))
    return result
