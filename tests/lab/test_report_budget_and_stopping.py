"""The report's budget curves and its stopping rules compared: which runs each reads and what it shows."""

from __future__ import annotations

import pandas as pd
import pytest

from topotuner_lab.lab.plots import stopping_sweep_figure
from topotuner_lab.lab.report import sections
from topotuner_lab.lab.report.inputs import stop_rules
from topotuner_lab.study.presets import Preset

EPOCHS = 6


def _epochs(plateau: int) -> dict[str, list]:
    """A card run's per-epoch record: accuracy rises 0.05 an epoch until ``plateau``; validation loss bottoms there."""
    acc = [0.60 + 0.05 * min(e, plateau) for e in range(1, EPOCHS + 1)]
    return {
        "drift_history": [{"epoch": e, "normalized": 1.0 / e, "from_pretrained": 2.0 - 0.2 * e} for e in range(1, 7)],
        "epoch_val_logloss": [1.0 - 0.1 * min(e, plateau) + 0.01 * max(e - plateau, 0) for e in range(1, EPOCHS + 1)],
        "epoch_val_accuracy": acc,
        "epoch_test_accuracy": acc,
    }


def _study() -> tuple[pd.DataFrame, dict[str, dict]]:
    """Full FT and a high-drift card on SST-2: sweep seed 100 at two card rates, result seeds 0-2 at the kept one."""
    rows, stored = [], {}

    def run(seed: int, method: str, lr: float, role: str, selected: bool, epochs: dict | None = None) -> None:
        run_dir = f"runs/{method}/{seed}/{lr}"
        strategy, budget = ("high-drift", 0.01) if method == "profile" else (None, None)
        name = "profile:high-drift@0.01" if method == "profile" else "full"
        rows.append(
            dict(prior="agnews", target="sst2", seed=seed, run=name, method=method, strategy=strategy, budget=budget,
                 schedule="linear", recipe="default", lr=lr, role=role, selected=selected, test_acc=0.86,
                 test_acc_before=0.78, run_dir=run_dir)
        )  # fmt: skip
        stored[run_dir] = epochs or {}

    run(100, "profile", 1e-3, "sweep", False, _epochs(plateau=3))  # at the kept rate: calibrates the rules
    run(100, "profile", 1e-2, "sweep", False, _epochs(plateau=1))  # another rate: must not enter the calibration
    for seed in (0, 1, 2):
        run(seed, "profile", 1e-3, "chosen", True, _epochs(plateau=5))
        run(seed, "full", 1e-4, "chosen", True)
    return pd.DataFrame(rows), stored


def test_the_rules_are_calibrated_on_the_sweep_run_at_the_kept_rate_and_judged_on_the_result_seeds():
    results, stored = _study()
    table = stop_rules(results, lambda d, key: stored[d][key], Preset())[0].set_index("rule")
    assert table.loc["fixed epoch", "runs"] == 3  # the result seeds only
    assert table.loc["fixed epoch", "tolerance"] == pytest.approx(0.04)  # half the 0.78 -> 0.86 gain
    # the kept rate's sweep run plateaus at epoch 3: stopping at 2 there loses 0.05 > 0.04, so the rule stops at 3
    assert table.loc["fixed epoch", "parameter"] == 3
    assert table.loc["fixed epoch", "change"] == pytest.approx(-0.10)  # the result runs climb until epoch 5
    assert "distance from pretrained <= eta" in table.index  # the runs recorded the distance


def test_a_rule_whose_signal_no_run_recorded_is_left_out():
    results, stored = _study()
    for record in stored.values():
        for entry in record.get("drift_history", []):
            del entry["from_pretrained"]
    table = stop_rules(results, lambda d, key: stored[d][key], Preset())[0]
    assert "distance from pretrained <= eta" not in set(table["rule"]) and len(table) == 3


def test_the_stopping_section_shows_the_comparison_only_when_there_is_one():
    results, stored = _study()
    results = results.assign(stop_epoch=2, acc_at_stop=0.7, drift_minus_lr_ratio=float("nan"), epochs_run=EPOCHS)
    rules = stop_rules(results, lambda d, key: stored[d][key], Preset())[0]
    text = sections.stopping_section(results, rules=rules)
    assert "Four stopping rules" in text and "| validation-loss patience" in text
    assert "Four stopping rules" not in sections.stopping_section(results)


