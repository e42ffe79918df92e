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
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from topotuner_lab._io import atomic
from topotuner_lab._io.errors import InputFileError, ParameterError
from topotuner_lab._io.paths import cache_dir
from topotuner_lab.topology.distances import SOLVERS, Solver, bottleneck, wasserstein
from topotuner_lab.topology.magnitude import magnitude_metrics
from topotuner_lab.topology.persistence import Diagrams, Metric, PersistenceSettings, diagrams
from topotuner_lab.weights.projections import PID_PATTERN, parse_pid
from topotuner_lab.weights.snapshot import Snapshot, check_comparable, matrix_hash

CACHE_VERSION = 2
MAGNITUDE_COLUMNS: tuple[str, ...] = ("rel_frobenius", "rel_spectral", "row_cosine_change")


@dataclass(frozen=True)
class DriftSettings:
    """What the table measures; part of every cache key.

    Attributes
    ----------
    maxdim : 0 for H0 only, 1 for H0 and H1.
    metric : distance between rows, ``"euclidean"`` or ``"cosine"`` (1 - cos).
    orders : Wasserstein orders p (each >= 1): one ``h{k}_w{p}`` column per dimension and order.
    bottleneck : also the bottleneck distance (``h{k}_bottleneck``).
    solver : Wasserstein solver for H1 (``"auto"``: the exact assignment up to ``distances.ASSIGNMENT_UP_TO`` points,
        exact POT up to ``distances.HERA_ABOVE``, hera beyond; see :func:`distances.wasserstein`).
    n_perm, seed : optional greedy subsample of rows for H1 (approximate; None = all rows).
    magnitude : also the magnitude baselines (``rel_frobenius``, ``rel_spectral``, ``row_cosine_change``); the
        magnitude control card ranks by ``rel_frobenius``. Off for a topology-only table (early stopping).
    """

    maxdim: int = 1
    metric: Metric = "euclidean"
    orders: tuple[float, ...] = (1.0, 2.0)
    bottleneck: bool = True
    solver: Solver = "auto"
    n_perm: int | None = None
    seed: int = 0
    magnitude: bool = True

    def __post_init__(self) -> None:
        if self.solver not in SOLVERS:
            raise ParameterError(f"unknown solver {self.solver!r}", f"use one of {', '.join(SOLVERS)}")
        if not self.orders or any(
            isinstance(p, bool) or not isinstance(p, (int, float)) or not np.isfinite(p) or p < 1 for p in self.orders
        ):
            raise ParameterError(f"orders={self.orders!r} must be Wasserstein orders >= 1", "use e.g. orders=(1, 2)")
        self.persistence()  # validates maxdim, metric, n_perm

    def persistence(self, n_threads: int = 1) -> PersistenceSettings:
        return PersistenceSettings(self.maxdim, self.metric, self.n_perm, self.seed, n_threads)  # type: ignore[arg-type]

    def key(self) -> dict[str, Any]:
        key = {**asdict(self), "orders": [float(p) for p in self.orders], "v": CACHE_VERSION}
        if self.magnitude:  # the default, and the only behaviour before the switch: earlier cache entries stay valid
            del key["magnitude"]
        return key

    def columns(self) -> list[str]:
        cols = []
        for dim in range(self.maxdim + 1):
            cols += [f"h{dim}_w{p:g}" for p in self.orders] + ([f"h{dim}_bottleneck"] if self.bottleneck else [])
        return cols


def _digest(obj: Any) -> str:
    return hashlib.blake2b(json.dumps(obj, sort_keys=True).encode(), digest_size=16).hexdigest()


