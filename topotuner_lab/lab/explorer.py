"""A finished study explored without its weights: claims, rate sweeps, per-epoch curves, stopping, card stability.

Reads a study folder as ``topotuner-lab report`` does (:func:`topotuner_lab.lab.report.inputs.load_study`: the ledger
verified, claims judged, prior-seed cards rebuilt from the drift tables; weights are not needed) plus each run's
``results.json`` for its per-epoch record; nothing is computed that needs a model, and nothing is written. Each
function returns a table or a plotly figure, so the notebook ``08_explore_study.ipynb`` only shows them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import ipywidgets as w
import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from topotuner_lab._io.errors import InputFileError
from topotuner_lab.lab.plots import claims_forest, update_figure_widget
from topotuner_lab.lab.report.inputs import StudyInputs, load_study
from topotuner_lab.study.claims import claims_frame
from topotuner_lab.study.stability import stability_table
from topotuner_lab.study.stopping import SWEEP_THRESHOLDS, early_by, share_interval, threshold_sweep
from topotuner_lab.study.workspace import WorkDir
from topotuner_lab.training.results import RunResults, load_results

#: the option of every explorer dropdown that filters nothing
ALL = "all"
#: the committed ledger the notebook opens by default
DEFAULT_STUDY = "runs/reproduce-cpu-decide"


def arm_colours(runs: Sequence[str]) -> dict[str, str]:
    """A colour per arm, by its name less the schedule (``+constant``), so an arm reads alike in every figure."""
    bases = sorted({run.split("+")[0] for run in runs})
    palette = qualitative.Plotly if len(bases) <= len(qualitative.Plotly) else qualitative.Dark24
    colour = {base: palette[i % len(palette)] for i, base in enumerate(bases)}
    return {run: colour[run.split("+")[0]] for run in runs}


@dataclass(frozen=True)
class Study:
    """One study folder as the report reads it, with each run's results and the claims as a filterable table."""

    inputs: StudyInputs
    #: run folder (``results.csv``'s ``run_dir``) -> that run's results
    runs: dict[str, RunResults]
    #: one row per claim (:func:`~topotuner_lab.study.claims.claims_frame`) with its ``target`` and ``budget``
    claims: pd.DataFrame

    @property
    def results(self) -> pd.DataFrame:
        """``results.csv``, one row per run."""
        return self.inputs.results


def open_study(folder: str | Path = DEFAULT_STUDY) -> Study:
    """The study under ``folder``, read-only; a missing folder or one that holds no study is an InputFileError."""
    root = Path(folder).expanduser()
    fix = (
        f"pass a folder `topotuner-lab reproduce -o FOLDER` wrote, e.g. {DEFAULT_STUDY} from the project root "
        f"(../{DEFAULT_STUDY} from notebooks/)"
    )
    if not root.is_dir():
        raise InputFileError(f"study folder {root} not found (relative paths start at {Path.cwd()})", fix)
    if not WorkDir(root).results.is_file() or not WorkDir(root).preset.is_file():
        raise InputFileError(f"{root} holds no study (results.csv and preset.json)", fix)
    inputs = load_study(root)  # verifies every run's results.json against results.csv and the preset
    runs = {run_dir: load_results(root / run_dir / "results.json") for run_dir in inputs.results["run_dir"]}
    return Study(inputs, runs, _with_filters(claims_frame(inputs.claims)))


def _with_filters(claims: pd.DataFrame) -> pd.DataFrame:
    """The claims with the target their setting names (``prior -> target``) and the budgets their measure names."""
    if claims.empty:
        return claims.assign(target=pd.Series(dtype=str), budget=pd.Series(dtype=str))
    target = [s.split(" -> ", 1)[1] if " -> " in s else "" for s in claims["setting"]]
    budget = [",".join(dict.fromkeys(re.findall(r"@([0-9.e+-]+)", m))) for m in claims["measure"]]
    return claims.assign(target=target, budget=budget)


def forest_rows(claims: pd.DataFrame, target: str = ALL, budget: str = ALL, claim: str = ALL) -> pd.DataFrame:
    """The paired claims the forest plot draws (a difference with an interval), filtered by target, budget, claim."""
    rows = claims[claims["measure"].str.contains(" - ", regex=False) & claims["low"].notna()]
    if target != ALL:
        rows = rows[rows["target"] == target]
    if budget != ALL:
        rows = rows[rows["budget"].str.split(",").apply(lambda found: budget in found)]
    if claim != ALL:
        rows = rows[rows["claim"] == claim]
    return rows.reset_index(drop=True)


