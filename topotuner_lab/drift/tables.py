"""Drift table files: written atomically as Parquet (keeps the provenance attributes) or CSV, read back checked."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from topotuner_lab._io import atomic
from topotuner_lab._io.errors import InputFileError, ParameterError
from topotuner_lab.drift.columns import ID_COLUMNS
from topotuner_lab.weights.projections import PID_PATTERN

TABLE_SUFFIXES: tuple[str, ...] = (".parquet", ".csv")


def check_table_path(path: str | os.PathLike[str]) -> Path:
    """Refuse a table file name this module cannot write, before any work is done."""
    path = Path(path)
    if path.suffix not in TABLE_SUFFIXES:
        raise ParameterError(f"cannot write a table to {path.name!r}", "use a .parquet or .csv file name")
    return path


def save_table(table: pd.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Write a table atomically as Parquet (``.parquet``) or CSV (``.csv``)."""
    path = check_table_path(path)
    with atomic.atomic_path(path) as tmp:
        if path.suffix == ".parquet":
            table.to_parquet(tmp, index=False)
        else:
            table.to_csv(tmp, index=False)
    return path


def load_table(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read and check a drift table written by :func:`save_table` (one row per projection id)."""
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
