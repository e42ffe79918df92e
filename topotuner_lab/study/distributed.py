"""The comparison's fine-tunes as Dask tasks: on a cluster of this machine, or on the cluster at a scheduler address.

This process (the owner) prepares the priors, drift tables and cards, then submits the fine-tunes of the grid in
their dependency order: every arm's sweep runs at once, its chosen-rate runs when its sweep is recorded (the rate
comes from them, :class:`~topotuner_lab.study.protocol.Ledger`). Only the owner writes ``results.csv`` and logs the
progress. Each task writes only its own run folder, and a folder two rows share (an arm without a card, reused by
every prior) is one task. A task whose worker dies is run again by the scheduler (``distributed.scheduler
.allowed-failures``, 3 by default; an error raised in a task is retried ``RETRIES`` times): its run resumes from its
last epoch checkpoint where the config keeps them, and a run already done is skipped (``finetune_once``).

Results equal those of the serial path on the same machine at the same torch threads per fine-tune.
"""

from __future__ import annotations

import functools
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from topotuner_lab._io.errors import TopoTunerError
from topotuner_lab.drift.executors import check_jobs, check_scheduler, dask_client
from topotuner_lab.study.protocol import use_torch_threads
from topotuner_lab.study.workspace import finetune_once, recorded_run
from topotuner_lab.weights.models import load_model

if TYPE_CHECKING:
    from topotuner_lab.study.plan import RunSpec
    from topotuner_lab.study.protocol import Ledger
    from topotuner_lab.training.config import FinetuneConfig
    from topotuner_lab.training.results import RunResults
    from topotuner_lab.weights.models import LoadedModel

#: times a fine-tune that raised an error on a live worker is run again (a worker's death is the scheduler's count)
RETRIES = 2
#: Dask's setting of how many tasks a worker is sent per thread (on a cluster made here; an address: its own)
SATURATION = "distributed.scheduler.worker-saturation"


class WorkerLostError(TopoTunerError):
    """A fine-tune's worker died more often than the scheduler allows."""


@dataclass(frozen=True)
class Cluster:
    """Where the fine-tunes run: ``local`` (``jobs`` worker processes here) or a Dask scheduler's address.

    ``gpu``: each fine-tune asks its worker for the resource ``GPU=1``; a local cluster gives worker i only GPU i.
    """

    scheduler: str
    jobs: int = 2
    gpu: bool = False

    def __post_init__(self) -> None:
        check_scheduler(self.scheduler)
        object.__setattr__(self, "jobs", check_jobs(self.jobs))


@functools.lru_cache(maxsize=1)
def _worker_model(model: str | None) -> LoadedModel:
    """The pretrained model on a worker, loaded once per worker process (every fine-tune copies it)."""
    return load_model(model)


def finetune_task(model: str | None, cfg: FinetuneConfig, threads: int) -> tuple[RunResults, float, list[str]]:
    """One fine-tune on a worker at ``threads`` torch threads: its results, seconds and log lines (for the owner)."""
    use_torch_threads(threads)
    lines: list[str] = []
    loaded = _worker_model(model)  # the first task of a worker loads it: not part of the fine-tune's time
    start = time.perf_counter()
    res = finetune_once(loaded, cfg, lines.append)
    return res, time.perf_counter() - start, lines


def _absolute(cfg: FinetuneConfig) -> FinetuneConfig:
    """``cfg`` with absolute folder and card paths, for workers started in another folder (same file system)."""
    profile = None if cfg.profile is None else str(Path(cfg.profile).absolute())
    return replace(cfg, output_dir=str(Path(cfg.output_dir).absolute()), profile=profile)


def run_on_dask(ledger: Ledger, loaded: LoadedModel, model: str | None, cluster: Cluster, threads: int) -> None:
    """Run the ledger's fine-tunes as Dask tasks on ``cluster`` (``threads`` torch threads each), recording each.

    Runs are submitted as soon as their rate is known; one whose folder another row's task already trains waits for
    that task's results, and one an earlier sitting finished is recorded here at once (``recorded_run``), so a
    resumed comparison's ``results.csv`` never loses a finished row while the workers are busy with unfinished ones.
    A free worker takes the queued run that comes first in the plan (Dask priorities), so a run whose rate became
    known late still goes before a side arm's runs submitted earlier: the claims' runs come first here too.
    """
    import dask
    from dask.distributed import KilledWorker, as_completed

    if model is not None and Path(model).exists():  # a model folder or file: the same path on every worker
        model = str(Path(model).absolute())
    # a worker holds only the run it trains (no second one queued on it): the next run is the scheduler's choice
    with dask.config.set({SATURATION: 1.0}), dask_client(cluster.scheduler, cluster.jobs, gpus=cluster.gpu) as client:
        ledger.progress.parallel = max(len(client.scheduler_info()["workers"]), 1)
        resources = {"GPU": 1} if cluster.gpu else None
        waiting: dict[str, list[RunSpec]] = {}  # run folder -> the rows its task serves, in the order they came
        folders: dict[str, str] = {}  # task key -> run folder
        finished: dict[str, RunResults] = {}
        completed = as_completed()
        queue = ledger.take()
        while queue or waiting:
            new: list[tuple[int, str, FinetuneConfig]] = []  # (plan position, task key, config) to submit
            while queue:  # a row found done frees the rows after it (its arm's rate): they are sorted out first
                for spec in queue:
                    cfg = _absolute(ledger.config(spec))
                    if cfg.output_dir not in finished and cfg.output_dir not in waiting:
                        done = recorded_run(loaded, cfg)  # finished in an earlier sitting: recorded here, not queued
                        if done is not None:
                            finished[cfg.output_dir] = done
                    if cfg.output_dir in finished:  # a shared run, done already: this row reuses it
                        ledger.record(spec, finished[cfg.output_dir], 0.0)
                    elif cfg.output_dir in waiting:
                        waiting[cfg.output_dir].append(spec)
                    else:
                        key = f"finetune-{uuid.uuid4().hex[:12]}"
                        folders[key], waiting[cfg.output_dir] = cfg.output_dir, [spec]
                        new.append((ledger.specs.index(spec), key, cfg))
                queue = ledger.take()
            for position, key, cfg in sorted(new, key=lambda n: n[0]):
                completed.add(
                    client.submit(
                        finetune_task,
                        model,
                        cfg,
                        threads,
                        key=key,
                        resources=resources,
                        retries=RETRIES,
                        pure=False,
                        priority=-position,  # a free worker takes the earliest planned run
                    )
                )
            if not waiting:
                continue
            future = next(completed)
            folder = folders.pop(future.key)
            try:
                res, seconds, lines = future.result()
            except KilledWorker as exc:
                raise WorkerLostError(
                    f"the fine-tune into {folder} lost its worker {exc.allowed_failures + 1} times "
                    "(the scheduler's distributed.scheduler.allowed-failures)",
                    "see the workers' logs (out of memory?), give them more memory, then run the same command again: "
                    "finished runs are kept",
                ) from exc
            for line in lines:
                ledger.log(line)
            finished[folder] = res
            for index, spec in enumerate(waiting.pop(folder)):
                ledger.record(spec, res, seconds if index == 0 else 0.0)
            queue = ledger.take()
