"""Where the pairs of a drift table are computed: local joblib processes, or Dask workers (local or a cluster)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
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


#: seconds a Dask scheduler has to answer its handshake (connect, then an ``identity`` request)
HANDSHAKE_SECONDS = 20.0
#: seconds a Dask scheduler has to show its first worker before the table is given up on
WORKER_SECONDS = 120.0
#: a Dask address: an optional scheme, a host (or [IPv6]) and a port
_ADDRESS = re.compile(
    r"(?:(?P<scheme>tcp|tls|ws|wss|ucx)://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):(?P<port>\d{1,5})"
)
_FIX = (
    "give --scheduler 'local' (a Dask cluster of --jobs workers here) or a running scheduler's address as "
    "tcp://host:8786, or drop --scheduler to use local processes"
)


def check_scheduler(scheduler: str | None) -> str | None:
    """``scheduler`` when it is None, ``"local"`` or a Dask address (host and port, or ``inproc://``); else refused."""
    if scheduler is None or scheduler == "local":
        return scheduler
    if isinstance(scheduler, str) and re.fullmatch(r"inproc://\S+", scheduler):  # a cluster in this process
        return scheduler
    match = _ADDRESS.fullmatch(scheduler) if isinstance(scheduler, str) else None
    if match is None or not 1 <= int(match["port"]) <= 65535:
        raise ParameterError(f"scheduler {scheduler!r} is not 'local' nor a Dask address (scheme://host:port)", _FIX)
    return scheduler


def _identity(address: str, seconds: float) -> Any:
    """What the server at ``address`` answers to Dask's ``identity`` request, the whole exchange within ``seconds``."""
    import asyncio

    from distributed.comm import connect

    async def ask() -> Any:
        comm = await connect(address, timeout=seconds)
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()

    return asyncio.run(asyncio.wait_for(ask(), seconds))


def check_scheduler_answers(address: str, seconds: float) -> None:
    """Raise a clear error unless a Dask scheduler at ``address`` completes the handshake within ``seconds``.

    Dask's own connect timeout bounds the TCP connect, not the handshake after it: a server that is not Dask (a web
    server, say) kept ``Client`` waiting forever, or answered bytes read as a frame of exabytes. The exchange runs on
    its own thread and event loop, so it works inside a notebook's running loop too.
    """
    import asyncio
    from concurrent.futures import ThreadPoolExecutor
    from concurrent.futures import TimeoutError as FutureTimeout

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dask-handshake")
    try:
        reply = pool.submit(_identity, address, seconds).result(timeout=seconds + 10)
    except (TimeoutError, asyncio.TimeoutError, FutureTimeout, OSError) as exc:
        raise ParameterError(
            f"no Dask scheduler answered at {address} within {seconds:g} s (nothing listening, or a server that is "
            f"not Dask{': ' + str(exc) if str(exc) else ''})",
            _FIX,
        ) from exc
    except Exception as exc:  # noqa: BLE001 - any garbled answer (MemoryError, ValueError...) means "not Dask"
        raise ParameterError(
            f"the server at {address} answers, but not as a Dask scheduler ({exc.__class__.__name__})", _FIX
        ) from exc
    finally:
        pool.shutdown(wait=False)
    if not (isinstance(reply, dict) and reply.get("type") == "Scheduler"):
        kind = reply.get("type") if isinstance(reply, dict) else type(reply).__name__
        raise ParameterError(f"the server at {address} answers as a Dask {kind}, not as a scheduler", _FIX)


def _local_cluster(n_jobs: int, gpus: bool) -> Any:
    """A Dask cluster of ``n_jobs`` one-thread worker processes here; with ``gpus`` worker i sees only GPU i.

    Each GPU worker offers the resource ``GPU=1`` and gets its own ``CUDA_VISIBLE_DEVICES`` (the i-th of the
    devices visible here), as ``dask-cuda``'s ``LocalCUDACluster`` does, without needing it.
    """
    from dask.distributed import LocalCluster, Nanny, Scheduler, SpecCluster

    if not gpus:
        return LocalCluster(n_workers=n_jobs, threads_per_worker=1, processes=True, dashboard_address=None)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = visible.split(",") if visible else [str(i) for i in range(n_jobs)]
    workers = {
        f"gpu-{device}": {
            "cls": Nanny,
            "options": {"nthreads": 1, "resources": {"GPU": 1}, "env": {"CUDA_VISIBLE_DEVICES": device}},
        }
        for device in devices[:n_jobs]
    }
    return SpecCluster(workers=workers, scheduler={"cls": Scheduler, "options": {"dashboard_address": None}})


@contextmanager
def dask_client(scheduler: str, n_jobs: int, *, gpus: bool = False) -> Iterator[Any]:
    """A Dask ``Client`` on a cluster here (``scheduler="local"``: ``n_jobs`` workers) or at a scheduler address.

    An address must answer Dask's handshake within ``HANDSHAKE_SECONDS`` and show a worker within ``WORKER_SECONDS``
    (with ``gpus``, one offering the resource ``GPU``), else a :class:`ParameterError` says so (never a computation
    stuck at 0/N). The client, and a cluster made here, are closed on exit.
    """
    import asyncio

    check_scheduler(scheduler)
    try:
        from dask.distributed import Client
    except ImportError as exc:
        raise ParameterError(
            "a Dask scheduler was asked for, but dask.distributed is not installed",
            "pip install 'dask[distributed]' (or drop --scheduler to use local processes)",
        ) from exc
    if scheduler != "local":
        check_scheduler_answers(scheduler, HANDSHAKE_SECONDS)
    cluster = _local_cluster(n_jobs, gpus) if scheduler == "local" else None
    try:
        client = Client(cluster if cluster is not None else scheduler, timeout=f"{HANDSHAKE_SECONDS:g}s")
    except (OSError, TimeoutError, asyncio.TimeoutError) as exc:
        if cluster is not None:
            cluster.close()
        raise ParameterError(f"cannot reach the Dask scheduler at {scheduler} ({exc})", _FIX) from exc
    try:
        try:
            client.wait_for_workers(1, timeout=WORKER_SECONDS)
        except (TimeoutError, asyncio.TimeoutError) as exc:
            raise ParameterError(
                f"the Dask scheduler at {scheduler} has no worker after {WORKER_SECONDS:g} s",
                "start workers for it (dask worker tcp://host:8786), or drop --scheduler to use local processes",
            ) from exc
        workers = client.scheduler_info()["workers"].values()
        if gpus and not any(w.get("resources", {}).get("GPU") for w in workers):
            raise ParameterError(
                f"no worker of the Dask scheduler at {scheduler} offers a GPU",
                "start its workers with --resources GPU=1 (one per GPU: dask worker ADDRESS --nthreads 1 "
                "--resources GPU=1), or drop --gpu to train on CPUs",
            )
        yield client
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def run_dask(work: list[tuple[Any, ...]], scheduler: str, n_jobs: int) -> Iterator[tuple[str, dict[str, Any]]]:
    """The pairs as Dask tasks, on a ``LocalCluster`` (``scheduler="local"``) or the cluster at a scheduler address.

    The cluster is :func:`dask_client`'s, checked the same way.
    """
    from dask.distributed import as_completed

    with dask_client(scheduler, n_jobs) as client:
        futures = [client.submit(_pid_values, *args, pure=False) for args in work]
        for future in as_completed(futures):
            yield future.result()
