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
    pids: list[str] | None = None,
    n_jobs: int = 2,
    cache: DriftCache | None = None,
    progress: bool = False,
    scheduler: str | None = None,
) -> pd.DataFrame:
    """Drift table between a pretrained and a fine-tuned snapshot of the same model.

    For every attention projection, the persistence diagrams of the two matrices' row clouds (:func:`diagrams`) and
    the Wasserstein and bottleneck distances between them (:func:`wasserstein`, :func:`bottleneck`), with magnitude
    baselines beside them. Pairs run in worker processes and are cached by content (:class:`DriftCache`), so a rerun
    is instant and an interrupted run resumes.

    The table's ``attrs`` record both models, the pretrained weight hash (``before_hash``, checked when a
    card is built from the table) and the settings; Parquet keeps them, CSV does not.

    Parameters
    ----------
    before, after : Snapshot
        The pretrained and the fine-tuned snapshot (:func:`load_snapshot`, :func:`extract_snapshot`): the same
        projection ids and shapes and the same base model.
    settings : DriftSettings, optional
        What to measure (default ``DriftSettings()``: H0 and H1, Euclidean rows, W1 and W2, bottleneck, magnitude).
    allow_other_base : bool, default False
        Accept snapshots whose base models differ (same shapes).
    pids : list of str, optional
        The projection ids to compute (default: all of ``before``).
    n_jobs : int, default 2
        Worker processes on this machine (capped at the core count); with ``scheduler="local"``, Dask workers.
    cache : DriftCache, optional
        The on-disk cache (default under ``$TOPOTUNER_CACHE``); ``DriftCache(None)`` disables it. With a Dask
        cluster it must be a path every worker sees.
    progress : bool, default False
        Show a progress bar over the matrices.
    scheduler : str, optional
        None for local joblib processes; ``"local"`` for a Dask ``LocalCluster``; a Dask scheduler address
        (``tcp://host:8786``) to spread the pairs over a cluster. The table is the same in every case.

    Returns
    -------
    pandas.DataFrame
        One row per id: ``pid``, ``layer``, ``kind``, ``rows``, ``cols``, the drift columns of ``settings``
        (``h{k}_w{p}``, ``h{k}_bottleneck``), diagram sizes (``n_h{k}_before/after``), the pretrained diagrams' total
        persistence (``h{k}_persistence_before``) and the magnitude baselines (``rel_frobenius``, ``rel_spectral``,
        ``row_cosine_change``).

    Raises
    ------
    ParameterError
        ``before`` or ``after`` is not a Snapshot (a path: load it first), an unknown id in ``pids``, ``n_jobs`` not a
        positive whole number, or a malformed ``scheduler`` address.
    SnapshotMismatchError
        The snapshots are of different models (ids, shapes, architecture), or of different base models without
        ``allow_other_base``.

    Warns
    -----
    UserWarning
        Exact cosine H1 on matrices of more than ``COSINE_H1_SUBSAMPLE`` rows (it can take hours; use ``subsample``).

    See Also
    --------
    save_table, load_table : the table as a file.
    build_profile : a profile card from the table.
    noise_check : the table against its noise floor.

    References
    ----------
    .. [1] Erol et al., TopoTuner (2026): Wasserstein drift between the Vietoris–Rips diagrams of each attention
       projection before and after fine-tuning ranks the projections; code https://github.com/FDataLab/TopoTuner.
    .. [2] D. Cohen-Steiner, H. Edelsbrunner, J. Harer, Y. Mileyko, "Lipschitz functions have Lp-stable
       persistence", Foundations of Computational Mathematics 10, 127–139 (2010).
    .. [3] U. Bauer, "Ripser: efficient computation of Vietoris–Rips persistence barcodes", Journal of Applied and
       Computational Topology 5, 391–423 (2021).

    Examples
    --------
    >>> import numpy as np
    >>> from topotuner_lab import DriftCache, DriftSettings, Snapshot, drift_table, perturb_snapshot
    >>> rng = np.random.default_rng(0)
    >>> matrices = {f"L{i}.{k}": rng.standard_normal((8, 4), dtype=np.float32) for i in (0, 1) for k in "qkvo"}
    >>> before = Snapshot(matrices, model="toy", base_model="toy", revision="r0", architecture="llama")
    >>> after = perturb_snapshot(before, scale=0.1, seed=1)  # stands in for a fine-tuned copy
    >>> h0 = DriftSettings(maxdim=0, orders=(1.0,))
    >>> table = drift_table(before, after, h0, n_jobs=1, cache=DriftCache(None))
    >>> table.shape
    (8, 13)
    >>> list(table.columns[:7])
    ['pid', 'layer', 'kind', 'rows', 'cols', 'h0_w1', 'h0_bottleneck']
    >>> bool((table["h0_w1"] > 0).all()), table.attrs["before"], table.attrs["after"]
    (True, 'toy', 'toy+noise(0.1,seed=1)')
    """
    for name, given in (("before", before), ("after", after)):
        _check_snapshot(name, given)
    check_comparable(before, after, allow_other_base=allow_other_base)
    table = drift_between(
        before.matrices,
        after.matrices,
        settings,
        pids=pids,
        n_jobs=n_jobs,
        cache=cache,
        progress=progress,
        scheduler=scheduler,
    )
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
