"""Budget curves: each arm's mean score over seeds and examples, its interval, and its trainable share."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from topotuner_lab.lab.plots import budget_curves_figure
from topotuner_lab.study.budget_curves import budget_curves

SEEDS = (0, 1, 2)
#: arm -> (method, strategy, budget, Train.%, accuracy the arm's runs reach)
ARMS = {
    "full": ("full", None, None, 100.0, 0.86),
    "lora:r16": ("lora", "r16", None, 1.4, 0.84),
    "profile:high-drift@0.0025": ("profile", "high-drift", 0.0025, 0.25, 0.82),
    "profile:high-drift@0.01": ("profile", "high-drift", 0.01, 0.98, 0.85),
    "profile:random@0.0025": ("profile", "random", 0.0025, 0.24, 0.78),
    "profile:random@0.01": ("profile", "random", 0.01, 1.01, 0.84),
}


def _study(examples: int = 400) -> tuple[pd.DataFrame, dict[str, dict]]:
    """A results table of the arms above on one target, and each run's per-example correctness."""
    rng = np.random.default_rng(0)
    rows, stored = [], {}
    for arm, (method, strategy, budget, pct, acc) in ARMS.items():
        for seed in SEEDS:
            run_dir = f"runs/sst2/seed{seed}/{arm}"
            stored[run_dir] = {"test_correct": (rng.random(examples) < acc).astype(int).tolist()}
            if method != "lora":  # LoRA's runs here predate Upd.%
                stored[run_dir] |= {"updated_fraction": pct / 100 + seed / 1000, "update_rel_change": 0.1 + seed}
            rows.append(
                dict(target="sst2", run=arm, seed=seed, run_dir=run_dir, method=method, strategy=strategy,
                     budget=budget, schedule="linear", recipe="default", selected=True, trainable_pct=pct)
            )  # fmt: skip
    return pd.DataFrame(rows), stored


def test_each_arm_is_its_mean_over_seeds_and_examples_with_an_interval_around_it():
    results, stored = _study()
    curves = budget_curves(results, lambda run_dir, key: stored[run_dir][key]).set_index("arm")
    assert list(curves.index) == list(ARMS)
    for arm, (_, _, _, pct, acc) in ARMS.items():
        point = curves.loc[arm]
        runs = [stored[f"runs/sst2/seed{s}/{arm}"]["test_correct"] for s in SEEDS]
        assert point["score"] == pytest.approx(np.mean(runs))
        assert point["low"] < point["score"] < point["high"]
        assert point["score"] == pytest.approx(acc, abs=0.05)
        assert point["share"] == pytest.approx(pct / 100)
        assert point["seeds"] == len(SEEDS)
        if arm == "lora:r16":
            assert np.isnan(point["updated"]) and np.isnan(point["rel_change"])
        else:
            assert point["updated"] == pytest.approx(pct / 100 + 0.001) and point["rel_change"] == pytest.approx(1.1)
    assert curves.loc["profile:random@0.01", "curve"] == "random"
    assert curves.loc["lora:r16", "curve"] == "lora (r16, the paper's)"


def test_the_interval_is_at_least_the_seed_level_one():
    """Seeds that disagree widen the interval beyond what the examples alone give."""
    results, stored = _study()
    for seed, shift in zip(SEEDS, (0, 60, 120)):  # the high-drift card at 1%: one seed far below the others
        correct = stored[f"runs/sst2/seed{seed}/profile:high-drift@0.01"]["test_correct"]
        correct[:shift] = [0] * shift
    curves = budget_curves(results, lambda run_dir, key: stored[run_dir][key]).set_index("arm")
    from scipy.stats import t

    per_seed = [np.mean(stored[f"runs/sst2/seed{s}/profile:high-drift@0.01"]["test_correct"]) for s in SEEDS]
    half = t.ppf(0.975, len(SEEDS) - 1) * np.std(per_seed, ddof=1) / np.sqrt(len(SEEDS))
    point = curves.loc["profile:high-drift@0.01"]
    assert point["high"] - point["low"] >= 2 * half - 1e-12


def test_an_arm_without_the_measure_is_left_out_and_the_figure_draws_one_line_per_strategy():
    results, stored = _study()
    curves = budget_curves(results, lambda run_dir, key: stored[run_dir][key], measure="logprob")
    assert curves.empty  # no run recorded per-example log-loss
    curves = budget_curves(results, lambda run_dir, key: stored[run_dir][key])
    fig = budget_curves_figure(curves)
    by_name = {trace.name: trace for trace in fig.data}
    assert set(by_name) == {"full", "lora (r16, the paper's)", "high-drift", "random"}
    assert by_name["high-drift"].mode == "lines+markers"
    assert list(by_name["high-drift"].x) == pytest.approx([0.25, 0.98])
    assert by_name["full"].mode == "markers"
    assert fig.layout.xaxis.type == "log"
