"""Wasserstein distance between diagrams: our exact H0 route vs POT (gudhi.wasserstein), hera and
persim, on H0 and H1 diagrams of realistic size, with the values checked against each other.

python benchmarks/bench_wasserstein.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys

import gudhi
import numpy as np
from common import median_time, publish, table
from gudhi.hera import bottleneck_distance as hera_bottleneck

from topotuner_lab.topology.distances import bottleneck, h0_wasserstein, wasserstein
from topotuner_lab.topology.persistence import PersistenceSettings, diagrams


def persim_w1(a, b):
    import persim

    return persim.wasserstein(a, b)


def _import_seconds(module: str) -> float:
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def main() -> None:
    rng = np.random.default_rng(0)
    rows = []
    cases = []
    for n in (192, 576, 2048, 4096):
        x = rng.standard_normal((n, 576)) * 0.02
        y = x + rng.standard_normal((n, 576)) * 0.002
        cases.append(
            (
                f"H0, {n - 1} points",
                diagrams(x, PersistenceSettings(maxdim=0))[0],
                diagrams(y, PersistenceSettings(maxdim=0))[0],
                n <= 2048,
            )
        )
    for n in (64, 96, 192, 576, 1024):  # 1024 rows: ~3,000 H1 points, past the auto solver's switch to hera
        x = rng.standard_normal((n, 576)) * 0.02
        y = x + rng.standard_normal((n, 576)) * 0.002
        a, b = diagrams(x)[1], diagrams(y)[1]
        cases.append((f"H1, {len(a)} points", a, b, n <= 576))
    for name, a, b, with_persim in cases:
        h0 = name.startswith("H0")
        pot_t, pot = median_time(lambda: wasserstein(a, b, 1, solver="pot"), 3 if len(a) < 3000 else 1)
        hera_t, hera = median_time(lambda: wasserstein(a, b, 1, solver="hera"), 3)
        row = {"diagrams": name, "POT_s": pot_t, "hera_s": hera_t, "hera_rel_err": abs(hera - pot) / pot}
        if h0:
            ours_t, ours = median_time(lambda: h0_wasserstein(a[:, 1], b[:, 1], 1), 3)
            row.update({"ours_h0_s": ours_t, "POT/ours": pot_t / ours_t, "ours_rel_err": abs(ours - pot) / pot})
        if not h0 and len(a) <= 2000:
            lsa_t, lsa = median_time(lambda: wasserstein(a, b, 1, solver="assignment"), 3)
            row.update(
                {"assignment_s": lsa_t, "POT/assignment": pot_t / lsa_t, "assignment_rel_err": abs(lsa - pot) / pot}
            )
        if with_persim:
            per_t, per = median_time(lambda: persim_w1(a, b), 1)
            row.update({"persim_s": per_t, "persim_rel_err": abs(per - pot) / pot})
        rows.append(row)
        print(row, file=sys.stderr)
    bottleneck_rows = []
    for name, a, b, _ in cases:
        if not name.startswith("H0"):
            continue
        ours_t, ours = median_time(lambda: bottleneck(a, b), 3)
        hera_t, exact = median_time(lambda: hera_bottleneck(a, b, 0), 1)
        cgal_t, cgal = median_time(lambda: gudhi.bottleneck_distance(a, b, 0.0), 1)
        bottleneck_rows.append(
            {
                "diagrams": name,
                "ours_s": ours_t,
                "hera exact_s": hera_t,
                "gudhi_s": cgal_t,
                "hera/ours": hera_t / ours_t,
                "gudhi/ours": cgal_t / ours_t,
                "ours - hera": ours - exact,
                "gudhi - hera": cgal - exact,
            }
        )
        print(bottleneck_rows[-1], file=sys.stderr)
    md = (
        "### Bottleneck between H0 diagrams\n\nOurs: exact O((n+m) log(n+m)) (greedy feasibility + binary search over "
        "float64 values). hera with delta = 0 is exact; `gudhi.bottleneck_distance(a, b, 0.0)` is gudhi's solver.\n\n"
        + table(bottleneck_rows)
        + "\n### W1 between diagrams (Euclidean ground metric; persim's convention)\n\n"
        "Pairs = diagrams of a random row cloud and of a copy with 10% noise. POT is the exact reference; relative "
        "errors are |x - POT| / POT. "
        "persim (Hungarian on an (n+m)^2 matrix) is skipped for the 4096-row H0 case. hera runs with its default "
        "relative error delta = 0.01. `assignment` = SciPy's linear assignment on the (n+m)^2 matching matrix (exact), "
        "what `auto` uses up to 300 points.\n\n" + table(rows)
    )
    imports = [
        {"import": module, "fresh process_s": statistics.median(_import_seconds(module) for _ in range(3))}
        for module in ("gudhi.wasserstein", "scipy.optimize")
    ]
    md += (
        "\n### What a drift worker pays before its first H1 Wasserstein distance\n\n"
        "Import time in a fresh process (median of 3): POT (behind `gudhi.wasserstein`) loads scikit-learn, pandas "
        "and torch; the assignment solver needs only `scipy.optimize`.\n\n" + table(imports)
    )
    publish("wasserstein", md, {"wasserstein": rows, "bottleneck": bottleneck_rows})


if __name__ == "__main__":
    main()