def claims_figure(claims: pd.DataFrame, target: str = ALL, budget: str = ALL, claim: str = ALL) -> go.Figure:
    """The forest plot of the paired claims that match the filters: estimate, interval, threshold or band, verdict."""
    rows = forest_rows(claims, target, budget, claim)
    shown = ", ".join(f"{name} {value}" for name, value in (("target", target), ("budget", budget), ("claim", claim)))
    return claims_forest(rows, title=f"Claims: estimate and 95% interval ({shown}; {len(rows)} shown)")


def claim_options(claims: pd.DataFrame) -> dict[str, list[str]]:
    """The choices of the forest plot's dropdowns: targets, budgets and claims that have a paired row."""
    rows = forest_rows(claims)
    budgets = sorted({b for found in rows["budget"] for b in found.split(",") if b}, key=float)
    return {
        "target": [ALL, *dict.fromkeys(t for t in rows["target"] if t)],
        "budget": [ALL, *budgets],
        "claim": [ALL, *dict.fromkeys(rows["claim"])],
    }


class ClaimsExplorer(w.VBox):
    """Dropdowns for target, budget and claim over a live forest plot; each change redraws the figure.

    Set ``.value`` of ``target``, ``budget`` or ``claim`` from Python to drive it as a browser would.
    """

    def __init__(self, claims: pd.DataFrame) -> None:
        self.claims = claims
        options = claim_options(claims)
        self.target, self.budget, self.claim = (
            w.Dropdown(options=options[name], value=ALL, description=name, layout=w.Layout(width="auto"))
            for name in ("target", "budget", "claim")
        )
        self.figure = go.FigureWidget()
        super().__init__([w.HBox([self.target, self.budget, self.claim]), self.figure])
        for control in (self.target, self.budget, self.claim):
            control.observe(self._redraw, names="value")
        # a browser shows a FigureWidget's updates, not the state it had before its view opened: draw again then
        self.figure.observe(self._redraw, names="_view_count")
        self._redraw(None)

    def _redraw(self, _change: object) -> None:
        fig = claims_figure(self.claims, self.target.value, self.budget.value, self.claim.value)
        update_figure_widget(self.figure, fig)


def rate_sweeps(study: Study) -> pd.DataFrame:
    """Per setting, arm and rate of the sweeps: the validation score its seeds reached and the rate kept.

    The score is the pooled validation accuracy of the sweep seeds with its exact binomial interval (the rate is
    chosen on it; the test set is not looked at), beside the mean validation log-loss.
    """
    results = study.results
    linear = results[results["schedule"].fillna("linear") == "linear"]
    swept = linear[linear["role"] == "sweep"]
    chosen = linear[linear["selected"].astype(bool)].groupby(["prior", "target", "run"])["lr"].first()
    rows = []
    for (prior, target, run, lr), group in swept.groupby(["prior", "target", "run", "lr"], sort=False):
        n_val = [int(study.runs[d]["config"]["n_val"]) for d in group["run_dir"]]
        hits = int(round(sum(acc * n for acc, n in zip(group["val_acc"], n_val))))
        interval = share_interval(hits, sum(n_val))
        rows.append(
            {
                "prior": prior,
                "target": target,
                "run": run,
                "method": group["method"].iloc[0],
                "lr": float(lr),
                "seeds": len(group),
                "val_acc": interval.estimate,
                "low": interval.low,
                "high": interval.high,
                "val_logloss": float(group["val_logloss"].mean()),
                "chosen": bool(np.isclose(lr, chosen.get((prior, target, run), np.nan))),
            }
        )
    return pd.DataFrame(rows).sort_values(["prior", "target", "run", "lr"], ignore_index=True)


def rate_sweep_figure(sweeps: pd.DataFrame, title: str = "Learning-rate sweeps: validation accuracy") -> go.Figure:
    """One panel per method: validation accuracy against the rate (log axis), one line per arm, the kept rate ringed."""
    methods = list(dict.fromkeys(sweeps["method"]))
    fig = make_subplots(rows=1, cols=max(len(methods), 1), subplot_titles=methods, shared_yaxes=True)
    colours = arm_colours(list(sweeps["run"]))
    for col, method in enumerate(methods, start=1):
        for (prior, target, run), arm in sweeps[sweeps["method"] == method].groupby(
            ["prior", "target", "run"], sort=False
        ):
            colour = colours[run]
            fig.add_trace(
                go.Scatter(
                    x=arm["lr"], y=arm["val_acc"], mode="lines+markers", name=f"{run} ({prior} -> {target})",
                    marker=dict(color=colour, size=8), line=dict(color=colour),
                    error_y=dict(type="data", symmetric=False, array=arm["high"] - arm["val_acc"],
                                 arrayminus=arm["val_acc"] - arm["low"]),
                    customdata=arm["seeds"],
                    hovertemplate="rate %{x:g}<br>val acc %{y:.3f}<br>%{customdata} seed(s)<extra>" + run + "</extra>",
                ),
                row=1, col=col,
            )  # fmt: skip
            kept = arm[arm["chosen"]]
            fig.add_trace(
                go.Scatter(
                    x=kept["lr"], y=kept["val_acc"], mode="markers", name=f"{run}: rate kept", showlegend=False,
                    marker=dict(symbol="circle-open", size=18, color="black", line=dict(width=2)), hoverinfo="skip",
                ),
                row=1, col=col,
            )  # fmt: skip
        fig.update_xaxes(type="log", title_text="learning rate", row=1, col=col)
    fig.update_yaxes(title_text="validation accuracy (pooled sweep seeds, 95% CI)", row=1, col=1)
    fig.update_layout(title=title + " (ringed: the rate kept)", template="plotly_white", height=450)
    return fig


