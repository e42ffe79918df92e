"""Plotly figures for the workbench.

Every function returns a new ``go.Figure`` (no global state), so the same figure is shown in a notebook, exported to
``figures/`` and tested.
"""

from __future__ import annotations

import copy
import functools
import importlib
import itertools
import logging
import os
import shutil
import threading
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from topotuner_lab._io.atomic import atomic_path
from topotuner_lab._io.errors import TopoTunerError
from topotuner_lab.weights.projections import KINDS, parse_pid

if TYPE_CHECKING:
    from topotuner_lab.profiles.compare import CardComparison
    from topotuner_lab.training.transfer import TransferCheck

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")
#: The renderer in notebooks: plotly's JSON mimetype, which JupyterLab's plotly extension draws with the plotly.js it
#: ships (offline, also when a saved notebook is opened without a kernel). Not ``+notebook``: that inlines a 4.9 MB
#: plotly.js into every executed notebook; not ``notebook_connected``: it loads plotly.js from a CDN (blank offline).
OFFLINE_RENDERER = "plotly_mimetype"


def use_offline_renderer() -> None:
    """Render through JupyterLab's plotly extension (no CDN, no plotly.js copy in the notebook)."""
    import plotly.io as pio

    pio.renderers.default = OFFLINE_RENDERER


def persistence_diagram(
    diagrams: Mapping[str, Sequence[np.ndarray]], dims: Iterable[int] = (0, 1), title: str = "Persistence diagram"
) -> go.Figure:
    """Birth–death scatter of several diagrams (e.g. pretrained vs fine-tuned) side by side on the same axes.

    One panel per diagram, one marker per dimension, one colour per diagram (the legend names each): drift shows as
    points that moved between panels, which overlaid markers would hide.
    """
    dims = list(dims)
    fig = make_subplots(rows=1, cols=len(diagrams), subplot_titles=list(diagrams), shared_yaxes=True)
    top = max(
        (float(np.asarray(d[dim]).max()) for d in diagrams.values() for dim in dims if dim < len(d) and len(d[dim])),
        default=1.0,
    )
    for i, (label, dgms) in enumerate(diagrams.items()):
        for dim in dims:
            if dim >= len(dgms) or len(dgms[dim]) == 0:
                continue
            d = np.asarray(dgms[dim])
            fig.add_trace(
                go.Scatter(
                    x=d[:, 0],
                    y=d[:, 1],
                    mode="markers",
                    name=f"{label} H{dim}",
                    marker=dict(
                        color=COLORS[i % len(COLORS)],
                        symbol="circle" if dim == 0 else "diamond",
                        size=6 if dim == 0 else 8,
                        opacity=0.7,
                    ),
                    hovertemplate=f"{label} H{dim}<br>birth %{{x:.4f}}<br>death %{{y:.4f}}<extra></extra>",
                ),
                row=1,
                col=i + 1,
            )
        fig.add_trace(
            go.Scatter(
                x=[0, top * 1.05],
                y=[0, top * 1.05],
                mode="lines",
                line=dict(color="gray", dash="dash"),
                name="diagonal",
                showlegend=i == 0,
                hoverinfo="skip",
            ),
            row=1,
            col=i + 1,
        )
    fig.update_xaxes(title_text="birth", range=[-0.02 * top, top * 1.05])
    fig.update_yaxes(range=[-0.02 * top, top * 1.05])
    fig.update_yaxes(title_text="death", col=1)
    fig.update_layout(title=title, template="plotly_white")
    return fig


def barcode(
    dgms: Sequence[np.ndarray], dims: Iterable[int] = (0, 1), max_bars: int = 200, title: str = "Barcode"
) -> go.Figure:
    """Horizontal bars from birth to death, longest first (at most ``max_bars`` per dimension)."""
    fig = go.Figure()
    row = 0
    for dim in dims:
        if dim >= len(dgms):
            continue
        d = np.asarray(dgms[dim])
        d = d[np.argsort(d[:, 0] - d[:, 1])][:max_bars]
        ys = np.arange(row, row + len(d))
        fig.add_trace(
            go.Bar(
                x=d[:, 1] - d[:, 0],
                base=d[:, 0],
                y=ys,
                orientation="h",
                name=f"H{dim}",
                marker_color=COLORS[dim % len(COLORS)],
                hovertemplate=f"H{dim}<br>birth %{{base:.4f}}<br>length %{{x:.4f}}<extra></extra>",
            )
        )
        row += len(d) + 5
    fig.update_layout(
        title=title,
        xaxis_title="filtration value",
        yaxis=dict(showticklabels=False),
        bargap=0.1,
        template="plotly_white",
    )
    return fig


