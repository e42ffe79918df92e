"""What a report renders, loaded and checked.

A comparison's results, preset and claims, and each model's drift tables, noise floor and snapshots. Loading never
computes: a table the comparison did not write is left out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from topotuner_lab._io.errors import InputFileError
from topotuner_lab.drift.tables import load_table
from topotuner_lab.study.claims import ClaimResult, claim_results, correct_from
from topotuner_lab.study.plan import with_key_columns
from topotuner_lab.study.presets import Preset
from topotuner_lab.study.workspace import WorkDir
from topotuner_lab.weights.snapshot import Snapshot, load_snapshot


@dataclass
class ModelDrift:
    """One model's drift after each prior fine-tune, with its noise floor and snapshots."""

    work: WorkDir
    pretrained: Snapshot
    tables: dict[str, pd.DataFrame]
    noise: list[pd.DataFrame]
    finetuned: dict[str, Snapshot | None] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The model's name as its snapshot records it."""
        return self.pretrained.model


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


def _preset(recorded: dict[str, Any]) -> tuple[Preset, int | None, str | None]:
    """The preset a comparison recorded, with the planned run count and machine it noted beside it."""
    recorded = dict(recorded)
    planned, machine = recorded.pop("planned_runs", None), recorded.pop("machine", None)
    if recorded.get("constant_lr") is True:  # an early version said ``true`` for every strategy
        recorded["constant_lr"] = recorded["strategies"]
    return Preset.from_dict(recorded), planned, machine


def _model_drift(work: WorkDir, noise_seeds: tuple[int, ...]) -> ModelDrift | None:
    if not work.pretrained.is_file() or not work.drift_tables():
        return None
    tables = {WorkDir.prior_task_of(path): load_table(path) for path in work.drift_tables()}
    noise = [load_table(work.noise_table(seed)) for seed in noise_seeds if work.noise_table(seed).is_file()]
    finetuned = {
        prior: load_snapshot(work.finetuned(prior)) if work.finetuned(prior).is_file() else None for prior in tables
    }
    return ModelDrift(work, load_snapshot(work.pretrained), tables, noise, finetuned)


def load_study(out_dir: str | Path) -> StudyInputs:
    """The comparison under ``out_dir``, loaded and checked (a folder of the earlier protocol is refused)."""
    out = WorkDir(out_dir)
    if not out.results.is_file() or not out.preset.is_file():
        raise InputFileError(
            f"{out.root} holds no comparison (results.csv and preset.json)", "run `topotuner-lab reproduce` first"
        )
    results = pd.read_csv(out.results)
    recorded = json.loads(out.preset.read_text())
    if "selected" not in results.columns or "lr_grid" not in recorded:
        raise InputFileError(
            f"{out.root} holds a comparison of the earlier protocol (no learning-rate selection)",
            "run `topotuner-lab reproduce` into a new folder (-o) to use the tuned protocol",
        )
    results = with_key_columns(results)
    preset, planned, machine = _preset(recorded)
    models = [m for m in (_model_drift(w, preset.noise_seeds) for w in [out, *out.models()]) if m is not None]
    correct = correct_from(out.root)  # one memoized reader of the runs' results: claims, and the test rows scored
    return StudyInputs(
        out.root,
        results,
        preset,
        planned or len(results),
        machine or "machine not recorded",
        claim_results(results, correct),
        models,
        (len(correct(str(results["run_dir"].iloc[0]), "test_correct")) or None) if len(results) else None,
    )
