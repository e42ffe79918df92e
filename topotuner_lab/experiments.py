"""The paper's comparison at a size this machine can run: one resumable command, one results table.

prior fine-tune -> drift table -> profile cards (high/low drift, random and magnitude controls, at
each budget) -> each card transferred to the target tasks, beside full fine-tuning and LoRA at a
matched budget, with topological early stopping. Every run keeps its own ``results.json``, so an
interrupted comparison resumes by skipping what is done.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from . import atomic
from .drift import DriftSettings, drift_table, load_table, save_table
from .errors import ParameterError
from .finetune import FinetuneConfig, run_finetune
from .models import PACKAGED_MODELS, embedded_gguf_path, load_model
from .profiles import ModelIdentity, build_profile
from .report import markdown_table
from .snapshot import extract_snapshot, load_snapshot, save_snapshot


@dataclass(frozen=True)
class Preset:
    """Sizes and grid of one comparison."""

    model: str | None = None  # None: the embedded SmolLM2-135M
    # further models, for drift only: their own prior fine-tunes and drift tables (under models/<name>/), to see
    # whether which projection kinds drift depends on the model family; the transfer grid runs on ``model``
    other_models: tuple[str, ...] = ()
    prior_tasks: tuple[str, ...] = ("sst2",)
    target_tasks: tuple[str, ...] = ("agnews",)
    budgets: tuple[float, ...] = (0.01,)
    strategies: tuple[str, ...] = ("high-drift", "low-drift", "random", "magnitude")
    baselines: tuple[str, ...] = ("full", "lora")
    seeds: tuple[int, ...] = (0,)
    early_stopping: tuple[bool, ...] = (True,)
    stop_threshold: float = 0.5
    metric: str = "h0_w1"
    drift: DriftSettings = field(default_factory=DriftSettings)
    prior: FinetuneConfig = field(default_factory=lambda: FinetuneConfig(epochs=2, n_train=128))
    target: FinetuneConfig = field(default_factory=lambda: FinetuneConfig(epochs=4, n_train=128, eval_each_epoch=True))


def _tiny_run(**kw: Any) -> FinetuneConfig:
    return FinetuneConfig(n_train=16, n_test=16, n_ood=8, n_ppl=4, batch_size=8, max_length=48, learning_rate=1e-3, save_checkpoints=False, **kw)


PRESETS: dict[str, Preset] = {
    "tiny": Preset(model="tiny-llama", other_models=("tiny-qwen2",), budgets=(0.05,), stop_threshold=0.9, prior=_tiny_run(epochs=1), target=_tiny_run(epochs=2)),
    "compare": Preset(),
    # Sized for about 1.5 h on 2 CPU cores. The prior fine-tune is strong enough (256 examples, lr 1e-4) for its drift to
    # stand well above the Q4_1 noise floor; targets get the paper's 6-epoch budget. Early stopping observes: with the same
    # seeds and learning-rate schedule a stopped run is the full-budget run cut at the stop epoch, so one run gives both.
    "cpu-small": Preset(
        prior_tasks=("sst2", "agnews"), target_tasks=("agnews", "sst2"), budgets=(0.01, 0.02), seeds=(0, 1), other_models=("gemma3-270m",),
        prior=FinetuneConfig(epochs=2, n_train=256, learning_rate=1e-4),
        target=FinetuneConfig(epochs=6, n_train=64, n_test=96, eval_each_epoch=True, observe_only=True),
    ),
}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ParameterError(f"unknown preset {name!r}", f"use one of {', '.join(PRESETS)}")
    return PRESETS[name]


def _done(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "results.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _run(loaded: Any, cfg: FinetuneConfig, log: Any) -> dict[str, Any]:
    done = _done(Path(cfg.output_dir))
    if done is not None:
        log(f"skip (done): {cfg.output_dir}")
        return done
    log(f"run: {cfg.output_dir}")
    return run_finetune(loaded, cfg)


def _pretrained(loaded: Any, out: Path) -> Any:
    """The pretrained snapshot under ``out`` (written once)."""
    path = out / "pretrained.safetensors"
    if path.is_file():
        return load_snapshot(path)
    pre = extract_snapshot(loaded)
    save_snapshot(pre, path)
    return pre


def _prior_drift(preset: Preset, loaded: Any, pre: Any, prior: str, out: Path, log: Any) -> pd.DataFrame:
    """Prior full fine-tune -> drift table against the pretrained snapshot; each step skipped when its file exists."""
    prior_cfg = replace(preset.prior, method="full", task=prior, output_dir=str(out / f"prior-{prior}"), save_snapshot=True, eval_each_epoch=False, stop_threshold=None)
    prior_res = _run(loaded, prior_cfg, log)
    table_path = out / f"drift-{prior}.parquet"
    if not table_path.is_file():
        save_table(drift_table(pre, load_snapshot(prior_res["snapshot"]), preset.drift, progress=True), table_path)
    return load_table(table_path)


def _cards_for_prior(preset: Preset, loaded: Any, pre: Any, identity: ModelIdentity, prior: str, out: Path, log: Any) -> dict[str, Path]:
    """The prior's drift table -> one card per (strategy, budget), each built once."""
    table = _prior_drift(preset, loaded, pre, prior, out, log)
    cards: dict[str, Path] = {}
    for budget in preset.budgets:
        for strategy in preset.strategies:
            path = out / "cards" / f"{prior}-{strategy}-{budget:g}.json"
            if not path.is_file():
                build_profile(table, identity, prior_task=prior, strategy=strategy, metric=preset.metric, fraction=budget,
                              stop_threshold=preset.stop_threshold, drift_settings=preset.drift.key()).save(path)
            cards[f"{strategy}@{budget:g}"] = path
    return cards


