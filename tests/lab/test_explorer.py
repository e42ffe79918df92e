"""The study explorer (lab.explorer, notebook 8) on the committed cpu-decide ledger, which git keeps without weights."""

import json
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest

from topotuner_lab._io.errors import InputFileError
from topotuner_lab.lab import explorer
from topotuner_lab.lab.notebooks import EXPECTED_FIGURES, run_notebooks
from topotuner_lab.profiles.card import ProfileCard

ROOT = Path(__file__).resolve().parents[2]
LEDGER = ROOT / explorer.DEFAULT_STUDY
COMPETITIVE = "competitive with full fine-tuning"


@pytest.fixture(scope="module")
def study():
    return explorer.open_study(LEDGER)


@pytest.fixture(scope="module")
def csv():
    return pd.read_csv(LEDGER / "results.csv")


def _points(fig):
    """(row label, x) of every marker of a forest plot, over its verdict traces."""
    return [(y, x) for trace in fig.data for y, x in zip(trace.y, trace.x)]


def test_forest_plot_has_one_row_per_paired_claim_at_its_recorded_estimate(study, csv):
    paired = study.claims[study.claims["measure"].str.contains(" - ") & study.claims["low"].notna()]
    points = _points(explorer.claims_figure(study.claims))
    assert len(points) == len(paired) == 8 and len({y for y, _ in points}) == len(points)
    assert sorted(x for _, x in points) == pytest.approx(sorted(paired["estimate"]))
    # the recorded estimate, from results.csv alone: the card's test accuracy minus full FT's, mean over the seeds
    kept = csv[csv["selected"] & (csv["schedule"] == "linear")].groupby("run")["test_acc"].mean()
    competitive = [x for y, x in points if y.startswith(COMPETITIVE)]
    assert competitive == pytest.approx([kept["profile:high-drift@0.01"] - kept["full"]])
    colours = {t.name: t.marker.color for t in explorer.claims_figure(study.claims).data}
    assert colours["held"] != colours["did not hold"]  # the verdict is the colour


def test_the_claim_dropdown_redraws_the_forest_plot(study):
    options = explorer.claim_options(study.claims)
    assert options["target"] == ["all", "sst2"] and options["budget"] == ["all", "0.01"]
    assert COMPETITIVE in options["claim"]
    widget = explorer.ClaimsExplorer(study.claims)
    assert len(_points(widget.figure)) == 8
    widget.claim.value = COMPETITIVE
    points = _points(widget.figure)
    assert len(points) == 1 and points[0][0].startswith(COMPETITIVE)
    assert COMPETITIVE in widget.figure.layout.title.text
    widget.claim.value = "all"
    widget.budget.value = "0.01"
    assert len(_points(widget.figure)) == 8
    assert len(_points(explorer.claims_figure(study.claims, target="boolq"))) == 0


def test_rate_sweep_has_one_point_per_rate_tried_and_rings_the_kept_rate(study, csv):
    sweeps = explorer.rate_sweeps(study)
    swept = csv[(csv["role"] == "sweep") & (csv["schedule"] == "linear")]
    tried = swept.groupby("run")["lr"].apply(lambda s: sorted(set(s)))
    assert sorted(sweeps["run"].unique()) == sorted(tried.index)
    fig = explorer.rate_sweep_figure(sweeps)
    lines = {t.name.split(" (")[0]: t for t in fig.data if t.mode == "lines+markers"}
    for run, rates in tried.items():
        assert sorted(lines[run].x) == pytest.approx(rates)  # e.g. magnitude: its grid plus the extension below
    assert len(lines["profile:magnitude@0.01"].x) == 4 and len(lines["full"].x) == 4
    chosen = csv[csv["selected"]].groupby("run")["lr"].first()
    rings = {t.name.removesuffix(": rate kept"): t for t in fig.data if t.name.endswith(": rate kept")}
    for run, lr in chosen.items():
        assert list(rings[run].x) == pytest.approx([lr])
    row = sweeps[(sweeps["run"] == "full") & np.isclose(sweeps["lr"], 1e-5)].iloc[0]
    assert row["val_acc"] == pytest.approx(
        swept[(swept["run"] == "full") & np.isclose(swept["lr"], 1e-5)]["val_acc"].mean()
    )
    assert row["low"] < row["val_acc"] < row["high"]


