"""What a report renders, loaded and checked.

A comparison's results, preset and claims, and each model's drift tables, noise floor and the facts of its weights
(recorded beside the ledger, so a folder restored from git renders without weights). Loading never computes: a table
the comparison did not write is left out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from topotuner_lab._io.errors import InputFileError
from topotuner_lab._io.json_files import read_json
from topotuner_lab.drift.tables import load_table
from topotuner_lab.lab.report import ledger
from topotuner_lab.profiles.card import ProfileCard
from topotuner_lab.profiles.select import CardSettings, build_profile
from topotuner_lab.study.budget_curves import budget_curves
from topotuner_lab.study.cards import prior_seed_dir
from topotuner_lab.study.claims import (
    ClaimResult,
    ClaimRules,
    claim_results,
    competitive_margin,
    interim_labels,
    pilot_labels,
    runs_at_chosen_rate,
    stopping_runs,
    with_holm,
)
from topotuner_lab.study.matrix import transfer_matrix
from topotuner_lab.study.plan import with_key_columns
from topotuner_lab.study.presets import RECIPE_STRATEGIES, Preset
from topotuner_lab.study.sequential import LOOKS_FILE
from topotuner_lab.study.sizing import study_sizes
from topotuner_lab.study.stability import (
    kind_counts,
    model_dependence_claims,
    noise_null,
    stability_claim,
    stability_table,
    value_output_share,
)
from topotuner_lab.study.stopping import THRESHOLD_RULES, EpochRecord, compare_rules, rule_grid, rule_sweep
from topotuner_lab.study.weights_facts import WeightsFacts, weights_facts
from topotuner_lab.study.workspace import WorkDir
from topotuner_lab.training.results import timed_last_sitting_only


@dataclass
class ModelDrift:
    """One model's drift after each prior fine-tune, with its noise floor and the facts of its weights."""

    work: WorkDir
    facts: WeightsFacts
    tables: dict[str, pd.DataFrame]
    noise: list[pd.DataFrame]
    #: prior task -> prior seed -> drift table (default recipe), every prior seed the comparison ran
    seed_tables: dict[str, dict[int, pd.DataFrame]] = field(default_factory=dict)
    #: the noise seed of each table of ``noise``, in order
    noise_seeds: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The model's name as its snapshot records it."""
        return self.facts.model


@dataclass
class StudyInputs:
    """Everything a report shows about one comparison folder."""

    root: Path
    results: pd.DataFrame
    preset: Preset
    planned_runs: int
    machine: str
    claims: list[ClaimResult]
    models: list[ModelDrift]
    test_rows: int | None = None  # test examples a run scored (a split may hold fewer than the preset asks)
    transfer_checks: list[dict[str, Any]] = field(default_factory=list)
    seed_picks: pd.DataFrame = field(default_factory=pd.DataFrame)  # kinds picked per model, prior and prior seed
    #: the card runs at their chosen rate (linear schedule): per run its normalized drift and test accuracy per epoch
    stop_histories: list[tuple[list[float], list[float]]] = field(default_factory=list)
    #: the transfer matrix across task families (:func:`~topotuner_lab.study.matrix.transfer_matrix`)
    matrix: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: (model, prior task) -> prior seed -> the first strategy's card that seed's drift gives (two seeds or more)
    prior_seed_cards: dict[tuple[str, str], dict[int, ProfileCard]] = field(default_factory=dict)
    #: target task -> where its validation rows came from, as its first run recorded it (runs of earlier versions: none)
    val_sources: dict[str, str] = field(default_factory=dict)
    #: (model, prior task) -> the stability's null (:func:`~topotuner_lab.study.stability.noise_null`), where there
    #: are prior seed cards to compare
    stability_nulls: dict[tuple[str, str], pd.DataFrame] = field(default_factory=dict)
    #: a pilot's sizing of the study it plans (:func:`~topotuner_lab.study.sizing.study_sizes`): empty otherwise
    sizes: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: each group-sequential look the study took (``looks.json``: seeds, level, undecided claims, whether it went on)
    looks: list[dict[str, Any]] = field(default_factory=list)
    #: each arm's score against its trainable share (:func:`~topotuner_lab.study.budget_curves.budget_curves`), where
    #: the preset has two budgets or more
    curves: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: the stopping rules compared (:func:`stop_rules`), where card runs scored every epoch
    stop_rules: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: runs whose wall time counts their last sitting alone (resumed from a checkpoint that recorded no earlier time)
    last_sitting_runs: int = 0
    #: the threshold rules over their whole grids on the same runs (:func:`stop_rules`)
    stop_sweeps: pd.DataFrame = field(default_factory=pd.DataFrame)


