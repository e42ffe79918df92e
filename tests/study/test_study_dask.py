"""The comparison's fine-tunes as Dask tasks: the same rows as the serial loop, in dependency order, none lost.

The fast tests run the grid's scheduling with a stand-in fine-tune on an in-process cluster (its worker threads see
the stand-in); the slow ones train the tiny preset on worker processes, one of them killed mid-run.
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

import topotuner_lab.study.distributed as distributed
import topotuner_lab.study.protocol as protocol
from topotuner_lab._io.errors import ParameterError
from topotuner_lab.cli import main
from topotuner_lab.drift.executors import dask_client
from topotuner_lab.study.cards import CardKey
from topotuner_lab.study.distributed import Cluster
from topotuner_lab.study.plan import arms, every_seed
from topotuner_lab.study.presets import PRESETS
from topotuner_lab.study.protocol import run_study

#: two priors share the full-FT arm's runs; every sweep's best rate is at an edge of its grid: each is extended once
GRID = replace(
    PRESETS["tiny"],
    prior_tasks=("sst2", "boolq"),
    target_tasks=("agnews",),
    strategies=("high-drift",),
    baselines=("full", "lora"),
    seeds=(0, 1),
    constant_lr=("high-drift",),
    lr_extend=1,
    other_models=(),
)


class StandIn:
    """A fine-tune that takes a moment and scores by its config alone; it records when each run folder trained."""

    def __init__(self, seconds: float = 0.05) -> None:
        self.seconds = seconds
        self.spans: dict[str, list[tuple[float, float]]] = {}
        self.lock = threading.Lock()

    def __call__(self, loaded, cfg, log=lambda _: None):
        start = time.perf_counter()
        time.sleep(self.seconds)
        # the card prefers the highest rate of its grid, the others the lowest: every sweep is extended
        logloss = 1 + 0.1 * cfg.seed + (-1 if cfg.method == "profile" else 1) * math.log10(cfg.learning_rate) / 10
        res = {
            "learning_rate": cfg.learning_rate,
            "config": {"lr_scheduler": cfg.lr_scheduler, "epochs": cfg.epochs},
            "val_accuracy": 1 / logloss,
            "val_logloss": logloss,
            "test_accuracy": round(0.5 + cfg.seed / 100 + cfg.learning_rate, 6),
            "train_accuracy": 0.9,
            "train_test_gap": 0.1,
            "ood_accuracy_before": 0.5,
            "ood_accuracy_after": 0.4,
            "perplexity_before": 10.0,
            "perplexity_after": 11.0,
            "trainable_fraction": 0.05,
            "epochs_run": cfg.epochs,
            "epoch_seconds": [1.0] * cfg.epochs,
            "seconds_per_epoch": 1.0,
            "train_seconds": 2.0,
        }
        log(f"run: {cfg.output_dir}")
        with self.lock:
            self.spans.setdefault(str(Path(cfg.output_dir).absolute()), []).append((start, time.perf_counter()))
        return res


@pytest.fixture
def stand_in(monkeypatch, tmp_path):
    """The stand-in fine-tune in both paths, and a prepare step that only names the cards."""
    fake = StandIn()

    def prepare(preset, work, log):
        cards = {CardKey(p, s, b): tmp_path / f"{p}-{s}-{b}.json" for p in preset.prior_tasks for s in
                 preset.strategies for b in preset.budgets}  # fmt: skip
        return None, cards

    monkeypatch.setattr(protocol, "prepare", prepare)
    monkeypatch.setattr(protocol, "_record_transfers", lambda cards, results: None)
    monkeypatch.setattr(protocol, "finetune_once", fake)
    monkeypatch.setattr(distributed, "finetune_once", fake)
    monkeypatch.setattr(distributed, "_worker_model", lambda model: None)
    return fake


@pytest.fixture
def threads_cluster():
    """An in-process Dask cluster of two one-thread workers (its tasks see this process's stand-ins)."""
    from dask.distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        yield cluster.scheduler_address


def test_dask_path_gives_the_serial_table_and_runs_chosen_rates_after_their_sweep(stand_in, threads_cluster, tmp_path):
    logs: list[str] = []
    serial = run_study(GRID, tmp_path / "serial", log=lambda _: None)
    stand_in.spans.clear()
    dask = run_study(GRID, tmp_path / "dask", log=logs.append, threads=1, cluster=Cluster(threads_cluster))
    pd.testing.assert_frame_equal(dask, serial)  # same rows, same order, same chosen rates and selected flags
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "dask" / "results.csv"), dask.pipe(_as_read))
    assert len(serial) > len(protocol.plan(GRID))  # the card's sweep was extended beyond its grid
    # no run folder trained twice, though two priors' rows share the full-FT runs
    assert all(len(spans) == 1 for spans in stand_in.spans.values())
    assert len(stand_in.spans) < len(dask)
    # an arm's chosen-rate runs start only after every run of its sweep (extension included) has finished
    dask = dask.assign(folder=[str((tmp_path / "dask" / d).absolute()) for d in dask["run_dir"]])
    for (prior, run), arm in dask.groupby(["prior", "run"]):
        base = run.removesuffix("+constant")
        sweep = dask[(dask["prior"] == prior) & (dask["run"] == base) & (dask["role"] == "sweep")]
        ended = max(stand_in.spans[f][0][1] for f in sweep["folder"])
        for folder in arm.loc[arm["role"] != "sweep", "folder"]:
            assert stand_in.spans[folder][0][0] >= ended, f"{folder} started before its sweep ended"
    # one progress log, in the owner, with the runs' own lines
    progress = [line for line in logs if line.startswith("[")]
    assert len(progress) == len(dask) and progress[-1].startswith(f"[{len(dask)}/{len(dask)}]")
    assert any(line.startswith("run: ") for line in logs)


