"""Every bad input is one clear error (exit 2), nothing hangs, results are reproducible and
checked before they are reused. One test per case, parametrized where a case has variants."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from topotuner_lab._io.errors import ParameterError
from topotuner_lab.topology.distances import bottleneck, wasserstein

GOOD = np.array([[0.0, 1.0], [0.5, 2.0]])


# ---------------------------------------------------------------- diagram inputs


@pytest.mark.parametrize("distance", [wasserstein, bottleneck], ids=["wasserstein", "bottleneck"])
@pytest.mark.parametrize(
    "bad, message",
    [
        pytest.param(np.array([[0.0, 1.0], [np.nan, 2.0]]), "NaN", id="nan-birth"),
        pytest.param(np.array([[0.0, 1.0], [0.2, np.nan]]), "NaN", id="nan-death"),
        pytest.param(np.array([[0.0, 1.0], [0.0, np.inf]]), "infinite", id="infinite-death"),
        pytest.param(np.array([[0.0, 1.0], [-np.inf, 1.0]]), "infinite", id="infinite-birth"),
        pytest.param(np.array([[0.0, 1.0], [2.0, 1.0]]), "birth > death", id="birth-after-death"),
        pytest.param(np.array([0.0, 1.0, 0.5, 2.0]), "shape (4,)", id="1-d"),
        pytest.param(np.array([[0.0, 1.0, 2.0]]), "shape (1, 3)", id="3-columns"),
        pytest.param(np.zeros((2, 2, 2)), "shape (2, 2, 2)", id="3-d"),
        pytest.param("0 1", "is str", id="string"),
        pytest.param(None, "is NoneType", id="none"),
        pytest.param([[0.0, "x"]], "not an array of numbers", id="text-inside"),
        pytest.param([[0.0, 1.0], [1.0]], "not an array of numbers", id="ragged"),
    ],
)
def test_bad_diagrams_are_refused(distance, bad, message):
    for first, second, name in ((bad, GOOD, "dgm_a"), (GOOD, bad, "dgm_b")):
        with pytest.raises(ParameterError) as info:
            distance(first, second)
        assert message in info.value.problem and name in info.value.problem and info.value.fix


def test_good_diagrams_still_measure():
    empty = np.zeros((0, 2))
    assert wasserstein([], GOOD) == wasserstein(empty, GOOD) > 0
    assert bottleneck(GOOD, GOOD) == 0.0 and wasserstein(GOOD.tolist(), GOOD) == 0.0


# ---------------------------------------------------------------- hera's delta


@pytest.mark.parametrize("delta", [0, 0.0, -1, float("nan"), float("inf"), True, "0.01", None])
def test_hera_delta_is_validated(delta):
    a, b = np.array([[0.0, 1.0], [0.2, 0.9], [0.1, 0.5]]), np.array([[0.0, 1.1], [0.3, 0.8]])
    with pytest.raises(ParameterError, match="delta") as info:
        wasserstein(a, b, solver="hera", delta=delta)
    assert "0.01" in info.value.fix
    assert wasserstein(a, b, solver="hera", delta=1e-3) == pytest.approx(wasserstein(a, b, solver="pot"), rel=1e-2)


def test_hera_delta_zero_returns_at_once():
    """Before the fix delta=0 spun for over 10 minutes: run it in a process that is killed after 60 s."""
    code = (
        "import numpy as np\n"
        "from topotuner_lab._io.errors import ParameterError\n"
        "from topotuner_lab.topology.distances import wasserstein\n"
        "a, b = np.array([[0.0, 1.0], [0.2, 0.9], [0.1, 0.5]]), np.array([[0.0, 1.1], [0.3, 0.8]])\n"
        "try:\n"
        "    wasserstein(a, b, solver='hera', delta=0)\n"
        "except ParameterError:\n"
        "    print('refused')\n"
    )
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("wasserstein(..., solver='hera', delta=0) still spins")
    assert out.stdout.strip() == "refused", out.stderr


# ---------------------------------------------------------------- early stopping's arguments


@pytest.mark.parametrize("min_epochs", [0, -1, 1.5, True, "2"])
def test_early_stopping_refuses_min_epochs_below_one(min_epochs):
    from topotuner_lab.training.early_stopping import TopologicalEarlyStopping

    with pytest.raises(ParameterError, match="min_epochs") as info:
        TopologicalEarlyStopping(0.5, min_epochs=min_epochs)
    assert "epoch 1 is the reference" in info.value.fix
    assert TopologicalEarlyStopping(0.5, min_epochs=1).min_epochs == 1


@pytest.mark.parametrize("pids", [[], "L0.q", [0, 1]], ids=["empty", "string", "numbers"])
def test_early_stopping_refuses_malformed_pids(pids):
    from topotuner_lab.training.early_stopping import TopologicalEarlyStopping

    with pytest.raises(ParameterError, match="projection ids"):
        TopologicalEarlyStopping(0.5, pids=pids)


def test_early_stopping_refuses_ids_the_model_lacks_at_train_begin(tiny_llama):
    from transformers import TrainerControl, TrainerState

    from topotuner_lab.training.early_stopping import TopologicalEarlyStopping

    callback = TopologicalEarlyStopping(0.5, pids=["L0.q", "L99.q", "L0.gate"])
    with pytest.raises(ParameterError, match="does not have") as info:
        callback.on_train_begin(None, TrainerState(), TrainerControl(), model=tiny_llama.model)
    assert "L99.q" in info.value.problem and "L0.gate" in info.value.problem and "L0.q" not in info.value.problem
    fine = TopologicalEarlyStopping(0.5, pids=["L0.q"])
    fine.on_train_begin(None, TrainerState(), TrainerControl(), model=tiny_llama.model)
    assert fine._previous is not None and set(fine._previous) == {"L0.q"}


# ---------------------------------------------------------------- LoRA initialization follows the seed


def _lora_tensors(loaded, seed: int, history: int) -> dict:
    import torch

    from topotuner_lab.training.config import FinetuneConfig
    from topotuner_lab.training.trainer import prepare_model

    torch.manual_seed(history)  # whatever ran earlier in the process
    torch.randn(history + 1)
    np.random.seed(history)
    model, info = prepare_model(loaded, FinetuneConfig(method="lora", lora_rank=4, seed=seed), None)
    assert info["lora_rank"] == 4
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def test_lora_adapter_initialization_follows_the_seed_not_the_rng_history(tiny_llama):
    import torch

    first, again = _lora_tensors(tiny_llama, seed=3, history=1), _lora_tensors(tiny_llama, seed=3, history=2)
    assert first and set(first) == set(again)
    assert all(torch.equal(first[name], again[name]) for name in first)
    other = _lora_tensors(tiny_llama, seed=4, history=1)
    assert any(not torch.equal(first[name], other[name]) for name in first if "lora_A" in name)


# ---------------------------------------------------------------- LoRA rank above what the model allows


def run_cli(capsys, *argv) -> tuple[int, str]:
    from topotuner_lab.cli import main

    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err
    return code, err


@pytest.mark.parametrize("rank", [100000, 33])
def test_lora_rank_above_the_smallest_projection_is_refused(capsys, tmp_path, monkeypatch, rank):
    import topotuner_lab.training.recipe as recipe

    monkeypatch.setattr(recipe, "load_run_data", lambda cfg: pytest.fail("data read before the rank was checked"))
    argv = ["finetune", "--model", "tiny-llama", "--method", "lora", "--lora-rank", rank, "-o", tmp_path / "run"]
    code, err = run_cli(capsys, *argv)
    assert code == 2 and f"lora_rank={rank} exceeds the largest useful rank 32" in err and "L0.k is 32x64" in err
    assert "--lora-rank 32 or less" in err and len(err.strip().splitlines()) == 2


def test_lora_rank_at_the_limit_builds(tiny_llama):
    from topotuner_lab.training.config import FinetuneConfig
    from topotuner_lab.training.trainer import prepare_model

    _, info = prepare_model(tiny_llama, FinetuneConfig(method="lora", lora_rank=32), None)
    assert info["lora_rank"] == 32


# ---------------------------------------------------------------- --n-test beyond what the split holds

SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
QUICK = ["--epochs", "1", "--n-train", "4", "--n-ood", "4", "--n-ppl", "2", "--batch-size", "4", "--max-length", "32"]


@pytest.fixture
def data_folder(tmp_path) -> Path:
    """A data folder laid out like shared/data with a few rows per split (the SST-2 test split holds 5)."""
    folder = tmp_path / "data"
    for rel, rows in (("sst2/train.tsv", 13), ("sst2/test.tsv", 6), ("agnews/test.tsv", 8), ("gsm8k/test.jsonl", 4)):
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        lines = (SHARED_DATA / rel).read_text(encoding="utf-8").splitlines(keepends=True)[:rows]
        (folder / rel).write_text("".join(lines), encoding="utf-8")
    return folder


@pytest.mark.slow
def test_n_test_beyond_the_split_records_the_rows_used(capsys, tmp_path, data_folder, tiny_llama):
    from topotuner_lab.study.workspace import finetune_once
    from topotuner_lab.training.config import FinetuneConfig
    from topotuner_lab.training.results import load_results

    run = tmp_path / "run"
    argv = ["finetune", "--model", "tiny-llama", "--n-test", "100000", "--data-source", data_folder, "-o", run, *QUICK]
    code, err = run_cli(capsys, *argv)
    assert code == 0 and "warning: the data holds fewer examples than asked (n_test 100000 -> 5)" in err
    results = load_results(run / "results.json")
    assert results["config"]["n_test"] == 5 == len(results["test_correct"])
    assert results["requested_counts"] == {"n_test": 100000} and results["config"]["n_train"] == 4
    asked = FinetuneConfig.from_dict({**results["config"], "n_test": 100000})
    logged: list[str] = []
    assert finetune_once(tiny_llama, asked, logged.append)["test_correct"] == results["test_correct"]
    assert logged == [f"skip (done): {run / 'results.json'}"]  # the same request is the same run: reused


# ---------------------------------------------------------------- hand-edited results are not reused


@pytest.mark.parametrize("edit", ["number", "checksum-removed", "checksum-garbled"])
def test_hand_edited_results_are_recomputed_not_reused(tmp_path, tiny_llama, monkeypatch, edit):
    import json

    import topotuner_lab.training.finetune as finetune_mod
    from topotuner_lab.study.workspace import finetune_once
    from topotuner_lab.training.config import FinetuneConfig
    from topotuner_lab.training.results import load_results, write_results

    calls = []

    def run(loaded, cfg):  # a real run writes its results with write_results too (see the n_test test)
        calls.append(cfg)
        results = {"config": cfg.to_dict(), "test_accuracy": 0.5, "ppl_after": float("nan")}
        write_results(Path(cfg.output_dir) / "results.json", results)
        return SimpleNamespace(to_dict=lambda: results)  # a FinetuneResult's dict view

    monkeypatch.setattr(finetune_mod, "run_finetune", run)
    cfg = FinetuneConfig(output_dir=str(tmp_path / "run"))
    finetune_once(tiny_llama, cfg)
    path = tmp_path / "run" / "results.json"
    assert load_results(path)["test_accuracy"] == 0.5 and "checksum" not in load_results(path)
    data = json.loads(path.read_text())
    if edit == "number":
        data["test_accuracy"] = 0.99
    elif edit == "checksum-removed":
        data = {**data, "test_accuracy": 0.99}
        del data["checksum"]
    else:
        data["checksum"] = "0" * 32
    path.write_text(json.dumps(data))
    log: list[str] = []
    assert finetune_once(tiny_llama, cfg, log.append)["test_accuracy"] == 0.5
    assert len(calls) == 2 and log[0].startswith(f"recompute (unreadable): {path}") and "checksum" in log[0]
    assert load_results(path)["test_accuracy"] == 0.5


# ---------------------------------------------------------------- reproduce into another preset's folder


@pytest.fixture
def tiny_folder(tmp_path) -> Path:
    """A folder as `reproduce --preset tiny` leaves it (its preset.json, and files another preset would replace)."""
    from topotuner_lab._io import atomic
    from topotuner_lab.study.presets import PRESETS

    folder = tmp_path / "D"
    atomic.write_json(folder / "preset.json", {**PRESETS["tiny"].to_dict(), "planned_runs": 26, "machine": "here"})
    (folder / "noise").mkdir()
    for name in ("pretrained.safetensors", "noise/noise-0.parquet", "results.csv", "RESULTS.md"):
        (folder / name).write_bytes(f"tiny's {name}".encode())
    return folder


def _contents(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


class Reached(Exception):
    """Raised where the comparison would start loading the model: the folder check passed."""


def test_reproduce_refuses_a_folder_of_another_preset(capsys, tiny_folder, monkeypatch):
    import dataclasses

    import topotuner_lab.study.protocol as protocol
    from topotuner_lab.study.presets import PRESETS

    before = _contents(tiny_folder)
    monkeypatch.setattr(protocol, "load_model", lambda name: pytest.fail("the model was loaded"))
    code, err = run_cli(capsys, "reproduce", "--preset", "compare", "-o", tiny_folder)
    assert code == 2 and f"{tiny_folder} holds the comparison of another preset" in err
    assert "(model tiny-llama there, smollm2-135m here)" in err and "seeds" in err and "-o" in err
    assert _contents(tiny_folder) == before  # nothing overwritten
    other_seeds = dataclasses.replace(PRESETS["tiny"], seeds=(0,))
    with pytest.raises(ParameterError) as info:
        protocol.run_study(other_seeds, tiny_folder, log=lambda _: None)
    assert info.value.problem.endswith("another preset; they differ in seeds")

    def reached(name):
        raise Reached

    monkeypatch.setattr(protocol, "load_model", reached)
    with pytest.raises(Reached):  # the same preset resumes
        protocol.run_study(PRESETS["tiny"], tiny_folder, log=lambda _: None)
    reworded = dataclasses.replace(PRESETS["tiny"], rationale=("a reason written later",))
    with pytest.raises(Reached):  # so does one whose reasons are reworded: they explain the choices, they are none
        protocol.run_study(reworded, tiny_folder, log=lambda _: None)
    (tiny_folder / "preset.json").write_bytes(b"\x00{damaged")
    log: list[str] = []
    with pytest.raises(Reached):  # a damaged preset.json is rewritten, as before
        protocol.run_study(PRESETS["compare"], tiny_folder, log=log.append)
    damaged = f"rewrite (unreadable): preset {tiny_folder / 'preset.json'} is not valid JSON (JSONDecodeError"
    assert len(log) == 1 and log[0].startswith(damaged)


# ---------------------------------------------------------------- run-notebooks checks, `-p n_train -5` among them

PROJECT = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_notebook_runs(monkeypatch):
    import topotuner_lab.lab.notebooks as notebooks

    monkeypatch.setattr(notebooks, "_execute_one", lambda *a, **k: pytest.fail("a notebook ran"))


@pytest.mark.parametrize(
    "output, message",
    [
        pytest.param("notebooks", "lies in the notebooks folder", id="notebooks"),
        pytest.param("notebooks/out", "lies in the notebooks folder", id="inside-notebooks"),
        pytest.param(".", "is the project root", id="project-root"),
        pytest.param("runs/..", "is the project root", id="project-root-spelled-otherwise"),
    ],
)
def test_run_notebooks_refuses_outputs_in_the_source_tree(capsys, monkeypatch, no_notebook_runs, output, message):
    monkeypatch.chdir(PROJECT)
    before = sorted(p.name for p in PROJECT.iterdir()), sorted(p.name for p in (PROJECT / "notebooks").iterdir())
    code, err = run_cli(capsys, "run-notebooks", "--preset", "tiny", "-o", output)
    assert code == 2 and f"output folder {output} {message}" in err and "-o runs/notebooks-tiny" in err
    assert (sorted(p.name for p in PROJECT.iterdir()), sorted(p.name for p in (PROJECT / "notebooks").iterdir())) == (
        before
    )


@pytest.mark.parametrize(
    "param, value, message",
    [
        pytest.param("n_train", "-5", "n_train=-5 is not a whole number >= 1", id="n_train-negative"),
        pytest.param("epochs", "0", "epochs=0 is not a whole number >= 1", id="epochs-zero"),
        pytest.param("stop_threshold", "1.5", "stop_threshold=1.5 is not a number in (0, 1)", id="threshold"),
        pytest.param("budget_fraction", "-1", "budget_fraction=-1.0 is not a number in (0, 1)", id="budget"),
    ],
)
def test_run_notebooks_checks_parameters_before_any_notebook_runs(
    capsys, tmp_path, no_notebook_runs, param, value, message
):
    code, err = run_cli(capsys, "run-notebooks", "--preset", "tiny", "-p", param, value, "-o", tmp_path / "nb")
    assert code == 2 and message in err and f"give {param} as" in err
    assert not (tmp_path / "nb").exists()


# ---------------------------------------------------------------- `--scheduler`: Dask addresses


@pytest.fixture
def snapshot_files(tmp_path, tiny_snapshot) -> tuple[Path, Path]:
    from topotuner_lab.weights.snapshot import perturb_snapshot, save_snapshot

    pre, post = tmp_path / "pre.safetensors", tmp_path / "post.safetensors"
    save_snapshot(tiny_snapshot, pre)
    save_snapshot(perturb_snapshot(tiny_snapshot, 0.05), post)
    return pre, post


@pytest.mark.parametrize(
    "scheduler, message",
    [
        pytest.param("foo", "scheduler 'foo' is not 'local' nor a Dask address", id="foo"),
        pytest.param("tcp://", "scheduler 'tcp://' is not 'local' nor a Dask address", id="missing-port"),
        pytest.param("tcp://127.0.0.1", "is not 'local' nor a Dask address", id="no-port"),
        pytest.param("tcp://127.0.0.1:99999", "is not 'local' nor a Dask address", id="port-out-of-range"),
        pytest.param("http://127.0.0.1:8786", "is not 'local' nor a Dask address", id="http"),
    ],
)
def test_malformed_scheduler_addresses_are_refused_up_front(capsys, tmp_path, snapshot_files, scheduler, message):
    pre, post = snapshot_files
    code, err = run_cli(capsys, "drift", pre, post, "-o", tmp_path / "T.csv", "--no-cache", "--scheduler", scheduler)
    assert code == 2 and message in err and "tcp://host:8786" in err and not (tmp_path / "T.csv").exists()


class _Junk(__import__("socketserver").BaseRequestHandler):
    """Answers any connection with bytes that are not Dask's (a length header of exabytes, then text)."""

    def handle(self) -> None:
        self.request.sendall(b"\xff" * 16 + b"HTTP/1.0 400 Bad Request\r\n\r\n" * 4)
        self.request.recv(1024)


