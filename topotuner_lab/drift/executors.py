"""Where the pairs of a drift table are computed: local joblib processes, or Dask workers (local or a cluster)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from topotuner_lab._io.config import POSITIVE_INT
from topotuner_lab._io.errors import ParameterError
from topotuner_lab.drift.pairs import pair_values


def _pid_values(pid: str, *args: Any) -> tuple[str, dict[str, Any]]:
    return pid, pair_values(*args)


def check_jobs(n_jobs: int) -> int:
    """``n_jobs`` capped at the machine's cores (each worker holds a copy of the matrices it works on)."""
    if not POSITIVE_INT(n_jobs):
        raise ParameterError(
            f"jobs={n_jobs!r} is not a positive number of worker processes",
            "use --jobs 1 or more (at most the core count)",
        )
    return min(n_jobs, os.cpu_count() or 1)


def run_joblib(work: list[tuple[Any, ...]], n_jobs: int) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(pid, values)`` of each matrix pair, computed on local joblib workers and yielded as they finish."""
    from joblib import Parallel, delayed

    yield from Parallel(n_jobs=min(n_jobs, len(work)), return_as="generator_unordered")(
        delayed(_pid_values)(*args) for args in work
    )


def run_dask(work: list[tuple[Any, ...]], scheduler: str, n_jobs: int) -> Iterator[tuple[str, dict[str, Any]]]:
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