def _arrays_digest(arrays: list[np.ndarray]) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for arr in arrays:
        arr = np.ascontiguousarray(arr, dtype=np.float64)
        digest.update(str(arr.shape).encode())
        digest.update(arr.data)
    return digest.hexdigest()


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class DriftCache:
    """On-disk cache of diagrams (``.npz``) and finished rows (``.json``); ``root=None`` disables it.

    Every entry stores its own key and a checksum of its content. An entry that cannot be read, was
    written for another key (swapped or renamed files), or fails its checksum (bit flips, truncation)
    is recomputed and rewritten, never trusted. Rows hold only what the matrix pair determines: the
    projection id is added when the table is assembled, so identical pairs under two ids share one entry.
    """

    root: Path | None = field(default_factory=lambda: cache_dir() / "drift")

    def _path(self, kind: str, key: str, suffix: str) -> Path | None:
        return None if self.root is None else Path(self.root) / kind / key[:2] / f"{key}{suffix}"

    def check_writable(self) -> None:
        """Raise a clear error now, before any work, when the cache folder cannot be created or written."""
        if self.root is None:
            return
        root = Path(self.root)
        try:
            root.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=root, prefix=".probe-"):
                pass
        except OSError as exc:
            raise ParameterError(
                f"cannot write the drift cache at {root} ({exc.strerror or exc})",
                "pass --cache with a writable folder, or --no-cache",
            ) from exc

    def _read_diagrams(self, path: Path, key: str, maxdim: int) -> Diagrams | None:
        try:
            with np.load(path, allow_pickle=False) as data:
                dgms = [np.asarray(data[f"h{k}"], dtype=np.float64) for k in range(maxdim + 1)]
                ok = str(data["key"]) == key and str(data["checksum"]) == _arrays_digest(dgms)
        except Exception:  # noqa: BLE001 - any unreadable entry (zip, zlib, EOF, missing member) is recomputed
            return None
        if not ok or any(d.ndim != 2 or d.shape[1] != 2 for d in dgms):
            return None
        return Diagrams(dgms)

    def diagrams(self, mhash: str, settings: PersistenceSettings, matrix: np.ndarray) -> Diagrams:
        """Diagrams of ``matrix`` (hash ``mhash``), from a verified cache entry or computed and stored."""
        key = _digest([mhash, settings.key(), CACHE_VERSION])
        path = self._path("diagrams", key, ".npz")
        if path is not None and path.is_file():
            cached = self._read_diagrams(path, key, settings.maxdim)
            if cached is not None:
                return cached
        dgms = diagrams(matrix, settings)
        if path is not None:
            arrays = {f"h{k}": d for k, d in enumerate(dgms.dgms)}
            with atomic.atomic_path(path) as tmp:
                with open(tmp, "wb") as fh:
                    np.savez(fh, key=np.array(key), checksum=np.array(_arrays_digest(dgms.dgms)), **arrays)
        return dgms

    def row_key(self, hash_a: str, hash_b: str, settings: DriftSettings) -> str:
        return _digest([hash_a, hash_b, settings.key()])

    def get_row(self, key: str, columns: list[str] | None = None) -> dict[str, Any] | None:
        """The values of a finished pair, or None when absent or not verified (then it is recomputed)."""
        path = self._path("rows", key, ".json")
        if path is None or not path.is_file():
            return None
        try:
            entry = json.loads(path.read_bytes().decode("utf-8"))
        except (ValueError, OSError, RecursionError):
            return None
        if not isinstance(entry, dict) or entry.get("key") != key or not isinstance(entry.get("values"), dict):
            return None
        values = entry["values"]
        if entry.get("checksum") != _digest(values) or not all(_is_number(v) for v in values.values()):
            return None
        if columns is not None and not set(columns) <= set(values):
            return None
        return values

    def put_row(self, key: str, values: dict[str, Any]) -> None:
        path = self._path("rows", key, ".json")
        if path is not None:
            atomic.write_json(path, {"key": key, "checksum": _digest(values), "values": values})


def value_columns(settings: DriftSettings) -> list[str]:
    """The columns a pair's cached values must hold for ``settings``."""
    sizes = [f"n_h{dim}_{side}" for dim in range(settings.maxdim + 1) for side in ("before", "after")]
    persistence = [f"h{dim}_persistence_before" for dim in range(settings.maxdim + 1)]
    magnitude = list(MAGNITUDE_COLUMNS) if settings.magnitude else []
    return ["rows", "cols", *settings.columns(), *sizes, *persistence, *magnitude]


def pair_values(
    before: np.ndarray,
    after: np.ndarray,
    settings: DriftSettings,
    cache: DriftCache,
    hashes: tuple[str, str] | None = None,
    n_threads: int = 1,
) -> dict[str, Any]:
    """Topological drift and magnitude metrics of one matrix pair (cached by content, not by id)."""
    hash_a, hash_b = hashes or (matrix_hash(before), matrix_hash(after))
    key = cache.row_key(hash_a, hash_b, settings)
    cached = cache.get_row(key, value_columns(settings))
    if cached is not None:
        return cached
    pset = settings.persistence(n_threads)
    dgm_a = cache.diagrams(hash_a, pset, before)
    dgm_b = cache.diagrams(hash_b, pset, after)
    values: dict[str, Any] = {"rows": int(before.shape[0]), "cols": int(before.shape[1])}
    for dim in range(settings.maxdim + 1):
        for p in settings.orders:
            values[f"h{dim}_w{p:g}"] = wasserstein(dgm_a[dim], dgm_b[dim], p, settings.solver)
        if settings.bottleneck:
            values[f"h{dim}_bottleneck"] = bottleneck(dgm_a[dim], dgm_b[dim])
        values[f"n_h{dim}_before"] = int(len(dgm_a[dim]))
        values[f"n_h{dim}_after"] = int(len(dgm_b[dim]))
        values[f"h{dim}_persistence_before"] = float(np.sum(dgm_a[dim][:, 1] - dgm_a[dim][:, 0]))  # total persistence
    if settings.magnitude:
        values.update(magnitude_metrics(before, after))
    cache.put_row(key, values)
    return values