def layer_kind_grid(table: pd.DataFrame, column: str) -> pd.DataFrame:
    """``column`` of a drift table as a layer x kind grid (rows: layers, columns: q, k, v, o)."""
    return table.pivot_table(index="layer", columns="kind", values=column, aggfunc="first").reindex(
        columns=[k for k in KINDS if k in set(table["kind"])]
    )


def drift_heatmaps(
    table: pd.DataFrame,
    columns: Sequence[str],
    title: str = "Drift per layer and projection",
    selected: Iterable[str] = (),
) -> go.Figure:
    """Side-by-side layer x {q,k,v,o} heatmaps, one per column, each with its own colour bar; ``selected`` outlined.

    Every cell's hover names its projection and value, an outlined (selected) cell's too.
    """
    fig = make_subplots(
        rows=1, cols=len(columns), subplot_titles=list(columns), horizontal_spacing=0.1 if len(columns) > 1 else 0.06
    )
    chosen = [parse_pid(pid) for pid in selected]
    for i, column in enumerate(columns, start=1):
        grid = layer_kind_grid(table, column)
        domain = fig.layout[f"xaxis{'' if i == 1 else i}"].domain
        fig.add_trace(
            go.Heatmap(
                z=grid.values,
                x=list(grid.columns),
                y=list(grid.index),
                colorscale="Viridis",
                colorbar=dict(x=domain[1] + 0.005, xanchor="left", thickness=10, len=0.9),
                hovertemplate=f"L%{{y}}.%{{x}}<br>{column} %{{z:.4g}}<extra></extra>",
            ),
            row=1,
            col=i,
        )
        if chosen:
            fig.add_trace(
                go.Scatter(
                    x=[kind for _, kind in chosen],
                    y=[layer for layer, _ in chosen],
                    customdata=[grid.loc[layer, kind] for layer, kind in chosen],
                    mode="markers",
                    name="trainable",
                    showlegend=i == 1,
                    marker=dict(symbol="square-open", size=14, color="red", line=dict(width=2)),
                    hovertemplate=f"L%{{y}}.%{{x}} (trainable)<br>{column} %{{customdata:.4g}}<extra></extra>",
                ),
                row=1,
                col=i,
            )
    fig.update_yaxes(title_text="layer", col=1)
    fig.update_yaxes(dtick=1 if table["layer"].nunique() <= 12 else 5)
    fig.update_layout(
        title=title,
        template="plotly_white",
        height=max(350, 18 * table["layer"].nunique() + 150),
        legend=dict(orientation="h", y=-0.08),
    )
    return fig


#: verdict -> colour of the forest plot (a verdict not listed is grey)
VERDICT_COLOURS = {
    "held": "#1b7837",
    "did not hold": "#b2182b",
    "equivalent": "#2166ac",
    "inconclusive": "#e08214",
    "inconclusive (Holm)": "#e08214",
    "pilot": "#7f7f7f",
}


