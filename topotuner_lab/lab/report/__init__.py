"""The Markdown report of a comparison (``docs/RESULTS.md``).

Load what the comparison computed (:mod:`.inputs`), export its figures (:mod:`.figures`), render pure sections
(:mod:`.sections`, their prose in the templates of :mod:`.prose`).
"""

from __future__ import annotations

from pathlib import Path

from topotuner_lab._io import atomic
from topotuner_lab.lab.report import sections
from topotuner_lab.lab.report.figures import (
    export_budget_figure,
    export_claims_figure,
    export_drift_figures,
    export_matrix_figure,
    export_stopping_figure,
)
from topotuner_lab.lab.report.inputs import StudyInputs, load_study


def render(
    study: StudyInputs,
    figures: dict[tuple[str, str], str],
    command: str,
    matrix_figure: str | None = None,
    claims_figure: str | None = None,
    curves_figure: str | None = None,
    stopping_figure: str | None = None,
) -> str:
    """The report's Markdown from loaded inputs and the figure paths (model, prior) -> relative path."""
    results, preset = study.results, study.preset
    parts = [
        sections.header(command, study.machine),
        sections.setup_section(
            preset,
            len(results),
            study.planned_runs,
            results,
            study.test_rows,
            study.val_sources,
            study.looks,
            study.last_sitting_runs,
        ),
        sections.claims_section(study.claims, claims_figure),
        sections.sizing_section(study.sizes, results, preset.margin_share),
        sections.budget_curves_section(study.curves, curves_figure, preset.claim_measure),
        sections.transfer_section(study.transfer_checks),
        sections.transfer_matrix_section(study.matrix, matrix_figure, study.transfer_checks),
        sections.seed_picks_section(study.seed_picks, preset.strategies[0], preset.budgets[0]),
        sections.prior_seed_section(study.prior_seed_cards, preset.strategies[0], study.stability_nulls),
    ]
    if len(results):  # a drift-only comparison (no target task) has no fine-tunes to show
        parts += [
            sections.lr_section(results, preset.rate_criterion),
            sections.spread_section(results),
            sections.stopping_section(results, study.stop_histories, study.stop_rules, stopping_figure),
        ]
    kinds = {}
    for index, model in enumerate(study.models):
        for prior, table in model.tables.items():
            by_kind = sections.drift_by_kind(table)
            kinds[(model.name, prior)] = by_kind["h0_w1_per_row"]
            parts.append(sections.drift_section(model.name, prior, figures[(model.name, prior)], by_kind))
            after = model.facts.finetuned.get(prior)
            parts.append(
                sections.noise_floor_section(
                    model.facts.grid_share, after.grid_share if after else None, table, model.noise, preset.metric
                )
            )
            if index == 0:
                parts.append(sections.normalization_section(table, model.facts.identity, model.noise, preset, prior))
    if len({name for name, _ in kinds}) > 1:
        parts.append(sections.model_family_section(kinds))
    if len(results):
        parts.append(sections.all_runs_section(results))
    return "".join(parts)


def write_report(out_dir: str | Path, target: str | Path, command: str) -> Path:
    """Write the Markdown report for the comparison under ``out_dir`` to ``target`` (figures beside it).

    The text depends on the ledger alone (no date, no weights where their facts are recorded), so the same command
    on a fresh clone writes the same bytes.
    """
    study, target = load_study(out_dir), Path(target)
    figures = {}
    for index, model in enumerate(study.models):
        ranking = (study.preset.metric, study.preset.normalization)
        for prior, path in export_drift_figures(
            model, index == 0, target.parent / "figures", target.stem.lower(), ranking
        ).items():
            figures[(model.name, prior)] = path
    matrix_figure = (
        export_matrix_figure(study.matrix, target.parent / "figures", target.stem.lower())
        if len(study.matrix) > 1
        else None
    )
    claims_figure = export_claims_figure(study.claims, target.parent / "figures", target.stem.lower())
    curves_figure = (
        export_budget_figure(study.curves, target.parent / "figures", target.stem.lower())
        if len(study.curves)
        else None
    )
    stopping_figure = (
        export_stopping_figure(study.stop_sweeps, study.stop_rules, target.parent / "figures", target.stem.lower())
        if len(study.stop_sweeps)
        else None
    )
    atomic.write_text(
        target, render(study, figures, command, matrix_figure, claims_figure, curves_figure, stopping_figure)
    )
    return target
