"""The whole drift table of SmolLM2-135M (120 projections): our pipeline (parallel, cached) vs the
straightforward serial script (ripser per matrix + persim Wasserstein); cold and warm cache; and (the
LLaMA-3.1-8B extrapolation is bench_extrapolation.py).

python benchmarks/bench_drift_table.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import ROOT, median_time, publish, table

from topotuner_lab.drift import DriftCache, DriftSettings, drift_between
from topotuner_lab.models import load_model
from topotuner_lab.snapshot import extract_snapshot, load_snapshot, perturb_snapshot


def straightforward(before: dict, after: dict, maxdim: int) -> dict:
    """What a paper's script would do: ripser on each matrix, persim.wasserstein per dimension, serially."""
    import persim
    import ripser

    out = {}
    for pid in before:
        da = ripser.ripser(before[pid], maxdim=maxdim)["dgms"]
        db = ripser.ripser(after[pid], maxdim=maxdim)["dgms"]
        out[pid] = [persim.wasserstein(a[np.isfinite(a[:, 1])], b[np.isfinite(b[:, 1])]) for a, b in zip(da, db)]
    return out


def main() -> None:
    loaded = load_model()
    pre = extract_snapshot(loaded)
    real = ROOT / "runs" / "reproduce-compare" / "prior-sst2" / "after.safetensors"
    post = load_snapshot(real) if real.is_file() else perturb_snapshot(pre, 1e-3)
    label = (
        "SmolLM2-135M vs its SST-2 full fine-tune" if real.is_file() else "SmolLM2-135M vs a 1e-3 random perturbation"
    )
    rows = []
    for maxdim in (0, 1):
        settings = DriftSettings(maxdim=maxdim, orders=(1.0,), bottleneck=False)
        with tempfile.TemporaryDirectory() as tmp:
            cache = DriftCache(Path(tmp))
            start = time.perf_counter()
            table_cold = drift_between(pre.matrices, post.matrices, settings, n_jobs=2, cache=cache)
            cold = time.perf_counter() - start
            warm, table_warm = median_time(
                lambda: drift_between(pre.matrices, post.matrices, settings, n_jobs=2, cache=cache), 3
            )
        start = time.perf_counter()
        naive = straightforward(pre.matrices, post.matrices, maxdim)
        naive_t = time.perf_counter() - start
        col = f"h{maxdim}_w1"
        ours = table_cold.set_index("pid")[col]
        ref = np.array([naive[p][maxdim] for p in ours.index])
        rel = float(np.max(np.abs(ours.values - ref) / np.maximum(ref, 1e-12)))
        rows.append(
            {
                "homology": "H0" if maxdim == 0 else "H0+H1",
                "serial ripser+persim_s": naive_t,
                "ours cold_s": cold,
                "cold speed-up": naive_t / cold,
                "ours warm_s": warm,
                "warm speed-up": naive_t / warm,
                "max rel diff of W1 vs straightforward": rel,
            }
        )
        print(rows[-1], file=sys.stderr)

    md = (
        f"### Whole drift table: {label}, 120 projections, W1 only\n\n"
        "Ours: exact H0 + giotto-ph H1 on one shared distance matrix, POT/exact-H0 Wasserstein, 2 joblib "
        "processes, content-hash cache "
        "(cold = empty cache; warm = median of 3 reruns on the filled cache). Straightforward: ripser.py per "
        "matrix + persim.wasserstein, serial.\n\n" + table(rows)
    )
    publish("drift_table", md, rows)


if __name__ == "__main__":
    main()
