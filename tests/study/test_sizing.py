"""A study's size from its pilot: gains, variance components, the seeds that decide each difference."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from topotuner_lab.study.power import Z95, Design, variance_components
from topotuner_lab.study.sizing import (
    MIN_SEEDS,
    gain,
    minutes_per_finetune,
    planned_seeds,
    power_z,
    seeds_to_decide,
    study_sizes,
)

ARMS = {
    "full": ("full", None),
    "profile-high-drift-0.01": ("profile", "high-drift"),
    "profile-random-0.01": ("profile", "random"),
}


def _pilot(
    n: int = 400, seeds: int = 3, *, seed_sd: float = 0.0, shift: float = 0.0, zero_shot_logloss: bool = True
) -> tuple[pd.DataFrame, dict[str, dict]]:
    """A pilot on one target: per arm and seed, per-example correctness and log-loss with known structure."""
    rng = np.random.default_rng(0)
    base = rng.uniform(0.2, 0.9, n)  # each example's difficulty, shared by every arm (the pairing)
    runs, rows = {}, []
    for seed in range(seeds):
        for run, (method, strategy) in ARMS.items():
            level = {"full": 0.1, "profile-high-drift-0.01": shift, "profile-random-0.01": 0.0}[run]
            p = np.clip(base + level + rng.normal(0, seed_sd), 0, 1)
            correct = (rng.uniform(size=n) < p).astype(int).tolist()
            logloss = (-np.log(np.clip(p, 0.05, 1)) + rng.normal(0, 0.05, n)).tolist()
            run_dir = f"runs/sst2/seed{seed}/{run}"
            runs[run_dir] = {
                "test_correct": correct,
                "test_example_metrics": {"acc": correct, "logloss": logloss},
                "test_correct_before": (rng.uniform(size=n) < base - 0.1).astype(int).tolist(),
                "test_example_metrics_before": {"logloss": (-np.log(np.clip(base - 0.1, 0.05, 1))).tolist()}
                if zero_shot_logloss
                else None,
            }
            rows.append(
                {
                    "prior": "gsm8k",
                    "target": "sst2",
                    "seed": seed,
                    "run": run,
                    "method": method,
                    "strategy": strategy,
                    "budget": 0.01 if strategy else None,
                    "recipe": "default" if strategy else None,
                    "lr": 1e-3,
                    "schedule": "linear",
                    "selected": True,
                    "role": "chosen",
                    "run_dir": run_dir,
                    "wall_sec": 600.0 if method == "full" else 300.0 + seed,
                }  # fmt: skip
            )
    return pd.DataFrame(rows), runs


def _reader(runs: dict[str, dict]):
    return lambda run_dir, key: runs[run_dir][key]


def test_the_gain_is_full_ft_over_zero_shot_on_each_measure():
    results, runs = _pilot()
    read = _reader(runs)
    full = results[results["method"] == "full"]["run_dir"]
    after = np.mean([np.mean(runs[d]["test_correct"]) for d in full])
    before = np.mean(runs[full.iloc[0]]["test_correct_before"])
    assert gain(results, read, "accuracy") == pytest.approx(after - before)
    logprob = np.mean([-np.mean(runs[d]["test_example_metrics"]["logloss"]) for d in full])
    zero = -np.mean(runs[full.iloc[0]]["test_example_metrics_before"]["logloss"])
    assert gain(results, read, "logprob") == pytest.approx(logprob - zero)
    assert gain(results, read, "logprob") > 0
    prob = np.mean([np.mean(np.exp(-np.asarray(runs[d]["test_example_metrics"]["logloss"]))) for d in full])
    zero_prob = np.mean(np.exp(-np.asarray(runs[full.iloc[0]]["test_example_metrics_before"]["logloss"])))
    assert gain(results, read, "prob") == pytest.approx(prob - zero_prob)


def test_every_card_pair_and_every_card_against_full_is_sized_on_every_measure():
    results, runs = _pilot()
    sizes = study_sizes(results, _reader(runs), margin_share=0.25)
    assert set(sizes["measure"]) == {"accuracy", "logprob", "prob"}
    assert set(sizes["comparison"]) == {
        "profile-high-drift-0.01 - profile-random-0.01",
        "profile-high-drift-0.01 - full",
        "profile-random-0.01 - full",
    }
    row = sizes[(sizes["measure"] == "accuracy") & (sizes["comparison"].str.endswith("random-0.01"))].iloc[0]
    assert row["margin"] == pytest.approx(0.25 * row["gain"])
    assert (row["seeds"], row["examples"]) == (3, 400)
    design = variance_components(
        [runs[f"runs/sst2/seed{s}/profile-high-drift-0.01"]["test_correct"] for s in range(3)],
        [runs[f"runs/sst2/seed{s}/profile-random-0.01"]["test_correct"] for s in range(3)],
    )
    assert row["example_sd"] == pytest.approx(np.sqrt(design.example_var))
    assert row["half_width"] == pytest.approx(design.half_width())


def test_a_measure_the_runs_did_not_record_is_left_out():
    results, runs = _pilot(zero_shot_logloss=False)  # older runs: no zero-shot log-loss, so no logprob gain
    sizes = study_sizes(results, _reader(runs))
    assert set(sizes["measure"]) == {"accuracy"}


def test_the_seeds_solve_the_variance_budget_at_the_measured_examples():
    design = Design(seed_var=4e-4, example_var=0.09, seeds=3, examples=1000)
    margin = 0.04
    seeds, examples = seeds_to_decide(design, margin)
    se = margin / (Z95 + power_z())
    assert examples is None
    assert design.seed_var / seeds + design.example_var / 1000 <= se**2  # enough
    assert design.seed_var / (seeds - 1) + design.example_var / 1000 > se**2  # and no more than enough


def test_example_noise_wider_than_the_margin_asks_for_examples_not_seeds():
    design = Design(seed_var=1e-4, example_var=0.25, seeds=3, examples=200)
    seeds, examples = seeds_to_decide(design, 0.02)
    assert seeds is None and examples is not None and examples > 200
    assert seeds_to_decide(design, 0.0) == (None, None)  # no gain, no band: nothing decides


def test_a_zero_difference_is_decided_at_the_planned_size_about_as_often_as_planned():
    """Simulated studies at the planned size land their 95% interval inside the band in about POWER of cases."""
    rng = np.random.default_rng(1)
    seed_sd, example_sd, n, margin = 0.01, 0.1, 500, 0.02
    design = Design(seed_sd**2, example_sd**2, seeds=3, examples=n)
    seeds, _ = seeds_to_decide(design, margin)
    assert seeds is not None
    decided = 0
    trials = 400
    for _ in range(trials):
        example = rng.normal(0, example_sd, n)  # each example's own difference, shared by every seed
        diffs = example[None, :] + rng.normal(0, seed_sd, (seeds, 1)) + rng.normal(0, 0.05, (seeds, n))
        measured = variance_components(diffs, np.zeros_like(diffs))
        half = measured.half_width()
        decided += abs(diffs.mean()) + half <= margin
    assert 0.7 <= decided / trials <= 0.92


def test_planned_seeds_take_the_hardest_card_pair_and_never_fewer_than_the_floor():
    sizes = pd.DataFrame(
        {
            "target": ["sst2", "sst2", "sst2", "boolq"],
            "measure": ["accuracy"] * 4,
            "comparison": ["a - b", "a - c", "a - full", "a - b"],
            "seeds_needed": [14, 23, 90, None],
            "examples_needed": [None, None, None, 9000],
        }  # fmt: skip
    )
    assert planned_seeds(sizes, "accuracy") == {"sst2": 23, "boolq": None}  # full FT's pair does not set it
    small = sizes.assign(seeds_needed=[3, 4, 5, 2])
    assert planned_seeds(small, "accuracy") == {"sst2": MIN_SEEDS, "boolq": MIN_SEEDS}


def test_minutes_per_finetune_are_medians_per_target_and_method():
    results, _ = _pilot(seeds=3)
    minutes = minutes_per_finetune(results)
    assert minutes[("sst2", "full")] == pytest.approx(10.0)
    assert minutes[("sst2", "profile")] == pytest.approx(301 / 60)


def test_planned_hours_price_every_planned_run_once_at_the_pilots_minutes():
    from topotuner_lab.study.plan import plan
    from topotuner_lab.study.presets import get_preset
    from topotuner_lab.study.sizing import planned_hours

    preset = get_preset("cpu-grid-pilot")  # 18 runs: 3 targets x (full + 2 cards) x 2 seeds, one rate each
    methods = ("full", "profile")
    minutes = pd.Series({(t, m): 10.0 if m == "full" else 5.0 for t in preset.target_tasks for m in methods})
    assert len(plan(preset)) == 18
    assert planned_hours(preset, minutes) == pytest.approx((6 * 10 + 12 * 5) / 60)
    only_full = minutes[minutes.index.get_level_values(1) == "full"]  # cards untimed: the target's median stands in
    assert planned_hours(preset, only_full) == pytest.approx(18 * 10 / 60)
    with pytest.raises(KeyError):
        planned_hours(preset, minutes.drop("sst2", level=0))


def test_a_pilots_report_prints_each_difference_and_the_seeds_to_plan():
    from topotuner_lab.lab.report.sections import sizing_section

    results, runs = _pilot()
    sizes = study_sizes(results, _reader(runs), margin_share=0.25)
    text = sizing_section(sizes, results, 0.25)
    assert text.startswith("\n## What the study this pilot plans needs")
    assert text.count("| sst2 ") == len(sizes) == 9  # one row per target, measure (3) and difference (3)
    per_target = planned_seeds(sizes, "accuracy")["sst2"]
    assert f"accuracy: sst2 {per_target if per_target else 'not by seeds'}" in text
    assert "sst2 full 10.0" in text  # median minutes per fine-tune
    assert sizing_section(sizes.iloc[0:0], results, 0.25) == ""  # not a pilot: no section