def _server(kind: str):
    import http.server
    import socketserver
    import threading

    if kind == "http-server":

        class Quiet(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    else:
        server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Junk)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.slow  # a child process per server (torch imports), each bounded at 2 s of handshake
@pytest.mark.parametrize(
    "kind, message",
    [
        pytest.param(
            "http-server", "no Dask scheduler answered at tcp://127.0.0.1:{port} within 2 s", id="http-server"
        ),
        pytest.param("junk-bytes", "the server at tcp://127.0.0.1:{port} answers, but not as a Dask", id="junk-bytes"),
        pytest.param("nothing", "no Dask scheduler answered at tcp://127.0.0.1:{port} within 2 s", id="nothing-there"),
    ],
)
def test_a_scheduler_address_that_is_not_dask_fails_instead_of_waiting(tmp_path, snapshot_files, kind, message):
    """The CLI runs in a child process (before the fix it waited forever); servers run here.

    The child is killed after 10 minutes, which a hang reaches and a slow start on a loaded machine does not (there
    the CLI alone took 83 s, so no wall-clock bound of its own is asserted); a timed-out handshake is named (2 s).
    """
    import socket

    if kind == "nothing":
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        server = None
    else:
        server = _server(kind)
        port = server.server_address[1]
    pre, post = snapshot_files
    argv = [str(pre), str(post), "-o", str(tmp_path / "T.csv"), "--no-cache", "--scheduler", f"tcp://127.0.0.1:{port}"]
    code = (
        "import sys\n"
        "import topotuner_lab.drift.executors as executors\n"
        "from topotuner_lab.cli import main\n"
        "executors.HANDSHAKE_SECONDS = 2.0\n"
        f"sys.exit(main(['drift', *{argv!r}]))\n"
    )
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        pytest.fail("drift still waits on a server that is not a Dask scheduler")
    finally:
        if server is not None:
            server.shutdown()
    assert out.returncode == 2 and message.format(port=port) in out.stderr and "tcp://host:8786" in out.stderr
    assert "Traceback" not in out.stderr and "internal error" not in out.stderr
    assert not (tmp_path / "T.csv").exists()


