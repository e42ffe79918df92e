"""The work folder (study.workspace): where each step's file lives, and "reuse a finished step, or compute it"."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest

import topotuner_lab.drift.compute as compute_mod
import topotuner_lab.training.finetune as finetune_mod
from topotuner_lab._io.errors import InputFileError, TopoTunerError
from topotuner_lab.drift.cache import DriftCache
from topotuner_lab.drift.compute import drift_table
from topotuner_lab.drift.settings import DriftSettings
from topotuner_lab.drift.tables import load_table
from topotuner_lab.profiles.card import ModelIdentity, ProfileCard
from topotuner_lab.profiles.select import CardSettings, build_profile
from topotuner_lab.study.workspace import (
    WorkDir,
    drift_table_once,
    finetune_once,
    noise_tables_once,
    reuse_or_compute,
    run_snapshot,
    snapshot_once,
)
from topotuner_lab.training.config import FinetuneConfig
from topotuner_lab.training.recipe import stop_threshold_for
from topotuner_lab.training.results import load_results, write_results
from topotuner_lab.training.trainer import resolve_lora_rank
from topotuner_lab.weights.extract import extract_snapshot
from topotuner_lab.weights.models import build_tiny_model
from topotuner_lab.weights.snapshot import NOISE_SCALE, load_snapshot, perturb_snapshot, save_snapshot

FAST = {"n_jobs": 1, "cache": DriftCache(None)}


# WorkDir -------------------------------------------------------------------------------------------------------
def test_paths_of_a_work_folder(tmp_path):
    work = WorkDir(str(tmp_path))
    assert work.root == tmp_path and WorkDir(tmp_path) == work
    assert work.pretrained == tmp_path / "pretrained.safetensors"
    assert work.prior_run("sst2") == tmp_path / "prior-sst2"
    assert work.finetuned("sst2") == tmp_path / "prior-sst2" / "after.safetensors"
    assert work.drift_table("agnews") == tmp_path / "drift-agnews.parquet"
    assert work.noise_table(3) == tmp_path / "noise" / "noise-3.parquet"
    assert work.cards == tmp_path / "cards"
    assert work.card() == tmp_path / "cards" / "profile.json"
    assert work.card("sst2-high-drift-0.05") == tmp_path / "cards" / "sst2-high-drift-0.05.json"
    assert work.compare_run("agnews", "lora") == tmp_path / "compare" / "agnews" / "lora"
    assert work.results == tmp_path / "results.csv" and work.preset == tmp_path / "preset.json"


def test_target_run_names_are_folder_safe(tmp_path):
    work = WorkDir(tmp_path)
    assert work.target_run("sst2", "agnews/seed0", "full") == tmp_path / "runs" / "prior-sst2" / "agnews/seed0" / "full"
    assert (
        work.target_run("sst2", "agnews/seed1", "profile:high-drift@0.05+constant")
        == tmp_path / "runs" / "prior-sst2" / "agnews" / "seed1" / "profile-high-drift-0.05+constant"
    )
    assert work.target_run("agnews", "sst2", "lora@0.01").name == "lora-0.01"


def test_drift_tables_lists_only_the_present_tables_sorted(tmp_path):
    work = WorkDir(tmp_path)
    assert work.drift_tables() == []
    for task in ("sst2", "agnews", "gsm8k"):
        work.drift_table(task).write_bytes(b"")
    (tmp_path / "drift-sst2.csv").write_text("")  # another suffix
    (tmp_path / "noise").mkdir()
    (tmp_path / "noise" / "drift-x.parquet").write_bytes(b"")  # another folder
    tables = work.drift_tables()
    assert tables == [work.drift_table(t) for t in ("agnews", "gsm8k", "sst2")]
    assert [WorkDir.prior_task_of(t) for t in tables] == ["agnews", "gsm8k", "sst2"]


@pytest.mark.parametrize(
    "name, task",
    [
        pytest.param("drift-sst2.parquet", "sst2", id="plain"),
        pytest.param("drift-my-task.parquet", "my-task", id="dash-in-task"),
        pytest.param("drift-drift-x.parquet", "drift-x", id="prefix-removed-once"),
    ],
)
def test_prior_task_of_a_table(tmp_path, name, task):
    assert WorkDir.prior_task_of(tmp_path / name) == task
    assert WorkDir(tmp_path).drift_table(task) == tmp_path / name  # the inverse of drift_table


def test_further_models_are_work_folders_inside(tmp_path):
    work = WorkDir(tmp_path)
    assert work.models() == []  # no models/ folder yet
    qwen = work.model("tiny-qwen2")
    assert qwen == WorkDir(tmp_path / "models" / "tiny-qwen2")
    assert qwen.drift_table("sst2") == tmp_path / "models" / "tiny-qwen2" / "drift-sst2.parquet"
    for name in ("tiny-qwen2", "gemma3-270m"):
        work.model(name).root.mkdir(parents=True)
    (tmp_path / "models" / "notes.txt").write_text("not a model")
    assert work.models() == [work.model("gemma3-270m"), work.model("tiny-qwen2")]


# reuse_or_compute ----------------------------------------------------------------------------------------------
class Step:
    """A step whose load and compute are counted."""

    def __init__(self, path: Path, *, loaded: str = "from disk", broken: bool = False) -> None:
        self.path, self.loaded, self.broken = path, loaded, broken
        self.loads = self.computes = 0
        self.log: list[str] = []

    def load(self, path: Path) -> str:
        self.loads += 1
        assert path == self.path
        if self.broken:
            raise InputFileError("it is damaged", "compute it again")
        return self.loaded

    def compute(self) -> str:
        self.computes += 1
        self.path.write_text("computed")
        return "computed"

    def run(self, valid=lambda _: True) -> str:
        return reuse_or_compute(self.path, self.load, self.compute, valid=valid, log=self.log.append)


def test_a_missing_file_is_computed(tmp_path):
    step = Step(tmp_path / "out.txt")
    assert step.run() == "computed"
    assert (step.loads, step.computes, step.log) == (0, 1, [])
    assert step.path.read_text() == "computed"


def test_a_valid_file_is_reused(tmp_path):
    step = Step(tmp_path / "out.txt")
    step.path.write_text("done")
    seen = []
    assert step.run(valid=lambda found: seen.append(found) or True) == "from disk"
    assert (step.loads, step.computes, seen) == (1, 0, ["from disk"])
    assert step.log == [f"skip (done): {step.path}"]
    assert step.path.read_text() == "done"


def test_an_unreadable_file_is_recomputed(tmp_path):
    step = Step(tmp_path / "out.txt", broken=True)
    step.path.write_text("garbage")
    valid_calls = []
    assert step.run(valid=lambda found: valid_calls.append(found) or True) == "computed"
    assert (step.loads, step.computes, valid_calls) == (1, 1, [])
    assert step.log == [f"recompute (unreadable): {step.path}: it is damaged"]
    assert step.path.read_text() == "computed"


def test_a_stale_file_is_recomputed(tmp_path):
    step = Step(tmp_path / "out.txt", loaded="made from other weights")
    step.path.write_text("old")
    assert step.run(valid=lambda found: found == "from disk") == "computed"
    assert (step.loads, step.computes) == (1, 1)
    assert step.log == [f"recompute (stale: made from other inputs or settings): {step.path}"]


def test_only_a_topotuner_error_means_unreadable(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("x")

    def load(_):
        raise KeyError("a bug in the loader is not a damaged file")

    with pytest.raises(KeyError, match="a bug in the loader"):
        reuse_or_compute(path, load, lambda: "computed")


def test_the_base_error_class_counts_as_unreadable(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("x")

    def load(_):
        raise TopoTunerError("some problem", "some fix")

    log: list[str] = []
    assert reuse_or_compute(path, load, lambda: "computed", log=log.append) == "computed"
    assert log == [f"recompute (unreadable): {path}: some problem"]


# snapshot_once -------------------------------------------------------------------------------------------------
def _file_id(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_ino, stat.st_mtime_ns


def test_snapshot_once_writes_then_reuses_the_same_weights(tmp_path, tiny_llama, tiny_snapshot):
    path = tmp_path / "pretrained.safetensors"
    first = snapshot_once(tiny_llama, path)
    assert first.weights_hash == tiny_snapshot.weights_hash
    assert load_snapshot(path).weights_hash == tiny_snapshot.weights_hash
    written = _file_id(path)
    again = snapshot_once(build_tiny_model("tiny-llama", seed=0), path)  # the same weights, another object
    assert again.weights_hash == tiny_snapshot.weights_hash and _file_id(path) == written


def test_snapshot_once_replaces_a_snapshot_of_other_weights(tmp_path, tiny_snapshot):
    path = tmp_path / "pretrained.safetensors"
    save_snapshot(tiny_snapshot, path)
    other = build_tiny_model("tiny-llama", seed=1)
    fresh = snapshot_once(other, path)
    assert fresh.weights_hash == extract_snapshot(other).weights_hash != tiny_snapshot.weights_hash
    assert load_snapshot(path).weights_hash == fresh.weights_hash


def test_snapshot_once_replaces_a_damaged_snapshot(tmp_path, tiny_llama, tiny_snapshot):
    path = tmp_path / "pretrained.safetensors"
    path.write_bytes(b"not a safetensors file")
    assert snapshot_once(tiny_llama, path).weights_hash == tiny_snapshot.weights_hash
    assert load_snapshot(path).weights_hash == tiny_snapshot.weights_hash


# drift_table_once ----------------------------------------------------------------------------------------------
@pytest.fixture
def drift_calls(monkeypatch):
    """Every drift_table call drift_table_once makes: (before hash, after hash, settings, kwargs)."""
    calls = []
    real = compute_mod.drift_table

    def counting(before, after, settings=None, **kwargs):
        calls.append((before.weights_hash, after.weights_hash, settings, kwargs))
        return real(before, after, settings, **kwargs)

    monkeypatch.setattr(compute_mod, "drift_table", counting)
    return calls


@pytest.fixture
def noisy(tiny_snapshot):
    return perturb_snapshot(tiny_snapshot, 0.05, seed=1)


H0_ONLY = DriftSettings(maxdim=0)


def test_drift_table_once_computes_writes_and_then_reuses(tmp_path, tiny_snapshot, noisy, drift_calls):
    path = tmp_path / "drift-sst2.parquet"
    table = drift_table_once(tiny_snapshot, noisy, path, H0_ONLY, **FAST)
    assert len(drift_calls) == 1 and drift_calls[0][2] == H0_ONLY
    assert drift_calls[0][3] == {"progress": True, **FAST}  # kwargs reach drift_table
    on_disk = load_table(path)
    pd.testing.assert_frame_equal(on_disk, table)
    assert on_disk.attrs["before_hash"] == tiny_snapshot.weights_hash
    again = drift_table_once(tiny_snapshot, noisy, path, H0_ONLY, **FAST)
    assert len(drift_calls) == 1
    pd.testing.assert_frame_equal(again, table)


def test_drift_table_once_default_settings_are_the_default_drift_settings(tmp_path, tiny_snapshot, noisy, drift_calls):
    path = tmp_path / "t.parquet"
    drift_table_once(tiny_snapshot, noisy, path, **FAST)
    assert drift_calls[0][2] == DriftSettings()
    drift_table_once(tiny_snapshot, noisy, path, DriftSettings(), **FAST)  # the same settings, spelt out
    assert len(drift_calls) == 1


def test_drift_table_once_recomputes_for_other_settings(tmp_path, tiny_snapshot, noisy, drift_calls):
    path = tmp_path / "t.parquet"
    drift_table_once(tiny_snapshot, noisy, path, H0_ONLY, **FAST)
    table = drift_table_once(tiny_snapshot, noisy, path, DriftSettings(maxdim=0, orders=(1.0,)), **FAST)
    assert len(drift_calls) == 2 and "h0_w2" not in table.columns
    assert "h0_w2" not in load_table(path).columns  # the file now holds the new settings' table


def test_drift_table_once_recomputes_for_other_fine_tuned_weights(tmp_path, tiny_snapshot, noisy, drift_calls):
    path = tmp_path / "t.parquet"
    first = drift_table_once(tiny_snapshot, noisy, path, H0_ONLY, **FAST)
    other = perturb_snapshot(tiny_snapshot, 0.05, seed=2)
    table = drift_table_once(tiny_snapshot, other, path, H0_ONLY, **FAST)
    assert len(drift_calls) == 2 and drift_calls[1][1] == other.weights_hash
    assert table.attrs["after_hash"] == load_table(path).attrs["after_hash"] == other.weights_hash
    assert not table["h0_w1"].equals(first["h0_w1"])


def test_drift_table_once_recomputes_for_other_pretrained_weights(tmp_path, tiny_snapshot, noisy, drift_calls):
    path = tmp_path / "t.parquet"
    drift_table_once(tiny_snapshot, noisy, path, H0_ONLY, **FAST)
    other_base = extract_snapshot(build_tiny_model("tiny-llama", seed=1))  # same model, other weights
    drift_table_once(other_base, noisy, path, H0_ONLY, **FAST)
    assert len(drift_calls) == 2 and drift_calls[1][0] == other_base.weights_hash
    assert load_table(path).attrs["before_hash"] == other_base.weights_hash


def test_drift_table_once_recomputes_a_damaged_table(tmp_path, tiny_snapshot, noisy, drift_calls):
    path = tmp_path / "t.parquet"
    path.write_bytes(b"PAR1 not really")
    table = drift_table_once(tiny_snapshot, noisy, path, H0_ONLY, **FAST)
    assert len(drift_calls) == 1 and len(table) == len(tiny_snapshot.matrices)
    pd.testing.assert_frame_equal(load_table(path), table)


def test_drift_table_once_never_trusts_a_csv_table(tmp_path, tiny_snapshot, noisy, drift_calls):
    path = tmp_path / "t.csv"  # CSV keeps no provenance attributes: nothing shows what it was computed from
    drift_table_once(tiny_snapshot, noisy, path, H0_ONLY, **FAST)
    drift_table_once(tiny_snapshot, noisy, path, H0_ONLY, **FAST)
    assert len(drift_calls) == 2


def test_drift_table_once_does_not_reuse_a_table_of_fewer_projections(tmp_path, tiny_snapshot, noisy):
    path = tmp_path / "t.parquet"
    assert len(drift_table_once(tiny_snapshot, noisy, path, H0_ONLY, pids=["L0.q"], **FAST)) == 1
    assert len(drift_table_once(tiny_snapshot, noisy, path, H0_ONLY, **FAST)) == len(tiny_snapshot.matrices)


def test_drift_table_once_passes_progress_through(tmp_path, tiny_snapshot, noisy):
    table = drift_table_once(tiny_snapshot, noisy, tmp_path / "t.parquet", H0_ONLY, progress=False, **FAST)
    assert len(table) == len(tiny_snapshot.matrices)


# noise_tables_once ---------------------------------------------------------------------------------------------
def test_noise_tables_once_one_table_per_seed_each_computed_once(tmp_path, tiny_snapshot, drift_calls):
    work = WorkDir(tmp_path)
    tables = noise_tables_once(tiny_snapshot, work, [0, 1], H0_ONLY)
    assert len(tables) == 2 and len(drift_calls) == 2
    assert [c[1] for c in drift_calls] == [
        perturb_snapshot(tiny_snapshot, NOISE_SCALE, seed).weights_hash for seed in (0, 1)
    ]
    assert all(c[0] == tiny_snapshot.weights_hash and c[2] == H0_ONLY for c in drift_calls)
    for seed, table in zip((0, 1), tables):
        pd.testing.assert_frame_equal(load_table(work.noise_table(seed)), table)
    assert not tables[0]["h0_w1"].equals(tables[1]["h0_w1"])  # each seed its own perturbation
    again = noise_tables_once(tiny_snapshot, work, [1, 0], H0_ONLY)
    assert len(drift_calls) == 2  # both reused
    pd.testing.assert_frame_equal(again[0], tables[1])
    noise_tables_once(tiny_snapshot, work, [0, 1, 2], H0_ONLY)
    assert len(drift_calls) == 3 and work.noise_table(2).is_file()  # only the new seed


def test_noise_tables_once_recomputes_for_other_settings_or_weights(tmp_path, tiny_snapshot, drift_calls):
    work = WorkDir(tmp_path)
    noise_tables_once(tiny_snapshot, work, [0], H0_ONLY)
    noise_tables_once(tiny_snapshot, work, [0], DriftSettings(maxdim=0, orders=(1.0,)))
    assert len(drift_calls) == 2
    other = extract_snapshot(build_tiny_model("tiny-llama", seed=1))
    table = noise_tables_once(other, work, [0], DriftSettings(maxdim=0, orders=(1.0,)))[0]
    assert len(drift_calls) == 3 and table.attrs["before_hash"] == other.weights_hash
    assert noise_tables_once(tiny_snapshot, work, [], H0_ONLY) == []


# finetune_once (run_finetune replaced: nothing trains) ---------------------------------------------------------
@pytest.fixture
def runs(monkeypatch):
    """Fake run_finetune: records each config and writes a results.json of it (as a real run does)."""
    calls = []

    def fake(loaded, cfg):
        calls.append(cfg)
        out = Path(cfg.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        results = {"config": cfg.to_dict(), "test_accuracy": 0.5 + len(calls) / 100}
        if cfg.save_snapshot:  # what a real run keeps and records
            (out / "after.safetensors").write_bytes(b"weights")
            results["snapshot"] = str(out / "after.safetensors")
        card = ProfileCard.load(cfg.profile) if cfg.profile else None
        results["stop_threshold"] = stop_threshold_for(cfg, card)
        if card is not None:  # what prepare_model records of the card
            if cfg.method == "profile":
                results["profile"] = {"trainable": card.trainable}
            else:
                results["lora_rank"] = resolve_lora_rank(loaded.model, cfg, card)
        write_results(out / "results.json", results)  # with its checksum, as a real run writes it
        return SimpleNamespace(to_dict=lambda: results)  # a FinetuneResult's dict view

    monkeypatch.setattr(finetune_mod, "run_finetune", fake)
    return calls


def test_finetune_once_runs_then_reuses_the_same_config(tmp_path, tiny_llama, runs):
    cfg = FinetuneConfig(output_dir=str(tmp_path / "run"), epochs=2, learning_rate=1e-3)
    log: list[str] = []
    first = finetune_once(tiny_llama, cfg, log.append)
    assert runs == [cfg] and first["test_accuracy"] == 0.51
    assert log == [f"run: {tmp_path / 'run'}"]
    again = finetune_once(
        tiny_llama, FinetuneConfig(output_dir=str(tmp_path / "run"), epochs=2, learning_rate=1e-3), log.append
    )
    assert len(runs) == 1 and again == first
    assert log[-1] == f"skip (done): {tmp_path / 'run' / 'results.json'}"


def test_finetune_once_trains_again_when_the_weights_it_kept_are_gone(tmp_path, tiny_llama, runs):
    cfg = FinetuneConfig(output_dir=str(tmp_path / "run"), save_snapshot=True)
    finetune_once(tiny_llama, cfg)
    assert finetune_once(tiny_llama, cfg)["test_accuracy"] == 0.51 and len(runs) == 1  # weights there: reused
    (tmp_path / "run" / "after.safetensors").unlink()  # a run folder restored from its results alone
    log: list[str] = []
    assert finetune_once(tiny_llama, cfg, log.append)["test_accuracy"] == 0.52
    assert len(runs) == 2 and log[0].startswith("recompute (stale")
    assert (tmp_path / "run" / "after.safetensors").is_file()
    # a copy of the folder without its weights trains again, though the recorded path (the original's) still has them
    shutil.copytree(tmp_path / "run", tmp_path / "copy", ignore=shutil.ignore_patterns("*.safetensors"))
    assert finetune_once(tiny_llama, replace(cfg, output_dir=str(tmp_path / "copy")))["test_accuracy"] == 0.53
    assert run_snapshot(load_results(tmp_path / "copy" / "results.json"), tmp_path / "copy").is_file()
    shutil.copytree(tmp_path / "copy", tmp_path / "moved")  # with its weights: reused, from where it is now
    shutil.rmtree(tmp_path / "copy")
    assert finetune_once(tiny_llama, replace(cfg, output_dir=str(tmp_path / "moved")))["test_accuracy"] == 0.53
    assert len(runs) == 3


@pytest.mark.parametrize("method", ["profile", "lora"])
def test_finetune_once_trains_again_when_its_card_changed(tmp_path, tiny_llama, tiny_snapshot, runs, method):
    table = drift_table(tiny_snapshot, perturb_snapshot(tiny_snapshot, 0.05), DriftSettings(maxdim=0), **FAST)
    identity = ModelIdentity.from_snapshot(tiny_snapshot)

    def card(path: Path, threshold: float = 0.5, **how: Any) -> str:
        build_profile(
            table, identity, CardSettings(prior_task="sst2", stop_threshold=threshold, **{"count": 2, **how})
        ).save(path)
        return str(path)

    extra = {"lora_rank": "match"} if method == "lora" else {"stop_threshold": "card"}
    cfg = FinetuneConfig(output_dir=str(tmp_path / "run"), method=method, profile=card(tmp_path / "a.json"), **extra)
    finetune_once(tiny_llama, cfg)
    card(tmp_path / "a.json")  # rebuilt the same: still that run, and so is the same card elsewhere (a cloned ledger)
    assert finetune_once(tiny_llama, cfg)["test_accuracy"] == 0.51
    assert finetune_once(tiny_llama, replace(cfg, profile=card(tmp_path / "b.json")))["test_accuracy"] == 0.51
    assert len(runs) == 1
    if method == "profile":  # other matrices, or another stopping threshold
        changes = [{"strategy": "low-drift"}, {"threshold": 0.7}]
    else:  # another matched rank
        changes = [{"count": 8}]
    for change in changes:  # each against a run made with the first card
        base = replace(cfg, output_dir=str(tmp_path / f"run-{len(runs)}"), profile=card(tmp_path / "c.json"))
        finetune_once(tiny_llama, base)
        card(tmp_path / "c.json", **change)
        log: list[str] = []
        calls = len(runs)
        finetune_once(tiny_llama, base, log.append)
        assert len(runs) == calls + 1 and log[0].startswith("recompute (stale")


def test_finetune_once_ignores_where_the_run_lives_and_whether_it_kept_checkpoints(tmp_path, tiny_llama, runs):
    cfg = FinetuneConfig(output_dir=str(tmp_path / "a"), epochs=2)
    finetune_once(tiny_llama, cfg)
    shutil.copytree(tmp_path / "a", tmp_path / "b")  # a run folder moved or copied
    moved = FinetuneConfig(output_dir=str(tmp_path / "b"), epochs=2, keep_checkpoints=True)
    assert finetune_once(tiny_llama, moved)["test_accuracy"] == 0.51
    assert len(runs) == 1


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"learning_rate": 3e-4}, id="learning-rate"),
        pytest.param({"seed": 1}, id="seed"),
        pytest.param({"epochs": 3}, id="epochs"),
        pytest.param({"lr_scheduler": "constant"}, id="schedule"),
    ],
)
def test_finetune_once_reruns_a_stale_run_and_drops_its_checkpoints(tmp_path, tiny_llama, runs, change):
    out = tmp_path / "run"
    base = {"output_dir": str(out), "epochs": 2, "learning_rate": 1e-3}
    finetune_once(tiny_llama, FinetuneConfig(**base))
    (out / "checkpoint-8").mkdir()  # left by the old config
    (out / "checkpoint-8" / "model.safetensors").write_bytes(b"old")
    log: list[str] = []
    changed = FinetuneConfig(**{**base, **change})
    result = finetune_once(tiny_llama, changed, log.append)
    assert runs == [FinetuneConfig(**base), changed] and result["test_accuracy"] == 0.52
    assert log == [f"recompute (stale: made from other inputs or settings): {out / 'results.json'}", f"run: {out}"]
    assert not list(out.glob("checkpoint-*"))
    assert json.loads((out / "results.json").read_text())["config"] == changed.to_dict()


def test_finetune_once_reruns_a_damaged_results_file(tmp_path, tiny_llama, runs):
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").write_text("{truncated")
    (out / "checkpoint-4").mkdir()
    log: list[str] = []
    cfg = FinetuneConfig(output_dir=str(out))
    finetune_once(tiny_llama, cfg, log.append)
    assert runs == [cfg] and not (out / "checkpoint-4").exists()
    assert (
        log[0].startswith(f"recompute (unreadable): {out / 'results.json'}: results file") and log[1] == f"run: {out}"
    )


def test_finetune_once_keeps_the_checkpoints_of_an_interrupted_run(tmp_path, tiny_llama, runs):
    out = tmp_path / "run"
    (out / "checkpoint-4").mkdir(parents=True)  # no results.json: a run stopped mid-way resumes from here
    finetune_once(tiny_llama, FinetuneConfig(output_dir=str(out)))
    assert len(runs) == 1 and (out / "checkpoint-4").is_dir()


def test_finetune_once_resumes_a_retrain_for_missing_weights_from_its_checkpoints(tmp_path, tiny_llama, runs):
    out = tmp_path / "run"
    cfg = FinetuneConfig(output_dir=str(out), save_snapshot=True)
    finetune_once(tiny_llama, cfg)
    (out / "after.safetensors").unlink()  # a ledger's run without its weights, whose retrain was interrupted
    (out / "checkpoint-4").mkdir()
    finetune_once(tiny_llama, cfg)
    assert len(runs) == 2 and (out / "checkpoint-4").is_dir()  # the same config's checkpoints: resumed, not dropped


def test_finetune_once_a_full_run_stopping_on_a_cards_threshold_follows_that_threshold(
    tmp_path, tiny_llama, tiny_snapshot, runs
):
    table = drift_table(tiny_snapshot, perturb_snapshot(tiny_snapshot, 0.05), DriftSettings(maxdim=0), **FAST)
    identity = ModelIdentity.from_snapshot(tiny_snapshot)
    path = tmp_path / "card.json"
    build_profile(table, identity, CardSettings(prior_task="sst2", count=2, stop_threshold=0.5)).save(path)
    cfg = FinetuneConfig(output_dir=str(tmp_path / "run"), profile=str(path), stop_threshold="card")
    finetune_once(tiny_llama, cfg)
    build_profile(table, identity, CardSettings(prior_task="sst2", count=4, stop_threshold=0.5)).save(path)
    finetune_once(tiny_llama, cfg)
    assert len(runs) == 1  # full FT trains every matrix: the card's picks do not matter, its threshold does
    build_profile(table, identity, CardSettings(prior_task="sst2", count=4, stop_threshold=0.7)).save(path)
    finetune_once(tiny_llama, cfg)
    assert len(runs) == 2


def test_finetune_once_reuses_a_run_recorded_before_epoch_snapshots_existed(tmp_path, tiny_llama, runs):
    out = tmp_path / "run"
    cfg = FinetuneConfig(output_dir=str(out), epochs=2)
    older = {k: v for k, v in cfg.to_dict().items() if k != "save_epoch_snapshots"}  # an older version's record
    write_results(out / "results.json", {"config": older, "test_accuracy": 0.7})
    assert finetune_once(tiny_llama, cfg)["test_accuracy"] == 0.7 and runs == []
    asks = FinetuneConfig(output_dir=str(out), epochs=2, save_epoch_snapshots=True)  # it wrote none: run again
    finetune_once(tiny_llama, asks)
    assert runs == [asks]


def test_finetune_once_a_run_with_epoch_snapshots_serves_a_config_without(tmp_path, tiny_llama, runs):
    out = tmp_path / "run"
    finetune_once(tiny_llama, FinetuneConfig(output_dir=str(out), epochs=2, save_epoch_snapshots=True))
    assert finetune_once(tiny_llama, FinetuneConfig(output_dir=str(out), epochs=2))["test_accuracy"] == 0.51
    assert len(runs) == 1


def test_a_spec_file_task_names_folders_by_its_task_field(tmp_path):
    from topotuner_lab.study.workspace import WorkDir, task_tag

    spec = tmp_path / "specs" / "reviews.yaml"
    spec.parent.mkdir()
    (tmp_path / "specs" / "rows.tsv").write_text("review\tlabel\nfine\t1\nbad\t0\n")
    spec.write_text(
        "task: my-reviews\noutput_type: multiple_choice\ndoc_to_text: '{{ review }} ->'\ndoc_to_target: label\n"
        "doc_to_choice: [bad, good]\ndata_files: {train: rows.tsv, test: rows.tsv}\n"
    )
    assert task_tag(str(spec)) == "my-reviews" and task_tag("sst2") == "sst2"
    work = WorkDir(tmp_path / "work")
    assert work.prior_run(str(spec)) == tmp_path / "work" / "prior-my-reviews"
    assert work.drift_table(str(spec)).name == "drift-my-reviews.parquet"
    assert work.target_run(str(spec), "sst2/seed0", "full").parent.parent.parent.name == "prior-my-reviews"
