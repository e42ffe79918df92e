"""Distances between persistence diagrams.

Ground metric: Wasserstein measures points in the birth–death plane with the L``q`` norm, ``q = internal_p``. The
default is the Euclidean distance (gudhi ``internal_p=2``), so ``wasserstein(a, b, p=1)`` equals
``persim.wasserstein(a, b)``; ``internal_p=np.inf`` is gudhi's own default, which the authors' reference scripts use
(a point then costs half its persistence to send to the diagonal, against 1/sqrt(2) of it under L2). The bottleneck
distance uses the L-infinity ground metric, as gudhi and persim both do.

For H0 diagrams (all births 0) an exact O(n·m) dynamic program over the two sorted death lists
replaces the general optimal-transport solver: with a convex cost |x − y|^p an optimal matching
never crosses, so each point is matched in order or sent to the diagonal. It is tested against POT.
"""

from __future__ import annotations

import numbers
from typing import Literal

import numpy as np

from topotuner_lab._io.errors import ParameterError

Solver = Literal["auto", "assignment", "pot", "hera", "h0"]
SOLVERS: tuple[str, ...] = ("auto", "assignment", "pot", "hera", "h0")
#: ``auto`` solves H1 diagrams of at most this many points as an exact assignment problem (SciPy), with no POT
#: import: POT loads scikit-learn, pandas and torch, seconds per worker process, while the real SmolLM2-135M H1
#: diagrams have at most ~200 points (median ~10). Measured here (benchmarks/bench_wasserstein.py): the assignment is
#: as fast as POT at 63 points and ~2x slower at 130-320 points (5-30 ms; its (n + m)^2 matrix against POT's
#: (n + 1)(m + 1)), while POT's import costs 2.5 s per fresh process against 0.4 s for scipy.optimize.
ASSIGNMENT_UP_TO = 300
#: ``auto`` uses hera (relative error ``delta``) above this many points per H1 diagram, exact POT at or below it.
#: Measured here (benchmarks/bench_wasserstein.py): POT and hera even at ~1,300 points (1.06 s vs 0.95 s), hera 3.4x
#: faster at ~2,100 (6.9 s vs 2.0 s, observed error 1e-4); POT's dense (n + m)^2 cost matrix does not fit in memory for
#: the ~19,000-point H1 diagrams of 8B-model q/o matrices. Up to 2,000 points the exact answer costs a few seconds.
HERA_ABOVE = 2000


def _check_order(p: float) -> None:
    if not (isinstance(p, (int, float)) and p >= 1 and np.isfinite(p)):
        raise ParameterError(
            f"Wasserstein order p={p!r} is not a finite number >= 1", "use p=1 or p=2 (bottleneck is a separate metric)"
        )


def _check_delta(delta: float) -> None:
    """Refuse a hera relative error that is not a positive finite number (0 never ends, a negative one crashes)."""
    if not (isinstance(delta, numbers.Real) and not isinstance(delta, bool) and np.isfinite(delta) and delta > 0):
        raise ParameterError(
            f"hera relative error delta={delta!r} is not a positive finite number",
            "use a small positive delta such as 0.01, or solver='pot' or 'assignment' for the exact distance",
        )


