import threading
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from topotuner_lab._io.errors import ParameterError, ProfileError, TaskError, TopoTunerError
from topotuner_lab.drift.cache import DriftCache
from topotuner_lab.drift.compute import drift_table
from topotuner_lab.drift.settings import DriftSettings
from topotuner_lab.lab import plots, workbench
from topotuner_lab.lab.widgets import (
    ProfileBuilder,
    ProjectionPicker,
    card_scores,
    selector_columns,
    table_recipe,
    task_picker,
)
from topotuner_lab.profiles.apply import identity_of
from topotuner_lab.profiles.card import ProfileCard
from topotuner_lab.profiles.select import CardSettings, build_profile
from topotuner_lab.study.workspace import WorkDir
from topotuner_lab.tasks.registry import TASKS
from topotuner_lab.topology.persistence import diagrams
from topotuner_lab.training.transfer import CLOSE, TransferCheck
from topotuner_lab.weights.snapshot import perturb_snapshot, save_snapshot


@pytest.fixture
def table(tiny_snapshot):
    return drift_table(tiny_snapshot, perturb_snapshot(tiny_snapshot, 0.05), n_jobs=1, cache=DriftCache(None))


def test_persistence_diagram_and_barcode(tiny_snapshot):
    before = diagrams(tiny_snapshot.matrices["L0.q"])
    after = diagrams(perturb_snapshot(tiny_snapshot, 0.1).matrices["L0.q"])
    fig = plots.persistence_diagram({"pretrained": before.dgms, "fine-tuned": after.dgms})
    names = [t.name for t in fig.data]
    assert names == ["pretrained H0", "pretrained H1", "diagonal", "fine-tuned H0", "fine-tuned H1", "diagonal"]
    axes = [(t.xaxis, t.yaxis) for t in fig.data]  # side by side, not overlaid: drift is the move between panels
    assert axes[0] == axes[1] == axes[2] == ("x", "y") and axes[3] == axes[4] == ("x2", "y2")
    assert fig.layout.xaxis.range == fig.layout.xaxis2.range and fig.layout.yaxis.range == fig.layout.yaxis2.range
    assert [t.showlegend for t in fig.data if t.name == "diagonal"] == [True, False]  # one legend entry each
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


def test_a_figure_saved_twice_writes_the_same_bytes(tmp_path, table):
    """A regenerated report must not differ from the committed one by plotly's fresh random div id."""
    first = plots.save_figure(plots.drift_heatmaps(table, ["h0_w1"]), tmp_path / "a" / "heat", png=False)[0]
    again = plots.save_figure(plots.drift_heatmaps(table, ["h0_w1"]), tmp_path / "b" / "heat", png=False)[0]
    assert first.read_bytes() == again.read_bytes() and 'id="heat"' in first.read_text()


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
    builder.mode.value = "fraction"
    builder.fraction.value = 0.001  # below one matrix: the error is shown, no card
    assert builder.card is None and "below the smallest projection" in builder.error.value
    builder.fraction.value = 0.05
    files = builder.save()
    assert all(f.is_file() for f in files)
    assert ProfileCard.load(files[0]).trainable == builder.card.trainable
    assert "unfrozen_parameters:" in files[2].read_text()


def _heat(builder):
    return [t for t in builder.plot.data if isinstance(t, go.Heatmap)]


def test_profile_builder_colours_by_the_score_that_ranks(table, tiny_llama, tmp_path):
    identity = identity_of(tiny_llama.model, "tiny-llama")
    builder = ProfileBuilder(table, identity, "sst2", tmp_path)
    builder.mode.value, builder.count.value = "count", 3
    card = builder.card
    assert card.normalization == "per-point" and card.metric == "h0_w1"
    per_point = table.assign(score=table["h0_w1"] / table["n_h0_before"])
    (heat,) = _heat(builder)
    np.testing.assert_allclose(np.asarray(heat.z, float), plots.layer_kind_grid(per_point, "score").values)
    assert not np.allclose(np.asarray(heat.z, float), plots.layer_kind_grid(table, "h0_w1").values)  # not raw W1
    assert heat.showscale is not False and heat.colorbar.x is not None  # a colour bar
    assert "h0_w1 (per-point)" in heat.hovertemplate and "%{z" in heat.hovertemplate
    picks = per_point.nlargest(3, "score")
    assert set(picks.pid) == set(card.trainable)  # the outlined cells hold the highest colour values
    (marks,) = [t for t in builder.plot.data if isinstance(t, go.Scatter)]
    values = dict(zip(zip(marks.x, marks.y), marks.customdata))  # a selected cell's hover shows its value too
    for pid, score in zip(picks.pid, picks.score):
        layer, kind = int(pid.split(".")[0][1:]), pid.split(".")[1]
        assert np.isclose(values[(kind, layer)], score)
    assert "%{customdata" in marks.hovertemplate
    builder.strategy.value = "low-drift"
    assert "lowest" in builder.plot.layout.title.text and set(builder.card.trainable) == set(
        per_point.nsmallest(3, "score").pid
    )


