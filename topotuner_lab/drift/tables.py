"""Drift table files: written atomically as Parquet (keeps the provenance attributes) or CSV, read back checked.

Per-epoch drift tables of one run (the pretrained snapshot against the snapshot after each epoch) combine into one
table with :func:`aggregate_epochs`, as the authors' reference scripts aggregate drift over the prior run's epochs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from topotuner_lab._io import atomic
from topotuner_lab._io.errors import InputFileError, ParameterError, SnapshotMismatchError
from topotuner_lab.drift.columns import ID_COLUMNS, MAGNITUDE_COLUMNS, topological
from topotuner_lab.weights.projections import PID_PATTERN

TABLE_SUFFIXES: tuple[str, ...] = (".parquet", ".csv")
#: how per-epoch drift tables combine: the last epoch's table, or the mean over epochs of every drift column
AGGREGATIONS: tuple[str, ...] = ("final", "mean")


def check_table_path(path: str | os.PathLike[str]) -> Path:
    """Refuse a table file name this module cannot write, before any work is done."""
    path = Path(path)
    if path.suffix not in TABLE_SUFFIXES:
        raise ParameterError(f"cannot write a table to {path.name!r}", "use a .parquet or .csv file name")
    return path


def save_table(table: pd.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Write a table atomically as Parquet (``.parquet``) or CSV (``.csv``).

    Parquet keeps the table's ``attrs`` (the models, the pretrained weight hash and the drift settings, which a card
    built from the table records and checks); CSV keeps the columns only.

    Parameters
    ----------
    table : pandas.DataFrame
        A drift table (:func:`drift_table`), written without its index.
    path : str or os.PathLike
        The file; its suffix picks the format.

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    ParameterError
        A suffix other than ``.parquet`` or ``.csv`` (refused before anything is written).

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> import pandas as pd
    >>> from topotuner_lab import load_table, save_table
    >>> table = pd.DataFrame({"pid": ["L0.q", "L0.k"], "layer": [0, 0], "kind": ["q", "k"], "rows": [8, 4],
    ...                       "cols": [8, 8], "h0_w1": [0.5, 0.25]})
    >>> table.attrs["before"] = "toy"
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = save_table(table, Path(folder) / "drift.parquet")
    ...     again = load_table(path)
    ...     print(path.name, again.equals(table), again.attrs["before"])
    drift.parquet True toy
    """
    path = check_table_path(path)
    with atomic.atomic_path(path) as tmp:
        if path.suffix == ".parquet":
            table.to_parquet(tmp, index=False)
        else:
            table.to_csv(tmp, index=False)
    return path