def test_each_threshold_rule_is_swept_on_the_judged_runs_through_its_calibrated_point():
    results, stored = _study()
    for entry in stored["runs/profile/100/0.001"]["drift_history"]:  # the calibration run moved further
        entry["from_pretrained"] *= 3
    correct = lambda d, key: stored[d][key]  # noqa: E731
    rules, sweeps = stop_rules(results, correct, Preset())
    rules = rules.set_index("rule")
    assert set(sweeps["rule"]) == {"normalized drift below a threshold", "distance from pretrained <= eta"}
    assert (sweeps["runs"] == 3).all()  # the result seeds, as the comparison judges them
    drift = sweeps[sweeps["rule"] == "normalized drift below a threshold"].set_index("parameter")
    calibrated = rules.loc["normalized drift below a threshold"]
    at = drift.loc[calibrated["parameter"]]
    assert (at["change"], at["mean_stop"]) == (calibrated["change"], calibrated["mean_stop"])
    eta = sweeps[sweeps["rule"] == "distance from pretrained <= eta"].sort_values("parameter")
    assert len(eta) == 200 and eta["mean_stop"].is_monotonic_decreasing  # a wider eta never stops later
    calibrated_eta = rules.loc["distance from pretrained <= eta"]
    at_eta = eta[eta["parameter"] == calibrated_eta["parameter"]]  # the grid spans the calibration runs too
    assert len(at_eta) == 1 and at_eta["change"].item() == calibrated_eta["change"]
    fig = stopping_sweep_figure(sweeps, rules.reset_index())
    assert [a.text for a in fig.layout.annotations[:2]] == list(sweeps["rule"].unique())
    assert {shape.x0 for shape in fig.layout.shapes if shape.line.dash == "dash"} >= {calibrated["parameter"]}


def test_the_stopping_section_links_the_sweep_figure_beside_the_comparison():
    results, stored = _study()
    results = results.assign(stop_epoch=2, acc_at_stop=0.7, drift_minus_lr_ratio=float("nan"), epochs_run=EPOCHS)
    rules = stop_rules(results, lambda d, key: stored[d][key], Preset())[0]
    text = sections.stopping_section(results, rules=rules, figure="figures/results_stopping_sweep.png")
    assert "](figures/results_stopping_sweep.png)" in text and "stopping by epoch 3 of 6" in text
    assert "stopping_sweep" not in sections.stopping_section(results, rules=rules)


def test_the_budget_curves_section_lists_every_point_and_links_the_figure():
    curves = pd.DataFrame(
        [
            dict(target="sst2", arm="profile:random@0.0025", curve="random", budget=0.0025, share=0.0024,
                 updated=0.0024, rel_change=0.31, seeds=3, score=0.8, low=0.78, high=0.82),
            dict(target="sst2", arm="full", curve="full", budget=None, share=1.0, updated=0.93, rel_change=0.012,
                 seeds=3, score=0.86, low=0.85, high=0.87),
        ]
    )  # fmt: skip
    text = sections.budget_curves_section(curves, "figures/results_budget_curves.png", "prob")
    assert text.startswith("\n## Budget curves\n")
    assert "![Budget curves](figures/results_budget_curves.png)" in text
    assert "0.800 [0.780, 0.820]" in text and "| full " in text
    assert "mean test score (gold-label probability)" in text
    header = next(line for line in text.splitlines() if line.startswith("| target"))
    assert [c.strip() for c in header.strip("|").split("|")][3:6] == ["Train.%", "Upd.%", "mean rel. change"]
    full = next(line for line in text.splitlines() if line.startswith("| sst2     | full"))
    assert [c.strip() for c in full.strip("|").split("|")][3:6] == ["100", "93", "0.012"]
    assert "Upd.% is the share" in text
    older = curves.assign(updated=float("nan"), rel_change=float("nan"))  # runs that recorded no Upd.%
    assert "Upd.%" not in sections.budget_curves_section(older)
    assert sections.budget_curves_section(pd.DataFrame()) == ""
