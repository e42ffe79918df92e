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
from joblib.externals.loky import get_reusable_executor

from topotuner_lab.drift.cache import DriftCache
from topotuner_lab.drift.compute import drift_between
from topotuner_lab.drift.settings import DriftSettings
from topotuner_lab.weights.extract import extract_snapshot
from topotuner_lab.weights.models import load_model
from topotuner_lab.weights.snapshot import load_snapshot, perturb_snapshot

#: real fine-tunes the benchmark prefers to a random perturbation, when a reproduce run has left one
REAL_FINE_TUNES = ("reproduce-cpu-small/prior-agnews", "reproduce-compare/prior-sst2")


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
    fine_tunes = [ROOT / "runs" / run / "after.safetensors" for run in REAL_FINE_TUNES]
    real = next((path for path in fine_tunes if path.is_file()), None)
    post = load_snapshot(real) if real else perturb_snapshot(pre, 1e-3)
    label = (
        f"SmolLM2-135M vs its fine-tune {real.parent.name}" if real else "SmolLM2-135M vs a 1e-3 random perturbation"
    )
    rows, naive_runs = [], {}
    for maxdim, magnitude in ((0, True), (1, True), (1, False)):
        settings = DriftSettings(maxdim=maxdim, orders=(1.0,), bottleneck=False, magnitude=magnitude)
        with tempfile.TemporaryDirectory() as tmp:
            cache = DriftCache(Path(tmp))
            get_reusable_executor().shutdown(wait=True)  # cold: fresh workers, their start and imports counted
            start = time.perf_counter()
            table_cold = drift_between(pre.matrices, post.matrices, settings, n_jobs=2, cache=cache)
            cold = time.perf_counter() - start
            warm, table_warm = median_time(
                lambda: drift_between(pre.matrices, post.matrices, settings, n_jobs=2, cache=cache), 3
            )
        if maxdim not in naive_runs:  # the serial baseline once per homology dimension
            start = time.perf_counter()
            naive_runs[maxdim] = (straightforward(pre.matrices, post.matrices, maxdim), time.perf_counter() - start)
        naive, naive_t = naive_runs[maxdim]
        col = f"h{maxdim}_w1"
        ours = table_cold.set_index("pid")[col]
        ref = np.array([naive[p][maxdim] for p in ours.index])
        rel = float(np.max(np.abs(ours.values - ref) / np.maximum(ref, 1e-12)))
        rows.append(
            {
                "homology": "H0" if maxdim == 0 else "H0+H1",
                "our table": "W1 + magnitude baselines" if magnitude else "W1 only (as the baseline)",
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
        "Ours: exact H0 + giotto-ph H1 on one shared distance matrix, exact H0 / assignment / POT Wasserstein (the "
        "`auto` solver), 2 joblib "
        "processes, content-hash cache "
        "(cold = empty cache and fresh worker processes, their start and imports counted; warm = median of 3 reruns on "
        "the filled cache). Straightforward: ripser.py per "
        "matrix + persim.wasserstein, serial.\n\n" + table(rows)
    )
    publish("drift_table", md, rows)


if __name__ == "__main__":
    main()
