"""Reusable ipywidgets components: a projection picker, a task picker, the live profile builder and explorers.

All work without a browser: set ``.value`` of their controls in Python and read the result
(``picker.pid``, ``tasks.value``, ``builder.card``), which is how the tests drive them.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import ipywidgets as w
import pandas as pd
import plotly.graph_objects as go

from topotuner_lab._io import atomic
from topotuner_lab._io.errors import ParameterError, ProfileError, TaskError, TopoTunerError
from topotuner_lab.drift import columns
from topotuner_lab.drift.noise import NoiseCheck, noise_check
from topotuner_lab.drift.settings import RECIPES, DriftSettings
from topotuner_lab.drift.signals import SIGNALS, with_relchange, with_signals
from topotuner_lab.lab.plots import barcode, drift_heatmaps, persistence_diagram, update_figure_widget
from topotuner_lab.profiles.card import (
    DEFAULT_NORMALIZATION,
    FIXED_RANKINGS,
    JOINT,
    NORMALIZATIONS,
    STRATEGIES,
    ModelIdentity,
    ProfileCard,
)
from topotuner_lab.profiles.select import MIN_NOISE_DRAWS, CardSettings, build_profile
from topotuner_lab.tasks.registry import TASKS, get_task
from topotuner_lab.tasks.schema import TaskSpec
from topotuner_lab.topology.persistence import diagrams
from topotuner_lab.weights.projections import parse_pid
from topotuner_lab.weights.snapshot import Snapshot


class Panel(w.VBox):
    """A box of widgets whose plain-text output says what it is, for a notebook read without a running kernel.

    A saved notebook keeps no widget state (:func:`~topotuner_lab.lab.notebooks.run_notebooks`); viewers that cannot
    draw the widget show this line instead of the widget's repr (``VBox(children=(...``).
    """

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        data: dict[str, Any] = super()._repr_mimebundle_(**kwargs)
        data["text/plain"] = f"[interactive {type(self).__name__}: run the notebook to use it]"
        return data


class ProjectionPicker(w.HBox):
    """Layer slider + projection-kind buttons; ``pid`` is the chosen id (e.g. ``L3.v``)."""

    def __init__(self, pids: Sequence[str], on_change: Callable[[str], None] | None = None) -> None:
        parsed = [parse_pid(p) for p in pids]
        layers = sorted({layer for layer, _ in parsed})
        kinds = [k for k in "qkvo" if any(kind == k for _, kind in parsed)]
        self.layer = w.IntSlider(value=layers[0], min=layers[0], max=layers[-1], description="layer")
        self.kind = w.ToggleButtons(options=kinds, value=kinds[0], description="projection")
        super().__init__([self.layer, self.kind])
        self._on_change = on_change
        for control in (self.layer, self.kind):
            control.observe(self._changed, names="value")

    @property
    def pid(self) -> str:
        """The projection id the two dropdowns select (``L3.v``)."""
        return f"L{self.layer.value}.{self.kind.value}"

    def _changed(self, _change: object) -> None:
        if self._on_change:
            self._on_change(self.pid)


def diagram_figures(pretrained: Snapshot, finetuned: Snapshot, pid: str) -> tuple[go.Figure, go.Figure]:
    """Projection ``pid``'s persistence diagrams before and after fine-tuning, side by side, and its barcode after."""
    before, after = diagrams(pretrained.matrices[pid]), diagrams(finetuned.matrices[pid])
    return (
        persistence_diagram({"pretrained": before.dgms, "fine-tuned": after.dgms}, title=f"{pid}: persistence diagram"),
        barcode(after.dgms, title=f"{pid}: barcode after fine-tuning"),
    )


def persistence_explorer(pretrained: Snapshot, finetuned: Snapshot, layer: int = 0, kind: str = "v") -> Panel:
    """A :class:`ProjectionPicker` over the snapshots' projections with the picked one's diagrams, redrawn live."""
    views = (go.FigureWidget(), go.FigureWidget())

    def show(pid: str) -> None:
        for view, fig in zip(views, diagram_figures(pretrained, finetuned, pid)):
            update_figure_widget(view, fig)

    picker = ProjectionPicker(list(pretrained.matrices), on_change=show)
    picker.layer.value, picker.kind.value = layer, kind
    show(picker.pid)
    return Panel([picker, *views])