def test_profile_builder_runs_every_offered_strategy_or_shows_why(table, tiny_snapshot, tiny_llama, tmp_path):
    identity = identity_of(tiny_llama.model, "tiny-llama")
    after = perturb_snapshot(tiny_snapshot, 0.05)
    loads = []
    pair = lambda: loads.append(1) or (tiny_snapshot, after)
    builder = ProfileBuilder(table, identity, "sst2", tmp_path, selectors=selector_columns(pair))
    builder.mode.value, builder.count.value = "count", 3
    offered = builder.strategy.options
    assert {"snr", "alpha", "kappa", "relchange"} <= set(offered) and "gradient" not in offered  # no target task
    assert loads == []  # nothing computed before a selector is picked
    for strategy in offered:
        builder.strategy.value = strategy
        if builder.card is None:
            assert builder.error.value, strategy  # the error is in the widget
            assert not _heat(builder)  # and the figure no longer shows the previous strategy
            continue
        assert builder.card.strategy == strategy and builder.error.value == "", strategy
        scores = card_scores(builder.card)
        (heat,) = _heat(builder)
        expected = plots.layer_kind_grid(table.assign(s=table["pid"].map(scores)), "s").values
        np.testing.assert_allclose(np.asarray(heat.z, float), expected, err_msg=strategy)
    assert loads == [1]  # the snapshots were read once
    built = {s for s in offered if (builder.strategy.__setattr__("value", s), builder.card)[1] is not None}
    assert {"snr", "alpha", "kappa", "relchange", "magnitude", "random", "high-drift"} <= built
    plain = ProfileBuilder(table, identity, "sst2", tmp_path)  # no snapshots: only what the table can rank
    assert "snr" not in plain.strategy.options and "magnitude" in plain.strategy.options


def test_profile_builder_shows_a_failing_strategy_and_a_failing_save(table, tiny_llama, tmp_path):
    identity = identity_of(tiny_llama.model, "tiny-llama")

    def broken(_table):
        raise ProfileError("the spectra could not be computed", "check the snapshot")

    builder = ProfileBuilder(table, identity, "sst2", tmp_path, selectors={"snr": broken})
    builder.mode.value, builder.count.value = "count", 2
    assert _heat(builder)
    builder.strategy.value = "snr"
    assert builder.card is None and "the spectra could not be computed" in builder.error.value
    assert not _heat(builder) and "no selection" in builder.plot.layout.title.text
    builder.save_button.click()  # Save with nothing to save: the error shows, nothing is written, nothing raised
    assert "no valid profile is selected" in builder.error.value and not list(tmp_path.glob("*.json"))
    builder.strategy.value = "high-drift"  # a working strategy clears the error
    assert builder.card is not None and builder.error.value == "" and _heat(builder)
    builder.save_button.click()
    assert list(tmp_path.glob("sst2-high-drift-*.json")) and "saved" in builder.status.value


def test_explorers_redraw_live_and_read_as_a_line_without_a_kernel(tiny_snapshot, table):
    from topotuner_lab.lab.widgets import drift_explorer, persistence_explorer

    explorer = persistence_explorer(tiny_snapshot, perturb_snapshot(tiny_snapshot, 0.1), 1, "k")
    picker, diagram, _bars = explorer.children
    assert diagram.layout.title.text == "L1.k: persistence diagram"
    picker.layer.value = 0
    assert diagram.layout.title.text == "L0.k: persistence diagram"
    assert explorer._repr_mimebundle_()["text/plain"] == "[interactive Panel: run the notebook to use it]"
    drift = drift_explorer(table, ["h0_w1", "h1_w1"])
    column, view = drift.children
    column.value = "h1_w1"
    assert [a.text for a in view.layout.annotations] == ["h1_w1", "rel_frobenius"]