def _preset(out: WorkDir, recorded: dict[str, Any]) -> tuple[Preset, int | None, str | None]:
    """The preset a comparison recorded, with the planned run count and machine it noted beside it."""
    recorded = dict(recorded)
    planned, machine = recorded.pop("planned_runs", None), recorded.pop("machine", None)
    if recorded.get("constant_lr") is True:  # an early version said ``true`` for every strategy
        recorded["constant_lr"] = recorded["strategies"]
    return ledger.checked_preset(out, recorded), planned, machine


def _model_drift(work: WorkDir, preset: Preset) -> ModelDrift | None:
    if not work.drift_tables():
        return None
    tables = {WorkDir.prior_task_of(path): load_table(path) for path in work.drift_tables()}
    facts = weights_facts(work, list(tables))
    if facts is None:  # a ledger of an earlier version restored from git: tables and results, no weights or facts
        raise InputFileError(
            f"{work.root} holds drift tables but not the pretrained snapshot they were computed from "
            f"({work.pretrained.name}; weights are not kept in git) nor a record of its facts "
            f"({work.weights_facts.name}), so the drift sections cannot be drawn",
            "run the same `topotuner-lab reproduce --preset ... -o` into this folder first: it restores the weights, "
            "records their facts, verifies every table and finished run against them and skips them",
        )
    noise_seeds = [seed for seed in preset.noise_seeds if work.noise_table(seed).is_file()]
    noise = [load_table(work.noise_table(seed)) for seed in noise_seeds]
    seed_tables = {
        prior: {
            seed: load_table(path)
            for seed in preset.prior_seeds
            if (path := prior_seed_dir(work, preset, seed).drift_table(prior)).is_file()
        }
        for prior in tables
    }
    return ModelDrift(work, facts, tables, noise, seed_tables, noise_seeds)


def load_study(out_dir: str | Path) -> StudyInputs:
    """The comparison under ``out_dir``, loaded and checked (a folder of the earlier protocol is refused).

    Its ledger (preset, results table, each run's results, transfer checks) is verified (:mod:`.ledger`) before any
    drift table or snapshot is read.
    """
    out = WorkDir(out_dir)
    if not out.results.is_file() or not out.preset.is_file():
        raise InputFileError(
            f"{out.root} holds no comparison (results.csv and preset.json)", "run `topotuner-lab reproduce` first"
        )
    results, recorded = ledger.read_results_table(out), ledger.read_preset_record(out)
    if "selected" not in results.columns or "lr_grid" not in recorded:
        raise InputFileError(
            f"{out.root} holds a comparison of the earlier protocol (no learning-rate selection)",
            "run `topotuner-lab reproduce` into a new folder (-o) to use the tuned protocol",
        )
    results = with_key_columns(results)
    preset, planned, machine = _preset(out, recorded)
    runs = ledger.verified_runs(out, results, preset, planned)
    transfer_checks = ledger.transfer_records(out, preset)
    models = [m for m in (_model_drift(w, preset) for w in [out, *out.models()]) if m is not None]

    def correct(run_dir: str, key: str) -> Any:  # the verified results: claims, and the test rows scored
        return runs[run_dir][key]  # type: ignore[literal-required]

    rules, sweeps = stop_rules(results, correct, preset) if len(results) else (pd.DataFrame(), pd.DataFrame())
    return StudyInputs(
        out.root,
        results,
        preset,
        planned or len(results),
        machine or "machine not recorded",
        judged_claims(results, correct, models, preset, [look["seeds"] for look in _looks(out)]),
        models,
        (len(correct(str(results["run_dir"].iloc[0]), "test_correct")) or None) if len(results) else None,
        transfer_checks,
        seed_picks(models, preset),
        stop_histories(results, correct) if len(results) else [],
        transfer_matrix(results) if len(results) else pd.DataFrame(),
        {
            (model.name, prior): cards
            for model in models
            for prior in preset.prior_tasks
            if len(cards := seed_cards(model, preset, prior)) > 1
        },
        _val_sources(results, correct) if len(results) else {},
        {
            (model.name, prior): stability_null(model, preset, prior)
            for model in models
            for prior in preset.prior_tasks
            if len(seed_cards(model, preset, prior)) > 1
        },
        (
            study_sizes(results, correct, margin_share=preset.margin_share)
            if preset.pilot and len(results)
            else pd.DataFrame()
        ),
        _looks(out),
        (
            budget_curves(results, correct, preset.claim_measure)
            if len(preset.budgets) > 1 and len(results)
            else pd.DataFrame()
        ),
        rules,
        sum(timed_last_sitting_only(res) for res in runs.values()),
        sweeps,
    )


