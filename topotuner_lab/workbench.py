"""Steps the notebooks share, so each notebook stays a few calls: prepare the pretrained and
fine-tuned snapshots, compute (or reuse) the drift table, and run the method comparison."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from .drift import DriftSettings, drift_table, load_table, save_table
from .finetune import FinetuneConfig, load_results, run_finetune
from .models import LoadedModel, load_model
from .profiles import ModelIdentity, ProfileCard, build_profile
from .snapshot import Snapshot, extract_snapshot, load_snapshot, save_snapshot


def pretrained_snapshot(model: str, work_dir: str | Path) -> tuple[LoadedModel, Snapshot]:
    """Load the model and write (or reuse) ``work_dir/pretrained.safetensors``."""
    loaded = load_model(model)
    path = Path(work_dir) / "pretrained.safetensors"
    if path.is_file():
        snap = load_snapshot(path)
        if snap.weights_hash == extract_snapshot(loaded).weights_hash:
            return loaded, snap
    snap = extract_snapshot(loaded)
    save_snapshot(snap, path)
    return loaded, snap


def finetuned_snapshot(loaded: LoadedModel, work_dir: str | Path, task: str, **config: Any) -> Snapshot:
    """Fine-tune fully on the prior ``task`` once (resumable) and return the fine-tuned snapshot."""
    run_dir = Path(work_dir) / f"prior-{task}"
    results = run_dir / "results.json"
    if not results.is_file():
        run_finetune(loaded, FinetuneConfig(method="full", task=task, output_dir=str(run_dir), save_snapshot=True, **config))
    return load_snapshot(load_results(results)["snapshot"])


def load_pair(work_dir: str | Path, prior_task: str) -> tuple[Snapshot, Snapshot]:
    """The pretrained and prior-fine-tuned snapshots written by the first notebook."""
    work = Path(work_dir)
    return load_snapshot(work / "pretrained.safetensors"), load_snapshot(work / f"prior-{prior_task}" / "after.safetensors")


def model_identity(loaded: LoadedModel, snap: Snapshot) -> ModelIdentity:
    return ModelIdentity.from_snapshot(snap, sum(p.numel() for p in loaded.model.parameters()))


def cached_drift_table(before: Snapshot, after: Snapshot, path: str | Path, settings: DriftSettings | None = None) -> pd.DataFrame:
    """The drift table at ``path``, computed once (and resumable through the drift cache)."""
    path = Path(path)
    if path.is_file():
        return load_table(path)
    table = drift_table(before, after, settings, progress=True)
    save_table(table, path)
    return table


def compare_methods(loaded: LoadedModel, card: str | Path, work_dir: str | Path, task: str, methods: tuple[str, ...] = ("full", "lora", "profile"), **config: Any) -> dict[str, dict[str, Any]]:
    """Run each method on ``task`` (LoRA at the card's budget); finished runs are reused."""
    results = {}
    for method in methods:
        out = Path(work_dir) / "compare" / task / method
        done = out / "results.json"
        extra = {"lora_rank": "match"} if method == "lora" else {}
        cfg = FinetuneConfig(method=method, task=task, output_dir=str(out), profile=str(card), **extra, **config)
        results[method] = load_results(done) if done.is_file() else run_finetune(loaded, cfg)
    return results


def results_frame(results: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """The comparison as a table: accuracy, gap, forgetting, trainable share, time, memory."""
    cols = ["test_accuracy", "train_test_gap", "forgetting_ood", "perplexity_change", "trainable_fraction", "epochs_run", "seconds_per_epoch", "peak_memory_mib"]
    return pd.DataFrame([{"run": name, **{c: res.get(c) for c in cols}} for name, res in results.items()])


def cards_to_compare(work_dir: str | Path, card_a: str = "", card_b: str = "") -> tuple[ProfileCard, ProfileCard, tuple[str, str]]:
    """Two cards and their labels. ``card_a`` defaults to notebook 4's card; ``card_b`` to the magnitude
    control at the same budget, built from the same drift table (topology's pick against magnitude's)."""
    work = Path(work_dir)
    a = ProfileCard.load(card_a or work / "cards" / "profile.json")
    if card_b:
        b = ProfileCard.load(card_b)
    else:
        table = load_table(work / f"drift-{a.prior_task}.parquet")
        b = build_profile(table, a.model, prior_task=a.prior_task, strategy="magnitude", seed=a.seed, **a.budget)
    label = lambda c: f"{c.model.name} {c.prior_task} {c.strategy}"
    labels = (label(a), label(b))
    return a, b, labels if labels[0] != labels[1] else ("A: " + labels[0], "B: " + labels[1])