def test_runs_finished_in_an_earlier_sitting_are_recorded_by_the_owner_not_queued(
    stand_in, threads_cluster, tmp_path, monkeypatch
):
    serial = run_study(GRID, tmp_path / "serial", log=lambda _: None)
    # an earlier sitting finished every run of the second seed: the owner finds their results in their folders
    earlier = {str((tmp_path / "dask" / d).absolute()) for d in serial.loc[serial["seed"] == 1, "run_dir"]}
    owner = StandIn()  # the results the owner reads back from those folders
    monkeypatch.setattr(
        distributed, "recorded_run", lambda loaded, cfg: owner(loaded, cfg) if cfg.output_dir in earlier else None
    )
    stand_in.spans.clear()
    dask = run_study(GRID, tmp_path / "dask", log=lambda _: None, threads=1, cluster=Cluster(threads_cluster))
    pd.testing.assert_frame_equal(dask, serial)  # the same rows, the earlier sitting's among them
    assert set(owner.spans) == earlier  # each read back once, by the owner
    assert stand_in.spans and not set(stand_in.spans) & earlier  # the workers trained only the unfinished runs


@pytest.mark.parametrize("resumed", [False, True], ids=["fresh", "resumed"])
def test_a_free_worker_takes_the_claims_runs_before_side_arms_submitted_earlier(
    stand_in, tmp_path, monkeypatch, resumed
):
    """One worker: the side arms' sweeps are queued first, yet every run of the claims' arms starts before them.

    Each stand-in run lasts long enough for the owner to submit an arm's chosen runs once its sweep is recorded (a
    real run lasts minutes): the order then comes from the priorities alone. Resumed: an earlier sitting finished
    the claims' sweeps, so their chosen runs are known at once and go before the side arms' sweeps.
    """
    from dask.distributed import LocalCluster

    stand_in.seconds = 0.4
    preset = replace(
        GRID,
        prior_tasks=("sst2",),
        strategies=("high-drift", "low-drift", "random"),
        seeds=(0, 1, 2),
        side_arm_seeds=1,
        margins={"agnews": 0.1},  # full FT is a side arm then, like LoRA
        lr_extend=0,
        constant_lr=(),
    )
    claims = {k.name for k in arms(preset) if every_seed(preset, k)}
    out = tmp_path / "out"
    if resumed:
        serial = run_study(preset, tmp_path / "serial", log=lambda _: None)
        sweeps = serial[serial["run"].isin(claims) & (serial["role"] == "sweep")]
        earlier = {str((out / d).absolute()) for d in sweeps["run_dir"]}
        owner = StandIn(seconds=0)
        monkeypatch.setattr(
            distributed, "recorded_run", lambda loaded, cfg: owner(loaded, cfg) if cfg.output_dir in earlier else None
        )
        stand_in.spans.clear()
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        table = run_study(preset, out, log=lambda _: None, threads=1, cluster=Cluster(cluster.scheduler_address))
    trained = {
        d: stand_in.spans[str((out / d).absolute())][0][0]
        for d in table["run_dir"]
        if str((out / d).absolute()) in stand_in.spans
    }
    claim_starts = [trained[d] for d, run in zip(table["run_dir"], table["run"]) if run in claims and d in trained]
    side_starts = [trained[d] for d, run in zip(table["run_dir"], table["run"]) if run not in claims]
    assert claim_starts and side_starts and max(claim_starts) < min(side_starts)
    assert len(trained) == len(table) - (len(earlier) if resumed else 0)