def drift_explorer(table: pd.DataFrame, measures: Sequence[str], beside: str = "rel_frobenius") -> Panel:
    """A dropdown of drift ``measures`` and the chosen one's heatmap beside the ``beside`` column's, redrawn live."""
    column = w.Dropdown(options=list(measures), description="drift")
    view = go.FigureWidget()

    def show(name: str) -> None:
        update_figure_widget(view, drift_heatmaps(table, [name, beside]))

    column.observe(lambda change: show(change.new), names="value")
    show(column.value)
    return Panel([column, view])


def task_label(spec: TaskSpec) -> str:
    """A task's option label: its name, output type and metric (``sst2 — multiple_choice, acc``)."""
    return f"{spec.task} — {spec.output_type}, {spec.metric}"


def task_summary(spec: TaskSpec) -> str:
    """One line on a task: how it is scored (label words or generation length) and where its rows are."""
    if spec.output_type == "multiple_choice" and spec.per_row_choices:
        scoring = "the likelihood of each row's own options"
    elif spec.output_type == "multiple_choice":
        scoring = f"the likelihood of {' / '.join(spec.doc_to_choice)}"
    else:
        scoring = f"greedy generation (up to {spec.max_gen_toks} tokens)"
    sources = [f"local {', '.join(spec.data_files)}"] if spec.data_files else []
    sources += [f"hub {spec.dataset_path}"] if spec.dataset_path else []
    return f"{spec.task}: {spec.output_type} scored by {spec.metric} on {scoring}; data: {' or '.join(sources)}"


class TaskPicker(Panel):
    """A built-in task (:data:`~topotuner_lab.tasks.registry.TASKS`) from a dropdown, or a task spec file by its path.

    ``value`` is the chosen built-in name, or the typed path once :func:`~topotuner_lab.tasks.registry.get_task` reads
    it; a bad spec file shows its problem and fix and leaves ``value`` as it was. Choosing a built-in clears the path.
    """

    def __init__(
        self, value: str | os.PathLike[str] | None = None, on_change: Callable[[str], None] | None = None
    ) -> None:
        names = list(TASKS)  # read now: built-in tasks are spec files, so the list grows with the folder
        if not names:
            raise TaskError("no built-in task specs were found", "reinstall topotuner_lab (tasks/builtin/*.yaml)")
        initial = os.fspath(value) if value is not None else names[0]
        spec = get_task(initial)  # a bad parameter (papermill, CLI) fails loudly, as the task it names would
        self.builtin = w.Dropdown(
            options=[(task_label(TASKS[n]), n) for n in names],
            value=initial if initial in TASKS else names[0],
            description="task",
            layout=w.Layout(width="32em"),
        )
        self.path = w.Text(
            value="" if initial in TASKS else initial,
            placeholder="or the path of a .yaml task spec file (Enter to check it)",
            description="spec file",
            continuous_update=False,
            layout=w.Layout(width="32em"),
        )
        self.info = w.HTML()
        self.status = w.HTML()
        self.error: TaskError | None = None
        self._value, self._spec, self._on_change = initial, spec, on_change
        self._show(spec)
        super().__init__([self.builtin, self.path, self.info, self.status])
        self.builtin.observe(self._builtin_changed, names="value")
        self.path.observe(self._path_changed, names="value")

    @property
    def value(self) -> str:
        """The chosen task: a built-in name or the path of a spec file (what ``get_task`` and the notebooks take)."""
        return self._value

    @property
    def spec(self) -> TaskSpec:
        """The chosen task's spec."""
        return self._spec

    def _show(self, spec: TaskSpec) -> None:
        self.info.value = f"<span style='color:#555'>{html.escape(task_summary(spec))}</span>"

    def _accept(self, value: str, spec: TaskSpec) -> None:
        changed = value != self._value
        self._value, self._spec, self.error = value, spec, None
        self.status.value = ""
        self._show(spec)
        if changed and self._on_change:
            self._on_change(value)

    def _builtin_changed(self, change: object) -> None:
        if self.path.value.strip():
            self.path.value = ""  # its observer accepts the dropdown's task
        else:
            self._accept(self.builtin.value, TASKS[self.builtin.value])

    def _path_changed(self, change: object) -> None:
        typed = self.path.value.strip()
        if not typed:
            self._accept(self.builtin.value, TASKS[self.builtin.value])
            return
        try:
            spec = get_task(typed)
        except TaskError as exc:
            self.error = exc
            self.status.value = (
                f"<b style='color:#b00'>{html.escape(exc.problem)}</b> — {html.escape(exc.fix)}"
                f"<br><span style='color:#555'>still using {html.escape(self._value)}</span>"
            )
            return
        self._accept(typed, spec)


