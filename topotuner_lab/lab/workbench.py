"""Steps the notebooks share, so each notebook stays a few calls.

Prepare the pretrained and fine-tuned snapshots, compute (or reuse) the drift table and its noise floor, and train
the methods side by side. File names come from :class:`~topotuner_lab.study.workspace.WorkDir`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from topotuner_lab.drift.noise import NoiseCheck, noise_check
from topotuner_lab.drift.settings import DriftSettings
from topotuner_lab.drift.tables import load_table
from topotuner_lab.profiles.card import ProfileCard
from topotuner_lab.profiles.select import build_profile
from topotuner_lab.study.workspace import WorkDir, drift_table_once, finetune_once, noise_tables_once, snapshot_once
from topotuner_lab.training.config import FinetuneConfig
from topotuner_lab.training.results import RunResults, load_results
from topotuner_lab.weights.models import LoadedModel, load_model
from topotuner_lab.weights.snapshot import Snapshot, load_snapshot

#: perturbation seeds of the noise floor (two, so a z-score against noise is defined)
NOISE_SEEDS: tuple[int, ...] = (0, 1)


def pretrained_snapshot(model: str, work_dir: str | Path) -> tuple[LoadedModel, Snapshot]:
    """Load the model and write (or reuse, if its weights match) ``work_dir/pretrained.safetensors``."""
    loaded = load_model(model)
    return loaded, snapshot_once(loaded, WorkDir(work_dir).pretrained)


def finetuned_snapshot(loaded: LoadedModel, work_dir: str | Path, task: str, **config: Any) -> Snapshot:
    """Fine-tune fully on the prior ``task`` once (resumable; redone when the config changes); its snapshot."""
    run_dir = WorkDir(work_dir).prior_run(task)
    results = finetune_once(
        loaded, FinetuneConfig(method="full", task=task, output_dir=str(run_dir), save_snapshot=True, **config)
    )
    return load_snapshot(results["snapshot"])


def load_pair(work_dir: str | Path, prior_task: str) -> tuple[Snapshot, Snapshot]:
    """The pretrained and prior-fine-tuned snapshots written by the first notebook."""
    work = WorkDir(work_dir)
    return load_snapshot(work.pretrained), load_snapshot(work.finetuned(prior_task))


def cached_drift_table(
    before: Snapshot, after: Snapshot, path: str | Path, settings: DriftSettings | None = None
) -> pd.DataFrame:
    """The drift table at ``path``, computed once (resumable through the drift cache; redone when its inputs change)."""
    return drift_table_once(before, after, Path(path), settings)


def noise_floor(
    pretrained: Snapshot, work_dir: str | Path, settings: DriftSettings | None = None
) -> list[pd.DataFrame]:
    """Drift of the pretrained matrices against perturbed copies of themselves, a table per seed in ``NOISE_SEEDS``."""
    return noise_tables_once(pretrained, WorkDir(work_dir), NOISE_SEEDS, settings)


def check_noise(work_dir: str | Path, prior_task: str, metric: str = "h0_w1") -> NoiseCheck:
    """How far the prior task's drift stands above the noise floor (warns when it does not)."""
    work = WorkDir(work_dir)
    table = load_table(work.drift_table(prior_task))
    noise = [load_table(work.noise_table(seed)) for seed in NOISE_SEEDS if work.noise_table(seed).is_file()]
    return noise_check(table, noise, metric, warn=True)


def train_methods(
    loaded: LoadedModel,
    card: str | Path,
    work_dir: str | Path,
    task: str,
    methods: tuple[str, ...] = ("full", "lora", "profile"),
    *,
    stop_threshold: float | None = None,
    **config: Any,
) -> dict[str, RunResults]:
    """Run each method on ``task`` (LoRA at the card's budget); finished runs of the same config are reused.

    With ``stop_threshold`` the profile run also records topological early stopping (observe mode, test accuracy
    every epoch), so notebook 6 reads it instead of training the same run again.
    """
    work = WorkDir(work_dir)
    results: dict[str, RunResults] = {}
    for method in methods:
        extra: dict[str, Any] = {"lora_rank": "match"} if method == "lora" else {}
        if method == "profile" and stop_threshold is not None:
            extra.update(stop_threshold=stop_threshold, observe_only=True, eval_each_epoch=True)
        cfg = FinetuneConfig(
            method=method,
            task=task,
            output_dir=str(work.compare_run(task, method)),
            profile=str(card),
            **extra,
            **config,
        )
        results[method] = finetune_once(loaded, cfg)
    return results


def method_run(work_dir: str | Path, task: str, method: str = "profile") -> RunResults:
    """The results of one run of notebook 5's comparison (a clear error if notebook 5 has not run)."""
    return load_results(WorkDir(work_dir).compare_run(task, method) / "results.json")


def results_frame(results: Mapping[str, RunResults]) -> pd.DataFrame:
    """The comparison as a table: accuracy, gap, forgetting, trainable share, time, memory."""
    cols = [
        "test_accuracy",
        "train_test_gap",
        "forgetting_ood",
        "perplexity_change",
        "trainable_fraction",
        "epochs_run",
        "seconds_per_epoch",
        "peak_rss_mib",
        "rss_increase_mib",
    ]
    return pd.DataFrame([{"run": name, **{c: res.get(c) for c in cols}} for name, res in results.items()])


def card_pair(
    work_dir: str | Path, card_a: str = "", card_b: str = ""
) -> tuple[ProfileCard, ProfileCard, tuple[str, str]]:
    """Two cards and their labels.

    ``card_a`` defaults to notebook 4's card; ``card_b`` to the magnitude control at the same budget, built from the
    same drift table (topology's pick against magnitude's).
    """
    work = WorkDir(work_dir)
    a = ProfileCard.load(card_a or work.card())
    if card_b:
        b = ProfileCard.load(card_b)
    else:
        table = load_table(work.drift_table(a.prior_task))
        b = build_profile(table, a.model, prior_task=a.prior_task, strategy="magnitude", seed=a.seed, **a.budget)
    label = lambda c: f"{c.model.name} {c.prior_task} {c.strategy}"
    labels = (label(a), label(b))
    return a, b, labels if labels[0] != labels[1] else ("A: " + labels[0], "B: " + labels[1])