def claims_forest(claims: pd.DataFrame, title: str = "Claims: estimate and 95% interval") -> go.Figure:
    """One row per paired claim (differences, not ratios or shares): its estimate, interval and threshold.

    ``claims`` is :func:`~topotuner_lab.study.claims.claims_frame`'s table. A difference claim's equivalence band
    (threshold 0, band +- the margin) is shaded when ``band`` is given; the colour says the verdict.
    """
    rows = claims[claims["measure"].str.contains(" - ", regex=False) & claims["low"].notna()].reset_index(drop=True)
    labels = [f"{c} | {m.split(' (')[0]} | {s}" for c, m, s in zip(rows["claim"], rows["measure"], rows["setting"])]
    fig = go.Figure()
    for verdict, group in rows.groupby("verdict", sort=False):
        fig.add_trace(
            go.Scatter(
                x=group["estimate"],
                y=[labels[i] for i in group.index],
                mode="markers",
                name=str(verdict),
                marker=dict(size=9, color=VERDICT_COLOURS.get(str(verdict), "#999999")),
                error_x=dict(
                    type="data",
                    symmetric=False,
                    array=group["high"] - group["estimate"],
                    arrayminus=group["estimate"] - group["low"],
                ),
                hovertemplate="%{y}<br>%{x:+.3f}<extra>" + str(verdict) + "</extra>",
            )
        )
    for i, row in rows.iterrows():
        if "band" in rows and pd.notna(row.get("band")):
            fig.add_shape(
                type="rect", x0=-row["band"], x1=row["band"], y0=int(i) - 0.4, y1=int(i) + 0.4,
                fillcolor="lightgrey", opacity=0.4, line_width=0, layer="below",
            )  # fmt: skip
        fig.add_shape(
            type="line", x0=row["threshold"], x1=row["threshold"], y0=int(i) - 0.45, y1=int(i) + 0.45,
            line=dict(color="black", dash="dash", width=1),
        )  # fmt: skip
    fig.update_yaxes(autorange="reversed", type="category", categoryorder="array", categoryarray=labels)
    fig.update_layout(
        title=title,
        template="plotly_white",
        xaxis_title="difference (card minus the other arm)",
        height=max(300, 28 * len(rows) + 140),
        margin=dict(l=20),
        legend_title_text="verdict",
    )
    return fig


def budget_curves_figure(
    curves: pd.DataFrame, title: str = "Score against the share of the model trained"
) -> go.Figure:
    """One panel per target: each card strategy's score at every budget as a line, reference arms as points.

    ``curves`` is :func:`~topotuner_lab.study.budget_curves.budget_curves`' table; the x axis is the trainable share
    (Train.%, log scale), the error bars its interval. An interval that one seed leaves unbounded draws no bar.
    """
    targets = list(dict.fromkeys(curves["target"]))
    fig = make_subplots(rows=1, cols=max(1, len(targets)), subplot_titles=targets)
    palette = dict(zip(dict.fromkeys(curves["curve"]), itertools.cycle(qualitative.Plotly)))
    for col, target in enumerate(targets, start=1):
        for curve, points in curves[curves["target"] == target].groupby("curve", sort=False):
            points = points.sort_values("share")
            finite = np.isfinite(points["low"]) & np.isfinite(points["high"])
            fig.add_trace(
                go.Scatter(
                    x=points["share"] * 100,
                    y=points["score"],
                    mode="lines+markers" if points["budget"].notna().all() and len(points) > 1 else "markers",
                    name=str(curve),
                    legendgroup=str(curve),
                    showlegend=col == 1,
                    marker=dict(size=8, color=palette[curve]),
                    line=dict(color=palette[curve]),
                    error_y=dict(
                        type="data",
                        symmetric=False,
                        array=(points["high"] - points["score"]).where(finite),
                        arrayminus=(points["score"] - points["low"]).where(finite),
                    ),
                    hovertemplate=f"{curve}<br>%{{x:.3g}}% trained<br>%{{y:.3f}}<extra>{target}</extra>",
                ),
                row=1,
                col=col,
            )
        fig.update_xaxes(type="log", title_text="trainable share (Train.%, log)", row=1, col=col)
    fig.update_yaxes(title_text="test score", row=1, col=1)
    fig.update_layout(title=title, template="plotly_white", height=420, legend_title_text="arm")
    return fig


#: each threshold rule's x axis in the stopping figure
STOP_RULE_AXES = {
    "normalized drift below a threshold": "threshold (epoch-to-epoch drift / the first epoch's)",
    "distance from pretrained <= eta": "eta (mean H0 W1 from the pretrained weights)",
}


def _band(fig: go.Figure, x: pd.Series, low: pd.Series, high: pd.Series, color: str, row: int, col: int) -> None:
    """A shaded interval between ``low`` and ``high`` (points where either is not finite leave a gap)."""
    finite = np.isfinite(low) & np.isfinite(high)
    for y, fill in ((high.where(finite), None), (low.where(finite), "tonexty")):
        fig.add_trace(
            go.Scatter(
                x=x, y=y, mode="lines", line=dict(width=0, color=color), fill=fill, opacity=0.2, showlegend=False,
                hoverinfo="skip",
            ),
            row=row,
            col=col,
        )  # fmt: skip