def task_picker(
    value: str | os.PathLike[str] | None = None, on_change: Callable[[str], None] | None = None
) -> TaskPicker:
    """A :class:`TaskPicker` starting at ``value`` (a built-in name or a spec path; default: the first built-in).

    A bad ``value`` raises :class:`~topotuner_lab._io.errors.TaskError`; ``on_change`` gets each newly chosen value.
    """
    return TaskPicker(value, on_change)


#: the drift table and its noise tables (the noise floor) of a named recipe, computed or loaded when asked
#: (:func:`topotuner_lab.lab.workbench.drift_source`)
DriftSource = Callable[[str], tuple[pd.DataFrame, Sequence[pd.DataFrame]]]
#: strategy -> a function that adds the column the strategy ranks by to a drift table (computed when picked)
ColumnSources = Mapping[str, Callable[[pd.DataFrame], pd.DataFrame]]


def selector_columns(
    snapshots: Callable[[], tuple[Snapshot, Snapshot]],
) -> dict[str, Callable[[pd.DataFrame], pd.DataFrame]]:
    """The columns of the field's selectors, computed on demand from the pretrained and prior-fine-tuned snapshots.

    ``snapshots`` returns the pair (read once, when a selector is first picked). The weight statistics (``snr``,
    ``alpha``, ``kappa``: :data:`~topotuner_lab.drift.signals.SIGNALS`) need the pretrained matrices, ``relchange``
    the fine-tuned ones too. ``gradient`` needs a target task and the model, so it is not among them.
    """
    pair: list[tuple[Snapshot, Snapshot]] = []

    def loaded() -> tuple[Snapshot, Snapshot]:
        if not pair:
            pair.append(snapshots())
        return pair[0]

    sources: dict[str, Callable[[pd.DataFrame], pd.DataFrame]] = {
        strategy: lambda table: with_signals(table, loaded()[0])
        for strategy, (column, _) in FIXED_RANKINGS.items()
        if column in SIGNALS
    }
    sources["relchange"] = lambda table: with_relchange(table, *loaded())
    return sources


def needed_columns(strategy: str) -> list[str]:
    """The drift-table columns ``strategy`` ranks by besides the drift column (none for high/low-drift and random)."""
    if strategy in FIXED_RANKINGS:
        return [FIXED_RANKINGS[strategy][0]]
    return [FIXED_RANKINGS["magnitude"][0]] if strategy in JOINT else []


def score_label(card: ProfileCard) -> str:
    """What a card's ranking scores are, for a colour bar: the column and its normalization, or the joint score."""
    if card.strategy == "random":
        return "random order"
    if card.strategy in JOINT:
        return f"joint score ({card.metric} {card.normalization} x rel_frobenius)"
    return card.metric if card.normalization == "raw" else f"{card.metric} ({card.normalization})"


def card_scores(card: ProfileCard) -> pd.Series:
    """The scores a card ranked its projections by, by id: the values its selection filled the budget from."""
    return pd.Series({row["pid"]: float(row["score"]) for row in card.ranking}, name=score_label(card))


def error_html(exc: BaseException) -> str:
    """An error for a widget's error label: a project error's problem and fix, any other error's type and text."""
    if isinstance(exc, TopoTunerError):
        return f"<b style='color:#b00'>{html.escape(exc.problem)}</b> — {html.escape(exc.fix)}"
    return f"<b style='color:#b00'>{html.escape(type(exc).__name__)}: {html.escape(str(exc))}</b>"


def table_recipe(table: pd.DataFrame) -> str:
    """The recipe (:data:`~topotuner_lab.drift.settings.RECIPES`) a drift table records; ``custom`` for other settings.

    A table without recorded settings (a CSV file) reads as ``unknown``.
    """
    recorded = table.attrs.get("settings")
    if not recorded:
        return "unknown"
    return DriftSettings.from_key(json.loads(recorded)).recipe_name


def recipe_summary(name: str) -> str:
    """One line on what a recipe measures (rows' distance, dimensions, orders, the norm of the birth-death plane)."""
    if name not in RECIPES:
        return f"drift settings: {name}"
    s = DriftSettings.recipe(name)
    dims = "H0" if s.maxdim == 0 else "H0 and H1"
    orders = ", ".join(f"W{p:g}" for p in s.orders) + (", bottleneck" if s.bottleneck else "")
    return f"{name}: {s.metric} distance between rows, {dims}; {orders}; L{s.internal_p:g} norm between diagram points"