def _looks(out: WorkDir) -> list[dict[str, Any]]:
    """The looks a group-sequential study recorded (none for a study judged once)."""
    path = out.root / LOOKS_FILE
    if not path.is_file():
        return []
    return read_json(
        path, "the study's record of its looks", "rerun `topotuner-lab reproduce` to rewrite it", kind=list
    )


def judged_claims(
    results: pd.DataFrame,
    correct: Callable[[str, str], Any],
    models: list[ModelDrift],
    preset: Preset,
    looked: Sequence[int] = (),
) -> list[ClaimResult]:
    """Every claim with its role (Holm) and, where it cannot decide, the *pilot* or *interim* label.

    A claim of the runs rests on their training seeds and on the prior seeds behind the card; a claim about the drift
    rankings compares the prior seeds itself (:mod:`~topotuner_lab.study.stability` judges how many it needs).
    ``looked``: the seed counts of the looks a group-sequential study has taken; between them its run claims are
    *interim* (:func:`~topotuner_lab.study.claims.interim_labels`).
    """
    seeds = int(runs_at_chosen_rate(results)["seed"].nunique()) if len(results) else None
    runs = claim_results(results, correct, ClaimRules.of(preset, seeds_run=seeds)) if len(results) else []
    claims = with_holm(runs + drift_claims(models, preset), preset.primary_claim)
    of_runs = pilot_labels(claims[: len(runs)], preset.pilot, seeds=seeds, prior_seeds=len(preset.prior_seeds))
    of_runs = interim_labels(of_runs, preset.seed_blocks, looked, seeds or 0)
    return of_runs + pilot_labels(claims[len(runs) :], preset.pilot)


def _val_sources(results: pd.DataFrame, correct: Callable[[str, str], Any]) -> dict[str, str]:
    """Per target task, the ``val_source`` its first run recorded (none where runs predate the field)."""
    sources = {}
    for target, run_dir in results.groupby("target", sort=False)["run_dir"].first().items():
        try:
            sources[str(target)] = str(correct(str(run_dir), "val_source"))
        except KeyError:
            continue
    return sources


def stop_histories(results: pd.DataFrame, correct: Any) -> list[tuple[list[float], list[float]]]:
    """Per card run at its chosen rate with the linear schedule: normalized drift and test accuracy per epoch."""
    runs = stopping_runs(results)
    runs = runs[runs["schedule"].fillna("linear") == "linear"]
    return [
        ([h["normalized"] for h in correct(run_dir, "drift_history")], list(correct(run_dir, "epoch_test_accuracy")))
        for run_dir in runs["run_dir"]
    ]


def _epoch_record(correct: Any, run_dir: str) -> EpochRecord | None:
    """A run's per-epoch record for the stopping rules; None where it did not score every epoch."""
    try:
        history = correct(run_dir, "drift_history") or []
        val_loss, val, test = (
            list(correct(run_dir, key) or [])
            for key in ("epoch_val_logloss", "epoch_val_accuracy", "epoch_test_accuracy")
        )
    except KeyError:  # a run of a version that recorded no per-epoch validation
        return None
    if not history or not test or not len(val) == len(val_loss) == len(test) == len(history):
        return None
    return EpochRecord(
        [h["normalized"] for h in history], [h.get("from_pretrained") for h in history], val_loss, val, test
    )


def _stop_rule_splits(
    results: pd.DataFrame, correct: Any, preset: Preset
) -> Iterator[tuple[str, list[EpochRecord], list[EpochRecord], int, float]]:
    """Per target: (target, calibration records, result records, epoch budget, the target's competitive margin).

    The calibration runs are the card runs of the sweep (the sweep seeds, or the first seed) at the rate each arm
    kept; the result runs are the other seeds' at that rate (linear schedule, runs that scored every epoch). A
    target with no calibration run or fewer than two result runs is left out.
    """
    cards = results[(results["method"] == "profile") & (results["schedule"].fillna("linear") == "linear")]
    chosen = cards[cards["selected"].astype(bool)]
    rates = chosen.groupby(["target", "run"])["lr"].first()
    at_rate = cards[[rates.get((t, r)) == lr for t, r, lr in zip(cards["target"], cards["run"], cards["lr"])]]
    for target, runs in at_rate.groupby("target", sort=False):
        split = {
            name: [r for d in part["run_dir"] if (r := _epoch_record(correct, str(d))) is not None]
            for name, part in (
                ("calibration", runs[runs["role"] == "sweep"]),
                ("result", runs[runs["role"] != "sweep"]),
            )
        }
        if len(split["calibration"]) < 1 or len(split["result"]) < 2:
            continue
        margin = competitive_margin(runs_at_chosen_rate(results[results["target"] == target]), preset.margin_share)
        budget = max(len(r.test_score) for r in split["result"])
        yield str(target), split["calibration"], split["result"], budget, margin.value


