"""One matrix pair's drift values: diagrams (cached per matrix), distances between them, magnitude baselines."""

from __future__ import annotations

from typing import Any

import numpy as np

from topotuner_lab.drift import columns
from topotuner_lab.drift.cache import DriftCache
from topotuner_lab.drift.settings import DriftSettings
from topotuner_lab.topology.distances import bottleneck, wasserstein
from topotuner_lab.topology.magnitude import magnitude_metrics
from topotuner_lab.weights.snapshot import matrix_hash


def pair_values(
    before: np.ndarray,
    after: np.ndarray,
    settings: DriftSettings,
    cache: DriftCache,
    hashes: tuple[str, str] | None = None,
    n_threads: int = 1,
) -> dict[str, Any]:
    """Topological drift and magnitude metrics of one matrix pair (cached by content, not by id)."""
    hash_a, hash_b = hashes or (matrix_hash(before), matrix_hash(after))
    key = cache.row_key(hash_a, hash_b, settings)
    cached = cache.get_row(key, settings.value_columns())
    if cached is not None:
        return cached
    pset = settings.persistence(n_threads)
    dgm_a = cache.diagrams(hash_a, pset, before)
    dgm_b = cache.diagrams(hash_b, pset, after)
    values: dict[str, Any] = {"rows": int(before.shape[0]), "cols": int(before.shape[1])}
    for dim in range(settings.maxdim + 1):
        for p in settings.orders:
            values[columns.wasserstein(dim, p)] = wasserstein(
                dgm_a[dim], dgm_b[dim], p, settings.solver, internal_p=settings.internal_p
            )
        if settings.bottleneck:
            values[columns.bottleneck(dim)] = bottleneck(dgm_a[dim], dgm_b[dim])
        values[columns.diagram_size(dim, "before")] = int(len(dgm_a[dim]))
        values[columns.diagram_size(dim, "after")] = int(len(dgm_b[dim]))
        values[columns.total_persistence(dim)] = float(np.sum(dgm_a[dim][:, 1] - dgm_a[dim][:, 0]))
    if settings.magnitude:
        values.update(magnitude_metrics(before, after))
    cache.put_row(key, values)
    return values