@pytest.mark.slow
def test_a_real_scheduler_passes_and_one_without_workers_is_refused(tiny_snapshot, monkeypatch):
    import pandas as pd
    from dask.distributed import LocalCluster

    import topotuner_lab.drift.executors as executors
    from topotuner_lab.drift.cache import DriftCache
    from topotuner_lab.drift.compute import drift_table
    from topotuner_lab.drift.settings import DriftSettings
    from topotuner_lab.weights.snapshot import perturb_snapshot

    noisy, settings = perturb_snapshot(tiny_snapshot, 0.05), DriftSettings(maxdim=0, orders=(1.0,), bottleneck=False)
    expected = drift_table(tiny_snapshot, noisy, settings, n_jobs=1, cache=DriftCache(None))
    with LocalCluster(n_workers=1, processes=False, threads_per_worker=1, dashboard_address=None) as cluster:
        executors.check_scheduler_answers(cluster.scheduler_address, 10)
        table = drift_table(
            tiny_snapshot, noisy, settings, n_jobs=1, cache=DriftCache(None), scheduler=cluster.scheduler_address
        )
    pd.testing.assert_frame_equal(table, expected)
    monkeypatch.setattr(executors, "WORKER_SECONDS", 1.0)
    with LocalCluster(n_workers=0, processes=False, dashboard_address=None) as empty:
        with pytest.raises(ParameterError, match="has no worker after 1 s"):
            drift_table(
                tiny_snapshot, noisy, settings, n_jobs=1, cache=DriftCache(None), scheduler=empty.scheduler_address
            )