def test_epoch_curves_end_at_each_arms_final_accuracy_and_drift_only_where_recorded(study, csv):
    curves = explorer.epoch_curves(study)
    kept = csv[csv["selected"] & (csv["schedule"] == "linear")].groupby("run")["test_acc"].mean()
    last = curves[(curves["series"] == "test_acc") & (curves["epoch"] == 6)].set_index("run")["mean"]
    for run, acc in kept.items():
        assert last[run] == pytest.approx(acc)
    drift = set(curves.loc[curves["series"] == "drift", "run"])
    assert "full" not in drift and "lora@0.01" not in drift and "profile:high-drift@0.01+constant" in drift
    assert (curves.loc[(curves["series"] == "drift") & (curves["epoch"] == 1), "mean"] == 1.0).all()
    fig = explorer.epoch_figure(curves)
    assert [a.text for a in fig.layout.annotations] == [
        "test accuracy",
        "validation accuracy",
        "drift / first-epoch drift",
    ]


def test_stopping_sweep_agrees_with_the_stop_epochs_the_runs_recorded(study, csv):
    sweep = explorer.stopping_sweep(study)
    cards = csv[csv["selected"] & (csv["method"] == "profile") & (csv["schedule"] == "linear")]
    at = sweep[np.isclose(sweep["threshold"], study.inputs.preset.stop_threshold)].iloc[0]
    assert at["runs"] == len(cards) == 20
    assert at["stopped_by_3"] == ((cards["stop_epoch"] <= 3).sum())
    assert list(sweep["threshold"]) == pytest.approx([0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9])
    assert (np.diff(sweep["share"]) >= 0).all()  # a higher threshold never stops later
    fig = explorer.stopping_figure(sweep, study.inputs.preset.stop_threshold)
    assert list(fig.data[0].y) == pytest.approx(list(sweep["share"]))


def test_stability_heatmap_compares_the_prior_seeds_cards_with_a_colour_scale(study):
    pairs = explorer.stability_tables(study)
    assert list(zip(pairs["seed_a"], pairs["seed_b"])) == [(0, 1), (0, 2), (1, 2)]
    ((model, prior), cards) = next(iter(study.inputs.prior_seed_cards.items()))
    saved = ProfileCard.load(LEDGER / "cards" / "agnews-high-drift-0.01.json")  # the card the study trained with
    assert prior == "agnews" and sorted(cards[0].trainable) == sorted(saved.trainable)
    one_two = set(cards[1].trainable), set(cards[2].trainable)
    assert pairs["jaccard"].iloc[2] == pytest.approx(len(one_two[0] & one_two[1]) / len(one_two[0] | one_two[1]))
    heat = explorer.stability_figure(pairs).data[0]
    assert heat.showscale and heat.colorbar.title.text == "Jaccard" and (heat.zmin, heat.zmax) == (0, 1)
    assert np.diag(np.array(heat.z)).tolist() == [1.0, 1.0, 1.0]
    stable = study.claims[study.claims["claim"].str.startswith("a card's picks hold")]
    assert stable["estimate"].tolist() == pytest.approx([pairs["jaccard"].mean()])
    assert stable["threshold"].tolist() == pytest.approx([pairs["noise_jaccard"].iloc[0]])  # the claim's null
    title = explorer.stability_figure(pairs).layout.title.text
    assert f"noise-only cards: {stable['threshold'].iloc[0]:.2f}" in title and "random cards" in title


def test_a_missing_or_non_study_folder_is_a_clear_error(tmp_path):
    with pytest.raises(InputFileError, match="study folder .*nowhere not found") as info:
        explorer.open_study(tmp_path / "nowhere")
    assert "reproduce -o" in info.value.fix
    (tmp_path / "notes.txt").write_text("not a study")
    with pytest.raises(InputFileError, match="holds no study"):
        explorer.open_study(tmp_path)


@pytest.mark.slow
def test_notebook_8_runs_on_the_committed_ledger_and_writes_nothing_into_it(tmp_path):
    before = {p: p.stat().st_mtime_ns for p in LEDGER.rglob("*")}
    (executed,) = run_notebooks("tiny", tmp_path, names=("08_explore_study.ipynb",))
    book = nbformat.read(executed, as_version=4)
    code = [c for c in book.cells if c.cell_type == "code"]
    assert all(c.metadata.papermill.status == "completed" for c in code)
    assert not [o for c in code for o in c.outputs if o.output_type == "error" or o.get("name") == "stderr"]
    widget = [o for c in code for o in c.outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert widget, "the claims explorer is displayed"
    for stem in EXPECTED_FIGURES["08_explore_study.ipynb"]:
        assert (tmp_path / "figures" / f"{stem}.html").is_file()
    assert {p: p.stat().st_mtime_ns for p in LEDGER.rglob("*")} == before
    assert json.loads((LEDGER / "preset.json").read_text())["prior_tasks"] == ["agnews"]