class ProfileBuilder(Panel):
    """A card built with widgets: drift recipe, strategy, budget, and the column it ranks by (H dim and measure).

    The budget is a fraction of the parameters (shown as percent text) or a count of matrices. The heatmap (coloured
    by the scores the strategy ranks by, the picks outlined) and the trainable-parameter count follow every change;
    *Save* writes the card, its Markdown view and the Spectrum/axolotl YAML. Given a ``drift`` source, the *recipe*
    control picks the drift table (:data:`~topotuner_lab.drift.settings.RECIPES`: the lab's ``default`` or the
    authors' ``reference``), computed or loaded when picked; the H dim and measure controls then offer that table's
    measures. Without one the recipe shows the given table's and is fixed. The strategy control offers the strategies
    whose columns the table has or ``selectors`` can add (:func:`selector_columns`, computed when the strategy is
    picked). Every error shows in the ``error`` label; the figure is then cleared.
    """

    def __init__(
        self,
        table: pd.DataFrame | None,
        identity: ModelIdentity,
        prior_task: str,
        out_dir: str | Path = ".",
        *,
        stop_threshold: float | None = None,
        seed: int = 0,
        noise: Sequence[pd.DataFrame] = (),
        drift: DriftSource | None = None,
        recipe: str = "default",
        selectors: ColumnSources | None = None,
    ) -> None:
        if table is None:
            if drift is None:
                raise ProfileError(
                    "the profile builder needs a drift table or a drift source",
                    "pass a table, or drift=workbench.drift_source(work_dir, prior_task)",
                )
            table, noise = self._load(drift, recipe)
        self.identity, self.prior_task, self.out_dir = identity, prior_task, Path(out_dir)
        self.stop_threshold, self.seed, self.drift = stop_threshold, seed, drift
        self.table, self.noise, self.selectors = table, list(noise), dict(selectors or {})
        self._holding = True  # no refresh while controls are (re)configured
        current = table_recipe(table)
        self.recipe = w.Dropdown(
            options=list(RECIPES) + ([current] if current not in RECIPES else []),
            value=current,
            description="recipe",
            disabled=drift is None,
        )
        self.recipe_info = w.HTML(f"<span style='color:#555'>{recipe_summary(current)}</span>")
        self.strategy = w.Dropdown(options=["high-drift"], value="high-drift", description="strategy")
        self.mode = w.ToggleButtons(
            options=[("fraction of parameters", "fraction"), ("matrices", "count")],
            value="fraction",
            description="budget",
        )
        # a fraction, as CardSettings, presets and cards take it; shown as percent text (0.01 reads 1.0%)
        self.fraction = w.FloatSlider(
            value=0.01, min=0.001, max=0.1, step=0.001, readout_format=".1%", description="fraction"
        )
        self.count = w.IntSlider(value=4, min=1, max=len(table), description="matrices")
        self.dim = w.Dropdown(description="H dim")
        self.order = w.Dropdown(description="measure")
        self.normalization = w.Dropdown(description="normalize")
        self._loaded = current
        self._configure()
        self.status = w.HTML()
        self.error = w.HTML()
        self.plot = go.FigureWidget()
        self.save_button = w.Button(description="Save profile card", button_style="success", icon="save")
        self.save_button.on_click(self._save_clicked)
        self.card: ProfileCard | None = None
        self.check: NoiseCheck | None = None
        self.noise_status = w.HTML()
        super().__init__(
            [
                w.HBox([self.recipe, self.recipe_info]),
                w.HBox([self.strategy, self.mode]),
                w.HBox([self.fraction, self.count]),
                w.HBox([self.dim, self.order, self.normalization]),
                self.noise_status,
                self.status,
                self.error,
                self.save_button,
                self.plot,
            ]
        )
        self.recipe.observe(lambda change: self.use_recipe(change.new), names="value")
        for control in (self.strategy, self.mode, self.fraction, self.count, self.dim, self.order, self.normalization):
            control.observe(lambda _c: None if self._holding else self.refresh(), names="value")
        self._holding = False
        self.refresh()

    @staticmethod
    def _load(drift: DriftSource, recipe: str) -> tuple[pd.DataFrame, list[pd.DataFrame]]:
        if recipe not in RECIPES:
            raise ParameterError(f"unknown drift recipe {recipe!r}", f"use one of {', '.join(RECIPES)}")
        table, noise = drift(recipe)
        return table, list(noise)

    @staticmethod
    def _set_options(control: w.Dropdown, options: Sequence[object], prefer: object) -> None:
        """New options for ``control``, keeping its value (else ``prefer``, else the first) where it is offered."""
        keep = next((v for v in (control.value, prefer) if v in options), options[0])
        control.options = options
        control.value = keep

    def offered_strategies(self) -> list[str]:
        """The strategies that can rank the current table: its columns have what they need, or ``selectors`` add it."""
        have = set(columns.rankable(self.table))
        return [s for s in STRATEGIES if s in self.selectors or set(needed_columns(s)) <= have]

    def _configure(self) -> None:
        """Offer the current table's strategies, dimensions, orders and normalizations (without refreshing)."""
        measures = columns.measures(self.table)
        dims = sorted({m.dim for m in measures})
        orders = sorted({f"{m.order:g}" for m in measures if m.order is not None}, key=float)
        orders += ["bottleneck"] if any(m.order is None for m in measures) else []
        usable = [n for n in NORMALIZATIONS if n != "noise-z" or len(self.noise) >= MIN_NOISE_DRAWS]
        self._set_options(self.strategy, self.offered_strategies(), "high-drift")
        self._set_options(self.dim, dims, dims[0])
        self._set_options(self.order, orders, orders[0])
        self._set_options(self.normalization, usable, DEFAULT_NORMALIZATION)
        self.count.max = len(self.table)

    def use_recipe(self, name: str) -> ProfileCard | None:
        """Switch to the drift table of recipe ``name`` (computed or loaded by the drift source) and rebuild the card.

        The H dim and measure controls keep their values where the new table has them (the ``reference`` recipe is
        H0 with W1 only). A recipe that cannot be loaded shows its error and keeps the current table.
        """
        if self.drift is None:
            raise ProfileError(
                "this profile builder has no drift source: its recipe is fixed by the table it was given",
                "build it with drift=workbench.drift_source(work_dir, prior_task) to choose the recipe",
            )
        if self.recipe.value != name:
            self.recipe.value = name  # the observer calls back here
            return self.card
        if name == self._loaded:
            return self.card
        self.status.value = f"loading the drift table of recipe <b>{name}</b>..."
        try:
            self.table, self.noise = self._load(self.drift, name)
        except Exception as exc:  # shown in the widget: an observer's exception would be lost in the kernel log
            self.recipe.value = self._loaded  # back to the table still in use (a no-op call back)
            self.status.value = ""
            self.error.value = error_html(exc)
            return None
        self._loaded = name
        self.recipe_info.value = f"<span style='color:#555'>{recipe_summary(name)}</span>"
        self._holding = True
        try:
            self._configure()
        finally:
            self._holding = False
        return self.refresh()

    @property
    def rank_by(self) -> str:
        """The drift column the controls select to rank by (``h0_w1``, ``h1_bottleneck``...)."""
        if self.order.value == "bottleneck":
            return columns.bottleneck(self.dim.value)
        return columns.wasserstein(self.dim.value, float(self.order.value))

    def _add_columns(self, strategy: str) -> None:
        """Compute the columns ``strategy`` ranks by when the table lacks them (once per table)."""
        if strategy in self.selectors and not set(needed_columns(strategy)) <= set(self.table.columns):
            self.status.value = f"computing the columns of strategy <b>{strategy}</b>..."
            self.table = self.selectors[strategy](self.table)

    def refresh(self) -> ProfileCard | None:
        """Rebuild the card from the controls and redraw.

        An error (a bad budget, a strategy that cannot rank the table) shows in the ``error`` label, clears the figure
        and leaves no card.
        """
        self.fraction.layout.display = None if self.mode.value == "fraction" else "none"
        self.count.layout.display = None if self.mode.value == "count" else "none"
        budget = {"fraction": self.fraction.value} if self.mode.value == "fraction" else {"count": self.count.value}
        try:
            self._add_columns(self.strategy.value)
            self.card = build_profile(
                self.table,
                self.identity,
                CardSettings(
                    prior_task=self.prior_task,
                    strategy=self.strategy.value,
                    metric=self.rank_by,
                    seed=self.seed,
                    stop_threshold=self.stop_threshold,
                    normalization=self.normalization.value,
                    **budget,
                ),
                noise=self.noise,
            )
        except Exception as exc:  # shown in the widget: an observer's exception would be lost in the kernel log
            self.card, self.check = None, None
            self.status.value = self.noise_status.value = ""
            self.error.value = error_html(exc)
            update_figure_widget(self.plot, go.Figure(layout=dict(title="no selection: see the error above")))
            return None
        c = self.card
        self.error.value = ""
        self.check = noise_check(self.table, self.noise, c.metric) if self.noise and c.metric in self.noise[0] else None
        color = "#b00" if self.check is not None and self.check.within_noise else "#555"
        self.noise_status.value = (
            f"<span style='color:{color}'>{self.check.message}</span>" if self.check is not None else ""
        )
        self.status.value = (
            f"<b>{len(c.trainable)}</b> trainable projections, <b>{c.trainable_params:,}</b> parameters "
            f"(<b>{100 * c.trainable_fraction:.2f}%</b>): {', '.join(c.trainable)}"
        )
        update_figure_widget(self.plot, self.figure())
        return c

    def figure(self) -> go.Figure:
        """The current card's selection on the layer x kind plane, coloured by the scores it ranked by."""
        if self.card is None:
            raise ProfileError(
                "no valid profile is selected", "change the controls until the builder shows a selection"
            )
        scores = card_scores(self.card)
        ranked = [row["score"] for row in self.card.ranking]  # best first
        first = "highest" if ranked[0] >= ranked[-1] else "lowest"
        return drift_heatmaps(
            self.table.assign(**{str(scores.name): self.table["pid"].map(scores)}),
            [str(scores.name)],
            title=f"{self.card.strategy} selection: the {first} {scores.name} first (picks outlined)",
            selected=self.card.trainable,
        )

    def save(self, stem: str | None = None) -> list[Path]:
        """Write ``<stem>.json``, ``<stem>.md`` and ``<stem>.spectrum.yaml`` for the current card."""
        if self.card is None:
            raise ProfileError(
                "no valid profile is selected", "change the controls until the builder shows a selection"
            )
        budget = f"{100 * self.fraction.value:g}pct" if self.mode.value == "fraction" else f"{self.count.value}m"
        recipe = "" if self.recipe.value == "default" else f"-{self.recipe.value}"
        stem = stem or f"{self.prior_task}-{self.card.strategy}-{budget}{recipe}"
        card_path = self.card.save(self.out_dir / f"{stem}.json")
        yaml_path = atomic.write_text(self.out_dir / f"{stem}.spectrum.yaml", self.card.to_spectrum_yaml())
        self.status.value += f"<br>saved {card_path}"
        return [card_path, card_path.with_suffix(".md"), yaml_path]

    def _save_clicked(self, _button: object) -> None:
        """The Save button: write the card, or show why not in the error label."""
        try:
            self.save()
        except Exception as exc:  # shown in the widget: a click handler's exception would be lost in the kernel log
            self.error.value = error_html(exc)


