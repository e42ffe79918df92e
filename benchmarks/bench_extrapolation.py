"""Extrapolation of the drift-table cost to LLaMA-3.1-8B shapes (32 layers; q/o 4096x4096, k/v
1024x4096) from one measured pair per shape. An extrapolation, not a run on that model.

python benchmarks/bench_extrapolation.py
"""

from __future__ import annotations

import time

import numpy as np
from common import publish, table

from topotuner_lab.topology.distances import wasserstein
from topotuner_lab.topology.persistence import PersistenceSettings, diagrams


def pair_cost(x: np.ndarray, y: np.ndarray, settings: PersistenceSettings) -> tuple[float, int]:
    """Seconds for both diagrams and the W1 distance per dimension (hera for H1), and the size of x's last diagram."""
    start = time.perf_counter()
    a, b = diagrams(x, settings), diagrams(y, settings)
    for dim in range(len(a)):
        wasserstein(a[dim], b[dim], 1, solver="hera" if dim else "auto")
    return time.perf_counter() - start, len(a[-1])


def main() -> None:
    rng = np.random.default_rng(0)
    per_matrix = {}
    for rows_, label_ in ((4096, "q/o 4096x4096"), (1024, "k/v 1024x4096")):
        x = (rng.standard_normal((rows_, 4096)) * 0.02).astype(np.float32)
        y = x + (rng.standard_normal(x.shape) * 0.002).astype(np.float32)
        perm = 1024 if rows_ > 1024 else None
        h0_t, _ = pair_cost(x, y, PersistenceSettings(maxdim=0))
        h1_t, n_h1 = pair_cost(x, y, PersistenceSettings(maxdim=1, n_perm=perm, n_threads=2))
        per_matrix[label_] = (h0_t, h1_t, perm, n_h1)
    extra = []
    total_h0 = 32 * 2 * (per_matrix["q/o 4096x4096"][0] + per_matrix["k/v 1024x4096"][0])
    total_h1 = 32 * 2 * (per_matrix["q/o 4096x4096"][1] + per_matrix["k/v 1024x4096"][1])
    for k, (a, b, perm, n_h1) in per_matrix.items():
        extra.append(
            {
                "matrix": k,
                "H0 pair_s (measured)": a,
                "H0+H1 pair_s (measured)": b,
                "H1 n_perm": perm,
                "H1 pairs per diagram": n_h1,
            }
        )
    md = (
        "### Extrapolation to LLaMA-3.1-8B shapes (an extrapolation, not a run)\n\n"
        "One pair (pretrained, perturbed) per shape measured here on random rows (std 0.02); H1 of the 4096-row "
        "matrices uses n_perm = 1024 "
        "and hera for W1. Serial cost for 32 layers x (2 q/o + 2 k/v) pairs; divide by the worker count for our "
        "parallel pipeline. "
        "Random Gaussian rows in 4096 dimensions are nearly equidistant, the worst case for Rips H1 (thousands of "
        "short H1 bars); "
        "real weights have far fewer (SmolLM2-135M: at most 190 per matrix), so the H0+H1 figure is an upper bound.\n\n"
        + table(extra)
        + f"\nEstimated serial total: H0 {total_h0 / 60:.1f} min, H0+H1 {total_h1 / 60:.1f} min (both snapshots' "
        "diagrams included).\n"
    )
    publish("extrapolation", md, {"llama8b": extra, "total_h0_s": total_h0, "total_h1_s": total_h1})


if __name__ == "__main__":
    main()