def _as_read(table: pd.DataFrame) -> pd.DataFrame:
    """A table as ``results.csv`` reads back (CSV types)."""
    import io

    return pd.read_csv(io.StringIO(table.to_csv(index=False)))


def test_a_gpu_run_needs_a_worker_offering_a_gpu(stand_in, threads_cluster, tmp_path):
    with pytest.raises(ParameterError, match="offers a GPU"):
        run_study(GRID, tmp_path / "gpu", log=lambda _: None, cluster=Cluster(threads_cluster, gpu=True))


@pytest.mark.parametrize(
    "argv, message",
    [
        pytest.param(["--scheduler", "foo"], "scheduler 'foo' is not 'local' nor a Dask address", id="address"),
        pytest.param(["--gpu"], "--gpu asks Dask workers for a GPU", id="gpu-alone"),
        pytest.param(["--threads-per-worker", "0"], "threads=0 is not a positive number", id="threads"),
        pytest.param(["--scheduler", "local", "-j", "0"], "jobs=0 is not a positive number", id="jobs"),
    ],
)
def test_bad_cluster_options_are_refused_before_anything_runs(capsys, tmp_path, monkeypatch, argv, message):
    monkeypatch.setattr(protocol, "prepare", lambda *a: pytest.fail("prepared despite a bad option"))
    assert main(["reproduce", "--preset", "tiny", "-o", str(tmp_path / "out"), *argv]) != 0
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_a_local_gpu_cluster_gives_each_worker_its_own_device(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    with dask_client("local", 2, gpus=True) as client:
        seen = client.run(lambda: os.environ["CUDA_VISIBLE_DEVICES"])
        resources = [w["resources"] for w in client.scheduler_info()["workers"].values()]
    assert sorted(seen.values()) == ["3", "5"]
    assert resources == [{"GPU": 1}, {"GPU": 1}]


# ------------------------------------------------------------------ the tiny preset, trained on worker processes

#: what differs between two runs of the same comparison: where and when it ran, and how long it took
VARYING = {"sec_per_epoch", "train_sec", "wall_sec", "peak_rss_mib", "rss_increase_mib", "topo_sec_per_epoch",
           "train_sec_to_stop", "machine"}  # fmt: skip
#: what a run's results.json holds beside its scores, per-example lists and config: timings, memory, its checksum
TIMINGS = {"epoch_seconds", "epoch_eval_seconds", "seconds_per_epoch", "train_seconds", "wall_seconds", "peak_rss_mib",
           "rss_increase_mib", "cuda_peak_allocated_mib", "machine", "checksum"}  # fmt: skip


@pytest.fixture(scope="module")
def serial_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("serial") / "tiny"
    assert main(["reproduce", "--preset", "tiny", "-o", str(out), "--threads-per-worker", "1"]) == 0
    return out


def _run_record(folder: Path, run_dir: str) -> dict:
    """A run's ``results.json`` less its timings, its paths relative to the comparison's folder."""
    record = json.loads((folder / run_dir / "results.json").read_text().replace(str(folder), "COMPARISON"))
    history = [{k: v for k, v in epoch.items() if k != "seconds"} for epoch in record.get("drift_history") or []]
    return {**{k: v for k, v in record.items() if k not in TIMINGS}, "drift_history": history}


def _same_results(folder: Path, serial: Path) -> None:
    """``folder``'s comparison equals ``serial``'s: every table column but timings, every run's record exactly."""
    ours, theirs = pd.read_csv(folder / "results.csv"), pd.read_csv(serial / "results.csv")
    keep = [c for c in theirs.columns if c not in VARYING]
    pd.testing.assert_frame_equal(ours[keep], theirs[keep])
    for run_dir in theirs["run_dir"]:
        mine, reference = _run_record(folder, run_dir), _run_record(serial, run_dir)
        assert mine.keys() == reference.keys(), run_dir
        for key in reference:
            assert mine[key] == reference[key], f"{run_dir}: {key}"


@pytest.mark.slow
def test_reproduce_on_a_local_dask_cluster_equals_the_serial_run(serial_tiny, tmp_path):
    out = tmp_path / "tiny"
    argv = ["reproduce", "--preset", "tiny", "-o", str(out), "--threads-per-worker", "1"]
    assert main([*argv, "--scheduler", "local", "--jobs", "2"]) == 0
    _same_results(out, serial_tiny)


@pytest.mark.slow
def test_a_worker_killed_mid_run_loses_nothing(serial_tiny, tmp_path):
    """A worker process is killed while it trains; the scheduler runs that fine-tune again and nothing is lost."""
    from dask.distributed import Client, LocalCluster

    out, killed = tmp_path / "tiny", []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with Client(cluster) as client:

            def kill_one_training_worker() -> None:
                deadline = time.monotonic() + 600
                while time.monotonic() < deadline and not killed:
                    busy = {w: keys for w, keys in client.processing().items() if keys}
                    if busy:
                        time.sleep(2.0)  # well into the fine-tune (the tiny ones take ~5-10 s)
                        worker, keys = next(iter(busy.items()))
                        pid = client.run(os.getpid, workers=[worker])[worker]
                        os.kill(pid, signal.SIGKILL)
                        killed.append(keys)
                    time.sleep(0.2)

            watcher = threading.Thread(target=kill_one_training_worker, daemon=True)
            watcher.start()
            argv = ["reproduce", "--preset", "tiny", "-o", str(out), "--threads-per-worker", "1"]
            assert main([*argv, "--scheduler", cluster.scheduler_address]) == 0
            watcher.join(timeout=5)
    assert killed, "no worker was killed: the test proved nothing"
    _same_results(out, serial_tiny)


def test_the_cluster_docs_slurm_and_kubernetes_configs_say_what_they_claim():
    """docs/CLUSTER.md's snippets, run as far as a machine without Slurm or Kubernetes goes (the cluster extra)."""
    pytest.importorskip("dask_jobqueue")
    pytest.importorskip("dask_kubernetes")
    import re

    blocks = re.findall(r"```python\n(.*?)```", (Path(__file__).parents[2] / "docs" / "CLUSTER.md").read_text(), re.S)
    slurm, kube = (next(b for b in blocks if marker in b) for marker in ("SLURMCluster(", "make_cluster_spec("))
    scope: dict = {}
    exec(slurm.split("slurm.scale(")[0], scope)  # the cluster object only: no job is submitted
    try:
        script = scope["slurm"].job_script()
    finally:
        scope["slurm"].close()
    for line in ("#SBATCH --cpus-per-task=8", "#SBATCH --gres=gpu:1", "--nthreads 1", "--resources GPU=1"):
        assert line in script
    exec(kube.split("with KubeCluster(")[0], scope)
    worker, scheduler = (scope["spec"]["spec"][role]["spec"] for role in ("worker", "scheduler"))
    assert worker["containers"][0]["args"][:6] == ["dask", "worker", "--nthreads", "1", "--resources", "GPU=1"]
    assert worker["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert scheduler["containers"][0]["resources"] == {}  # no GPU held by the scheduler
    assert worker["containers"][0]["volumeMounts"] == scheduler["containers"][0]["volumeMounts"]