def stop_rules(results: pd.DataFrame, correct: Any, preset: Preset) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per target: the stopping rules compared, and the threshold rules over their whole grids (the figure).

    The comparison: four rules calibrated on the sweep runs at each card's chosen rate, each losing at most the
    target's competitive margin (in accuracy) of the calibration runs' validation score, judged on the rest
    (:func:`_stop_rule_splits` says which runs). A rule whose signal no run recorded (the eta rule before runs kept
    their distance from the pretrained weights) is left out. The sweeps: each threshold rule judged on the same
    result runs over its grid on them joined with its grid on the calibration runs, so the figure's curve passes
    through the comparison's calibrated row.
    """
    compared, swept = [], []
    for target, calibration, result, budget, tolerance in _stop_rule_splits(results, correct, preset):
        table = compare_rules(calibration, result, budget, tolerance)
        recorded = [rule for rule in table["rule"] if rule_grid(rule, calibration, budget)]
        compared.append(table[table["rule"].isin(recorded)].assign(target=target, tolerance=tolerance))
        swept += [
            rule_sweep(result, rule, budget, grid).assign(target=target, tolerance=tolerance)
            for rule in THRESHOLD_RULES
            if (grid := sorted({*rule_grid(rule, calibration, budget), *rule_grid(rule, result, budget)}))
        ]
    return (
        pd.concat(compared, ignore_index=True) if compared else pd.DataFrame(),
        pd.concat(swept, ignore_index=True) if swept else pd.DataFrame(),
    )


def seed_picks(models: list[ModelDrift], preset: Preset) -> pd.DataFrame:
    """Per model, prior task and prior seed: how many matrices of each kind the first strategy's card picks."""
    rows = [
        {
            "model": model.name,
            "prior": prior,
            "prior seed": seed,
            **kind_counts(card),
            "V/O share": value_output_share(card),
        }
        for model in models
        for prior in preset.prior_tasks
        for seed, card in seed_cards(model, preset, prior).items()
    ]
    return pd.DataFrame(rows)


def seed_cards(model: ModelDrift, preset: Preset, prior: str) -> dict[int, ProfileCard]:
    """The first strategy's card at the first budget that each prior seed's drift table would give (not saved)."""
    return _cards(model, preset, prior, model.seed_tables.get(prior, {}))


def stability_null(model: ModelDrift, preset: Preset, prior: str) -> pd.DataFrame:
    """What the prior seeds' cards must beat: the same card built from each noise-only drift table (not saved).

    A noise table is the pretrained weights against a perturbed copy: no fine-tune moved them, so whatever its cards
    share is the agreement a ranking gets from the matrices themselves
    (:func:`~topotuner_lab.study.stability.noise_null`).
    """
    noise_cards = _cards(model, preset, prior, dict(zip(model.noise_seeds, model.noise)))
    return noise_null(seed_cards(model, preset, prior), noise_cards)


def _cards(model: ModelDrift, preset: Preset, prior: str, tables: dict[int, pd.DataFrame]) -> dict[int, ProfileCard]:
    """The first strategy's card at the first budget that each of ``tables`` (by seed) gives."""
    return {
        seed: build_profile(
            table,
            model.facts.identity,
            CardSettings(
                prior_task=prior,
                strategy=preset.strategies[0],
                metric=preset.metric,
                fraction=preset.budgets[0],
                normalization=preset.normalization,
            ),
            noise=model.noise,
        )
        for seed, table in tables.items()
    }


def drift_claims(models: list[ModelDrift], preset: Preset) -> list[ClaimResult]:
    """Claims about the rankings themselves: picks stable across prior seeds; kinds picked per model family."""
    if preset.strategies[0] not in RECIPE_STRATEGIES:
        return []
    claims: list[ClaimResult] = []
    for prior in preset.prior_tasks:
        shares = {}
        for model in models:
            cards = seed_cards(model, preset, prior)
            if len(cards) > 1:
                null = stability_null(model, preset, prior)
                claim = stability_claim(stability_table(cards), f"{model.name}, prior {prior}", null)
                claims += [claim] if claim else []
            if cards:
                shares[model.name] = (model.facts.architecture, [value_output_share(c) for c in cards.values()])
        if len(shares) > 1 and all(len(v) > 1 for _, v in shares.values()):
            claims += model_dependence_claims(shares)
    return claims