def test_a_figure_widget_updated_before_it_shows_syncs_its_figure(table):
    """A browser view created after the update draws from the synced state, not from the (missed) update messages."""
    widget = go.FigureWidget()
    fig = plots.drift_heatmaps(table, ["h0_w1"], selected=["L1.v"])
    plots.update_figure_widget(widget, fig)
    assert [t["type"] for t in widget._widget_data] == ["heatmap", "scatter"]
    assert widget._widget_layout["title"]["text"] == fig.layout.title.text


def _drawn_on_open(view: go.FigureWidget) -> dict:
    """The figure a browser view opened now would draw: the widget's synced state, not its Python-side figure."""
    state = view.get_state()
    return {"types": [t["type"] for t in state["_widget_data"]], "layout": state["_widget_layout"]}


def test_live_widgets_send_their_current_figure_to_a_view_opened_later(table, tiny_snapshot, tiny_llama, tmp_path):
    """Each live widget's figure reaches a view opened after it changed (JupyterLab opens it after the cell ran).

    Its update messages reach only views already open, so the figure must be in the state a new view draws from.
    """
    from topotuner_lab.lab.widgets import drift_explorer, persistence_explorer

    builder = ProfileBuilder(table, identity_of(tiny_llama.model, "tiny-llama"), "sst2", tmp_path)
    builder.mode.value, builder.count.value = "count", 3
    builder.strategy.value = "magnitude"
    drawn = _drawn_on_open(builder.plot)
    assert drawn["layout"]["title"]["text"].startswith("magnitude selection")
    assert drawn["types"] == [t.type for t in builder.plot.data] and "heatmap" in drawn["types"]
    _picker, diagram, bars = persistence_explorer(tiny_snapshot, perturb_snapshot(tiny_snapshot, 0.1), 1, "k").children
    assert _drawn_on_open(diagram)["layout"]["title"]["text"] == "L1.k: persistence diagram"
    assert _drawn_on_open(bars)["types"] and len(_drawn_on_open(diagram)["types"]) == len(diagram.data)
    column, view = drift_explorer(table, ["h0_w1", "h1_w1"]).children
    column.value = "h1_w1"
    assert [a["text"] for a in _drawn_on_open(view)["layout"]["annotations"]] == ["h1_w1", "rel_frobenius"]


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


def test_a_png_export_that_never_returns_is_abandoned_and_retried(tmp_path, monkeypatch):
    never = threading.Event()  # a browser that stopped answering: the first export waits on it
    calls = []

    def hangs_once(self, path, **kwargs):
        calls.append(path)
        if len(calls) == 1:
            never.wait()
        Path(path).write_bytes(b"png")

    monkeypatch.setattr(go.Figure, "write_image", hangs_once)
    try:
        with pytest.warns(UserWarning, match=r"retrying \(1/3\)"):
            plots._write_png(go.Figure(), tmp_path / "a.png", timeout=1.0)
        assert len(calls) == 2 and (tmp_path / "a.png").read_bytes() == b"png"
        monkeypatch.setattr(go.Figure, "write_image", lambda self, path, **kw: never.wait())
        with pytest.raises(TopoTunerError, match=r"b.png: the PNG export did not finish in 1 s in any of 3 tries"):
            with pytest.warns(UserWarning):
                plots._write_png(go.Figure(), tmp_path / "b.png", timeout=1.0)
    finally:
        never.set()  # let the abandoned exports end