# ---------------------------------------------------------------- `finetune --data-source`: malformed data files


@pytest.mark.parametrize(
    "content, message",
    [
        pytest.param(
            b"sentence\tlabel\ngood \xff\xfe film\t1\nbad\t0\n",
            "is not UTF-8 text (byte 0xff on line 2)",
            id="non-utf8",
        ),
        pytest.param(b"", "is empty", id="empty"),
        pytest.param(b"\n\r\n", "is empty", id="blank-lines"),
        pytest.param(b"sentence\tlabel\n", "holds a header but no rows", id="header-only"),
        pytest.param(b"sentence\tlabel\ngood\t1\nbad\t0\textra\n", "line 3 of data file", id="extra-field"),
        pytest.param(np.random.default_rng(7).bytes(300), "is not UTF-8 text", id="random-bytes"),
        pytest.param(b"sentence\tlabel\ngood\t\nbad\t\n", "holds no example with both", id="no-labels"),
    ],
)
def test_malformed_data_files_are_one_line_errors(capsys, tmp_path, data_folder, content, message):
    (data_folder / "sst2" / "train.tsv").write_bytes(content)
    argv = ["finetune", "--model", "tiny-llama", "--data-source", data_folder, "-o", tmp_path / "run", *QUICK]
    code, err = run_cli(capsys, *argv)
    lines = err.splitlines()  # datasets' progress bars may come first
    error = next(i for i, line in enumerate(lines) if line.startswith("error: "))
    assert code == 2 and "train.tsv" in lines[error] and message in lines[error]
    assert lines[error + 1].startswith("  How to fix: ") and len(lines) == error + 2
    assert not (tmp_path / "run" / "results.json").exists()


