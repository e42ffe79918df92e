"""The report's figures, exported beside it (HTML, and PNG where Chromium is installed)."""

from __future__ import annotations

from pathlib import Path

from topotuner_lab.lab.plots import drift_heatmaps, save_figure
from topotuner_lab.lab.report.inputs import ModelDrift

HEATMAP_COLUMNS = ["h0_w1", "h1_w1", "rel_frobenius"]


def drift_figure_stem(model: ModelDrift, main: bool, prior: str) -> str:
    """The file stem of one model's drift heatmaps after one prior fine-tune."""
    tag = "" if main else f"{model.work.root.name}_"
    return f"results_drift_{tag}{prior}"


def export_drift_figures(model: ModelDrift, main: bool, folder: Path) -> dict[str, str]:
    """Write the drift heatmaps of each prior into ``folder``; prior -> the PNG path relative to the report."""
    paths = {}
    for prior, table in model.tables.items():
        stem = drift_figure_stem(model, main, prior)
        title = f"{model.name}: drift after the {prior} prior fine-tune"
        save_figure(drift_heatmaps(table, HEATMAP_COLUMNS, title=title), folder / stem)
        paths[prior] = f"{folder.name}/{stem}.png"
    return paths