def test_rank_agreement_heatmap_is_square_annotated_and_fixed_to_minus_one_one():
    names = ["high-drift", "low-drift", "magnitude", "snr"]
    values = np.array(
        [[1.0, -0.8, 0.35, np.nan], [-0.8, 1.0, -0.2, 0.1], [0.35, -0.2, 1.0, 0.05], [np.nan, 0.1, 0.05, 1.0]]
    )
    fig = plots.rank_agreement_heatmap(pd.DataFrame(values, index=names, columns=names))
    (heat,) = fig.data
    assert isinstance(heat, go.Heatmap) and list(heat.x) == names and list(heat.y) == names
    assert (heat.zmin, heat.zmax, heat.zmid) == (-1, 1, 0)
    scale = [c for _, c in heat.colorscale]
    assert scale[0] != scale[-1] and len(scale) > 2  # diverging: two ends, a middle
    np.testing.assert_array_equal(np.asarray(heat.z, dtype=float), values)
    assert heat.text[0][1] == "-0.80" and heat.text[1][3] == "0.10" and heat.text[0][3] == ""  # NaN left blank
    assert heat.texttemplate == "%{text}" and fig.layout.yaxis.autorange == "reversed"  # reads like the table
    with pytest.raises(ValueError, match="square"):
        plots.rank_agreement_heatmap(pd.DataFrame(values[:, :3], index=names, columns=names[:3]))


def test_transfer_gradients_marks_the_card_picks():
    pids = ["L0.q", "L0.k", "L0.v", "L0.o", "L1.q", "L1.k", "L1.v", "L1.o"]
    table = pd.DataFrame(
        {
            "pid": pids,
            "cosine": [0.9, 0.1, -0.3, 0.7, 0.8, 0.2, 0.6, -0.1],
            "grad_prior": np.linspace(0.1, 0.8, 8),
            "grad_target": np.linspace(0.8, 0.1, 8),
            "in_card": [True, False, False, True, True, False, False, False],
        }
    )
    check = TransferCheck("sst2", "agnews", table, 0.8, 0.4, 0.5, 2 / 3)
    fig = plots.transfer_gradients(check)
    heat = next(t for t in fig.data if isinstance(t, go.Heatmap))
    grid = np.asarray(heat.z, dtype=float)
    assert list(heat.x) == ["q", "k", "v", "o"] and list(heat.y) == [0, 1] and (heat.zmin, heat.zmax) == (-1, 1)
    assert grid[1, 2] == 0.6 and grid[0, 2] == -0.3  # L1.v, L0.v
    picks = next(t for t in fig.data if isinstance(t, go.Scatter))
    assert sorted(zip(picks.y, picks.x)) == [(0, "o"), (0, "q"), (1, "q")]
    boxes = {t.name: sorted(t.y) for t in fig.data if isinstance(t, go.Box)}
    assert boxes == {"card's picks": [0.7, 0.8, 0.9], "other matrices": [-0.3, -0.1, 0.1, 0.2, 0.6]}
    assert any(shape.y0 == CLOSE for shape in fig.layout.shapes) and "sst2 -> agnews" in fig.layout.title.text


@pytest.fixture
def recipe_tables(tiny_snapshot):
    """A drift source over the tiny model: each recipe's table (pretrained vs a perturbed copy), five noise tables."""
    after = perturb_snapshot(tiny_snapshot, 0.05)
    calls = []

    def source(name):
        calls.append(name)
        settings = DriftSettings.recipe(name)
        table = drift_table(tiny_snapshot, after, settings, n_jobs=1, cache=DriftCache(None))
        noise = [
            drift_table(tiny_snapshot, perturb_snapshot(tiny_snapshot, 0.01, seed), settings, n_jobs=1)
            for seed in range(5)
        ]
        return table, noise

    source.calls = calls
    return source