@pytest.mark.parametrize(
    "content, message",
    [
        pytest.param(b"", "is empty", id="empty"),
        pytest.param(b'{"question": "q", "answer": "#### 1"}\nnot json\n', "line 2 of data file", id="not-json"),
        pytest.param(b"[1, 2]\n", "line 1 of data file", id="not-an-object"),
        pytest.param(b"\xff\xfe{}\n", "is not UTF-8 text", id="non-utf8"),
    ],
)
def test_malformed_jsonl_files_are_task_errors(data_folder, content, message):
    from topotuner_lab._io.errors import TaskError
    from topotuner_lab.tasks.loading import load_task

    (data_folder / "gsm8k" / "test.jsonl").write_bytes(content)
    with pytest.raises(TaskError, match="test.jsonl") as info:
        load_task("gsm8k", "test", 2, 0, str(data_folder))
    assert message in info.value.problem


# ---------------------------------------------------------------- Python API: drift_table given a path


@pytest.mark.parametrize(
    "which, given, message",
    [
        pytest.param("after", "path.safetensors", "after is a path ('path.safetensors'), not a Snapshot", id="str"),
        pytest.param("before", Path("pre.safetensors"), "before is a path ('pre.safetensors')", id="pathlib"),
        pytest.param("after", {"L0.q": np.zeros((2, 2))}, "after is a dict, not a Snapshot", id="dict"),
        pytest.param("before", None, "before is a NoneType, not a Snapshot", id="none"),
    ],
)
def test_drift_table_refuses_what_is_not_a_snapshot(tiny_snapshot, which, given, message):
    from topotuner_lab.drift.cache import DriftCache
    from topotuner_lab.drift.compute import drift_table

    args = (given, tiny_snapshot) if which == "before" else (tiny_snapshot, given)
    with pytest.raises(ParameterError) as info:
        drift_table(*args, n_jobs=1, cache=DriftCache(None))
    assert message in info.value.problem
    assert ("load_snapshot(" in info.value.fix) and (
        not isinstance(given, (str, Path)) or repr(str(given)) in info.value.fix
    )