def profile_builder(
    model: str,
    work_dir: str | Path,
    prior_task: str,
    *,
    recipe: str = "default",
    strategy: str = "high-drift",
    budget_fraction: float = 0.01,
    homology_dim: int = 0,
    normalization: str = DEFAULT_NORMALIZATION,
    stop_threshold: float | None = None,
) -> ProfileBuilder:
    """Notebook 4's builder over the series' work folder, its controls set from the notebook's parameters.

    The drift tables come from :func:`~topotuner_lab.lab.workbench.drift_source` (each recipe computed once), the
    selectors' columns from notebook 1's snapshots when a selector is picked; cards are saved in ``cards/``.
    """
    from topotuner_lab.lab import workbench
    from topotuner_lab.study.workspace import WorkDir

    _, pretrained = workbench.pretrained_snapshot(model, work_dir)
    builder = ProfileBuilder(
        None,  # the drift table comes from the recipe control: computed or loaded per recipe
        ModelIdentity.from_snapshot(pretrained),
        prior_task,
        out_dir=WorkDir(work_dir).cards,
        stop_threshold=stop_threshold,
        drift=workbench.drift_source(work_dir, prior_task),
        recipe=recipe,
        selectors=selector_columns(lambda: workbench.load_pair(work_dir, prior_task)),
    )
    builder.strategy.value, builder.fraction.value = strategy, budget_fraction
    builder.dim.value, builder.normalization.value = homology_dim, normalization
    return builder