def test_profile_builder_offers_the_drift_recipe(recipe_tables, tiny_llama, tmp_path):
    identity = identity_of(tiny_llama.model, "tiny-llama")
    builder = ProfileBuilder(None, identity, "sst2", tmp_path, drift=recipe_tables)
    assert builder.recipe.options == ("default", "reference") and builder.recipe.value == "default"
    assert not builder.recipe.disabled and recipe_tables.calls == ["default"]
    assert builder.dim.options == (0, 1) and builder.order.options == ("1", "2", "bottleneck")
    assert "noise-z" in builder.normalization.options  # the source gave five noise tables (MIN_NOISE_DRAWS)
    builder.mode.value, builder.count.value = "count", 3
    builder.dim.value, builder.order.value, builder.normalization.value = 1, "2", "noise-z"
    assert builder.card.metric == "h1_w2" and builder.card.normalization == "noise-z"

    builder.recipe.value = "reference"  # H0 only, W1 only: the controls follow the table
    assert recipe_tables.calls == ["default", "reference"] and table_recipe(builder.table) == "reference"
    assert builder.dim.options == (0,) and builder.order.options == ("1",)
    assert builder.card.metric == "h0_w1" and builder.card.normalization == "noise-z"  # kept where offered
    assert DriftSettings.from_key(builder.card.drift_settings).recipe_name == "reference"
    assert "cosine distance between rows, H0" in builder.recipe_info.value
    expected = build_profile(
        builder.table, identity, CardSettings(prior_task="sst2", count=3, normalization="noise-z"), noise=builder.noise
    )
    assert builder.card.trainable == expected.trainable and "3</b> trainable" in builder.status.value
    assert builder.save()[0].name == "sst2-high-drift-3m-reference.json"

    builder.use_recipe("default")  # back: the lab's table, dimension 0 (kept), all orders offered again
    assert table_recipe(builder.table) == "default" and builder.order.options == ("1", "2", "bottleneck")
    assert builder.card.drift_settings == DriftSettings().key()


def test_profile_builder_recipe_errors(recipe_tables, table, tiny_llama, tmp_path):
    identity = identity_of(tiny_llama.model, "tiny-llama")
    fixed = ProfileBuilder(table, identity, "sst2", tmp_path)  # a table, no source: its recipe, fixed
    assert fixed.recipe.value == "default" and fixed.recipe.disabled
    with pytest.raises(ProfileError, match="no drift source"):
        fixed.use_recipe("reference")
    with pytest.raises(ProfileError, match="needs a drift table or a drift source"):
        ProfileBuilder(None, identity, "sst2", tmp_path)
    with pytest.raises(ParameterError, match="unknown drift recipe"):
        ProfileBuilder(None, identity, "sst2", tmp_path, drift=recipe_tables, recipe="authors")

    def failing(name):
        if name == "reference":
            raise ParameterError("the reference table could not be computed", "try again")
        return recipe_tables(name)

    builder = ProfileBuilder(None, identity, "sst2", tmp_path, drift=failing)
    before = builder.card
    builder.recipe.value = "reference"  # the error is shown; the table in use stays, and so does the dropdown
    assert builder.recipe.value == "default" and table_recipe(builder.table) == "default"
    assert "could not be computed" in builder.error.value and builder.card == before


def test_drift_source_keeps_each_recipe_in_its_own_folder(tiny_snapshot, tmp_path):
    work = WorkDir(tmp_path / "work")
    save_snapshot(tiny_snapshot, work.pretrained)
    save_snapshot(perturb_snapshot(tiny_snapshot, 0.05), work.finetuned("sst2"))
    source = workbench.drift_source(work.root, "sst2")
    default, noise = source("default")
    reference, _ = source("reference")
    assert workbench.recipe_work(work.root) == work and len(noise) == len(workbench.NOISE_SEEDS)
    assert work.drift_tables() == [work.drift_table("sst2")]  # the folder's drift tables stay the default recipe's
    folder = workbench.recipe_work(work.root, "reference")
    assert folder.drift_table("sst2").is_file() and folder.noise_table(1).is_file()
    assert table_recipe(default) == "default" and table_recipe(reference) == "reference"
    assert "h1_w1" in default and "h1_w1" not in reference
    with pytest.raises(ParameterError, match="unknown drift recipe"):
        workbench.recipe_work(work.root, "authors")


def _agreement(values):
    names = ["high-drift", "low-drift", "magnitude", "snr", "alpha", "kappa"]
    matrix = pd.DataFrame(np.eye(6), index=names, columns=names)
    for other, value in {"low-drift": -1.0, **values}.items():
        matrix.loc["high-drift", other] = matrix.loc[other, "high-drift"] = value
    return matrix