def load_table(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read and check a drift table written by :func:`save_table` (one row per projection id).

    Parameters
    ----------
    path : str or os.PathLike
        A ``.parquet`` or ``.csv`` file written by :func:`save_table` or ``topotuner-lab drift``.

    Returns
    -------
    pandas.DataFrame
        The table, with its ``attrs`` when it was written as Parquet.

    Raises
    ------
    InputFileError
        The file is missing, of another suffix, unreadable, or not a drift table: an identity column (``pid``,
        ``layer``, ``kind``, ``rows``, ``cols``) missing, a projection id listed twice or not shaped like ``L0.q``.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> import pandas as pd
    >>> from topotuner_lab import InputFileError, load_table
    >>> twice = pd.DataFrame({"pid": ["L0.q", "L0.q"], "layer": 0, "kind": "q", "rows": 8, "cols": 8, "h0_w1": 0.5})
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = Path(folder) / "drift.csv"
    ...     twice.to_csv(path, index=False)
    ...     try:
    ...         load_table(path)
    ...     except InputFileError as err:
    ...         print(err.problem)
    drift table .../drift.csv lists projection id(s) ['L0.q'] more than once
    """
    path = Path(path)
    redo = "compute it again with `topotuner-lab drift BEFORE AFTER -o FILE.parquet`"
    if not path.is_file():
        raise InputFileError(
            f"drift table {path} does not exist", "compute it with `topotuner-lab drift BEFORE AFTER -o FILE`"
        )
    if path.suffix not in TABLE_SUFFIXES:
        raise InputFileError(
            f"{path} is not a drift table (.parquet or .csv)",
            f"pass the table written by `topotuner-lab drift`; {redo}",
        )
    try:
        table = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow/pandas raise many types for empty, truncated or foreign files
        raise InputFileError(
            f"drift table {path} cannot be read ({exc.__class__.__name__}: {str(exc)[:120]})",
            f"the file is damaged or not a table: {redo}",
        ) from exc
    missing = [c for c in ID_COLUMNS if c not in table.columns]
    if missing:
        raise InputFileError(f"{path} is not a drift table: no column(s) {missing}", redo)
    duplicated = sorted(set(table.loc[table["pid"].duplicated(), "pid"].astype(str)))
    if duplicated:
        raise InputFileError(f"drift table {path} lists projection id(s) {duplicated[:5]} more than once", redo)
    bad = [p for p in table["pid"].astype(str) if not PID_PATTERN.fullmatch(p)]
    if bad:
        raise InputFileError(f"drift table {path} has invalid projection id(s) {bad[:5]}", redo)
    return table


def drift_columns(table: pd.DataFrame) -> list[str]:
    """The columns that measure drift (topological measures and magnitude baselines), in table order.

    Not the identity columns, nor the columns that describe one side's diagrams (``n_h{k}_before/after``,
    ``h{k}_persistence_before``).
    """
    return [str(c) for c in table.columns if topological(str(c)) is not None or c in MAGNITUDE_COLUMNS]


def _pretrained_columns(table: pd.DataFrame) -> list[str]:
    """The columns fixed by the pretrained matrices and the settings: ids, shapes, the pretrained diagrams."""
    return [str(c) for c in table.columns if c in ID_COLUMNS or str(c).endswith("_before")]


def _check_same_run(tables: Sequence[pd.DataFrame]) -> None:
    """Refuse per-epoch tables that are not of one pretrained snapshot, one set of projections and one setting."""
    first = tables[0]
    fix = "aggregate the tables of one run's epochs, each computed from the same pretrained snapshot and settings"
    for epoch, table in enumerate(tables, start=1):
        if not isinstance(table, pd.DataFrame) or any(c not in table.columns for c in ID_COLUMNS):
            raise ParameterError(f"per-epoch table {epoch} is not a drift table (a {type(table).__name__})", fix)
        if "aggregation" in table.attrs:
            raise ParameterError(
                f"per-epoch table {epoch} is already aggregated ({table.attrs['aggregation']!r} over "
                f"{table.attrs.get('epochs')} epochs)",
                "aggregate the per-epoch tables themselves, not an aggregate",
            )
    for epoch, table in enumerate(tables[1:], start=2):
        if table.attrs.get("before_hash") != first.attrs.get("before_hash"):
            raise SnapshotMismatchError(
                f"per-epoch tables 1 and {epoch} were computed from different pretrained weights "
                f"({str(first.attrs.get('before_hash'))[:12]} vs {str(table.attrs.get('before_hash'))[:12]})",
                fix,
            )
        if table.attrs.get("settings") != first.attrs.get("settings") or list(table.columns) != list(first.columns):
            raise ParameterError(
                f"per-epoch tables 1 and {epoch} were computed with different drift settings "
                f"({first.attrs.get('settings') or list(first.columns)} vs "
                f"{table.attrs.get('settings') or list(table.columns)})",
                fix,
            )
        only = sorted(set(first["pid"]) ^ set(table["pid"]))
        if only:
            raise ParameterError(
                f"per-epoch tables 1 and {epoch} hold different projections (ids in only one: {only[:5]})", fix
            )
        aligned = table.set_index("pid").loc[first["pid"]].reset_index()
        for column in _pretrained_columns(first):
            a, b = first[column].to_numpy(), aligned[column].to_numpy()
            same = np.array_equal(a, b) if a.dtype.kind not in "fc" else np.allclose(a, b, rtol=1e-12, atol=0)
            if not same:
                raise SnapshotMismatchError(
                    f"per-epoch tables 1 and {epoch} differ in {column!r}, which the pretrained matrices fix: "
                    "they are of different pretrained snapshots",
                    fix,
                )


def aggregate_epochs(tables: Sequence[pd.DataFrame], how: str) -> pd.DataFrame:
    """One drift table from the per-epoch drift tables of a run (the pretrained snapshot against each epoch's).

    Parameters
    ----------
    tables : the per-epoch tables in epoch order (epoch 1 first), all of the same pretrained snapshot, projections
        and drift settings (else :class:`SnapshotMismatchError` or :class:`ParameterError`; an aggregate is refused
        too).
    how : ``"mean"``: the mean over epochs of every drift column (topological measures and magnitude baselines;
        the other columns as the last epoch's table has them); ``"final"``: the last epoch's table.

    Returns
    -------
    A drift table in the first table's projection order. Its ``attrs`` are the last table's (settings, pretrained
    hash ``before_hash``: what verification and cards read) plus ``aggregation`` (``how``), ``epochs`` (the number of
    tables combined) and ``after_hashes`` (each epoch's fine-tuned weight hash, where recorded). A mean's
    ``after``/``after_hash`` say it is no single snapshot's table.
    """
    if how not in AGGREGATIONS:
        raise ParameterError(f"unknown aggregation {how!r}", f"use one of {', '.join(AGGREGATIONS)}")
    if isinstance(tables, pd.DataFrame) or not isinstance(tables, Sequence) or len(tables) == 0:
        raise ParameterError(
            "aggregate_epochs needs a non-empty list of per-epoch drift tables",
            "pass [table_epoch_1, table_epoch_2, ...] (one drift table per epoch)",
        )
    _check_same_run(tables)
    order = tables[0]["pid"]
    aligned = [t.set_index("pid").loc[order].reset_index() for t in tables]
    last = tables[-1]
    result = aligned[-1].copy()
    if how == "mean":
        for column in drift_columns(result):
            result[column] = np.mean(np.stack([t[column].to_numpy(dtype=float) for t in aligned]), axis=0)
    attrs: dict[str, Any] = dict(last.attrs)
    after_hashes = [t.attrs.get("after_hash") for t in tables]
    if how == "mean":
        attrs["after"] = f"mean over {len(tables)} epochs up to {last.attrs.get('after', 'the last epoch')}"
        attrs["after_hash"] = None
    attrs.update(
        {
            "aggregation": how,
            "epochs": len(tables),
            "after_hashes": after_hashes if all(h is not None for h in after_hashes) else None,
        }
    )
    result.attrs = attrs
    return result
