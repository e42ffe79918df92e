"""The drift table: topological drift and magnitude baselines for every projection pair.

Work is split per projection and run in joblib worker processes. Every result is cached on disk
by content hash of the two matrices and the settings: diagrams per matrix (so a pretrained
matrix's diagram is computed once for all its fine-tuned copies) and finished rows per pair
(so a rerun is instant and an interrupted run resumes where it stopped).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from . import atomic
from .distances import SOLVERS, bottleneck, wasserstein
from .errors import InputFileError, ParameterError
from .magnitude import magnitude_metrics
from .paths import cache_dir
from .persistence import Diagrams, PersistenceSettings, diagrams
from .projections import parse_pid
from .snapshot import Snapshot, check_comparable, matrix_hash

CACHE_VERSION = 1
MAGNITUDE_COLUMNS: tuple[str, ...] = ("rel_frobenius", "rel_spectral", "row_cosine_change")


@dataclass(frozen=True)
class DriftSettings:
    """What the table measures: homology dimensions, Wasserstein orders, metric, solver, subsampling."""

    maxdim: int = 1
    metric: str = "euclidean"
    orders: tuple[float, ...] = (1.0, 2.0)
    bottleneck: bool = True
    solver: str = "auto"
    n_perm: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.solver not in SOLVERS:
            raise ParameterError(f"unknown solver {self.solver!r}", f"use one of {', '.join(SOLVERS)}")
        if not self.orders or any(not isinstance(p, (int, float)) or p < 1 for p in self.orders):
            raise ParameterError(f"orders={self.orders!r} must be Wasserstein orders >= 1", "use e.g. orders=(1, 2)")
        self.persistence()  # validates maxdim, metric, n_perm

    def persistence(self, n_threads: int = 1) -> PersistenceSettings:
        return PersistenceSettings(self.maxdim, self.metric, self.n_perm, self.seed, n_threads)  # type: ignore[arg-type]

    def key(self) -> dict[str, Any]:
        return {**asdict(self), "orders": [float(p) for p in self.orders], "v": CACHE_VERSION}

    def columns(self) -> list[str]:
        cols = []
        for dim in range(self.maxdim + 1):
            cols += [f"h{dim}_w{p:g}" for p in self.orders] + ([f"h{dim}_bottleneck"] if self.bottleneck else [])
        return cols


def _digest(obj: Any) -> str:
    return hashlib.blake2b(json.dumps(obj, sort_keys=True).encode(), digest_size=16).hexdigest()


@dataclass
class DriftCache:
    """On-disk cache of diagrams (``.npz``) and finished rows (``.json``); ``root=None`` disables it."""

    root: Path | None = field(default_factory=lambda: cache_dir() / "drift")

    def _path(self, kind: str, key: str, suffix: str) -> Path | None:
        return None if self.root is None else Path(self.root) / kind / key[:2] / f"{key}{suffix}"

    def diagrams(self, mhash: str, settings: PersistenceSettings, matrix: np.ndarray) -> Diagrams:
        """Diagrams of ``matrix`` (hash ``mhash``), from the cache or computed and stored."""
        path = self._path("diagrams", _digest([mhash, settings.key(), CACHE_VERSION]), ".npz")
        if path is not None and path.is_file():
            with np.load(path) as data:
                return Diagrams([data[f"h{k}"] for k in range(len(data.files))])
        dgms = diagrams(matrix, settings)
        if path is not None:
            with atomic.atomic_path(path) as tmp:
                with open(tmp, "wb") as fh:
                    np.savez(fh, **{f"h{k}": d for k, d in enumerate(dgms.dgms)})
        return dgms

    def row_key(self, hash_a: str, hash_b: str, settings: DriftSettings) -> str:
        return _digest([hash_a, hash_b, settings.key()])

    def get_row(self, key: str) -> dict[str, Any] | None:
        path = self._path("rows", key, ".json")
        if path is None or not path.is_file():
            return None
        try:
            return json.loads(path.read_text())
        except (json.JSONDecodeError, OSError):
            return None  # a damaged entry is recomputed, never trusted

    def put_row(self, key: str, row: dict[str, Any]) -> None:
        path = self._path("rows", key, ".json")
        if path is not None:
            atomic.write_json(path, row)


def drift_row(pid: str, before: np.ndarray, after: np.ndarray, settings: DriftSettings, cache: DriftCache, hashes: tuple[str, str] | None = None, n_threads: int = 1) -> dict[str, Any]:
    """Topological drift and magnitude metrics of one projection pair (cached)."""
    hash_a, hash_b = hashes or (matrix_hash(before), matrix_hash(after))
    key = cache.row_key(hash_a, hash_b, settings)
    cached = cache.get_row(key)
    if cached is not None:
        return cached
    pset = settings.persistence(n_threads)
    dgm_a = cache.diagrams(hash_a, pset, before)
    dgm_b = cache.diagrams(hash_b, pset, after)
    layer, kind = parse_pid(pid)
    row: dict[str, Any] = {"pid": pid, "layer": layer, "kind": kind, "rows": before.shape[0], "cols": before.shape[1]}
    for dim in range(settings.maxdim + 1):
        for p in settings.orders:
            row[f"h{dim}_w{p:g}"] = wasserstein(dgm_a[dim], dgm_b[dim], p, settings.solver)
        if settings.bottleneck:
            row[f"h{dim}_bottleneck"] = bottleneck(dgm_a[dim], dgm_b[dim])
        row[f"n_h{dim}"] = int(len(dgm_a[dim]))
    row.update(magnitude_metrics(before, after))
    cache.put_row(key, row)
    return row


def drift_between(
    before: dict[str, np.ndarray],
    after: dict[str, np.ndarray],
    settings: DriftSettings | None = None,
    *,
    pids: list[str] | None = None,
    n_jobs: int = 2,
    cache: DriftCache | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """Drift table between two dicts of matrices keyed by projection id (same ids and shapes)."""
    from joblib import Parallel, delayed
    from tqdm.auto import tqdm

    settings = settings or DriftSettings()
    cache = cache if cache is not None else DriftCache()
    pids = list(before) if pids is None else list(pids)
    unknown = [p for p in pids if p not in before or p not in after]
    if unknown:
        raise ParameterError(f"unknown projection id(s) {unknown[:5]}", f"use ids present in both snapshots, e.g. {list(before)[:4]}")
    hashes = {pid: (matrix_hash(before[pid]), matrix_hash(after[pid])) for pid in pids}
    rows: dict[str, dict[str, Any]] = {}
    pending = []
    for pid in pids:
        hit = cache.get_row(cache.row_key(*hashes[pid], settings))
        if hit is not None:
            rows[pid] = hit
        else:
            pending.append(pid)
    pending.sort(key=lambda p: -before[p].shape[0])  # big matrices first: better load balance
    if pending:
        jobs = (delayed(drift_row)(pid, before[pid], after[pid], settings, cache, hashes[pid]) for pid in pending)
        results = Parallel(n_jobs=min(n_jobs, len(pending)), return_as="generator_unordered")(jobs)
        bar = tqdm(results, total=len(pending), desc="drift", unit="matrix", disable=not progress)
        for row in bar:
            rows[row["pid"]] = row
    return pd.DataFrame([rows[pid] for pid in pids])


def drift_table(before: Snapshot, after: Snapshot, settings: DriftSettings | None = None, *, allow_other_base: bool = False, **kwargs: Any) -> pd.DataFrame:
    """Drift table between a pretrained and a fine-tuned snapshot of the same model."""
    check_comparable(before, after, allow_other_base=allow_other_base)
    table = drift_between(before.matrices, after.matrices, settings, **kwargs)
    table.attrs.update({"before": before.model, "after": after.model, "settings": json.dumps((settings or DriftSettings()).key())})
    return table


def save_table(table: pd.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Write a table atomically as Parquet (``.parquet``) or CSV (``.csv``)."""
    path = Path(path)
    if path.suffix not in (".parquet", ".csv"):
        raise ParameterError(f"cannot write a table to {path.name!r}", "use a .parquet or .csv file name")
    with atomic.atomic_path(path) as tmp:
        if path.suffix == ".parquet":
            table.to_parquet(tmp, index=False)
        else:
            table.to_csv(tmp, index=False)
    return path


def load_table(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read a drift table written by :func:`save_table`."""
    path = Path(path)
    if not path.is_file():
        raise InputFileError(f"drift table {path} does not exist", "compute it with `topotuner-lab drift BEFORE AFTER -o FILE`")
    return pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