def test_agreement_sentence_reads_the_matrix():
    matrix = _agreement({"magnitude": 0.26, "snr": 0.38, "alpha": -0.05, "kappa": 0.17})
    sentence = workbench.agreement_sentence(matrix)
    assert "agrees most with snr (Spearman rho +0.38) and least with alpha (-0.05)" in sentence
    assert "moderate, with snr (+0.38): topology partly picks as snr would" in sentence  # low-drift (-1) left out
    matrix.loc["high-drift", "alpha"] = matrix.loc["alpha", "high-drift"] = -0.8
    assert "strong, with alpha (-0.80): topology largely picks the opposite of alpha" in workbench.agreement_sentence(
        matrix
    )
    matrix.loc[["magnitude", "snr", "alpha", "kappa"], "high-drift"] = [0.1, -0.2, 0.05, np.nan]  # NaN: no ranking
    assert "weak, with snr (-0.20): topology ranks the matrices in an order of its own" in workbench.agreement_sentence(
        matrix
    )


@pytest.mark.parametrize(
    "values",
    [
        {"magnitude": 0.12, "snr": -0.1, "alpha": -0.2996, "kappa": 0.23},  # the least agreeing is the strongest
        {"magnitude": 0.71, "snr": -0.69, "alpha": 0.0, "kappa": 0.3},
        {"magnitude": -0.05, "snr": 0.04, "alpha": 0.02, "kappa": -0.01},
    ],
)
def test_agreement_sentence_states_the_numbers_it_reads(values):
    """Every number the sentence prints is the value of the selector it names, and its words follow that number."""
    import re

    sentence = workbench.agreement_sentence(_agreement(values))
    named = dict(re.findall(r"(\w[\w-]*) \((?:Spearman rho )?([+-]\d\.\d\d)\)", sentence))
    assert len(named) >= 2, sentence
    for selector, printed in named.items():
        assert float(printed) == round(values[selector], 2), (selector, sentence)
    best, worst = max(values, key=values.get), min(values, key=values.get)
    assert f"agrees most with {best} " in sentence and f"least with {worst} " in sentence
    closest = max(values, key=lambda k: abs(round(values[k], 2)))
    strength = re.search(r"either way is (\w+), with (\S+) ", sentence)
    printed = abs(round(values[closest], 2))
    assert strength.group(2) == closest
    assert strength.group(1) == ("strong" if printed >= 0.7 else "moderate" if printed >= 0.3 else "weak")


def test_noise_ratios_are_the_numbers_the_noise_check_prints(tiny_snapshot, tmp_path):
    work = WorkDir(tmp_path / "work")
    save_snapshot(tiny_snapshot, work.pretrained)
    save_snapshot(perturb_snapshot(tiny_snapshot, 0.05), work.finetuned("sst2"))
    table, noise = workbench.drift_source(work.root, "sst2")("default")
    ratios = workbench.noise_ratios(work.root, "sst2", ["h0_w1", "rel_frobenius"])
    check = workbench.check_noise(work.root, "sst2")
    pooled = np.concatenate([n["h0_w1"].to_numpy() for n in noise])  # every draw of every seed
    expected = table["h0_w1"].median() / np.median(pooled)
    assert np.isclose(ratios.loc["h0_w1", "fine-tune / noise (median)"], expected) and np.isclose(check.ratio, expected)
    assert f"{expected:.2f}x the noise floor" in check.message
    floor = np.stack([n.set_index("pid").loc[table["pid"], "h0_w1"].to_numpy() for n in noise]).max(axis=0)
    assert np.isclose(ratios.loc["h0_w1", "above_every_draw"], (table["h0_w1"].to_numpy() > floor).mean())


def test_selector_agreement_on_the_series_table(tiny_snapshot, tiny_llama, tmp_path):
    from topotuner_lab.drift.signals import with_signals
    from topotuner_lab.profiles.compare import rank_agreement, selector_scores

    work = WorkDir(tmp_path / "work")
    save_snapshot(tiny_snapshot, work.pretrained)
    save_snapshot(perturb_snapshot(tiny_snapshot, 0.05), work.finetuned("sst2"))
    table, noise = workbench.drift_source(work.root, "sst2")("default")
    build_profile(table, identity_of(tiny_llama.model, "tiny-llama"), CardSettings(prior_task="sst2", count=3)).save(
        work.card()
    )
    matrix, sentence = workbench.selector_agreement(work.root)
    assert list(matrix.index) == list(matrix.columns) == list(workbench.SELECTORS)
    assert np.allclose(np.diag(matrix), 1) and np.isclose(matrix.loc["high-drift", "low-drift"], -1)
    direct = rank_agreement(selector_scores(with_signals(table, tiny_snapshot), workbench.SELECTORS, "h0_w1"))
    pd.testing.assert_frame_equal(matrix, direct)
    assert sentence.startswith("Topology (high-drift by h0_w1) agrees most with")
    fig = plots.rank_agreement_heatmap(matrix)
    np.testing.assert_allclose(np.asarray(fig.data[0].z, dtype=float), matrix.to_numpy())


