"""Reusable ipywidgets components: a projection picker and the live profile builder.

Both work without a browser: set ``.value`` of their controls in Python and read the result
(``picker.pid``, ``builder.card``), which is how the tests drive them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import ipywidgets as w
import pandas as pd
import plotly.graph_objects as go

from topotuner_lab._io import atomic
from topotuner_lab._io.errors import ProfileError
from topotuner_lab.drift import columns
from topotuner_lab.drift.noise import NoiseCheck, noise_check
from topotuner_lab.lab.plots import drift_heatmaps, update_figure_widget
from topotuner_lab.profiles.card import NORMALIZATIONS, STRATEGIES, ModelIdentity, ProfileCard
from topotuner_lab.profiles.select import build_profile
from topotuner_lab.weights.projections import parse_pid


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


class ProfileBuilder(w.VBox):
    """A profile card built with widgets: strategy, budget (% or count), metric and homology dimension.

    The heatmap and the trainable-parameter count follow every change; *Save* writes the card, its Markdown view
    and the Spectrum/axolotl YAML.
    """

    def __init__(
        self,
        table: pd.DataFrame,
        identity: ModelIdentity,
        prior_task: str,
        out_dir: str | Path = ".",
        *,
        stop_threshold: float | None = None,
        seed: int = 0,
        noise: Sequence[pd.DataFrame] = (),
    ) -> None:
        self.table, self.identity, self.prior_task, self.out_dir = table, identity, prior_task, Path(out_dir)
        self.stop_threshold, self.seed, self.noise = stop_threshold, seed, list(noise)
        measures = columns.measures(table)
        dims = sorted({m.dim for m in measures})
        orders = sorted({f"{m.order:g}" for m in measures if m.order is not None})
        self.strategy = w.Dropdown(options=list(STRATEGIES), value="high-drift", description="strategy")
        self.mode = w.ToggleButtons(options=["percent", "count"], value="percent", description="budget in")
        self.percent = w.FloatSlider(value=1.0, min=0.1, max=10.0, step=0.1, description="budget %")
        self.count = w.IntSlider(value=4, min=1, max=len(table), description="matrices")
        self.dim = w.Dropdown(options=dims, value=dims[0], description="H dim")
        self.order = w.Dropdown(
            options=orders + (["bottleneck"] if any(m.order is None for m in measures) else []),
            value=orders[0],
            description="metric",
        )
        usable = [n for n in NORMALIZATIONS if n != "noise-z" or len(self.noise) >= 2]
        self.normalization = w.Dropdown(
            options=usable, value="per-point" if "per-point" in usable else usable[0], description="normalize"
        )
        self.status = w.HTML()
        self.plot = go.FigureWidget()
        self.save_button = w.Button(description="Save profile card", button_style="success", icon="save")
        self.save_button.on_click(lambda _b: self.save())
        self.card: ProfileCard | None = None
        self.check: NoiseCheck | None = None
        self.noise_status = w.HTML()
        super().__init__(
            [
                w.HBox([self.strategy, self.mode]),
                w.HBox([self.percent, self.count]),
                w.HBox([self.dim, self.order, self.normalization]),
                self.noise_status,
                self.status,
                self.save_button,
                self.plot,
            ]
        )
        for control in (self.strategy, self.mode, self.percent, self.count, self.dim, self.order, self.normalization):
            control.observe(lambda _c: self.refresh(), names="value")
        self.refresh()

    @property
    def metric(self) -> str:
        """The drift column the controls select (``h0_w1``, ``h1_bottleneck``...)."""
        if self.order.value == "bottleneck":
            return columns.bottleneck(self.dim.value)
        return columns.wasserstein(self.dim.value, float(self.order.value))

    def refresh(self) -> ProfileCard | None:
        """Rebuild the card from the controls and redraw; a bad budget shows its error instead."""
        self.percent.layout.display = None if self.mode.value == "percent" else "none"
        self.count.layout.display = None if self.mode.value == "count" else "none"
        budget = {"fraction": self.percent.value / 100} if self.mode.value == "percent" else {"count": self.count.value}
        try:
            self.card = build_profile(
                self.table,
                self.identity,
                prior_task=self.prior_task,
                strategy=self.strategy.value,
                metric=self.metric,
                seed=self.seed,
                stop_threshold=self.stop_threshold,
                normalization=self.normalization.value,
                noise=self.noise,
                **budget,
            )
        except ProfileError as exc:
            self.card = None
            self.status.value = f"<b style='color:#b00'>{exc.problem}</b> — {exc.fix}"
            return None
        c = self.card
        self.check = noise_check(self.table, self.noise, c.metric) if self.noise and c.metric in self.noise[0] else None
        color = "#b00" if self.check is not None and self.check.within_noise else "#555"
        self.noise_status.value = (
            f"<span style='color:{color}'>{self.check.message}</span>" if self.check is not None else ""
        )
        self.status.value = (
            f"<b>{len(c.trainable)}</b> trainable projections, <b>{c.trainable_params:,}</b> parameters "
            f"(<b>{100 * c.trainable_fraction:.2f}%</b>): {', '.join(c.trainable)}"
        )
        update_figure_widget(
            self.plot,
            drift_heatmaps(self.table, [c.metric], title=f"{c.strategy} selection by {c.metric}", selected=c.trainable),
        )
        return c

    def save(self, stem: str | None = None) -> list[Path]:
        """Write ``<stem>.json``, ``<stem>.md`` and ``<stem>.spectrum.yaml`` for the current card."""
        if self.card is None:
            raise ProfileError("no valid profile is selected", "change the budget until the builder shows a selection")
        budget = f"{self.percent.value:g}pct" if self.mode.value == "percent" else f"{self.count.value}m"
        stem = stem or f"{self.prior_task}-{self.card.strategy}-{budget}"
        card_path = self.card.save(self.out_dir / f"{stem}.json")
        yaml_path = atomic.write_text(self.out_dir / f"{stem}.spectrum.yaml", self.card.to_spectrum_yaml())
        self.status.value += f"<br>saved {card_path}"
        return [card_path, card_path.with_suffix(".md"), yaml_path]