def stopping_sweep_figure(
    sweeps: pd.DataFrame, calibrated: pd.DataFrame, title: str = "Stopping rules over their thresholds"
) -> go.Figure:
    """One column per threshold rule: test score at the stop minus the end, and the share stopping early.

    ``sweeps`` is the second table of :func:`~topotuner_lab.lab.report.inputs.stop_rules` (one row per target, rule and
    parameter, with intervals: shaded); ``calibrated`` the rule comparison, whose parameter per target and rule is
    marked by a dashed line. The top row's dotted line is the loss the calibration allows (the target's margin);
    the bottom row's dotted curve is the share of runs stopping at the earliest epoch the rule allows.
    """
    rules = [rule for rule in STOP_RULE_AXES if rule in set(sweeps["rule"])]
    fig = make_subplots(rows=2, cols=max(1, len(rules)), subplot_titles=rules, shared_xaxes="columns")
    palette = dict(zip(dict.fromkeys(sweeps["target"]), itertools.cycle(qualitative.Plotly)))
    chosen = calibrated.set_index(["target", "rule"])["parameter"] if len(calibrated) else pd.Series(dtype=float)
    for col, rule in enumerate(rules, start=1):
        for target, points in sweeps[sweeps["rule"] == rule].groupby("target", sort=False):
            points, color = points.sort_values("parameter"), palette[target]
            x = points["parameter"]
            _band(fig, x, points["change_low"], points["change_high"], color, 1, col)
            _band(fig, x, points["early_low"], points["early_high"], color, 2, col)
            for row, column, dash, name in ((1, "change", None, target), (2, "early_share", None, target),
                                            (2, "at_minimum", "dot", f"{target}: at the earliest epoch")):  # fmt: skip
                fig.add_trace(
                    go.Scatter(
                        x=x, y=points[column], mode="lines", name=name, legendgroup=name,
                        showlegend=col == 1 and row == (2 if dash else 1), line=dict(color=color, dash=dash),
                    ),
                    row=row,
                    col=col,
                )  # fmt: skip
            fig.add_hline(y=-float(points["tolerance"].iloc[0]), line=dict(color=color, dash="dot"), row=1, col=col)
            parameter = chosen.get((target, rule))
            if parameter is not None and np.isfinite(parameter):
                for row in (1, 2):
                    fig.add_vline(x=float(parameter), line=dict(color=color, dash="dash"), row=row, col=col)
        fig.update_xaxes(title_text=STOP_RULE_AXES[rule], row=2, col=col)
    fig.update_yaxes(title_text="test score at stop - end", row=1, col=1)
    fig.update_yaxes(title_text="share stopping by half the budget", row=2, col=1)
    fig.update_yaxes(range=[0, 1.02], row=2)
    fig.update_layout(title=title, template="plotly_white", height=560, legend_title_text="target")
    return fig


def rank_correlation(
    table: pd.DataFrame, columns: Sequence[str], title: str = "Spearman rank correlation: topology vs magnitude"
) -> go.Figure:
    """Spearman correlation between the rankings the drift columns induce."""
    corr = table[list(columns)].rank().corr()
    fig = go.Figure(
        go.Heatmap(
            z=corr.values,
            x=list(columns),
            y=list(columns),
            zmin=-1,
            zmax=1,
            colorscale="RdBu",
            text=np.round(corr.values, 2),
            texttemplate="%{text}",
            hovertemplate="%{x} vs %{y}: %{z:.3f}<extra></extra>",
        )
    )
    fig.update_layout(title=title, template="plotly_white")
    return fig


