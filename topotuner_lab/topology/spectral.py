"""Weight-statistic signals of one matrix, the field's other layer selectors, computed from its singular values.

- :func:`spectrum_snr`: Spectrum's signal-to-noise ratio (singular values above the Marchenko–Pastur edge of a noise
  level estimated from their interquartile range, over those below, over the largest), as ``spectrum.py`` of
  cognitivecomputations/spectrum computes it. Spectrum trains the highest-SNR layers of each kind.
- :func:`powerlaw_alpha`: WeightWatcher's power-law exponent of the eigenvalue spectrum of ``W^T W`` (its default
  ``fit="PL"``: the tail start ``xmin`` chosen by the smallest Kolmogorov–Smirnov distance, Clauset et al. 2009);
  tested equal to ``weightwatcher``'s own ``alpha``. A large alpha reads as a less-trained layer.
- :func:`condition_number`: PEFT's KappaTune condition number ``s_max / (s_min + 1e-8)``; tested equal to
  ``peft.helpers.KappaTuneSelector``. KappaTune trains the lowest-kappa modules.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def singular_values(matrix: np.ndarray) -> np.ndarray:
    """Singular values of ``matrix`` in float64, largest first."""
    return np.linalg.svd(np.asarray(matrix, dtype=np.float64), compute_uv=False)


def spectrum_snr(matrix: np.ndarray) -> float:
    """Spectrum's SNR: (sum of singular values above the MP edge) / (sum of the rest) / the largest singular value.

    The noise level is the interquartile range of the singular values over 1.349 (a Gaussian's IQR in sigmas), the
    edge ``sigma * (1 + sqrt(beta))`` with ``beta`` the aspect ratio (short side over long side).
    """
    s = singular_values(matrix)
    sigma = (np.quantile(s, 0.75) - np.quantile(s, 0.25)) / 1.349
    rows, cols = np.shape(matrix)
    beta = min(rows, cols) / max(rows, cols)
    signal_mask = s > sigma * (1 + np.sqrt(beta))
    signal = s[signal_mask].sum() if signal_mask.any() else 0.0
    noise = s[~signal_mask].sum() if (~signal_mask).any() else 1.0
    return float(signal / noise / s[0]) if noise else float("inf")


@dataclass(frozen=True)
class PowerLawFit:
    """A power-law fit of an eigenvalue tail: exponent, where the tail starts, and the KS distance of the fit."""

    alpha: float
    xmin: float
    ks_distance: float


def powerlaw_fit(eigenvalues: np.ndarray) -> PowerLawFit:
    """Continuous power-law fit with ``xmin`` chosen by the smallest KS distance over every candidate eigenvalue.

    For a tail starting at ``xmin`` the exponent is the maximum-likelihood ``1 + k / sum(ln(x / xmin))``; the KS
    distance compares the tail's empirical CDF with ``1 - (x / xmin) ** (1 - alpha)``.
    """
    values = np.sort(np.asarray(eigenvalues, dtype=np.float64))
    values = values[values > 0]
    if values.size < 2:
        return PowerLawFit(float("nan"), float("nan"), float("nan"))
    best = PowerLawFit(float("nan"), float("nan"), float("inf"))
    for start in range(values.size - 1):
        xmin, tail = values[start], values[start:]
        logs = np.log(tail / xmin).sum()
        if logs <= 0:
            continue
        alpha = 1 + tail.size / logs
        fitted = 1 - (tail / xmin) ** (1 - alpha)
        distance = float(np.max(np.abs(np.arange(tail.size) / tail.size - fitted)))
        if distance < best.ks_distance:
            best = PowerLawFit(float(alpha), float(xmin), distance)
    return best


def powerlaw_alpha(matrix: np.ndarray) -> float:
    """WeightWatcher's alpha: the power-law exponent of the eigenvalues of ``W^T W`` (squared singular values)."""
    return powerlaw_fit(singular_values(matrix) ** 2).alpha


def condition_number(matrix: np.ndarray) -> float:
    """PEFT KappaTune's condition number ``s_max / (s_min + 1e-8)``, from float64 singular values.

    PEFT takes them in float32 (``torch.linalg.svdvals``): for ill-conditioned matrices its smallest singular value
    carries float32 rounding, so the two agree to ~1e-4 relative, not to the last digit.
    """
    s = singular_values(matrix)
    return float(s[0] / (s[-1] + 1e-8))
