"""Extrapolation of the drift-table cost to LLaMA-3.1-8B shapes (32 layers; q/o 4096x4096, k/v
1024x4096) from one measured pair per shape. An extrapolation, not a run on that model.

python benchmarks/bench_extrapolation.py
"""

from __future__ import annotations

import numpy as np

from common import dump_json, median_time, save, table
from topotuner_lab.distances import wasserstein
from topotuner_lab.persistence import PersistenceSettings, diagrams


def main() -> None:
    rng = np.random.default_rng(0)
    per_matrix = {}
    for rows_, label_ in ((4096, "q/o 4096x4096"), (1024, "k/v 1024x4096")):
        x = (rng.standard_normal((rows_, 4096)) * 0.02).astype(np.float32)
        y = x + (rng.standard_normal(x.shape) * 0.002).astype(np.float32)
        h0_t, _ = median_time(lambda: [wasserstein(diagrams(m, PersistenceSettings(maxdim=0))[0], diagrams(y, PersistenceSettings(maxdim=0))[0]) for m in (x,)], 1)
        perm = 1024 if rows_ > 1024 else None
        h1_t, _ = median_time(lambda: (lambda a, b: [wasserstein(a[0], b[0]), wasserstein(a[1], b[1], solver="hera")])(
            diagrams(x, PersistenceSettings(maxdim=1, n_perm=perm, n_threads=2)), diagrams(y, PersistenceSettings(maxdim=1, n_perm=perm, n_threads=2))), 1)
        per_matrix[label_] = (h0_t, h1_t, perm)
    extra = []
    total_h0 = 32 * 2 * (per_matrix["q/o 4096x4096"][0] + per_matrix["k/v 1024x4096"][0])
    total_h1 = 32 * 2 * (per_matrix["q/o 4096x4096"][1] + per_matrix["k/v 1024x4096"][1])
    for k, (a, b, perm) in per_matrix.items():
        extra.append({"matrix": k, "H0 pair_s (measured)": a, "H0+H1 pair_s (measured)": b, "H1 n_perm": perm})
    dump_json("extrapolation", {"llama8b": extra, "total_h0_s": total_h0, "total_h1_s": total_h1})
    md = ("### Extrapolation to LLaMA-3.1-8B shapes (an extrapolation, not a run)\n\n"
          "One pair (pretrained, perturbed) per shape measured here on random rows (std 0.02); H1 of the 4096-row matrices uses n_perm = 1024 "
          "and hera for W1. Serial cost for 32 layers x (2 q/o + 2 k/v) pairs; divide by the worker count for our parallel pipeline.\n\n"
          + table(extra)
          + f"\nEstimated serial total: H0 {total_h0 / 60:.1f} min, H0+H1 {total_h1 / 60:.1f} min (both snapshots' diagrams included).\n")
    save("extrapolation", md, "python benchmarks/bench_extrapolation.py")


if __name__ == "__main__":
    main()