def rank_agreement_heatmap(matrix: pd.DataFrame, title: str = "Rank agreement between selectors") -> go.Figure:
    """An annotated square heatmap of a rank-agreement matrix (e.g. Spearman between selectors' rankings).

    The colour scale is diverging and fixed to -1..1 (white at 0), so matrices of different runs read alike; a
    missing value (NaN, e.g. a constant ranking) is left blank.
    """
    if list(matrix.index) != list(matrix.columns):
        raise ValueError(f"a rank-agreement matrix is square with the same labels on both axes, got {matrix.shape}")
    labels = [str(c) for c in matrix.columns]
    z = matrix.to_numpy(dtype=float)
    text = [["" if np.isnan(v) else f"{v:.2f}" for v in row] for row in z]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=labels,
            y=labels,
            zmin=-1,
            zmax=1,
            zmid=0,
            colorscale="RdBu",
            text=text,
            texttemplate="%{text}",
            colorbar=dict(title="agreement"),
            hovertemplate="%{y} vs %{x}: %{z:.3f}<extra></extra>",
        )
    )
    size = max(400, 60 * len(labels) + 200)
    fig.update_yaxes(autorange="reversed", scaleanchor="x", constrain="domain")
    fig.update_xaxes(constrain="domain")
    fig.update_layout(title=title, template="plotly_white", width=size + 100, height=size)
    return fig


def transfer_matrix_heatmap(matrix: pd.DataFrame, title: str = "Card score minus the baselines'") -> go.Figure:
    """Prior-family x target-family heatmaps of the card's score minus full FT's and minus LoRA's (a transfer matrix).

    ``matrix`` has the columns of :func:`topotuner_lab.study.matrix.transfer_matrix`; each target is scored on its own
    metric (named under its column). The colour scale is diverging and symmetric (white at 0: as good as the
    baseline); a missing baseline is left blank.
    """
    rows = list(dict.fromkeys(f"{p} ({f})" for p, f in zip(matrix["prior"], matrix["prior_family"])))
    cols = list(
        dict.fromkeys(f"{t} ({f}, {m})" for t, f, m in zip(matrix["target"], matrix["target_family"], matrix["metric"]))
    )
    diffs = ("card_minus_full", "card_minus_lora")
    extent = float(np.nanmax(np.abs(matrix[list(diffs)].to_numpy(dtype=float)))) if len(matrix) else 0.0
    extent = extent if np.isfinite(extent) and extent > 0 else 1.0
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("card - full FT", "card - LoRA"), shared_yaxes=True, horizontal_spacing=0.04
    )
    for index, column in enumerate(diffs, start=1):
        grid = pd.DataFrame(np.nan, index=rows, columns=cols)
        for _, r in matrix.iterrows():
            grid.loc[f"{r['prior']} ({r['prior_family']})", f"{r['target']} ({r['target_family']}, {r['metric']})"] = r[
                column
            ]
        z = grid.to_numpy(dtype=float)
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=cols,
                y=rows,
                zmin=-extent,
                zmax=extent,
                zmid=0,
                colorscale="RdBu",
                text=[["" if np.isnan(v) else f"{v:+.3f}" for v in row] for row in z],
                texttemplate="%{text}",
                showscale=index == 2,
                colorbar=dict(title="difference"),
                hovertemplate="%{y} -> %{x}: %{z:+.3f}<extra></extra>",
            ),
            row=1,
            col=index,
        )
    fig.update_layout(
        title=title, template="plotly_white", width=max(900, 260 * len(cols)), height=260 + 70 * len(rows)
    )
    return fig