def _grid(preset: Preset, cards: dict[str, Path], base: FinetuneConfig, stop: bool) -> list[tuple[str, FinetuneConfig]]:
    """Full FT, then per budget every card (the card's own stopping threshold) and LoRA at the high-drift card's budget."""
    grid: list[tuple[str, FinetuneConfig]] = [("full", replace(base, method="full"))] if "full" in preset.baselines else []
    for budget in preset.budgets:
        for name, card in cards.items():
            if name.endswith(f"@{budget:g}"):
                grid.append((f"profile:{name}", replace(base, method="profile", profile=str(card), stop_threshold="card" if stop else None)))
        if "lora" in preset.baselines:
            grid.append((f"lora@{budget:g}", replace(base, method="lora", lora_rank="match", profile=str(cards[f"high-drift@{budget:g}"]))))
    return grid


def run_comparison(preset: Preset, out_dir: str | Path, log: Any = print) -> pd.DataFrame:
    """Run (or resume) the whole grid of ``preset`` under ``out_dir``; returns and writes the results table.

    Seeds are the outer loop, so an interrupted run has whole seeds done first. A seed sets both the
    training seed and the data seed (which rows are drawn and their order): with no dropout, the
    training seed alone would leave full and profile fine-tunes bit-identical across seeds.
    """
    out = Path(out_dir)
    for name in preset.other_models:  # fail now, not after the grid, when a second model is not installed
        if name in PACKAGED_MODELS:
            embedded_gguf_path(name)
    loaded = load_model(preset.model)
    pre = _pretrained(loaded, out)
    identity = ModelIdentity.from_snapshot(pre, sum(p.numel() for p in loaded.model.parameters()))
    atomic.write_json(out / "preset.json", asdict(preset))
    cards = {prior: _cards_for_prior(preset, loaded, pre, identity, prior, out, log) for prior in preset.prior_tasks}
    for name in preset.other_models:  # drift only, before the long grid
        other, folder = load_model(name), out / "models" / name
        for prior in preset.prior_tasks:
            _prior_drift(preset, other, _pretrained(other, folder), prior, folder, log)
        del other
    rows: list[dict[str, Any]] = []
    for seed in preset.seeds:
        for prior in preset.prior_tasks:
            for target in (t for t in preset.target_tasks if t != prior):  # transfer: never back to the prior task
                for stop in preset.early_stopping:
                    base = replace(preset.target, task=target, seed=seed, data_seed=seed, stop_threshold=preset.stop_threshold if stop else None)
                    tag = f"{target}/seed{seed}-{'es' if stop else 'full-budget'}"
                    for name, cfg in _grid(preset, cards[prior], base, stop):
                        cfg = replace(cfg, output_dir=str(out / "runs" / f"prior-{prior}" / tag / name.replace(":", "-").replace("@", "-")))
                        rows.append(_summary(prior, target, seed, stop, name, _run(loaded, cfg, log)))
                        save_table(pd.DataFrame(rows), out / "results.csv")  # partial table after every run
    results = pd.DataFrame(rows)
    save_table(results, out / "results.csv")
    atomic.write_text(out / "results.md", markdown_table(results) + "\n")
    return results


def drift_minus_lr_ratio(res: dict[str, Any]) -> float | None:
    """Mean over epochs 2.. of (normalized epoch drift - the epoch's mean learning rate over the first epoch's).

    Under a linear decay over E epochs that ratio is (E - k + 0.5) / (E - 0.5) for epoch k; a value near 0
    says the drift only followed the schedule, a negative one that the weights settled faster than it.
    """
    history, cfg = res.get("drift_history") or [], res.get("config", {})
    epochs = cfg.get("epochs")
    if cfg.get("lr_scheduler") != "linear" or len(history) < 2 or not epochs:
        return None
    gaps = [h["normalized"] - (epochs - h["epoch"] + 0.5) / (epochs - 0.5) for h in history[1:]]
    return sum(gaps) / len(gaps)


def _summary(prior: str, target: str, seed: int, stop: bool, name: str, res: dict[str, Any]) -> dict[str, Any]:
    epoch_acc = res.get("epoch_test_accuracy") or []
    stop_epoch = res.get("stop_epoch")
    topo_sec = [h.get("seconds", 0.0) for h in res.get("drift_history", [])]  # the stopping rule's own cost per epoch
    return {
        "prior": prior, "target": target, "seed": seed, "early_stopping": stop, "run": name,
        "test_acc": res["test_accuracy"], "train_acc": res["train_accuracy"], "gap": res["train_test_gap"],
        "ood_acc_before": res["ood_accuracy_before"], "ood_acc_after": res["ood_accuracy_after"],
        "ppl_before": res["perplexity_before"], "ppl_after": res["perplexity_after"],
        "trainable_pct": 100 * res["trainable_fraction"], "epochs_run": res["epochs_run"], "stop_epoch": stop_epoch,
        "acc_at_stop": epoch_acc[stop_epoch - 1] if stop_epoch and len(epoch_acc) >= stop_epoch else None,
        "train_sec_to_stop": sum(res["epoch_seconds"][:stop_epoch]) + sum(topo_sec[:stop_epoch]) if stop_epoch else None,
        "topo_sec_per_epoch": sum(topo_sec) / len(topo_sec) if topo_sec else None,
        "drift_minus_lr_ratio": drift_minus_lr_ratio(res),
        "sec_per_epoch": res["seconds_per_epoch"], "train_sec": res["train_seconds"], "peak_mem_mib": res["peak_memory_mib"],
    }
