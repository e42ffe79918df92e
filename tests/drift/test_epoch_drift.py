"""Epoch-aggregated drift: per-epoch snapshots of a fine-tune, their drift tables and the aggregate."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import topotuner_lab.drift.compute as compute_mod
import topotuner_lab.training.callbacks as callbacks_mod
from topotuner_lab._io.errors import ParameterError, ProfileError, SnapshotMismatchError
from topotuner_lab.cli import main
from topotuner_lab.drift.cache import DriftCache
from topotuner_lab.drift.compute import drift_table
from topotuner_lab.drift.settings import DriftSettings
from topotuner_lab.drift.tables import AGGREGATIONS, aggregate_epochs, drift_columns, load_table, save_table
from topotuner_lab.study.workspace import WorkDir, epoch_drift_once, epoch_table_path
from topotuner_lab.training.callbacks import EpochSnapshots, epoch_snapshot_path
from topotuner_lab.training.config import FinetuneConfig
from topotuner_lab.training.finetune import run_finetune
from topotuner_lab.weights.extract import extract_snapshot
from topotuner_lab.weights.models import build_tiny_model
from topotuner_lab.weights.snapshot import load_snapshot, perturb_snapshot, save_snapshot

FAST = {"n_jobs": 1, "cache": DriftCache(None)}
H0 = DriftSettings(maxdim=0)
TINY = dict(n_train=16, n_test=8, n_ood=8, n_ppl=2, batch_size=8, max_length=40, learning_rate=1e-3)


@pytest.fixture
def epochs(tiny_snapshot):
    """Three "epochs": the pretrained snapshot moved further each time (seeded, so each differs)."""
    return [perturb_snapshot(tiny_snapshot, scale, seed=seed) for seed, scale in enumerate((0.01, 0.03, 0.05))]


@pytest.fixture
def tables(tiny_snapshot, epochs):
    return [drift_table(tiny_snapshot, after, H0, **FAST) for after in epochs]


# the fine-tune writes a snapshot per epoch ---------------------------------------------------------------------
def _state(epoch: float, first: bool = True) -> SimpleNamespace:
    return SimpleNamespace(epoch=epoch, is_world_process_zero=first)


def _callback(folder, **kwargs) -> EpochSnapshots:
    return EpochSnapshots(
        folder, model_name="tiny-llama@sst2-full", base_model="tiny-llama", architecture="llama", **kwargs
    )


def test_epoch_snapshots_callback_writes_each_epoch_atomically(tmp_path, tiny_llama):
    callback = _callback(tmp_path, total_params=123)
    callback.on_epoch_end(None, _state(1.0), None, model=tiny_llama.model)
    with torch_no_grad():
        for p in tiny_llama.model.parameters():
            p.add_(0.01)
    callback.on_epoch_end(None, _state(2.0000001), None, model=tiny_llama.model)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch-1.safetensors", "epoch-2.safetensors"]  # no temp
    assert callback.written == {1: epoch_snapshot_path(tmp_path, 1), 2: epoch_snapshot_path(tmp_path, 2)}
    first, second = load_snapshot(tmp_path / "epoch-1.safetensors"), load_snapshot(tmp_path / "epoch-2.safetensors")
    assert second.weights_hash == extract_snapshot(tiny_llama).weights_hash != first.weights_hash
    assert (first.model, first.base_model, first.total_params) == ("tiny-llama@sst2-full-epoch1", "tiny-llama", 123)
    assert all(m.dtype == np.float32 for m in second.matrices.values())


def test_epoch_snapshots_only_the_first_process_writes(tmp_path, tiny_llama):
    callback = _callback(tmp_path)
    callback.on_epoch_end(None, _state(1.0, first=False), None, model=tiny_llama.model)
    assert not any(tmp_path.iterdir()) and callback.written == {}


def test_epoch_snapshots_reuse_the_early_stopping_copy_of_every_matrix(tmp_path, tiny_llama, monkeypatch):
    from topotuner_lab.training.early_stopping import TopologicalEarlyStopping

    stopper = TopologicalEarlyStopping(0.5, observe_only=True)
    stopper.on_train_begin(None, _state(0.0), None, model=tiny_llama.model)
    control = SimpleNamespace(should_training_stop=False)
    state = SimpleNamespace(epoch=1.0, is_world_process_zero=True, log_history=[])
    stopper.on_epoch_end(None, state, control, model=tiny_llama.model)

    def extraction(*args, **kwargs):
        raise RuntimeError("extracted again")

    monkeypatch.setattr(callbacks_mod, "projection_matrices", extraction)
    _callback(tmp_path, shared=stopper).on_epoch_end(None, state, control, model=tiny_llama.model)  # none extracted
    assert load_snapshot(tmp_path / "epoch-1.safetensors").weights_hash == extract_snapshot(tiny_llama).weights_hash
    monitored = TopologicalEarlyStopping(0.5, pids=["L0.q"])  # a copy of only some matrices is not enough
    monitored.on_train_begin(None, _state(0.0), None, model=tiny_llama.model)
    monitored.on_epoch_end(None, state, control, model=tiny_llama.model)
    with pytest.raises(RuntimeError, match="extracted again"):
        _callback(tmp_path, shared=monitored).on_epoch_end(None, state, control, model=tiny_llama.model)
    stale = SimpleNamespace(epoch=2.0, is_world_process_zero=True, log_history=[])  # the stopper's copy is epoch 1's
    with pytest.raises(RuntimeError, match="extracted again"):
        _callback(tmp_path, shared=stopper).on_epoch_end(None, stale, control, model=tiny_llama.model)


def torch_no_grad():
    import torch

    return torch.no_grad()


@pytest.mark.slow
def test_finetune_writes_and_lists_a_snapshot_per_epoch(tiny_llama, tmp_path):
    out = tmp_path / "run"
    cfg = FinetuneConfig(
        task="sst2",
        output_dir=str(out),
        epochs=2,
        save_snapshot=True,
        save_epoch_snapshots=True,
        stop_threshold=0.01,  # early stopping observes (its copy of the matrices is what gets written) ...
        observe_only=True,  # ... and never stops
        **TINY,
    )
    res = run_finetune(tiny_llama, cfg)
    listed = [str(out / "epoch-1.safetensors"), str(out / "epoch-2.safetensors")]
    assert res.epochs_run == 2 and res.epoch_snapshots == listed
    assert json.loads((out / "results.json").read_text())["epoch_snapshots"] == listed
    assert not list(out.glob(".*.tmp*"))
    first, last = (load_snapshot(p) for p in listed)
    pre = extract_snapshot(tiny_llama)
    assert last.weights_hash == load_snapshot(res.snapshot).weights_hash  # the last epoch is the final weights
    assert len({pre.weights_hash, first.weights_hash, last.weights_hash}) == 3
    assert first.base_model == last.base_model == "tiny-llama"
    assert FinetuneConfig().save_epoch_snapshots is False  # off unless asked


# aggregate_epochs ----------------------------------------------------------------------------------------------
def test_mean_is_the_mean_of_the_per_epoch_tables(tables):
    mean = aggregate_epochs(tables, "mean")
    measured = drift_columns(tables[0])
    assert "h0_w1" in measured and "rel_frobenius" in measured and "n_h0_after" not in measured
    for column in measured:
        expected = (tables[0][column] + tables[1][column] + tables[2][column]) / 3
        np.testing.assert_allclose(mean[column], expected, rtol=1e-12, atol=0)
        assert not np.allclose(mean[column], tables[-1][column])  # not the last epoch's
    other = [c for c in tables[0].columns if c not in measured]
    pd.testing.assert_frame_equal(mean[other], tables[-1][other])
    assert mean.attrs["aggregation"] == "mean" and mean.attrs["epochs"] == 3
    assert mean.attrs["after_hashes"] == [t.attrs["after_hash"] for t in tables]
    assert mean.attrs["after_hash"] is None  # no single fine-tuned snapshot's table
    for kept in ("settings", "before_hash", "before"):
        assert mean.attrs[kept] == tables[0].attrs[kept]


def test_final_is_the_last_epochs_table(tables):
    final = aggregate_epochs(tables, "final")
    pd.testing.assert_frame_equal(final, tables[-1], check_exact=True)
    hashes = [t.attrs["after_hash"] for t in tables]
    assert final.attrs == {**tables[-1].attrs, "aggregation": "final", "epochs": 3, "after_hashes": hashes}
    assert "aggregation" not in tables[-1].attrs  # the input tables are left as they were


def test_rows_are_matched_by_projection_id(tables):
    shuffled = tables[1].sample(frac=1.0, random_state=0).reset_index(drop=True)
    shuffled.attrs = dict(tables[1].attrs)
    mean = aggregate_epochs([tables[0], shuffled, tables[2]], "mean")
    pd.testing.assert_frame_equal(mean, aggregate_epochs(tables, "mean"))
    assert list(mean["pid"]) == list(tables[0]["pid"])


def test_the_aggregate_survives_a_parquet_round_trip(tmp_path, tables):
    mean = aggregate_epochs(tables, "mean")
    back = load_table(save_table(mean, tmp_path / "mean.parquet"))
    pd.testing.assert_frame_equal(back, mean)
    assert back.attrs == mean.attrs


def test_one_epoch_aggregates_to_itself(tables):
    for how in AGGREGATIONS:
        pd.testing.assert_frame_equal(aggregate_epochs(tables[:1], how), tables[0])


def test_tables_of_other_settings_are_refused(tiny_snapshot, epochs, tables):
    other = drift_table(tiny_snapshot, epochs[1], DriftSettings(maxdim=0, orders=(1.0,)), **FAST)
    with pytest.raises(ParameterError, match="tables 1 and 2 were computed with different drift settings"):
        aggregate_epochs([tables[0], other, tables[2]], "mean")
    same_columns = drift_table(tiny_snapshot, epochs[1], DriftSettings(maxdim=0, metric="cosine"), **FAST)
    with pytest.raises(ParameterError, match="different drift settings"):
        aggregate_epochs([tables[0], same_columns], "final")


def test_tables_of_other_projections_are_refused(tiny_snapshot, epochs, tables):
    fewer = drift_table(tiny_snapshot, epochs[2], H0, pids=["L0.q", "L0.k"], **FAST)
    with pytest.raises(ParameterError, match=r"tables 1 and 3 hold different projections \(ids in only one"):
        aggregate_epochs([tables[0], tables[1], fewer], "mean")


def test_tables_of_another_pretrained_snapshot_are_refused(epochs, tables):
    other = extract_snapshot(build_tiny_model("tiny-llama", seed=1))
    foreign = drift_table(other, epochs[1], H0, **FAST)
    with pytest.raises(SnapshotMismatchError, match="different pretrained weights"):
        aggregate_epochs([tables[0], foreign], "mean")
    bare = [t.copy() for t in (tables[0], foreign)]
    for t in bare:
        t.attrs = {}  # as read from CSV: the pretrained columns still tell
    with pytest.raises(SnapshotMismatchError, match="which the pretrained matrices fix"):
        aggregate_epochs(bare, "mean")


@pytest.mark.parametrize(
    "given, how, message",
    [
        pytest.param("tables", "median", "unknown aggregation 'median'", id="how"),
        pytest.param("none", "mean", "non-empty list", id="empty"),
        pytest.param("one", "mean", "non-empty list", id="a-table-not-a-list"),
        pytest.param("aggregated", "mean", "table 2 is already aggregated", id="aggregate"),
    ],
)
def test_bad_arguments_are_refused(tables, given, how, message):
    aggregated = [tables[0], aggregate_epochs(tables, "mean")]
    arg = {"tables": tables, "none": [], "one": tables[0], "aggregated": aggregated}[given]
    with pytest.raises(ParameterError, match=message):
        aggregate_epochs(arg, how)


# epoch_drift_once ----------------------------------------------------------------------------------------------
@pytest.fixture
def drift_calls(monkeypatch):
    calls = []
    real = compute_mod.drift_table

    def counting(before, after, settings=None, **kwargs):
        calls.append(after.weights_hash)
        return real(before, after, settings, **kwargs)

    monkeypatch.setattr(compute_mod, "drift_table", counting)
    return calls


def test_epoch_drift_once_computes_each_epoch_then_reuses(tmp_path, tiny_snapshot, epochs, tables, drift_calls):
    work = WorkDir(tmp_path)
    path = work.drift_table("sst2")
    log: list[str] = []
    mean = epoch_drift_once(tiny_snapshot, epochs, path, "mean", H0, log=log.append, **FAST)
    assert drift_calls == [e.weights_hash for e in epochs]
    pd.testing.assert_frame_equal(mean, aggregate_epochs(tables, "mean"))
    pd.testing.assert_frame_equal(load_table(path), mean)
    for epoch, table in enumerate(tables, start=1):
        assert work.epoch_drift_table("sst2", epoch) == tmp_path / "drift-sst2-epochs" / f"epoch-{epoch}.parquet"
        pd.testing.assert_frame_equal(load_table(epoch_table_path(path, epoch)), table)
    assert work.drift_tables() == [path]  # the per-epoch tables are no prior task's
    assert "drift after epoch 3/3" in log[-1]
    again = epoch_drift_once(tiny_snapshot, epochs, path, "mean", H0, log=log.append, **FAST)
    assert len(drift_calls) == 3 and log[-1] == f"skip (done): {path}"
    pd.testing.assert_frame_equal(again, mean)
    final = epoch_drift_once(tiny_snapshot, epochs, path, "final", H0, **FAST)  # the epochs' tables are reused
    assert len(drift_calls) == 3 and final.attrs["aggregation"] == "final"
    pd.testing.assert_frame_equal(final, tables[-1])


def test_epoch_drift_once_recomputes_a_damaged_epoch_table_only(tmp_path, tiny_snapshot, epochs, drift_calls):
    path = tmp_path / "drift-sst2.parquet"
    mean = epoch_drift_once(tiny_snapshot, epochs, path, "mean", H0, **FAST)
    epoch_table_path(path, 2).write_bytes(b"PAR1 torn")
    path.write_bytes(b"PAR1 torn")
    again = epoch_drift_once(tiny_snapshot, epochs, path, "mean", H0, **FAST)
    assert drift_calls[3:] == [epochs[1].weights_hash]  # epoch 2 alone computed again
    pd.testing.assert_frame_equal(again, mean)
    pd.testing.assert_frame_equal(load_table(path), mean)


def test_epoch_drift_once_recomputes_for_other_epochs_or_settings(tmp_path, tiny_snapshot, epochs, drift_calls):
    path = tmp_path / "drift-sst2.parquet"
    epoch_drift_once(tiny_snapshot, epochs[:2], path, "mean", H0, **FAST)
    assert len(drift_calls) == 2
    three = epoch_drift_once(tiny_snapshot, epochs, path, "mean", H0, **FAST)  # one more epoch: only it is new
    assert len(drift_calls) == 3 and three.attrs["epochs"] == 3
    h0_w1 = DriftSettings(maxdim=0, orders=(1.0,))
    table = epoch_drift_once(tiny_snapshot, epochs, path, "mean", h0_w1, **FAST)
    assert len(drift_calls) == 6 and "h0_w2" not in table.columns


def test_epoch_drift_once_never_reuses_a_plain_table(tmp_path, tiny_snapshot, epochs, drift_calls):
    path = tmp_path / "drift-sst2.parquet"
    save_table(drift_table(tiny_snapshot, epochs[-1], H0, **FAST), path)  # pretrained vs after.safetensors
    assert epoch_drift_once(tiny_snapshot, epochs, path, "final", H0, **FAST).attrs["aggregation"] == "final"
    assert len(drift_calls) == 3  # every epoch computed (the plain table above was made before counting)
    assert load_table(path).attrs["aggregation"] == "final"


def test_epoch_drift_once_refuses_no_epochs_or_an_unknown_aggregation(tmp_path, tiny_snapshot, epochs):
    with pytest.raises(ParameterError, match="no per-epoch snapshots"):
        epoch_drift_once(tiny_snapshot, [], tmp_path / "d.parquet", "mean", H0, **FAST)
    with pytest.raises(ParameterError, match="unknown aggregation 'max'"):
        epoch_drift_once(tiny_snapshot, epochs, tmp_path / "d.parquet", "max", H0, **FAST)


# the CLI -------------------------------------------------------------------------------------------------------
@pytest.fixture
def run_folder(tmp_path, tiny_snapshot, epochs):
    pre = save_snapshot(tiny_snapshot, tmp_path / "pre.safetensors")
    run = tmp_path / "run"
    for epoch, snap in enumerate(epochs, start=1):
        save_snapshot(snap, run / f"epoch-{epoch}.safetensors")
    return pre, run


def _drift(*args: str) -> int:
    return main(["drift", *args, "--maxdim", "0", "--no-cache", "-j", "1"])


def test_cli_aggregates_a_runs_epochs(tmp_path, run_folder, tables, capsys):
    pre, run = run_folder
    out = tmp_path / "mean.parquet"
    assert _drift(str(pre), str(run), "--aggregate", "mean", "-o", str(out)) == 0
    captured = capsys.readouterr()
    assert "mean over 3 epochs" in captured.out and "[3/3] drift against" in captured.err
    expected = aggregate_epochs(tables, "mean")
    written = load_table(out)
    pd.testing.assert_frame_equal(written, expected, rtol=1e-12, atol=0)
    assert {k: written.attrs[k] for k in ("aggregation", "epochs", "after_hashes")} == {
        k: expected.attrs[k] for k in ("aggregation", "epochs", "after_hashes")
    }
    files = [str(run / f"epoch-{n}.safetensors") for n in (3, 1, 2)]  # any order, as a glob may list them
    assert _drift(str(pre), *files, "--aggregate", "final", "-o", str(tmp_path / "final.csv")) == 0
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "final.csv"), tables[-1], rtol=1e-12, atol=0)


def test_cli_single_after_snapshot_is_unchanged(tmp_path, run_folder, tables):
    pre, run = run_folder
    out = tmp_path / "one.parquet"
    assert _drift(str(pre), str(run / "epoch-2.safetensors"), "-o", str(out)) == 0
    written = load_table(out)
    pd.testing.assert_frame_equal(written, tables[1], rtol=1e-12, atol=0)
    assert "aggregation" not in written.attrs


@pytest.mark.parametrize(
    "after, extra, message",
    [
        pytest.param(["epoch-1", "epoch-2"], [], "2 after-snapshots (one per epoch) need an aggregation", id="no-how"),
        pytest.param(["."], [], "3 after-snapshots", id="folder-no-how"),
        pytest.param(["epoch-1", "epoch-1"], ["--aggregate", "mean"], "given twice", id="twice"),
        pytest.param(["empty"], ["--aggregate", "mean"], "without per-epoch snapshots", id="empty-folder"),
    ],
)
def test_cli_usage_errors_name_the_fix(tmp_path, run_folder, capsys, after, extra, message):
    pre, run = run_folder
    (run / "empty").mkdir()
    paths = [str(run / (a if a in (".", "empty") else f"{a}.safetensors")) for a in after]
    assert _drift(str(pre), *paths, *extra, "-o", str(tmp_path / "x.parquet")) == 2
    err = capsys.readouterr().err
    assert message in err and "How to fix" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 2  # the problem, then its fix
    assert not (tmp_path / "x.parquet").exists()


def test_cli_bad_aggregation_is_a_usage_error(tmp_path, run_folder, capsys):
    pre, run = run_folder
    with pytest.raises(SystemExit) as exit_:
        _drift(str(pre), str(run), "--aggregate", "max", "-o", str(tmp_path / "x.parquet"))
    assert exit_.value.code == 2 and "invalid choice: 'max'" in capsys.readouterr().err


def test_a_card_built_from_the_mean_records_it_and_checks_the_pretrained_hash(tiny_llama, tables):
    from topotuner_lab.profiles.apply import identity_of
    from topotuner_lab.profiles.select import CardSettings, build_profile

    identity = identity_of(tiny_llama.model, "tiny-llama")
    card = build_profile(aggregate_epochs(tables, "mean"), identity, CardSettings(prior_task="sst2", count=2))
    assert card.aggregation == "mean" and len(card.trainable) == 2
    assert build_profile(tables[-1], identity, CardSettings(prior_task="sst2", count=2)).aggregation == "final"
    other = extract_snapshot(build_tiny_model("tiny-llama", seed=1))
    foreign = aggregate_epochs([drift_table(other, perturb_snapshot(other, 0.05), H0, **FAST)], "mean")
    with pytest.raises(ProfileError, match="drift table was computed from weights"):  # the pretrained hash is kept
        build_profile(foreign, identity, CardSettings(prior_task="sst2", count=2))