def transfer_gradients(check: TransferCheck, title: str | None = None) -> go.Figure:
    """The transfer check per matrix, the card's picks marked.

    Left: the gradient cosine of prior and target per matrix on the layer x kind plane (-1..1), the card's picks
    outlined; right: the cosines of the card's picks beside those of the other matrices (dashed: the ``CLOSE``
    threshold of the verdict).
    """
    from topotuner_lab.training.transfer import CLOSE

    table = check.table.assign(
        layer=[parse_pid(pid)[0] for pid in check.table["pid"]], kind=[parse_pid(pid)[1] for pid in check.table["pid"]]
    )
    grid = layer_kind_grid(table, "cosine")
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.6, 0.4],
        horizontal_spacing=0.16,
        subplot_titles=["gradient cosine per matrix (prior vs target)", "card's picks vs the rest"],
    )
    fig.add_trace(
        go.Heatmap(
            z=grid.values,
            x=list(grid.columns),
            y=list(grid.index),
            zmin=-1,
            zmax=1,
            zmid=0,
            colorscale="RdBu",
            colorbar=dict(title="cosine", x=0.515, xanchor="left", thickness=15),
            hovertemplate="L%{y}.%{x}<br>cosine %{z:.3f}<extra></extra>",
        ),
        row=1,
        col=1,
    )
    picks = table[table["in_card"]]
    fig.add_trace(
        go.Scatter(
            x=picks["kind"],
            y=picks["layer"],
            mode="markers",
            name="card's picks",
            marker=dict(symbol="square-open", size=14, color="black", line=dict(width=2)),
            hoverinfo="skip",
        ),
        row=1,
        col=1,
    )
    for name, rows, color in (
        ("card's picks", picks, COLORS[1]),
        ("other matrices", table[~table["in_card"]], COLORS[0]),
    ):
        fig.add_trace(
            go.Box(
                y=rows["cosine"],
                name=name,
                text=rows["pid"],
                boxpoints="all",
                jitter=0.4,
                pointpos=0,
                marker_color=color,
                showlegend=False,
                hovertemplate="%{text}: cosine %{y:.3f}<extra></extra>",
            ),
            row=1,
            col=2,
        )
    fig.add_hline(y=CLOSE, line_dash="dash", line_color="gray", row=1, col=2)
    n_layers = int(table["layer"].nunique())
    fig.update_xaxes(categoryorder="array", categoryarray=[k for k in KINDS if k in set(table["kind"])], row=1, col=1)
    fig.update_yaxes(title_text="layer", dtick=1 if n_layers <= 12 else 5, row=1, col=1)
    fig.update_yaxes(title_text="gradient cosine", range=[-1.05, 1.05], row=1, col=2)
    fig.update_layout(
        title=title
        or (
            f"Transfer check: {check.card_prior} -> {check.target} (median cosine {check.median_cosine_card:.2f} over "
            f"the card's picks, {check.median_cosine_all:.2f} over all)"
        ),
        template="plotly_white",
        legend=dict(orientation="h", y=-0.12),
        height=max(380, 18 * n_layers + 180),
    )
    return fig


def training_curves(runs: Mapping[str, dict[str, Any]], title: str = "Training loss per epoch") -> go.Figure:
    """Loss per epoch of several fine-tuning runs (from their results' ``log_history``)."""
    fig = go.Figure()
    for name, res in runs.items():
        points = [(h["epoch"], h["loss"]) for h in res.get("log_history", []) if "loss" in h]
        fig.add_trace(go.Scatter(x=[p[0] for p in points], y=[p[1] for p in points], mode="lines+markers", name=name))
    fig.update_layout(title=title, xaxis_title="epoch", yaxis_title="training loss", template="plotly_white")
    return fig


def bars(
    results: pd.DataFrame, columns: Sequence[str], label: str = "run", title: str = "Cost per method"
) -> go.Figure:
    """One bar panel per column (e.g. seconds per epoch, peak memory) across runs."""
    fig = make_subplots(rows=1, cols=len(columns), subplot_titles=list(columns))
    for i, column in enumerate(columns, start=1):
        fig.add_trace(go.Bar(x=results[label], y=results[column], name=column, showlegend=False), row=1, col=i)
    fig.update_layout(title=title, template="plotly_white")
    return fig


def early_stopping(result: dict[str, Any], threshold: float, title: str = "Topological early stopping") -> go.Figure:
    """Normalized epoch-to-epoch drift with the threshold and stop epoch, beside test accuracy per epoch."""
    hist = result.get("drift_history", [])
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(
        go.Scatter(
            x=[h["epoch"] for h in hist],
            y=[h["normalized"] for h in hist],
            mode="lines+markers",
            name="normalized drift",
        ),
        secondary_y=False,
    )
    fig.add_hline(y=threshold, line_dash="dash", line_color="red", annotation_text=f"threshold {threshold:g}")
    if result.get("stop_epoch"):
        fig.add_vline(
            x=result["stop_epoch"],
            line_dash="dot",
            line_color="black",
            annotation_text=f"stop: epoch {result['stop_epoch']}",
        )
    acc = result.get("epoch_test_accuracy") or []
    if acc:
        fig.add_trace(
            go.Scatter(x=list(range(1, len(acc) + 1)), y=acc, mode="lines+markers", name="test accuracy"),
            secondary_y=True,
        )
    fig.update_xaxes(title_text="epoch", dtick=1)
    fig.update_yaxes(title_text="drift / first-epoch drift", secondary_y=False)
    fig.update_yaxes(title_text="test accuracy", range=[0, 1], secondary_y=True)
    fig.update_layout(title=title, template="plotly_white")
    return fig