def epoch_curves(study: Study) -> pd.DataFrame:
    """Per arm at its kept rate and epoch: test and validation accuracy and normalized drift, mean over seeds.

    Only what the runs recorded: per-epoch accuracy where they evaluated each epoch, drift where they observed it
    (card runs; an epoch without a record is left out). Constant-rate runs are an arm of their own.
    """
    results = study.results
    kept = results[results["selected"].astype(bool) | (results["schedule"].fillna("linear") != "linear")]
    rows = []
    for _, run in kept.iterrows():
        res = study.runs[run["run_dir"]]
        series: dict[str, Sequence[float | None]] = {
            "test_acc": res.get("epoch_test_accuracy") or [],
            "val_acc": res.get("epoch_val_accuracy") or [],
            "drift": [h["normalized"] for h in res.get("drift_history") or []],
        }
        for name, values in series.items():
            rows += [
                {"prior": run["prior"], "target": run["target"], "run": run["run"], "seed": run["seed"],
                 "epoch": epoch, "series": name, "value": float(v)}
                for epoch, v in enumerate(values, start=1)
                if v is not None
            ]  # fmt: skip
    table = pd.DataFrame(rows, columns=["prior", "target", "run", "seed", "epoch", "series", "value"])
    return (
        table.groupby(["prior", "target", "run", "series", "epoch"], sort=False)["value"]
        .agg(mean="mean", low="min", high="max", seeds="count")
        .reset_index()
    )


SERIES_TITLES = {"test_acc": "test accuracy", "val_acc": "validation accuracy", "drift": "drift / first-epoch drift"}


def epoch_figure(curves: pd.DataFrame, title: str = "Per epoch, each arm at its kept rate") -> go.Figure:
    """Test accuracy, validation accuracy and normalized drift per epoch; a line per arm, the band spans its seeds."""
    series = [s for s in SERIES_TITLES if s in set(curves["series"])]
    fig = make_subplots(rows=1, cols=max(len(series), 1), subplot_titles=[SERIES_TITLES[s] for s in series])
    arms = list(dict.fromkeys(zip(curves["prior"], curves["target"], curves["run"])))
    colours = arm_colours([run for _, _, run in arms])
    for prior, target, run in arms:
        colour = colours[run]
        for col, name in enumerate(series, start=1):
            arm = curves[(curves["prior"] == prior) & (curves["target"] == target) & (curves["run"] == run)
                         & (curves["series"] == name)]  # fmt: skip
            if arm.empty:
                continue
            fig.add_trace(
                go.Scatter(
                    x=arm["epoch"], y=arm["mean"], mode="lines+markers", name=f"{run} ({prior} -> {target})",
                    legendgroup=run, showlegend=col == 1 or name == "drift" and "test_acc" not in series,
                    line=dict(color=colour, dash="dash" if "+" in run else "solid"), marker=dict(color=colour),
                    error_y=dict(type="data", symmetric=False, array=arm["high"] - arm["mean"],
                                 arrayminus=arm["mean"] - arm["low"], thickness=1),
                    customdata=arm["seeds"],
                    hovertemplate="epoch %{x}: %{y:.3f} (mean of %{customdata} seeds, bars: min-max)<extra>"
                    + run + "</extra>",
                ),
                row=1, col=col,
            )  # fmt: skip
        fig.update_xaxes(title_text="epoch", dtick=1)
    fig.update_layout(title=title + " (bars: range over seeds)", template="plotly_white", height=450)
    return fig


