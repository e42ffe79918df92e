"""The drift table's column names: built here and parsed here only.

A table has identity columns (``pid``, ``layer``, ``kind``, ``rows``, ``cols``), topological measures per homology
dimension (``h{k}_w{p}``, ``h{k}_bottleneck``), the pretrained and fine-tuned diagrams' sizes (``n_h{k}_before``,
``n_h{k}_after``), the pretrained diagram's total persistence (``h{k}_persistence_before``) and, optionally, the
magnitude baselines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import pandas as pd

ID_COLUMNS: tuple[str, ...] = ("pid", "layer", "kind", "rows", "cols")
MAGNITUDE_COLUMNS: tuple[str, ...] = ("rel_frobenius", "rel_spectral", "row_cosine_change")
#: the topological column cards and early stopping rank by unless told otherwise
DEFAULT_METRIC = "h0_w1"

_TOPOLOGICAL = re.compile(r"h(?P<dim>\d+)_(?:w(?P<p>\d+(?:\.\d+)?)|(?P<bottleneck>bottleneck))")


def wasserstein(dim: int, p: float) -> str:
    """``h{dim}_w{p}``: p-Wasserstein drift of the H``dim`` diagrams."""
    return f"h{dim}_w{p:g}"


def bottleneck(dim: int) -> str:
    """``h{dim}_bottleneck``: bottleneck drift of the H``dim`` diagrams."""
    return f"h{dim}_bottleneck"


def diagram_size(dim: int, side: Literal["before", "after"]) -> str:
    """``n_h{dim}_{side}``: points in the pretrained (before) or fine-tuned (after) H``dim`` diagram."""
    return f"n_h{dim}_{side}"


def total_persistence(dim: int) -> str:
    """``h{dim}_persistence_before``: total persistence of the pretrained H``dim`` diagram."""
    return f"h{dim}_persistence_before"


@dataclass(frozen=True)
class Measure:
    """A topological measure column, parsed: homology dimension, and the Wasserstein order (None: bottleneck)."""

    name: str
    dim: int
    order: float | None

    @property
    def label(self) -> str:
        """The measure without its dimension: ``w1``, ``w2`` or ``bottleneck``."""
        return "bottleneck" if self.order is None else f"w{self.order:g}"


def topological(name: str) -> Measure | None:
    """The topological measure ``name`` is (``h0_w1`` -> dim 0, order 1), or None for any other column."""
    match = _TOPOLOGICAL.fullmatch(name)
    if match is None:
        return None
    return Measure(name, int(match["dim"]), None if match["bottleneck"] else float(match["p"]))


def measures(table: pd.DataFrame) -> list[Measure]:
    """The topological measure columns of a table, in table order."""
    return [m for m in map(topological, map(str, table.columns)) if m is not None]


def rankable(table: pd.DataFrame) -> list[str]:
    """The numeric measure columns a card can be ranked by (topological and magnitude; not ids or diagram sizes)."""
    auxiliary = {c for c in table.columns if str(c).startswith("n_h") or str(c).endswith("_persistence_before")}
    return [
        str(c)
        for c in table.columns
        if c not in ID_COLUMNS and c not in auxiliary and pd.api.types.is_numeric_dtype(table[c])
    ]