def card_comparison(comparison: CardComparison, title: str = "Two profile cards compared") -> go.Figure:
    """Two cards side by side.

    Left: each card's trainable projections on the layer x kind plane (both / only one); right: each card's share of
    trainable parameters per projection kind.
    """
    a, b = comparison.labels
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.45, 0.55],
        subplot_titles=["trainable projections", "share of trainable parameters per kind"],
    )
    groups = (
        ("both", comparison.both, COLORS[3]),
        (f"only {a}", comparison.only_a, COLORS[0]),
        (f"only {b}", comparison.only_b, COLORS[1]),
    )
    for name, pids, color in groups:
        parsed = [parse_pid(pid) for pid in pids]
        fig.add_trace(
            go.Scatter(
                x=[k for _, k in parsed],
                y=[layer for layer, _ in parsed],
                mode="markers",
                name=name,
                text=pids,
                marker=dict(symbol="square", size=12, color=color),
                hovertemplate="%{text}<extra>" + name + "</extra>",
            ),
            row=1,
            col=1,
        )
    for label, color in zip(comparison.labels, COLORS[:2]):
        fig.add_trace(
            go.Bar(
                x=list(comparison.kind_share.index),
                y=comparison.kind_share[label],
                name=label,
                marker_color=color,
                showlegend=False,
                hovertemplate=f"{label}<br>%{{x}}: %{{y:.1%}}<extra></extra>",
            ),
            row=1,
            col=2,
        )
    top = max((parse_pid(pid)[0] for pid in comparison.both + comparison.only_a + comparison.only_b), default=0)
    fig.update_xaxes(categoryorder="array", categoryarray=list(KINDS), range=[-0.5, len(KINDS) - 0.5])
    fig.update_yaxes(title_text="layer", dtick=1 if top <= 12 else 5, range=[-0.5, top + 0.5], row=1, col=1)
    fig.update_yaxes(tickformat=".0%", range=[0, 1], row=1, col=2)
    fig.update_layout(title=title, template="plotly_white", barmode="group")
    return fig


def update_figure_widget(widget: go.FigureWidget, fig: go.Figure) -> go.FigureWidget:
    """Replace a FigureWidget's traces and layout with those of ``fig``, in one update.

    Live widgets redraw this way rather than through an ``Output`` widget, whose capture of
    display messages can stall headless execution (nbclient issue #312).
    """
    with widget.batch_update():
        widget.data = []
        widget.add_traces(list(fig.data))
        widget.layout = fig.layout
    # the synced state a browser view draws from when it is created: the update messages above reach only a model
    # whose script has loaded (on a busy machine a widget updated before it shows would draw empty axes)
    widget._widget_data, widget._widget_layout = copy.deepcopy(widget._data), copy.deepcopy(widget._layout)
    return widget


