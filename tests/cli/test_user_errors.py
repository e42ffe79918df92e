"""A user error is one clear line (exit 2) and never a traceback; a damaged
cache is recomputed, never trusted; no command writes over its own inputs."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from topotuner_lab._io.errors import InvalidMatrixError, ModelLoadError, ParameterError, SnapshotMismatchError
from topotuner_lab.cli import main
from topotuner_lab.drift.cache import DriftCache
from topotuner_lab.drift.compute import drift_table
from topotuner_lab.drift.executors import check_jobs
from topotuner_lab.drift.tables import save_table
from topotuner_lab.profiles.card import SCHEMA_VERSION
from topotuner_lab.weights.extract import extract_snapshot
from topotuner_lab.weights.models import build_tiny_model, load_model
from topotuner_lab.weights.snapshot import Snapshot, check_comparable, load_snapshot, perturb_snapshot, save_snapshot


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def profile_argv(table, pretrained, output, *extra) -> list:
    """``profile TABLE --pretrained P --prior-task sst2 --count 2 -o OUTPUT [EXTRA...]``."""
    return ["profile", table, "--pretrained", pretrained, "--prior-task", "sst2", "--count", "2", "-o", output, *extra]


def run_profile(capsys, table, pretrained, output, *extra: str) -> tuple[int, str]:
    """``topotuner-lab profile TABLE --pretrained P --prior-task sst2 --count 2 -o OUTPUT [EXTRA...]``."""
    return run_cli(capsys, *profile_argv(table, pretrained, output, *extra))


@pytest.fixture
def files(tmp_path, tiny_snapshot):
    """A pretrained snapshot, a fine-tuned copy, and their drift table."""
    pre, post, table = tmp_path / "pre.safetensors", tmp_path / "post.safetensors", tmp_path / "T.parquet"
    save_snapshot(tiny_snapshot, pre)
    save_snapshot(perturb_snapshot(tiny_snapshot, 0.05), post)
    save_table(drift_table(load_snapshot(pre), load_snapshot(post), n_jobs=1, cache=DriftCache(None)), table)
    return pre, post, table


def _with_matrix(snap: Snapshot, pid: str, matrix: np.ndarray) -> Snapshot:
    return Snapshot(
        {**snap.matrices, pid: matrix},
        snap.model,
        snap.base_model,
        snap.revision,
        snap.architecture,
        total_params=snap.total_params,
    )


# 1. errors raised inside drift workers -----------------------------------------------------------------------
def test_errors_survive_pickling():
    back = pickle.loads(pickle.dumps(InvalidMatrixError("a problem", "a fix")))
    assert (
        isinstance(back, InvalidMatrixError)
        and back.problem == "a problem"
        and back.fix == "a fix"
        and "How to fix: a fix" in str(back)
    )


@pytest.mark.parametrize("bad", ["nan", "one-row"])
def test_worker_errors_reach_the_user_as_one_line(tmp_path, tiny_snapshot, capsys, bad):
    matrix = tiny_snapshot.matrices["L1.v"].copy()
    if bad == "nan":
        matrix[0, 0] = np.nan
    else:
        matrix = matrix[:1]
    for name, snap in (
        ("a", tiny_snapshot if bad == "nan" else _with_matrix(tiny_snapshot, "L1.v", matrix)),
        ("b", _with_matrix(tiny_snapshot, "L1.v", matrix)),
    ):
        save_snapshot(snap, tmp_path / f"{name}.safetensors")
    code, err = run_cli(
        capsys,
        "drift",
        tmp_path / "a.safetensors",
        tmp_path / "b.safetensors",
        "-o",
        tmp_path / "d.parquet",
        "-j",
        "2",
        "--no-cache",
    )
    assert code == 2 and ("NaN/Inf" in err if bad == "nan" else "1 row(s)" in err) and "How to fix" in err


def test_nan_wasserstein_order_is_refused(files, tmp_path, capsys):
    pre, post, _ = files
    code, err = run_cli(capsys, "drift", pre, post, "-o", tmp_path / "d.parquet", "-p", "nan")
    assert code == 2 and "orders=(nan,)" in err


# 2. identical matrix pairs under two ids ---------------------------------------------------------------------
def test_identical_pairs_share_a_cache_entry_but_keep_their_ids(tiny_snapshot, tmp_path):
    noisy = perturb_snapshot(tiny_snapshot, 0.05)
    copied = [
        _with_matrix(_with_matrix(s, "L1.q", s.matrices["L0.q"]), "L1.o", s.matrices["L0.o"])
        for s in (tiny_snapshot, noisy)
    ]
    reference = drift_table(*copied, n_jobs=1, cache=DriftCache(None))
    cache = DriftCache(tmp_path / "c")
    for _ in range(2):  # cold, then from the cache
        table = drift_table(*copied, n_jobs=2, cache=cache)
        assert list(table["pid"]) == list(copied[0].matrices)
        pd.testing.assert_frame_equal(table, reference)
    row = table.set_index("pid")
    assert row.loc["L1.q", "h0_w1"] == row.loc["L0.q", "h0_w1"] and row.loc["L1.q", "layer"] == 1


# 3. damaged cache entries ------------------------------------------------------------------------------------
def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


DAMAGE = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "emptied": lambda p: p.write_bytes(b""),
    "bit-flipped": _flip,
    "invalid-utf8": lambda p: p.write_bytes(b"\xff\xfe\x00garbage"),
    "empty-object": lambda p: p.write_text("{}"),
    "empty-list": lambda p: p.write_text("[]"),
}


@pytest.mark.parametrize("kind", ["diagrams", "rows"])
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_cache_entries_are_recomputed(tiny_snapshot, tmp_path, kind, damage):
    noisy = perturb_snapshot(tiny_snapshot, 0.05)
    reference = drift_table(tiny_snapshot, noisy, n_jobs=1, cache=DriftCache(None))
    cache = DriftCache(tmp_path / "c")
    drift_table(tiny_snapshot, noisy, n_jobs=1, cache=cache)
    entries = sorted((tmp_path / "c" / kind).rglob("*.*"))
    assert entries
    for path in entries:
        DAMAGE[damage](path)
    if kind == "diagrams":  # rows are intact: drop them so the diagrams are read
        shutil.rmtree(tmp_path / "c" / "rows")
    pd.testing.assert_frame_equal(drift_table(tiny_snapshot, noisy, n_jobs=1, cache=cache), reference)


def test_edited_row_values_and_swapped_entries_are_not_trusted(tiny_snapshot, tmp_path):
    noisy = perturb_snapshot(tiny_snapshot, 0.05)
    reference = drift_table(tiny_snapshot, noisy, n_jobs=1, cache=DriftCache(None))
    cache = DriftCache(tmp_path / "c")
    drift_table(tiny_snapshot, noisy, n_jobs=1, cache=cache)
    rows = sorted((tmp_path / "c" / "rows").rglob("*.json"))
    entry = json.loads(rows[0].read_text())
    entry["values"]["h0_w1"] *= 1.5  # a flipped digit: the checksum no longer matches
    rows[0].write_text(json.dumps(entry))
    a, b = rows[1].read_bytes(), rows[2].read_bytes()  # two files swapped: each holds another key
    rows[1].write_bytes(b)
    rows[2].write_bytes(a)
    diagrams = sorted((tmp_path / "c" / "diagrams").rglob("*.npz"))
    d0, d1 = diagrams[0].read_bytes(), diagrams[1].read_bytes()
    diagrams[0].write_bytes(d1)
    diagrams[1].write_bytes(d0)
    pd.testing.assert_frame_equal(drift_table(tiny_snapshot, noisy, n_jobs=1, cache=cache), reference)


# 4. outputs never overwrite inputs ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv, message",
    [
        pytest.param(
            lambda pre, post, table, tmp: profile_argv(table, pre, table), "should end in .json", id="card-onto-table"
        ),
        pytest.param(
            lambda pre, post, table, tmp: profile_argv(table, pre, pre), "should end in .json", id="card-onto-snapshot"
        ),
        pytest.param(
            lambda pre, post, table, tmp: profile_argv(table, pre, tmp / "card.md"),
            "should end in .json",
            id="card-as-markdown",
        ),
        pytest.param(
            lambda pre, post, table, tmp: profile_argv(table, pre, tmp / "card.json", "--spectrum", tmp / "card.json"),
            "are the same file",
            id="spectrum-is-the-card",
        ),
        pytest.param(
            lambda pre, post, table, tmp: profile_argv(table, pre, tmp / "card.json", "--spectrum", table),
            "is the drift table",
            id="spectrum-is-the-table",
        ),
        pytest.param(
            lambda pre, post, table, tmp: ["perturb", pre, "-o", pre], "is the input snapshot", id="perturb-onto-input"
        ),
        pytest.param(
            lambda pre, post, table, tmp: ["drift", pre, post, "-o", pre],
            "should end in .parquet or .csv",
            id="drift-onto-snapshot",
        ),
    ],
)
def test_outputs_that_are_inputs_are_refused(files, tmp_path, capsys, argv, message):
    before = {p: p.read_bytes() for p in files}
    code, err = run_cli(capsys, *argv(*files, tmp_path))
    assert code == 2 and message in err, err
    assert {p: p.read_bytes() for p in files} == before
    assert not (tmp_path / "card.json").exists()


def test_a_link_to_an_input_is_replaced_not_written_through(files, tmp_path, capsys):
    pre, post, table = files
    before = {p: p.read_bytes() for p in files}
    os.symlink(table, tmp_path / "alias.parquet")
    code, err = run_cli(capsys, "drift", pre, post, "-o", tmp_path / "alias.parquet")
    assert code == 0  # the output is not an input of drift: the link is replaced, the table it pointed to is kept
    assert {p: p.read_bytes() for p in files} == before
    assert not (tmp_path / "alias.parquet").is_symlink()


def test_card_markdown_view_never_replaces_a_json_card(files, tmp_path, capsys):
    pre, _, table = files
    yaml = tmp_path / "card.md.yaml"
    code, _ = run_profile(capsys, table, pre, tmp_path / "card.json", "--spectrum", yaml)
    assert (
        code == 0
        and json.loads((tmp_path / "card.json").read_text())["schema_version"] == SCHEMA_VERSION
        and (tmp_path / "card.md").read_text().startswith("#")
    )


# 5. + 6. the model behind a card -----------------------------------------------------------------------------
def test_profile_counts_the_snapshots_own_model(files, tmp_path, capsys, tiny_llama):
    pre, _, table = files
    assert run_profile(capsys, table, pre, tmp_path / "c.json")[0] == 0
    card = json.loads((tmp_path / "c.json").read_text())
    total = sum(p.numel() for p in tiny_llama.model.parameters())
    assert (
        card["model"]["total_params"] == total
        and abs(card["trainable_fraction"] - card["trainable_params"] / total) < 1e-12
    )
    code, err = run_profile(capsys, table, pre, tmp_path / "d.json", "--model", "tiny-qwen2")
    assert code == 2 and "is not the model of the pretrained snapshot" in err


@pytest.mark.parametrize(
    "bad", [pytest.param("0", id="zero"), pytest.param("1", id="one"), pytest.param("-5", id="negative")]
)
def test_profile_refuses_a_total_below_the_snapshots_own_count(files, tmp_path, capsys, bad):
    pre, _, table = files
    code, err = run_profile(capsys, table, pre, tmp_path / "d.json", "--total-params", bad)
    assert code == 2 and "below the" in err
    assert not (tmp_path / "d.json").exists()


def test_profile_refuses_another_models_drift_table(files, tmp_path, capsys):
    pre, _, _ = files
    other = extract_snapshot(build_tiny_model("tiny-llama", seed=5))  # same shapes, other weights
    save_table(
        drift_table(other, perturb_snapshot(other, 0.05), n_jobs=1, cache=DriftCache(None)), tmp_path / "other.parquet"
    )
    code, err = run_profile(capsys, tmp_path / "other.parquet", pre, tmp_path / "c.json")
    assert code == 2 and "drift table was computed from weights" in err
    small = build_tiny_model("tiny-llama", intermediate_size=64, hidden_size=32)
    snap = extract_snapshot(small)
    save_table(
        drift_table(snap, perturb_snapshot(snap, 0.05), n_jobs=1, cache=DriftCache(None)), tmp_path / "small.parquet"
    )
    code, err = run_profile(capsys, tmp_path / "small.parquet", pre, tmp_path / "c.json")
    assert code == 2 and "shapes differ" in err


# 7. unhandled exceptions -------------------------------------------------------------------------------------
def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _without_pid(tmp: Path, pre: Path, table: Path) -> Path:
    pd.read_parquet(table).drop(columns=["pid"]).to_parquet(tmp / "nopid.parquet")
    return tmp / "nopid.parquet"


def _duplicated_row(tmp: Path, pre: Path, table: Path) -> Path:
    frame = pd.read_parquet(table)
    pd.concat([frame, frame.iloc[:1]]).to_parquet(tmp / "dup.parquet")
    return tmp / "dup.parquet"


@pytest.mark.parametrize(
    "make, message",
    [
        pytest.param(lambda tmp, pre, table: _write(tmp / "empty.parquet", b""), "cannot be read", id="empty"),
        pytest.param(
            lambda tmp, pre, table: _write(tmp / "truncated.parquet", table.read_bytes()[:200]),
            "cannot be read",
            id="truncated",
        ),
        pytest.param(
            lambda tmp, pre, table: _write(tmp / "snapshot.parquet", pre.read_bytes()),
            "cannot be read",
            id="snapshot-named-parquet",
        ),
        pytest.param(_without_pid, "no column(s) ['pid']", id="no-pid-column"),
        pytest.param(_duplicated_row, "more than once", id="duplicated-pid"),
        pytest.param(lambda tmp, pre, table: pre, "not a drift table", id="snapshot-file"),
    ],
)
def test_bad_tables_are_clear_errors(files, tmp_path, capsys, make, message):
    pre, _, table = files
    code, err = run_profile(capsys, make(tmp_path, pre, table), pre, tmp_path / "c.json")
    assert code == 2 and message in err, err
    assert not (tmp_path / "c.json").exists()


def test_a_metric_that_is_not_a_measure_column_is_a_clear_error(files, tmp_path, capsys):
    pre, _, table = files
    code, err = run_profile(capsys, table, pre, tmp_path / "c.json", "--metric", "pid")
    assert code == 2 and "no measure column 'pid'" in err


BAD_CARDS = [
    pytest.param(lambda card: json.dumps({**card, "colour": "red"}).encode(), ("card", "How to fix"), id="extra-field"),
    pytest.param(
        lambda card: json.dumps({**card, "trainable": None}).encode(), ("card", "How to fix"), id="trainable-null"
    ),
    pytest.param(
        lambda card: json.dumps({**card, "ranking": [{"pid": r["pid"]} for r in card["ranking"]]}).encode(),
        ("card", "How to fix"),
        id="ranking-without-score",
    ),
    pytest.param(
        lambda card: json.dumps(
            {**card, "ranking": [{"pid": r["pid"], "score": "high"} for r in card["ranking"]]}
        ).encode(),
        ("card", "How to fix"),
        id="score-as-text",
    ),
    pytest.param(lambda card: b"[" * 100_000 + b"]" * 100_000, ("card", "How to fix"), id="deep-nesting"),
    pytest.param(lambda card: b"\xff\xfe{", ("not valid JSON (UnicodeDecodeError",), id="invalid-utf8"),
]


@pytest.mark.parametrize("content, messages", BAD_CARDS)
def test_bad_cards_are_clear_errors_before_any_training(files, tmp_path, capsys, content, messages):
    pre, _, table = files
    assert run_profile(capsys, table, pre, tmp_path / "good.json")[0] == 0
    path = tmp_path / "bad.json"
    path.write_bytes(content(json.loads((tmp_path / "good.json").read_text())))
    code, err = run_cli(
        capsys, "finetune", "--model", "tiny-llama", "--method", "profile", "--profile", path, "-o", tmp_path / "run"
    )
    assert code == 2 and all(m in err for m in messages), err
    assert not (tmp_path / "run" / "results.json").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        pytest.param(
            lambda pre, post, tmp: ["drift", pre, post, "-o", "/proc/drift.parquet"],
            "system folder",
            id="system-folder",
        ),
        pytest.param(
            lambda pre, post, tmp: ["drift", pre, post, "-o", tmp / "a-file" / "d.parquet"],
            "which is a file",
            id="output-under-a-file",
        ),
        pytest.param(
            lambda pre, post, tmp: ["drift", pre, post, "-o", tmp / "a-dir.parquet"],
            "is a folder",
            id="output-is-a-folder",
        ),
        pytest.param(
            lambda pre, post, tmp: ["drift", pre, post, "-o", tmp / "d.parquet", "--jobs", "0"],
            "not a positive number of worker processes",
            id="jobs-0",
        ),
        pytest.param(
            lambda pre, post, tmp: [
                "finetune",
                "--model",
                "tiny-llama",
                "--method",
                "lora",
                "--lora-rank",
                "abc",
                "-o",
                tmp / "r",
            ],
            None,  # argparse: exit 2 with usage
            id="lora-rank-not-a-number",
        ),
        pytest.param(
            lambda pre, post, tmp: ["perturb", pre, "-o", tmp / "n.safetensors", "--seed", "-1"],
            "seed=-1 is not a whole number >= 0",
            id="negative-seed",
        ),
        pytest.param(
            lambda pre, post, tmp: [
                "finetune",
                "--model",
                "tiny-llama",
                "--data-source",
                tmp / "a-file",
                "-o",
                tmp / "r",
            ],
            "or an existing data folder",
            id="data-source-is-a-file",
        ),
        pytest.param(
            lambda pre, post, tmp: ["finetune", "--model", "tiny-llama", "-o", tmp / "a-file"],
            "is a file, not a folder",
            id="run-folder-is-a-file",
        ),
        pytest.param(
            lambda pre, post, tmp: ["drift", pre, post, "-o", tmp / "d.parquet", "--cache", tmp / "locked" / "c"],
            "cannot write the drift cache",
            id="cache-in-a-read-only-folder",
            marks=pytest.mark.skipif(
                hasattr(os, "geteuid") and os.geteuid() == 0,
                reason="root writes anywhere: the permission case only means something for other users",
            ),
        ),
    ],
)
def test_bad_paths_and_options_are_clear_errors(files, tmp_path, capsys, argv, message):
    pre, post, _ = files
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-dir.parquet").mkdir()
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        try:
            code, err = run_cli(capsys, *argv(pre, post, tmp_path))
        except SystemExit as exc:  # argparse's own usage error
            code, err = exc.code, capsys.readouterr().err
    finally:
        locked.chmod(0o700)
    assert code == 2 and (message is None or message in err), err


def test_unwritable_cache_is_refused_before_work(files, tmp_path, capsys):
    pre, post, _ = files
    (tmp_path / "cache-file").write_text("x")
    code, err = run_cli(
        capsys, "drift", pre, post, "-o", tmp_path / "d.parquet", "--cache", tmp_path / "cache-file" / "c"
    )
    assert code == 2 and "cannot write the drift cache" in err and not (tmp_path / "d.parquet").exists()


# 8. snapshot metadata ----------------------------------------------------------------------------------------
def _rewrite_metadata(path: Path, edit) -> None:
    from safetensors import safe_open
    from safetensors.numpy import save_file

    with safe_open(str(path), framework="numpy") as handle:
        meta, tensors = dict(handle.metadata()), {k: handle.get_tensor(k) for k in handle.keys()}
    save_file(tensors, str(path), metadata=edit(meta))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda m: {k: v for k, v in m.items() if k != "model"}, "lacks metadata ['model']"),
        (lambda m: {k: v for k, v in m.items() if k != "created"}, "lacks metadata ['created']"),
        (lambda m: {k: v for k, v in m.items() if k != "weights_hash"}, "lacks metadata ['weights_hash']"),
        (lambda m: {**m, "base_model": "someone-else"}, "metadata does not match its own hash"),
        (lambda m: {**m, "total_params": "12"}, "metadata does not match its own hash"),
    ],
)
def test_snapshot_metadata_is_verified(tmp_path, tiny_snapshot, edit, message, capsys):
    path = save_snapshot(tiny_snapshot, tmp_path / "s.safetensors")
    _rewrite_metadata(path, edit)
    code, err = run_cli(capsys, "perturb", path, "-o", tmp_path / "n.safetensors")
    assert code == 2 and message in err


@pytest.mark.parametrize("scale", ["nan", "inf", "0", "-1"])
def test_perturb_scale_must_be_positive_and_finite(files, tmp_path, capsys, scale):
    code, err = run_cli(capsys, "perturb", files[0], "-o", tmp_path / "n.safetensors", "--scale", scale)
    assert code == 2 and "not a positive finite number" in err and not (tmp_path / "n.safetensors").exists()


# 9. hygiene --------------------------------------------------------------------------------------------------
def test_ctrl_c_is_one_line_and_exit_130(files, tmp_path, capsys, monkeypatch):
    import topotuner_lab.drift.compute as drift_mod

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(drift_mod, "drift_between", interrupted)
    code, err = run_cli(capsys, "drift", files[0], files[1], "-o", tmp_path / "d.parquet")
    assert code == 130 and "interrupted" in err and "resume" in err


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc for child processes")
def test_sigterm_stops_cleanly_and_leaves_no_workers(tmp_path):
    import psutil

    rng = np.random.default_rng(0)
    big = {f"L{i}.{k}": rng.standard_normal((700, 64)).astype(np.float32) for i in range(4) for k in "qkvo"}
    snap = Snapshot(big, "big", "big", "r", "llama", total_params=10**7)
    save_snapshot(snap, tmp_path / "a.safetensors")
    save_snapshot(perturb_snapshot(snap, 0.1), tmp_path / "b.safetensors")
    cmd = [
        sys.executable,
        "-m",
        "topotuner_lab.cli",
        "drift",
        str(tmp_path / "a.safetensors"),
        str(tmp_path / "b.safetensors"),
        "-o",
        str(tmp_path / "d.parquet"),
        "-j",
        "2",
        "--cache",
        str(tmp_path / "c"),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and len(psutil.Process(proc.pid).children(recursive=True)) < 2:
        time.sleep(0.2)
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err and "interrupted" in err
    time.sleep(1.0)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE], (
        "worker processes left running"
    )


def test_jobs_are_capped_at_the_core_count():
    assert check_jobs(1000) == (os.cpu_count() or 1) and check_jobs(1) == 1
    with pytest.raises(ParameterError, match="jobs=0 is not a positive number of worker processes"):
        check_jobs(0)


def test_files_honour_the_umask(tmp_path, tiny_snapshot):
    old = os.umask(0o022)
    try:
        path = save_snapshot(tiny_snapshot, tmp_path / "s.safetensors")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644


def test_a_mistyped_tiny_model_name_fails_at_once_with_a_hint():
    start = time.perf_counter()
    with pytest.raises(ModelLoadError, match="did you mean 'tiny-llama'"):
        load_model("tiny-lama")
    assert time.perf_counter() - start < 5  # no hub retries


def test_mismatch_messages_name_what_differs(tiny_snapshot):
    other = Snapshot(dict(tiny_snapshot.matrices), "x", tiny_snapshot.base_model, "r", "qwen2")
    with pytest.raises(SnapshotMismatchError, match="architectures differ: 'llama' vs 'qwen2'"):
        check_comparable(tiny_snapshot, other)