def test_card_stability_ranks_each_prior_seed_with_the_cards_settings(tiny_snapshot, tiny_llama, tmp_path):
    work = WorkDir(tmp_path / "work")
    save_snapshot(tiny_snapshot, work.pretrained)
    save_snapshot(perturb_snapshot(tiny_snapshot, 0.05, seed=0), work.finetuned("sst2"))
    save_snapshot(perturb_snapshot(tiny_snapshot, 0.05, seed=0), work.prior_seed(1).finetuned("sst2"))  # same run
    save_snapshot(perturb_snapshot(tiny_snapshot, 0.05, seed=7), work.prior_seed(2).finetuned("sst2"))  # another
    table, noise = workbench.drift_source(work.root, "sst2")("default")
    identity = identity_of(tiny_llama.model, "tiny-llama")
    build_profile(table, identity, CardSettings(prior_task="sst2", count=3), noise=noise).save(work.card())
    pairs, over = workbench.card_stability(work.root, [1, 2])
    same = pairs[(pairs["seed_a"] == 0) & (pairs["seed_b"] == 1)].iloc[0]
    assert same["jaccard"] == 1.0 and np.isclose(same["spearman"], 1.0)  # a repeated run ranks alike
    assert len(pairs) == 3 and (pairs["jaccard"] < 1).any()  # seed 7's perturbation is other noise
    assert over["seeds"].eq(3).all() and over["picked_by"].max() <= 3 and over["picked_by"].sum() == 9
    with pytest.raises(FileNotFoundError, match="extra_prior_seeds including 5"):
        workbench.card_stability(work.root, [5])
    with pytest.raises(ValueError, match="other than 0"):
        workbench.card_stability(work.root, [0, 1])


def test_save_figure_keeps_dots_in_a_stem(tmp_path, table):
    """A model name with a dot (qwen2.5-coder-0.5b) must not lose the rest of the stem to a 'suffix'."""
    files = plots.save_figure(
        plots.drift_heatmaps(table, ["h0_w1"]), tmp_path / "drift_qwen2.5-coder-0.5b_agnews", png=False
    )
    assert files == [tmp_path / "drift_qwen2.5-coder-0.5b_agnews.html"] and files[0].is_file()


REVIEWS_SPEC = """\
task: my-reviews
output_type: multiple_choice
doc_to_text: "Review: {{ sentence | trim }}\\nSentiment:"
doc_to_target: label
doc_to_choice: [negative, positive]
metric_list:
  - metric: acc
data_files:
  train: reviews.tsv
  test: reviews.tsv
"""


def _reviews_spec(folder: Path, text: str = REVIEWS_SPEC) -> Path:
    (folder / "reviews.tsv").write_text("sentence\tlabel\na dull film\t0\na lovely film\t1\n")
    spec = folder / "reviews.yaml"
    spec.write_text(text)
    return spec


def test_task_picker_lists_the_built_in_tasks_with_how_they_are_scored():
    seen = []
    picker = task_picker(on_change=seen.append)
    assert [name for _, name in picker.builtin.options] == list(TASKS)
    assert picker.value == next(iter(TASKS)) and picker.path.value == ""
    for label, name in picker.builtin.options:
        assert label.startswith(name) and TASKS[name].output_type in label and TASKS[name].metric in label
    other = list(TASKS)[1]
    picker.builtin.value = other
    assert picker.value == other and picker.spec is TASKS[other] and seen == [other]
    assert TASKS[other].output_type in picker.info.value and picker.status.value == ""
    assert task_picker("gsm8k").value == "gsm8k"