def _with_id(pid: str, values: dict[str, Any]) -> dict[str, Any]:
    layer, kind = parse_pid(pid)
    return {"pid": pid, "layer": layer, "kind": kind, **values}


def _pid_values(pid: str, *args: Any) -> tuple[str, dict[str, Any]]:
    return pid, pair_values(*args)


def check_jobs(n_jobs: int) -> int:
    """``n_jobs`` capped at the machine's cores (each worker holds a copy of the matrices it works on)."""
    if not isinstance(n_jobs, int) or isinstance(n_jobs, bool) or n_jobs < 1:
        raise ParameterError(
            f"jobs={n_jobs!r} is not a positive number of worker processes",
            "use --jobs 1 or more (at most the core count)",
        )
    return min(n_jobs, os.cpu_count() or 1)


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
    pids = list(before) if pids is None else list(pids)
    unknown = [p for p in pids if p not in before or p not in after]
    if unknown:
        raise ParameterError(
            f"unknown projection id(s) {unknown[:5]}", f"use ids present in both snapshots, e.g. {list(before)[:4]}"
        )
    hashes = {pid: (matrix_hash(before[pid]), matrix_hash(after[pid])) for pid in pids}
    columns = value_columns(settings)
    values: dict[str, dict[str, Any]] = {}
    pending = []
    for pid in pids:
        hit = cache.get_row(cache.row_key(*hashes[pid], settings), columns)
        if hit is not None:
            values[pid] = hit
        else:
            pending.append(pid)
    pending.sort(key=lambda p: -before[p].shape[0])  # big matrices first: better load balance
    if pending:
        work = [(pid, before[pid], after[pid], settings, cache, hashes[pid]) for pid in pending]
        results = _run_dask(work, scheduler, n_jobs) if scheduler else _run_joblib(work, n_jobs)
        for pid, row in tqdm(results, total=len(pending), desc="drift", unit="matrix", disable=not progress):
            values[pid] = row
    return pd.DataFrame([_with_id(pid, values[pid]) for pid in pids])


def _run_joblib(work: list[tuple[Any, ...]], n_jobs: int) -> Iterator[tuple[str, dict[str, Any]]]:
    from joblib import Parallel, delayed

    yield from Parallel(n_jobs=min(n_jobs, len(work)), return_as="generator_unordered")(
        delayed(_pid_values)(*args) for args in work
    )


def _run_dask(work: list[tuple[Any, ...]], scheduler: str, n_jobs: int) -> Iterator[tuple[str, dict[str, Any]]]:
    """The pairs as Dask tasks, on a ``LocalCluster`` (``scheduler="local"``) or the cluster at a scheduler address."""
    try:
        from dask.distributed import Client, LocalCluster, as_completed
    except ImportError as exc:
        raise ParameterError(
            "a Dask scheduler was asked for, but dask.distributed is not installed",
            "pip install 'dask[distributed]' (or drop --scheduler to use local processes)",
        ) from exc
    cluster = (
        LocalCluster(n_workers=n_jobs, threads_per_worker=1, processes=True, dashboard_address=None)
        if scheduler == "local"
        else None
    )
    try:
        client = Client(cluster if cluster is not None else scheduler, timeout="20s")
    except OSError as exc:
        raise ParameterError(
            f"cannot reach the Dask scheduler at {scheduler} ({exc})",
            "check the address (tcp://host:8786) and that the scheduler runs",
        ) from exc
    try:
        futures = [client.submit(_pid_values, *args, pure=False) for args in work]
        for future in as_completed(futures):
            yield future.result()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


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


TABLE_SUFFIXES: tuple[str, ...] = (".parquet", ".csv")
ID_COLUMNS: tuple[str, ...] = ("pid", "layer", "kind", "rows", "cols")


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


def numeric_columns(table: pd.DataFrame) -> list[str]:
    """The measure columns of a drift table: what a card can be ranked by."""
    return [
        c
        for c in table.columns
        if c not in ID_COLUMNS
        and not c.startswith("n_h")
        and not c.endswith("_persistence_before")
        and pd.api.types.is_numeric_dtype(table[c])
    ]