def stopping_sweep(study: Study, thresholds: Sequence[float] = SWEEP_THRESHOLDS) -> pd.DataFrame:
    """The stopping rule replayed at other thresholds from the card runs' stored drift (no retraining).

    The runs are those the report sweeps (card runs at the kept rate, linear schedule); see
    :func:`~topotuner_lab.study.stopping.threshold_sweep`. No card run: an empty table.
    """
    histories = study.inputs.stop_histories
    if not histories:
        return pd.DataFrame()
    budget = max(len(drift) for drift, _ in histories)
    return threshold_sweep(histories, budget, thresholds).assign(budget=budget)


def stopping_figure(sweep: pd.DataFrame, stop_threshold: float | None = None) -> go.Figure:
    """The share of card runs stopping early (exact 95% interval) and the accuracy given up, against the threshold."""
    by = early_by(int(sweep["budget"].iloc[0])) if len(sweep) else 0
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(
        go.Scatter(
            x=sweep["threshold"], y=sweep["share"], mode="lines+markers", name=f"share stopped by epoch {by}",
            error_y=dict(type="data", symmetric=False, array=sweep["share_high"] - sweep["share"],
                         arrayminus=sweep["share"] - sweep["share_low"]),
        ),
        secondary_y=False,
    )  # fmt: skip
    fig.add_trace(
        go.Scatter(x=sweep["threshold"], y=sweep["acc_at_stop_minus_end"], mode="lines+markers",
                   name="test accuracy at stop minus at the end", line=dict(dash="dot")),
        secondary_y=True,
    )  # fmt: skip
    if stop_threshold is not None:
        fig.add_vline(x=stop_threshold, line_dash="dash", line_color="gray", annotation_text="the study's threshold")
    fig.update_xaxes(title_text="threshold on drift / first-epoch drift")
    fig.update_yaxes(title_text="share of card runs (95% CI)", range=[0, 1.05], secondary_y=False)
    fig.update_yaxes(title_text="accuracy change", secondary_y=True)
    runs = int(sweep["runs"].iloc[0]) if len(sweep) else 0
    fig.update_layout(title=f"Stopping threshold sweep over {runs} card runs", template="plotly_white", height=420)
    return fig


def stability_tables(study: Study) -> pd.DataFrame:
    """Per model and prior task, each pair of prior seeds: Jaccard of their cards' picks, random cards', Spearman.

    ``noise_jaccard`` is the mean Jaccard of cards built the same way from noise-only drift tables (the threshold of
    the stability claim, :func:`~topotuner_lab.study.stability.noise_null`; NaN where the study has no such null).
    """
    nulls = study.inputs.stability_nulls
    tables = [
        stability_table(cards).assign(
            model=model,
            prior=prior,
            noise_jaccard=nulls[(model, prior)].query("pair == 'noise-noise'")["jaccard"].mean()
            if (model, prior) in nulls
            else np.nan,
        )
        for (model, prior), cards in study.inputs.prior_seed_cards.items()
        if len(cards) > 1
    ]
    return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()


def stability_figure(pairs: pd.DataFrame) -> go.Figure:
    """Seed x seed Jaccard heatmap of the cards' picks per model and prior task (0..1, colour bar shown)."""
    groups = list(pairs.groupby(["model", "prior"], sort=False)) if len(pairs) else []
    fig = make_subplots(rows=1, cols=max(len(groups), 1), subplot_titles=[f"{m}, prior {p}" for (m, p), _ in groups])
    for col, (_, table) in enumerate(groups, start=1):
        seeds = sorted(set(table["seed_a"]) | set(table["seed_b"]))
        grid = pd.DataFrame(np.eye(len(seeds)), index=seeds, columns=seeds)
        for _, r in table.iterrows():
            grid.loc[r["seed_a"], r["seed_b"]] = grid.loc[r["seed_b"], r["seed_a"]] = r["jaccard"]
        labels = [f"seed {s}" for s in seeds]
        fig.add_trace(
            go.Heatmap(
                z=grid.to_numpy(), x=labels, y=labels, zmin=0, zmax=1, colorscale="Viridis",
                text=np.round(grid.to_numpy(), 2), texttemplate="%{text}", showscale=col == len(groups),
                colorbar=dict(title="Jaccard"), hovertemplate="%{x} vs %{y}: Jaccard %{z:.3f}<extra></extra>",
            ),
            row=1, col=col,
        )  # fmt: skip
    noise = pairs["noise_jaccard"].mean() if len(pairs) else np.nan
    baseline = (
        (f" (noise-only cards: {noise:.2f}; " if np.isfinite(noise) else " (")
        + f"random cards of the same size: {pairs['random_jaccard'].mean():.2f})"
        if len(pairs)
        else ""
    )
    fig.update_layout(
        title="Card picks across prior seeds: Jaccard index" + baseline, template="plotly_white", height=420
    )
    return fig
