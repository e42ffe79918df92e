"""The report's figures, exported beside it (HTML, and PNG where Chromium is installed)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from topotuner_lab._io.errors import ProfileError
from topotuner_lab.lab.plots import (
    budget_curves_figure,
    claims_forest,
    drift_heatmaps,
    save_figure,
    stopping_sweep_figure,
    transfer_matrix_heatmap,
)
from topotuner_lab.lab.report.inputs import ModelDrift
from topotuner_lab.profiles.select import normalized_scores
from topotuner_lab.study.claims import ClaimResult, claims_frame, common_level

#: raw columns shown beside the score the cards rank by
HEATMAP_COLUMNS = ["h0_w1", "h1_w1", "rel_frobenius"]


def ranking_column(metric: str, normalization: str) -> str:
    """The heatmap column of the score the cards rank by: ``metric`` under ``normalization``."""
    return f"{metric} {normalization} (ranks the cards)"


def with_ranking_score(
    table: pd.DataFrame, metric: str, normalization: str, noise: list[pd.DataFrame]
) -> tuple[pd.DataFrame, list[str]]:
    """``table`` with the cards' ranking score as a column, and the heatmap's columns (that score first).

    The cards rank by a normalized score (per-point by default), not the raw drift: the figure shows both. A
    normalization the tables cannot give (noise-z without enough noise draws) leaves the raw columns only.
    """
    try:
        scores = normalized_scores(table, metric, normalization, noise)
    except ProfileError:
        return table, HEATMAP_COLUMNS
    column = ranking_column(metric, normalization)
    return table.assign(**{column: table["pid"].map(scores).to_numpy()}), [column, *HEATMAP_COLUMNS]


def drift_figure_stem(model: ModelDrift, main: bool, prior: str, report: str = "results") -> str:
    """The file stem of one model's drift heatmaps after one prior fine-tune, for the report named ``report``."""
    tag = "" if main else f"{model.work.root.name}_"
    return f"{report}_drift_{tag}{prior}"


def export_drift_figures(
    model: ModelDrift,
    main: bool,
    folder: Path,
    report: str = "results",
    ranking: tuple[str, str] = ("h0_w1", "per-point"),
) -> dict[str, str]:
    """Write the drift heatmaps of each prior into ``folder``; prior -> the PNG path relative to the report.

    ``report`` (the report file's stem, lower case) prefixes the files, so reports sharing a figures folder
    (``RESULTS.md``, ``RESULTS-models.md``) never overwrite each other's figures. ``ranking`` (metric,
    normalization) is the score the cards rank by, shown first.
    """
    paths = {}
    for prior, table in model.tables.items():
        stem = drift_figure_stem(model, main, prior, report)
        title = f"{model.name}: drift after the {prior} prior fine-tune"
        shown, columns = with_ranking_score(table, *ranking, model.noise)
        save_figure(drift_heatmaps(shown, columns, title=title), folder / stem)
        paths[prior] = f"{folder.name}/{stem}.png"
    return paths


def export_matrix_figure(matrix: pd.DataFrame, folder: Path, report: str = "results") -> str:
    """Write the transfer matrix heatmaps into ``folder``; the PNG path relative to the report."""
    stem = f"{report}_transfer_matrix"
    save_figure(transfer_matrix_heatmap(matrix), folder / stem)
    return f"{folder.name}/{stem}.png"


def export_claims_figure(claims: list[ClaimResult], folder: Path, report: str = "results") -> str | None:
    """Write the forest plot of the paired claims into ``folder``; its PNG path relative to the report (None: none)."""
    paired = [c for c in claims if " - " in c.measure and c.low is not None]
    if not paired:
        return None
    stem = f"{report}_claims"
    common = common_level(paired)
    title = f"Claims: estimate and {common} interval" if common else "Claims: estimate and interval (levels differ)"
    save_figure(claims_forest(claims_frame(paired), title), folder / stem)
    return f"{folder.name}/{stem}.png"


def export_budget_figure(curves: pd.DataFrame, folder: Path, report: str = "results") -> str:
    """Write the budget curves (score against Train.%) into ``folder``; the PNG path relative to the report."""
    stem = f"{report}_budget_curves"
    save_figure(budget_curves_figure(curves), folder / stem)
    return f"{folder.name}/{stem}.png"


def export_stopping_figure(
    sweeps: pd.DataFrame, calibrated: pd.DataFrame, folder: Path, report: str = "results"
) -> str:
    """Write the threshold rules' sweeps (score and stopping share per threshold) into ``folder``; the PNG path."""
    stem = f"{report}_stopping_sweep"
    save_figure(stopping_sweep_figure(sweeps, calibrated), folder / stem)
    return f"{folder.name}/{stem}.png"
