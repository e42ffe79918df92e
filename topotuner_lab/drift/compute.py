"""The drift table: topological drift and magnitude baselines for every projection pair.

Work is split per projection and run in worker processes (:mod:`executors`). Every result is cached on disk
by content hash of the two matrices and the settings (:mod:`cache`): diagrams per matrix (so a pretrained
matrix's diagram is computed once for all its fine-tuned copies) and finished rows per pair (so a rerun is
instant and an interrupted run resumes where it stopped).
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

import numpy as np
import pandas as pd

from topotuner_lab._io.errors import ParameterError
from topotuner_lab.drift.cache import DriftCache
from topotuner_lab.drift.executors import check_jobs, check_scheduler, run_dask, run_joblib
from topotuner_lab.drift.settings import COSINE_H1_SUBSAMPLE, DriftSettings
from topotuner_lab.weights.projections import parse_pid
from topotuner_lab.weights.snapshot import Snapshot, check_comparable, matrix_hash


def _with_id(pid: str, values: dict[str, Any]) -> dict[str, Any]:
    layer, kind = parse_pid(pid)
    return {"pid": pid, "layer": layer, "kind": kind, **values}


def drift_between(
    before: dict[str, np.ndarray],
    after: dict[str, np.ndarray],
    settings: DriftSettings | None = None,
    *,
    pids: list[str] | None = None,
    n_jobs: int = 2,
    cache: DriftCache | None = None,
    progress: bool = False,
    scheduler: str | None = None,
) -> pd.DataFrame:
    """Drift table between two dicts of matrices keyed by projection id (same ids and shapes).

    Parameters
    ----------
    before, after : projection id -> (rows, cols) float32 matrix, e.g. ``Snapshot.matrices``.
    settings : what to measure (default :class:`DriftSettings`).
    pids : the ids to compute (default: all of ``before``).
    n_jobs : worker processes on this machine (capped at the core count); with ``scheduler="local"``, Dask workers.
    cache : the on-disk cache (default under ``$TOPOTUNER_CACHE``); ``DriftCache(None)`` disables it. With a Dask
        cluster it must be a path every worker sees.
    scheduler : None for local joblib processes; ``"local"`` for a Dask ``LocalCluster``; a Dask scheduler address
        (``tcp://host:8786``) to spread the pairs over a cluster. The table is the same in every case.

    Returns
    -------
    One row per id: ``pid``, ``layer``, ``kind``, ``rows``, ``cols``, the drift columns of ``settings``, diagram sizes
    (``n_h{k}_before/after``), the pretrained diagrams' total persistence and the magnitude baselines.
    """
    from tqdm.auto import tqdm

    settings = settings or DriftSettings()
    cache = cache if cache is not None else DriftCache()
    n_jobs = check_jobs(n_jobs)
    check_scheduler(scheduler)
    pids = list(before) if pids is None else list(pids)
    unknown = [p for p in pids if p not in before or p not in after]
    if unknown:
        raise ParameterError(
            f"unknown projection id(s) {unknown[:5]}", f"use ids present in both snapshots, e.g. {list(before)[:4]}"
        )
    hashes = {pid: (matrix_hash(before[pid]), matrix_hash(after[pid])) for pid in pids}
    columns = settings.value_columns()
    values: dict[str, dict[str, Any]] = {}
    pending = []
    for pid in pids:
        hit = cache.get_row(cache.row_key(*hashes[pid], settings), columns)
        if hit is not None:
            values[pid] = hit
        else:
            pending.append(pid)
    pending.sort(key=lambda p: -before[p].shape[0])  # big matrices first: better load balance
    warn_exact_cosine_h1(settings, [before[p].shape[0] for p in pending])
    if pending:
        work = [(pid, before[pid], after[pid], settings, cache, hashes[pid]) for pid in pending]
        results = run_dask(work, scheduler, n_jobs) if scheduler else run_joblib(work, n_jobs)
        for pid, row in tqdm(results, total=len(pending), desc="drift", unit="matrix", disable=not progress):
            values[pid] = row
    return pd.DataFrame([_with_id(pid, values[pid]) for pid in pids])


def warn_exact_cosine_h1(settings: DriftSettings, rows: list[int]) -> None:
    """Warn before exact cosine H1 on matrices with more rows than :data:`COSINE_H1_SUBSAMPLE`: it can take hours."""
    big = sum(n > COSINE_H1_SUBSAMPLE for n in rows)
    approximate = settings.subsample is not None or settings.n_perm is not None
    if settings.metric != "cosine" or settings.maxdim < 1 or approximate or not big:
        return
    warnings.warn(
        f"exact cosine H1 of {big} matrices with more than {COSINE_H1_SUBSAMPLE} rows: each can take minutes to tens "
        "of minutes (SmolLM2-135M's deep o projections, 576 rows: 1-18 min; its whole table ~2 h on one worker). "
        f"subsample={COSINE_H1_SUBSAMPLE} (--subsample {COSINE_H1_SUBSAMPLE}) computes H1 on that many seeded rows "
        "per matrix (1-2 min for that table, drift ranking per H1 point kept: docs/BENCHMARKS.md, bench_cosine_h1.py)",
        stacklevel=3,
    )


def _check_snapshot(name: str, given: object) -> None:
    """Refuse anything but a :class:`Snapshot` (a path is the usual slip: say how to load it)."""
    if isinstance(given, Snapshot):
        return
    if isinstance(given, (str, os.PathLike)):
        raise ParameterError(
            f"drift_table's {name} is a path ({os.fspath(given)!r}), not a Snapshot",
            f"load it first: drift_table(..., load_snapshot({os.fspath(given)!r}), ...) or extract_snapshot(model)",
        )
    raise ParameterError(
        f"drift_table's {name} is a {type(given).__name__}, not a Snapshot",
        "pass snapshots from load_snapshot(path) or extract_snapshot(model)",
    )


def drift_table(
    before: Snapshot,
    after: Snapshot,
    settings: DriftSettings | None = None,
    *,
    allow_other_base: bool = False,
    **kwargs: Any,
) -> pd.DataFrame:
    """Drift table between a pretrained and a fine-tuned snapshot of the same model.

    ``before`` and ``after`` must have the same projection ids and shapes and the same base model (else
    :class:`SnapshotMismatchError`; ``allow_other_base`` relaxes the last). Keyword arguments go to
    :func:`drift_between` (``n_jobs``, ``cache``, ``progress``, ``scheduler``, ``pids``); its docstring lists
    the columns.

    The table's ``attrs`` record both models, the pretrained weight hash (``before_hash``, checked when a
    card is built from the table) and the settings; Parquet keeps them, CSV does not.
    """
    for name, given in (("before", before), ("after", after)):
        _check_snapshot(name, given)
    check_comparable(before, after, allow_other_base=allow_other_base)
    table = drift_between(before.matrices, after.matrices, settings, **kwargs)
    table.attrs.update(
        {
            "before": before.model,
            "after": after.model,
            "before_hash": before.weights_hash,
            "after_hash": after.weights_hash,
            "settings": json.dumps((settings or DriftSettings()).key()),
        }
    )
    return table