def chromium_path() -> str | None:
    """A local Chromium for kaleido (Debian's ``chromium``), if installed."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class _DropIgnoredBrowserMessage(logging.Filter):
    """Drop choreographer's messages about its browser that say nothing a user can act on.

    Kaleido's browser pipe sometimes reads a message in pieces; choreographer logs the piece with a full traceback,
    ignores it, and the export goes on (the PNG is written, or the export raises). On a loaded machine the headless
    browser may take over 3 s to exit after an export; choreographer then warns that it kills it, and does (the PNG is
    already written). Neither is printed into notebooks and command output.
    """

    IGNORED = ("JSONError decoding message", "Resorting to unclean kill browser")

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.IGNORED)


@functools.cache
def _quiet_browser_pipe() -> None:
    """Filter choreographer's pipe and browser loggers, once; imported first so they are logistro's loggers."""
    for module in ("choreographer.channels.pipe", "choreographer.browser_async"):
        importlib.import_module(module)
        logging.getLogger(module).addFilter(_DropIgnoredBrowserMessage())


#: seconds one PNG export may take before it is abandoned and retried: kaleido waits on its browser's tab without a
#: limit, and a Chromium that died on a loaded machine left a report render waiting for 18 minutes (an export there
#: takes up to ~3.5 min when both cores are busy, ~5 s when idle)
PNG_TIMEOUT_S = 600.0


def _export_within(fig: go.Figure, path: Path, timeout: float) -> None:
    """``fig.write_image`` on a daemon thread, abandoned after ``timeout`` seconds (TimeoutError).

    Kaleido's own thread, started from this one, is a daemon too, so an export that never returns cannot keep the
    process from exiting.
    """
    outcome: list[BaseException | None] = []

    def export() -> None:
        try:
            fig.write_image(str(path), format="png", width=1000, height=fig.layout.height or 500)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            outcome.append(exc)

    worker = threading.Thread(target=export, name=f"png-export {path.name}", daemon=True)
    worker.start()
    worker.join(timeout)
    if not outcome:
        raise TimeoutError(f"no answer from kaleido's browser in {timeout:g} s")
    if outcome[0] is not None:
        raise outcome[0]


def _write_png(fig: go.Figure, path: Path, attempts: int = 3, timeout: float = PNG_TIMEOUT_S) -> None:
    """Kaleido's PNG export, retried, each try abandoned after ``timeout`` seconds.

    On a busy machine its Chromium tab can be asked to render before the tab's own script has loaded
    (``ReferenceError: kaleido_scopes is not defined``), or the browser can stop answering. An export that times out
    on every try is a user error (the machine is too loaded): nothing written before it is lost.
    """
    _quiet_browser_pipe()
    for attempt in range(1, attempts + 1):
        try:
            _export_within(fig, path, timeout)
            return
        except Exception as exc:  # kaleido raises its own JavascriptError / ChromeError classes
            if attempt == attempts:
                if isinstance(exc, TimeoutError):
                    raise TopoTunerError(
                        f"{path.name}: the PNG export did not finish in {timeout:g} s in any of {attempts} tries "
                        "(kaleido's headless Chromium stopped answering)",
                        "run the command again when the machine is less loaded: the files written so far are kept",
                    ) from exc
                raise
            warnings.warn(
                f"PNG export failed ({exc.__class__.__name__}), retrying ({attempt}/{attempts})", stacklevel=2
            )


PLOTLY_JS = "plotly.min.js"


def _plotly_js_beside(folder: Path) -> None:
    """One plotly.js per figures folder (what ``include_plotlyjs="directory"`` pages load), written atomically."""
    target = folder / PLOTLY_JS
    if not target.is_file():
        from plotly.offline import get_plotlyjs

        with atomic_path(target) as tmp:
            tmp.write_text(get_plotlyjs(), encoding="utf-8")


def save_figure(fig: go.Figure, stem: str | os.PathLike[str], png: bool = True) -> list[Path]:
    """Write ``stem.html`` and, with a local Chromium, ``stem.png``.

    The HTML loads ``plotly.min.js`` from its own folder (one copy shared by all figures there, works
    offline). Returns the files written. Without Chromium the PNG is not written and a warning says why.
    """
    stem = Path(stem)
    html, png_path = stem.with_name(stem.name + ".html"), stem.with_name(stem.name + ".png")  # dots in names stay
    written = []
    stem.parent.mkdir(parents=True, exist_ok=True)
    _plotly_js_beside(stem.parent)
    with atomic_path(html) as tmp:
        # the figure's name as its div id (plotly's default is a fresh uuid): the same figure writes the same bytes
        fig.write_html(tmp, include_plotlyjs="directory", full_html=True, div_id=stem.name)
    written.append(html)
    if png:
        browser = chromium_path()
        if browser is None:
            warnings.warn(
                f"no Chromium found: {stem.name}.png not written (apt-get install chromium to export PNGs)",
                stacklevel=2,
            )
        else:
            os.environ.setdefault("BROWSER_PATH", browser)
            with atomic_path(png_path) as tmp:
                _write_png(fig, tmp)
            written.append(png_path)
    return written
