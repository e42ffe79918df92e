"""Rates swept on seeds of their own: the criterion averaged over them, their runs never results."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from topotuner_lab._io.errors import ParameterError
from topotuner_lab.study.claim_ids import ClaimId
from topotuner_lab.study.plan import plan
from topotuner_lab.study.presets import PRESETS
from topotuner_lab.study.protocol import extension, run_study, select_rate

SWEEP = replace(PRESETS["tiny"], sweep_seeds=(100, 101), seeds=(0, 1), other_models=(), constant_lr=())


def test_sweeps_run_first_on_their_own_seeds_and_every_seed_runs_the_chosen_rate():
    specs = plan(SWEEP)
    sweeps = [s for s in specs if s.role == "sweep"]
    assert specs[: len(sweeps)] == sweeps  # every sweep before any result
    assert {s.seed for s in sweeps} == {100, 101} and not {s.seed for s in specs if s.role != "sweep"} & {100, 101}
    arms = {s.key for s in specs}
    assert len(sweeps) == len(arms) * 2 * 2  # each arm: two rates x two sweep seeds
    first = [(s.key, s.lr, s.seed) for s in sweeps[:4]]
    assert first == [(sweeps[0].key, 1e-4, 100), (sweeps[0].key, 1e-4, 101), (sweeps[0].key, 1e-3, 100),
                     (sweeps[0].key, 1e-3, 101)]  # fmt: skip
    chosen = [s for s in specs if s.role == "chosen"]
    assert {(s.seed, s.key) for s in chosen} == {(seed, k) for seed in (0, 1) for k in arms}
    # without sweep seeds the first seed sweeps (the golden tiny preset's plan is unchanged)
    assert {s.seed for s in plan(PRESETS["tiny"]) if s.role == "sweep"} == {0}


def test_the_criterion_is_averaged_over_the_sweep_seeds():
    sweep = [
        (1e-3, {"val_logloss": 0.50}),
        (1e-3, {"val_logloss": 0.90}),  # the single best run is at 1e-3, its mean is not
        (1e-2, {"val_logloss": 0.60}),
        (1e-2, {"val_logloss": 0.70}),
    ]
    assert select_rate(sweep) == 1e-2  # type: ignore[arg-type]
    accuracy = [(1e-3, {"val_accuracy": 0.9}), (1e-3, {"val_accuracy": 0.5}), (1e-2, {"val_accuracy": 0.8})]
    assert select_rate(accuracy) == 1e-2  # type: ignore[arg-type]
    # extension counts rates, not runs: two seeds at the two grid rates are no extension yet
    assert extension(sweep, (1e-3, 1e-2), 1) == 0.1  # type: ignore[arg-type]


def test_rates_can_be_chosen_on_accuracy_where_log_loss_prefers_a_timid_model():
    """After many epochs log-loss can favour a small rate whose accuracy is lower (cpu-decide's full FT sweep)."""
    sweep = [
        (3e-6, {"val_logloss": 0.43, "val_accuracy": 0.83}),
        (1e-5, {"val_logloss": 0.70, "val_accuracy": 0.86}),
        (1e-4, {"val_logloss": 0.78, "val_accuracy": 0.87}),
    ]
    assert select_rate(sweep) == 3e-6  # type: ignore[arg-type]
    assert select_rate(sweep, "accuracy") == 1e-4  # type: ignore[arg-type]
    grid = (3e-6, 1e-5, 1e-4)
    assert extension(sweep, grid, 2) < 3e-6 < 1e-4 < extension(sweep, grid, 2, "accuracy")  # type: ignore[arg-type, operator]
    assert PRESETS["cpu-decide"].rate_criterion == "accuracy"
    with pytest.raises(ParameterError, match="rate_criterion"):
        replace(PRESETS["tiny"], rate_criterion="loss")


def test_sweep_seeds_may_not_be_result_seeds():
    with pytest.raises(ParameterError, match=r"sweep_seeds and seeds share \[1\]"):
        replace(PRESETS["tiny"], sweep_seeds=(1, 7))


@pytest.mark.slow
def test_a_comparison_with_sweep_seeds_keeps_their_runs_out_of_the_results(tmp_path):
    preset = replace(SWEEP, seeds=(0,), strategies=("high-drift",), baselines=(), noise_seeds=(0,), lr_extend=1)
    results = run_study(preset, tmp_path / "out", log=lambda _: None)
    sweep, chosen = results[results["role"] == "sweep"], results[results["role"] == "chosen"]
    assert set(sweep["seed"]) == {100, 101} and not sweep["selected"].any()
    assert list(chosen["seed"]) == [0] and chosen["selected"].all()
    assert (sweep.groupby("lr")["seed"].apply(set) == {100, 101}).all()  # an extension runs on every sweep seed too
    assert sweep["lr"].nunique() == 3  # the grid's best rate lay on an edge: one rate added beyond it
    means = sweep.groupby("lr")["val_logloss"].mean()
    assert chosen["lr"].iloc[0] == means.idxmin()  # the rate with the best mean over the two sweep seeds
    assert isinstance(pd.read_csv(tmp_path / "out" / "results.csv"), pd.DataFrame)


def test_the_decisive_preset_has_separate_sweep_seeds_every_control_and_enough_seeds():
    decide = PRESETS["cpu-decide"]
    assert len(decide.seeds) >= 5 and decide.sweep_seeds and not set(decide.sweep_seeds) & set(decide.seeds)
    assert {"random", "magnitude", "low-drift"} <= set(decide.strategies) and decide.strategies[0] == "high-drift"
    assert decide.target.epochs == 6 and decide.target.eval_each_epoch and decide.target.observe_only
    assert decide.target.n_ood >= 1000 and decide.target.ood_tasks == ("boolq",)  # yes/no, unlike SST-2's words
    assert decide.primary_claim == ClaimId.COMPETITIVE and len(decide.prior_seeds) >= 3
    assert len(decide.noise_seeds) >= 5 and decide.lr_extend >= 1