# ---------------------------------------------------------------- a killed `accelerate` rank: the survivor's message


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
def test_the_surviving_rank_of_a_killed_distributed_run_says_a_peer_died(tmp_path):
    """Two ranks started as torchrun starts them (environment variables), without its agent: the agent of
    ``accelerate launch`` may tear the survivor down before it can speak, a race outside this package."""
    import os
    import signal
    import time

    run = tmp_path / "run"
    finetune = [sys.executable, "-m", "topotuner_lab.cli", "finetune", "--model", "tiny-llama", "--method", "full"]
    finetune += ["--task", "sst2", "-o", str(run), "--epochs", "100", "--n-train", "32", "--batch-size", "4"]
    finetune += ["--n-test", "4", "--n-ood", "4", "--n-ppl", "2", "--max-length", "32"]
    common = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"}
    ranks = [
        subprocess.Popen(
            finetune,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **common, "RANK": str(rank), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2"},
            start_new_session=True,
        )
        for rank in (0, 1)
    ]
    try:
        deadline = time.monotonic() + 300
        while not list(run.glob("checkpoint-*")) and ranks[0].poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)  # the first epoch checkpoint: both ranks train in one process group
        assert ranks[0].poll() is None and ranks[1].poll() is None, "the run did not reach its first epoch"
        os.kill(ranks[1].pid, signal.SIGKILL)
        _, err = ranks[0].communicate(timeout=240)
    finally:
        for proc in ranks:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert ranks[0].returncode == 2 and "internal error" not in err
    assert "error: rank 0 of 2: a peer process of this distributed run died or stopped answering" in err
    assert "run the same accelerate launch command again" in err


def test_a_lone_process_keeps_its_own_errors():
    from topotuner_lab.training.finetune import peer_loss_reported

    with pytest.raises(RuntimeError, match="Connection reset by peer"):  # no process group: not a peer's death
        with peer_loss_reported():
            raise RuntimeError("[pair.cc:537] Read error: Connection reset by peer")