def test_task_picker_accepts_a_spec_file(tmp_path):
    spec = _reviews_spec(tmp_path)
    seen = []
    picker = task_picker("sst2", on_change=seen.append)
    picker.path.value = str(spec)
    assert picker.value == str(spec) and seen == [str(spec)] and picker.error is None
    assert picker.spec.task == "my-reviews" and "my-reviews" in picker.info.value and picker.status.value == ""
    picker.builtin.value = "agnews"  # a built-in replaces the path
    assert picker.value == "agnews" and picker.path.value == "" and seen[-1] == "agnews"
    started = task_picker(spec)  # a path parameter (papermill, CLI) starts in the path box
    assert started.value == str(spec) and started.path.value == str(spec) and started.spec.task == "my-reviews"


def test_task_picker_shows_a_bad_spec_and_keeps_its_value(tmp_path):
    bad = _reviews_spec(tmp_path, REVIEWS_SPEC.replace("multiple_choice", "loglikelihood"))
    seen = []
    picker = task_picker("sst2", on_change=seen.append)
    picker.path.value = str(bad)
    assert picker.value == "sst2" and picker.spec is TASKS["sst2"] and seen == []
    assert isinstance(picker.error, TaskError) and "output_type" in picker.error.problem
    assert "output_type" in picker.status.value and "Traceback" not in picker.status.value
    assert "still using sst2" in picker.status.value
    picker.path.value = str(tmp_path / "missing.yaml")
    assert "does not exist" in picker.status.value and picker.value == "sst2"
    picker.path.value = "mnli"
    assert "unknown task &#x27;mnli&#x27;" in picker.status.value and picker.value == "sst2"
    picker.path.value = ""  # cleared: back to the dropdown's task, error gone
    assert picker.value == "sst2" and picker.status.value == "" and picker.error is None
    with pytest.raises(TaskError, match="unknown task 'mnli'"):
        task_picker("mnli")  # a bad parameter fails loudly: a notebook must not run another task


def test_method_intervals_pair_each_method_with_the_reference_over_test_rows():
    full = {"test_correct": [1, 1, 0, 1] * 50, "test_accuracy": 0.75}
    card = {"test_correct": [1, 0, 0, 1] * 50, "test_accuracy": 0.5}
    table = workbench.method_intervals({"full": full, "profile": card}).set_index("method")
    assert table.loc["full", "minus full"] == 0.0 and np.isnan(table.loc["full", "95% low"])
    assert table.loc["profile", "minus full"] == pytest.approx(-0.25)
    assert table.loc["profile", "95% low"] < -0.25 < table.loc["profile", "95% high"] < 0


def test_stop_summary_says_where_the_rule_fired_and_what_it_saved():
    run = {"config": {"epochs": 4}, "stop_threshold": 0.5, "epoch_test_accuracy": [0.5, 0.6, 0.7, 0.72]}
    early = workbench.stop_summary({**run, "stop_epoch": 3})
    assert early.startswith("would stop after epoch 3 of 4 (1 of 4 epochs saved)")
    assert "at the stop epoch 0.700 vs the full budget 0.720" in early
    assert "nothing saved at this budget" in workbench.stop_summary({**run, "stop_epoch": 4})
    assert workbench.stop_summary({**run, "stop_epoch": None}) == (
        "normalized drift stayed above 0.5: no stop within 4 epochs"
    )


def test_png_export_keeps_the_browser_pipes_ignored_message_out_of_the_output(caplog):
    import logging

    plots._quiet_browser_pipe()
    pipe = logging.getLogger("choreographer.channels.pipe")
    with caplog.at_level(logging.DEBUG):
        try:
            raise ValueError("half a message")
        except ValueError:
            pipe.exception("JSONError decoding message. Ignoring")  # what choreographer logs, with a traceback
        pipe.error("Error in trying to decode JSON off our read.")  # a real failure still shows
    assert [r.getMessage() for r in caplog.records] == ["Error in trying to decode JSON off our read."]


def test_png_export_keeps_the_browsers_slow_exit_out_of_the_output(caplog):
    """On a loaded machine the browser may exit slowly after an export; choreographer's kill notice is not shown."""
    import logging

    plots._quiet_browser_pipe()
    browser = logging.getLogger("choreographer.browser_async")
    with caplog.at_level(logging.DEBUG):
        browser.warning("Resorting to unclean kill browser.")  # what choreographer logs before it kills the browser
        browser.error("Couldn't close or kill browser subprocess")  # a real failure still shows
    assert [r.getMessage() for r in caplog.records] == ["Couldn't close or kill browser subprocess"]