def _as_diagram(dgm: object, name: str) -> np.ndarray:
    """``dgm`` as a float64 (m, 2) array of (birth, death) pairs, or a :class:`ParameterError` naming what is wrong.

    Refused: anything that is not numbers in two columns (a 1-D array is not reshaped into points; an empty list
    is the empty diagram), NaN coordinates, infinite coordinates (our diagrams leave the essential H0 bar out, so an
    infinite death cannot be matched) and points born after they die.
    """
    fix = f"pass {name} as an (m, 2) array of (birth, death) pairs, e.g. Diagrams[k] from persistence.diagrams"
    if dgm is None or isinstance(dgm, (str, bytes)):
        raise ParameterError(f"{name} is {type(dgm).__name__}, not an (m, 2) array of (birth, death) pairs", fix)
    try:
        arr = np.asarray(dgm, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ParameterError(f"{name} is not an array of numbers ({exc})", fix) from exc
    if arr.ndim == 1 and arr.size == 0:
        return arr.reshape(0, 2)
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise ParameterError(f"{name} has shape {arr.shape}, not (m, 2) (birth, death) pairs", fix)
    nan = int(np.isnan(arr).any(axis=1).sum())
    if nan:
        raise ParameterError(f"{name} has {nan} point(s) with a NaN coordinate", "drop or recompute those points")
    infinite = int(np.isinf(arr).any(axis=1).sum())
    if infinite:
        raise ParameterError(
            f"{name} has {infinite} point(s) with an infinite birth or death (an essential bar cannot be matched)",
            f"drop them first, e.g. {name}[np.isfinite({name}).all(axis=1)] (our diagrams already leave the "
            "essential H0 bar out)",
        )
    reversed_points = int((arr[:, 0] > arr[:, 1]).sum())
    if reversed_points:
        raise ParameterError(
            f"{name} has {reversed_points} point(s) born after they die (birth > death)",
            "give (birth, death) pairs with birth <= death (are the columns swapped?)",
        )
    return arr


def is_h0_diagram(dgm: np.ndarray) -> bool:
    """True when every point is born at 0 (the H0 diagram of a Rips filtration)."""
    return bool(np.all(np.asarray(dgm)[:, 0] == 0.0))


def _check_internal_p(internal_p: float) -> None:
    if not (isinstance(internal_p, numbers.Real) and not isinstance(internal_p, bool) and internal_p >= 1):
        raise ParameterError(
            f"ground metric internal_p={internal_p!r} is not a number >= 1 (or infinity)",
            "use internal_p=2 (Euclidean, the default) or internal_p=np.inf (gudhi's default)",
        )


def to_diagonal(persistence: np.ndarray, internal_p: float = 2.0) -> np.ndarray:
    """The L``q`` distance from points of the given persistence (death - birth) to the diagonal.

    ``persistence * 2 ** (1 / q - 1)``: persistence / sqrt(2) for ``q = 2`` (divided, to the last bit what the drift
    tables always computed), half of it for ``q = inf``, all of it for ``q = 1``.
    """
    values = np.abs(np.asarray(persistence, dtype=np.float64))
    if internal_p == 2.0:
        return values / np.sqrt(2.0)
    return values * 2.0 ** (1.0 / internal_p - 1.0)


def h0_wasserstein(deaths_a: np.ndarray, deaths_b: np.ndarray, p: float = 1.0, internal_p: float = 2.0) -> float:
    """Exact p-Wasserstein distance between two H0 diagrams given by their death times (L``internal_p`` ground).

    Two H0 points (0, x) and (0, y) are |x - y| apart under any L``q`` norm; only the diagonal cost depends on ``q``.
    """
    _check_order(p)
    _check_internal_p(internal_p)
    x = np.sort(np.asarray(deaths_a, dtype=np.float64))
    y = np.sort(np.asarray(deaths_b, dtype=np.float64))
    diag_x = to_diagonal(x, internal_p) ** p
    diag_y = to_diagonal(y, internal_p) ** p
    cum_y = np.concatenate([[0.0], np.cumsum(diag_y)])  # cost of sending y[:j] to the diagonal
    row = cum_y.copy()  # dp over x[:0]
    for i in range(x.size):
        step = np.empty_like(row)
        step[0] = row[0] + diag_x[i]
        step[1:] = np.minimum(row[1:] + diag_x[i], row[:-1] + np.abs(x[i] - y) ** p)
        row = cum_y + np.minimum.accumulate(step - cum_y)
    return float(row[-1] ** (1.0 / p))


def assignment_wasserstein(a: np.ndarray, b: np.ndarray, p: float = 1.0, internal_p: float = 2.0) -> float:
    """Exact p-Wasserstein distance as a linear assignment on the (n + m) x (m + n) matrix of the diagram matching.

    Costs: point to point (L``internal_p``), point to its diagonal projection, and diagonal to diagonal at no cost.
    """
    from scipy.optimize import linear_sum_assignment

    n, m = len(a), len(b)
    cost = np.full((n + m, m + n), np.inf)
    gaps = np.stack([a[:, None, 0] - b[None, :, 0], a[:, None, 1] - b[None, :, 1]], axis=-1)
    cost[:n, :m] = np.linalg.norm(gaps, ord=internal_p, axis=-1) ** p
    cost[np.arange(n), m + np.arange(n)] = to_diagonal(a[:, 1] - a[:, 0], internal_p) ** p
    cost[n + np.arange(m), np.arange(m)] = to_diagonal(b[:, 1] - b[:, 0], internal_p) ** p
    cost[n:, m:] = 0.0
    rows, cols = linear_sum_assignment(cost)
    return float(cost[rows, cols].sum() ** (1.0 / p))


def wasserstein(
    dgm_a: np.ndarray,
    dgm_b: np.ndarray,
    p: float = 1.0,
    solver: Solver = "auto",
    delta: float = 0.01,
    internal_p: float = 2.0,
) -> float:
    """p-Wasserstein distance between two diagrams (L``internal_p`` ground metric, Euclidean by default).

    The cost of the best matching of the two diagrams' points, each point matched to one of the other diagram or to
    its projection on the diagonal: (sum of ground distances to the power ``p``) to the power 1/``p``.

    Parameters
    ----------
    dgm_a, dgm_b : array_like, shape (m, 2)
        Finite (birth, death) pairs with birth <= death (an empty list is the empty diagram).
    p : float, default 1.0
        Wasserstein order, a finite number >= 1.
    solver : {"auto", "assignment", "pot", "hera", "h0"}
        ``"auto"``: the exact H0 route when both diagrams are H0 (all births 0; an O(n·m) dynamic program over the
        sorted deaths), else the exact assignment up to ``ASSIGNMENT_UP_TO`` points, exact POT up to ``HERA_ABOVE``,
        hera beyond; ``"assignment"``: SciPy's linear assignment (exact); ``"pot"``: exact optimal transport
        (gudhi.wasserstein, POT); ``"hera"``: gudhi's hera with relative error ``delta``; ``"h0"``: force the H0
        route.
    delta : float, default 0.01
        hera's relative error, a positive finite number (checked whatever the solver).
    internal_p : float, default 2.0
        The ground metric's norm in the birth–death plane, >= 1 or ``np.inf``. 2 (Euclidean) makes ``p=1`` equal
        ``persim.wasserstein``; ``np.inf`` is gudhi's default and the authors' reference recipe.

    Returns
    -------
    float
        The distance, in the diagrams' filtration units (row distances); 0.0 for two empty diagrams.

    Raises
    ------
    ParameterError
        ``p`` or ``internal_p`` below 1, an unknown ``solver``, a ``delta`` that is not a positive finite number, a
        diagram that is not finite (birth, death) pairs with birth <= death (NaN, an infinite death, a 1-D or
        3-column array), or ``solver="h0"`` with a point born after 0.

    See Also
    --------
    bottleneck : the L-infinity matching distance.
    diagrams : the diagrams of a matrix's rows.

    References
    ----------
    .. [1] D. Cohen-Steiner, H. Edelsbrunner, J. Harer, Y. Mileyko, "Lipschitz functions have Lp-stable
       persistence", Foundations of Computational Mathematics 10, 127–139 (2010).
    .. [2] R. Flamary et al., "POT: Python Optimal Transport", Journal of Machine Learning Research 22(78), 1–8
       (2021); used through ``gudhi.wasserstein.wasserstein_distance``.
    .. [3] M. Kerber, D. Morozov, A. Nigmetov, "Geometry helps to compare persistence diagrams", ACM Journal of
       Experimental Algorithmics 22 (2017); hera, used through ``gudhi.hera.wasserstein_distance``.
    .. [4] Erol et al., TopoTuner (2026): H0 Wasserstein drift of attention projections; code
       https://github.com/FDataLab/TopoTuner (gudhi's ``internal_p=inf``).

    Examples
    --------
    Matching sorted deaths is not optimal: sending the two outer points to the diagonal is cheaper.

    >>> import numpy as np
    >>> from topotuner_lab import wasserstein
    >>> a = np.array([[0.0, 0.1], [0.0, 1.0]])
    >>> b = np.array([[0.0, 1.0], [0.0, 1.9]])
    >>> round(wasserstein(a, b), 4)
    1.4142
    >>> round(wasserstein(a, b, internal_p=np.inf), 4)
    1.0
    >>> round(wasserstein([[1.0, 2.0]], [[1.0, 3.0]], p=2), 4)
    1.0
    """
    _check_order(p)
    _check_internal_p(internal_p)
    if solver not in SOLVERS:
        raise ParameterError(f"unknown Wasserstein solver {solver!r}", f"use one of {', '.join(SOLVERS)}")
    _check_delta(delta)
    a, b = _as_diagram(dgm_a, "dgm_a"), _as_diagram(dgm_b, "dgm_b")
    if a.size == 0 and b.size == 0:
        return 0.0
    h0 = is_h0_diagram(a) and is_h0_diagram(b)
    if solver == "h0" or (solver == "auto" and h0):
        if not h0:
            raise ParameterError(
                "solver='h0' was given diagrams with non-zero births", "use solver='pot' or 'hera' for H1 diagrams"
            )
        return h0_wasserstein(a[:, 1], b[:, 1], p, internal_p)
    size = max(len(a), len(b))
    if solver == "assignment" or (solver == "auto" and size <= ASSIGNMENT_UP_TO):
        return assignment_wasserstein(a, b, p, internal_p)
    if solver == "hera" or (solver == "auto" and size > HERA_ABOVE):
        from gudhi.hera import wasserstein_distance as hera_wasserstein

        return float(hera_wasserstein(a, b, order=p, internal_p=internal_p, delta=delta))
    from gudhi.wasserstein import wasserstein_distance as pot_wasserstein

    return float(pot_wasserstein(a, b, order=p, internal_p=internal_p))


def _covers(required: np.ndarray, others: np.ndarray, eps: float) -> bool:
    """Whether every ``required`` value (sorted) can be matched to its own ``others`` value (sorted) within ``eps``.

    Each required x may take any y in [x - eps, x + eps]; these windows all have one width, so giving each x in turn
    the smallest free y >= x - eps is optimal. Vectorized: the k-th x takes index k + max_{l<=k}(first_l - l).
    """
    if required.size == 0:
        return True
    if required.size > others.size:
        return False
    first = np.searchsorted(others, required - eps, side="left")
    taken = np.arange(required.size) + np.maximum.accumulate(first - np.arange(required.size))
    if taken[-1] >= others.size:
        return False
    return bool(np.all(others[taken] - required <= eps))


def _h0_bottleneck_feasible(x: np.ndarray, y: np.ndarray, eps: float) -> bool:
    """Whether two H0 diagrams (death times) have a matching of cost <= ``eps``.

    It exists iff the deaths that cannot go to the diagonal (d / 2 > eps) on each side can each be matched within eps
    (Mendelsohn-Dulmage: two one-sided matchings combine into one).
    """
    return _covers(x[x / 2 > eps], y, eps) and _covers(y[y / 2 > eps], x, eps)


def h0_bottleneck(deaths_a: np.ndarray, deaths_b: np.ndarray) -> float:
    """Exact bottleneck distance between two H0 diagrams given by their death times, in O((n + m) log(n + m)).

    Points are (0, d): two deaths cost |x - y| to match, a death costs d / 2 to send to the diagonal (L-infinity
    ground metric, as gudhi). Feasibility of a cost eps is monotone in eps and decided greedily on the sorted deaths,
    so a binary search over the float64 values themselves (their bit patterns are ordered) finds the smallest
    feasible eps: the distance, to the last bit of the float comparisons. Tested against gudhi.
    """
    x = np.sort(np.asarray(deaths_a, dtype=np.float64))
    y = np.sort(np.asarray(deaths_b, dtype=np.float64))
    if x.size == 0 and y.size == 0:
        return 0.0
    high = float(max(x.max(initial=0.0), y.max(initial=0.0)))  # matching everything to the diagonal costs at most max/2
    lo_bits, hi_bits = 0, int(np.float64(high).view(np.int64))
    while lo_bits < hi_bits:  # smallest feasible non-negative float, by its bit pattern
        mid = (lo_bits + hi_bits) // 2
        if _h0_bottleneck_feasible(x, y, float(np.int64(mid).view(np.float64))):
            hi_bits = mid
        else:
            lo_bits = mid + 1
    return float(np.int64(hi_bits).view(np.float64))


def bottleneck(dgm_a: np.ndarray, dgm_b: np.ndarray) -> float:
    """Exact bottleneck distance (L-infinity ground metric).

    The smallest largest cost of a matching of the two diagrams (points matched to points or to the diagonal). The
    O(n log n) H0 route when both diagrams are H0 (all births 0), hera's exact solver (``delta=0``) otherwise.

    Parameters
    ----------
    dgm_a, dgm_b : array_like, shape (m, 2)
        Finite (birth, death) pairs with birth <= death (checked as in :func:`wasserstein`).

    Returns
    -------
    float
        The distance in filtration units; 0.0 for two empty diagrams. Not ``gudhi.bottleneck_distance``: on H0
        diagrams (all points on the line birth = 0) it returned 1.5 where the exact distance is 1.0 (deaths
        {1, 2, 3, 4} vs {4, 5}; hera and persim give 1.0); a test keeps that case.

    Raises
    ------
    ParameterError
        A diagram that is not finite (birth, death) pairs with birth <= death.

    See Also
    --------
    wasserstein : the p-Wasserstein matching distance.

    References
    ----------
    .. [1] D. Cohen-Steiner, H. Edelsbrunner, J. Harer, "Stability of persistence diagrams", Discrete &
       Computational Geometry 37, 103–120 (2007).
    .. [2] M. Kerber, D. Morozov, A. Nigmetov, "Geometry helps to compare persistence diagrams", ACM Journal of
       Experimental Algorithmics 22 (2017); hera, used through ``gudhi.hera.bottleneck_distance``.

    Examples
    --------
    >>> import numpy as np
    >>> from topotuner_lab import bottleneck
    >>> a = np.column_stack([np.zeros(4), [1.0, 2.0, 3.0, 4.0]])
    >>> b = np.column_stack([np.zeros(2), [4.0, 5.0]])
    >>> bottleneck(a, b)
    1.0
    >>> bottleneck([[1.0, 2.0]], [[1.0, 2.5]])
    0.5
    """
    from gudhi.hera import bottleneck_distance as hera_bottleneck

    a, b = _as_diagram(dgm_a, "dgm_a"), _as_diagram(dgm_b, "dgm_b")
    if a.size == 0 and b.size == 0:
        return 0.0
    if is_h0_diagram(a) and is_h0_diagram(b):
        return h0_bottleneck(a[:, 1], b[:, 1])
    return float(hera_bottleneck(a, b, 0))
