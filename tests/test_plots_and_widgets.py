from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import pytest

from topotuner_lab.drift.cache import DriftCache
from topotuner_lab.drift.compute import drift_table
from topotuner_lab.lab import plots
from topotuner_lab.lab.widgets import ProfileBuilder, ProjectionPicker
from topotuner_lab.profiles.apply import identity_of
from topotuner_lab.profiles.card import ProfileCard
from topotuner_lab.topology.persistence import diagrams
from topotuner_lab.weights.snapshot import perturb_snapshot


@pytest.fixture
def table(tiny_snapshot):
    return drift_table(tiny_snapshot, perturb_snapshot(tiny_snapshot, 0.05), n_jobs=1, cache=DriftCache(None))


def test_persistence_diagram_and_barcode(tiny_snapshot):
    before = diagrams(tiny_snapshot.matrices["L0.q"])
    after = diagrams(perturb_snapshot(tiny_snapshot, 0.1).matrices["L0.q"])
    fig = plots.persistence_diagram({"pretrained": before.dgms, "fine-tuned": after.dgms})
    names = [t.name for t in fig.data]
    assert names == ["pretrained H0", "pretrained H1", "fine-tuned H0", "fine-tuned H1", "diagonal"]
    assert len(fig.data[0].x) == 63 and "birth" in fig.data[0].hovertemplate
    bars = plots.barcode(before.dgms)
    assert sum(len(t.x) for t in bars.data) == len(before[0]) + len(before[1])


def test_heatmap_grid_matches_table(table):
    grid = plots.layer_kind_grid(table, "h0_w1")
    assert list(grid.columns) == ["q", "k", "v", "o"] and list(grid.index) == [0, 1]
    assert grid.loc[1, "v"] == table.set_index("pid").loc["L1.v", "h0_w1"]
    fig = plots.drift_heatmaps(table, ["h0_w1", "rel_frobenius"], selected=["L1.v"])
    heat = [t for t in fig.data if isinstance(t, go.Heatmap)]
    assert len(heat) == 2
    np.testing.assert_array_equal(heat[0].z, grid.values)
    corr = plots.rank_correlation(table, ["h0_w1", "h1_w1", "rel_frobenius"])
    assert np.allclose(np.diag(corr.data[0].z), 1)


def test_save_figure_html_is_offline(tmp_path, table):
    files = plots.save_figure(plots.drift_heatmaps(table, ["h0_w1"]), tmp_path / "heat", png=False)
    plots.save_figure(plots.drift_heatmaps(table, ["h1_w1"]), tmp_path / "heat1", png=False)
    html = files[0].read_text()
    assert (
        files == [tmp_path / "heat.html"]
        and '<script src="http' not in html
        and 'src="plotly.min.js"' in html
        and len(html) < 200_000
    )
    js = tmp_path / "plotly.min.js"  # one local copy for every figure in the folder: offline, and no 4.8 MB per figure
    assert js.stat().st_size > 1_000_000 and sorted(p.name for p in tmp_path.iterdir()) == [
        "heat.html",
        "heat1.html",
        "plotly.min.js",
    ]


def test_projection_picker():
    seen = []
    picker = ProjectionPicker(["L0.q", "L0.k", "L1.q", "L1.k"], on_change=seen.append)
    assert picker.pid == "L0.q" and picker.kind.options == ("q", "k")
    picker.layer.value = 1
    picker.kind.value = "k"
    assert picker.pid == "L1.k" and seen[-1] == "L1.k"


def test_profile_builder_follows_controls(table, tiny_llama, tmp_path):
    identity = identity_of(tiny_llama.model, "tiny-llama")
    builder = ProfileBuilder(table, identity, "sst2", tmp_path)
    assert (
        builder.normalization.value == "per-point" and "noise-z" not in builder.normalization.options
    )  # no noise tables given
    builder.normalization.value = "raw"
    builder.mode.value = "count"
    builder.count.value = 3
    assert len(builder.card.trainable) == 3 and builder.card.metric == "h0_w1"
    assert "3</b> trainable" in builder.status.value
    builder.dim.value = 1
    builder.strategy.value = "low-drift"
    expected = set(table.nsmallest(3, "h1_w1").pid)
    assert set(builder.card.trainable) == expected and builder.card.metric == "h1_w1"
    builder.normalization.value = "per-point"
    per_point = table.assign(score=table["h1_w1"] / table["n_h1_before"])
    assert (
        set(builder.card.trainable) == set(per_point.nsmallest(3, "score").pid)
        and builder.card.normalization == "per-point"
    )
    builder.mode.value = "percent"
    builder.percent.value = 0.1  # below one matrix: the error is shown, no card
    assert builder.card is None and "below the smallest projection" in builder.status.value
    builder.percent.value = 5.0
    files = builder.save()
    assert all(f.is_file() for f in files)
    assert ProfileCard.load(files[0]).trainable == builder.card.trainable
    assert "unfrozen_parameters:" in files[2].read_text()


def test_png_export_retries_a_transient_kaleido_failure(tmp_path, monkeypatch):
    calls = []

    def flaky(self, path, **kwargs):
        calls.append(path)
        if len(calls) == 1:
            raise RuntimeError("ReferenceError: kaleido_scopes is not defined")
        Path(path).write_bytes(b"png")

    monkeypatch.setattr(go.Figure, "write_image", flaky)
    with pytest.warns(UserWarning, match="retrying"):
        plots._write_png(go.Figure(), tmp_path / "a.png")
    assert len(calls) == 2 and (tmp_path / "a.png").read_bytes() == b"png"
    monkeypatch.setattr(
        go.Figure, "write_image", lambda self, path, **kw: (_ for _ in ()).throw(RuntimeError("always"))
    )
    with pytest.raises(RuntimeError, match="always"), pytest.warns(UserWarning):
        plots._write_png(go.Figure(), tmp_path / "b.png")
