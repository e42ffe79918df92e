"""The paper's comparison at a size this machine can run: one resumable command, one results table.

prior fine-tune -> drift table and its noise floor -> profile cards (high/low drift, random and magnitude
controls, at each budget) -> each card transferred to the target tasks, beside full fine-tuning and LoRA at
a matched budget. The protocol is a fair one:

- every method (each card strategy and control, LoRA, full FT) gets its own learning rate, chosen from a
  small log grid by accuracy on a validation split carved from the training data, never the test set;
  the rate is chosen on the first seed and the other seeds run at it;
- every method and seed is scored on the same test examples, so differences get paired bootstrap
  intervals (:mod:`topotuner_lab.study.stats`);
- optionally a constant-learning-rate run of each card, so early stopping is seen apart from a decaying schedule.

Every run keeps its own ``results.json``, so an interrupted comparison resumes by skipping what is done.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from topotuner_lab._io import atomic
from topotuner_lab._io.errors import ParameterError
from topotuner_lab.drift.noise import noise_check
from topotuner_lab.drift.settings import DriftSettings
from topotuner_lab.drift.tables import save_table
from topotuner_lab.lab.report import markdown_table
from topotuner_lab.profiles.card import ModelIdentity, ProfileCard
from topotuner_lab.profiles.select import build_profile
from topotuner_lab.study.claims import method_family, strategy_of
from topotuner_lab.study.workspace import (
    WorkDir,
    drift_table_once,
    finetune_once,
    noise_tables_once,
    pretrained_snapshot,
)
from topotuner_lab.training.config import FinetuneConfig
from topotuner_lab.weights.models import PACKAGED_MODELS, LoadedModel, embedded_gguf_path, load_model
from topotuner_lab.weights.snapshot import Snapshot, load_snapshot

#: learning-rate grids per method family (log-spaced), searched on validation accuracy
DEFAULT_LR_GRID: dict[str, tuple[float, ...]] = {
    "full": (1e-5, 3e-5, 1e-4, 3e-4),
    "lora": (1e-4, 3e-4, 1e-3, 3e-3),
    "profile": (1e-4, 3e-4, 1e-3, 3e-3),
}


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
    seeds: tuple[int, ...] = (0, 1, 2)
    lr_grid: dict[str, tuple[float, ...]] = field(default_factory=lambda: dict(DEFAULT_LR_GRID))
    # card strategies that also run at their chosen rate with a constant schedule, every seed (early stopping seen
    # apart from a decaying rate)
    constant_lr: tuple[str, ...] = ("high-drift", "low-drift", "random", "magnitude")
    stop_threshold: float = 0.5
    metric: str = "h0_w1"
    normalization: str = "per-point"  # how drift is made comparable across matrix sizes (profiles.NORMALIZATIONS)
    noise_seeds: tuple[int, ...] = (0, 1)
    drift: DriftSettings = field(default_factory=DriftSettings)
    prior: FinetuneConfig = field(default_factory=lambda: FinetuneConfig(epochs=2, n_train=256, learning_rate=1e-4))
    target: FinetuneConfig = field(
        default_factory=lambda: FinetuneConfig(epochs=4, n_train=128, n_val=64, eval_each_epoch=True, observe_only=True)
    )


def _tiny_run(**kw: Any) -> FinetuneConfig:
    return FinetuneConfig(
        n_train=16,
        n_test=16,
        n_ood=8,
        n_ppl=4,
        batch_size=8,
        max_length=48,
        learning_rate=1e-3,
        save_checkpoints=False,
        **kw,
    )


PRESETS: dict[str, Preset] = {
    # CI: every piece of the protocol (LR selection, seeds, constant-rate runs, noise check) on an in-memory model
    "tiny": Preset(
        model="tiny-llama",
        other_models=("tiny-qwen2",),
        budgets=(0.05,),
        seeds=(0, 1),
        stop_threshold=0.9,
        lr_grid={"full": (1e-4, 1e-3), "lora": (1e-3, 1e-2), "profile": (1e-3, 1e-2)},
        prior=_tiny_run(epochs=1),
        target=_tiny_run(epochs=2, n_val=8, eval_each_epoch=True, observe_only=True),
    ),
    "compare": Preset(seeds=(0,), lr_grid={"full": (3e-5,), "lora": (3e-4,), "profile": (2e-4,)}, constant_lr=()),
    # Sized for about 1.5 h on 2 CPU cores: one transfer (AG News prior -> SST-2, tested on all 872 GLUE validation
    # sentences); the three card strategies (high, low drift, random control), full FT and rank-matched LoRA, each at
    # the best of 3 rates on 128 validation examples; 3 seeds; the high-drift card also at a constant rate. The prior
    # fine-tune is strong enough for its drift to stand well above the Q4_1 noise floor.
    "cpu-small": Preset(
        prior_tasks=("agnews",),
        target_tasks=("sst2",),
        budgets=(0.01,),
        strategies=("high-drift", "low-drift", "random"),
        constant_lr=("high-drift",),
        lr_grid={"full": (1e-5, 3e-5, 1e-4), "lora": (3e-4, 1e-3, 3e-3), "profile": (3e-4, 1e-3, 3e-3)},
        prior=FinetuneConfig(epochs=2, n_train=256, learning_rate=1e-4, n_test=64),
        target=FinetuneConfig(
            epochs=3, n_train=192, n_val=128, n_test=1000, n_ood=200, eval_each_epoch=False, observe_only=True
        ),
    ),
    # Both transfer directions (AG News on 1,000 test examples), the magnitude control too, 256 training examples x 4
    # epochs, constant-rate runs of every card, and Gemma-3-270M's drift beside SmolLM2's: 84 fine-tunes, about 7 h.
    "cpu-both": Preset(
        prior_tasks=("sst2", "agnews"),
        target_tasks=("agnews", "sst2"),
        budgets=(0.01,),
        other_models=("gemma3-270m",),
        lr_grid={"full": (3e-5, 1e-4, 3e-4), "lora": (3e-4, 1e-3, 3e-3), "profile": (3e-4, 1e-3, 3e-3)},
        prior=FinetuneConfig(epochs=2, n_train=256, learning_rate=1e-4, n_test=64),
        target=FinetuneConfig(
            epochs=4, n_train=256, n_val=128, n_test=1000, n_ood=200, eval_each_epoch=False, observe_only=True
        ),
    ),
}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ParameterError(f"unknown preset {name!r}", f"use one of {', '.join(PRESETS)}")
    return PRESETS[name]


class Progress:
    """Runs done of planned, with an estimate of the time left from the runs computed so far."""

    def __init__(self, planned: int, log: Callable[[str], None]) -> None:
        self.planned, self.done, self.log = planned, 0, log
        self.computed_seconds: list[float] = []

    def step(self, label: str, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        start = time.perf_counter()
        result = run()
        seconds = time.perf_counter() - start
        if seconds > 0.25:  # a skipped (finished) run takes milliseconds and says nothing about the time left
            self.computed_seconds.append(seconds)
        self.done += 1
        left = self.planned - self.done
        eta = ""
        if self.computed_seconds and left:
            eta = f", about {left * sum(self.computed_seconds) / len(self.computed_seconds) / 60:.0f} min left"
        self.log(f"[{self.done}/{self.planned}] {label}: test accuracy {result['test_accuracy']:.3f}{eta}")
        return result


def _prior_drift(
    preset: Preset, loaded: LoadedModel, pre: Snapshot, prior: str, work: WorkDir, log: Callable[[str], None]
) -> pd.DataFrame:
    """Prior full fine-tune -> drift table against the pretrained snapshot; each step reused when done and verified."""
    prior_cfg = replace(
        preset.prior,
        method="full",
        task=prior,
        output_dir=str(work.prior_run(prior)),
        save_snapshot=True,
        eval_each_epoch=False,
        stop_threshold=None,
        n_val=0,
    )
    prior_res = finetune_once(loaded, prior_cfg, log)
    return drift_table_once(pre, load_snapshot(prior_res["snapshot"]), work.drift_table(prior), preset.drift)


def _cards_for_prior(
    preset: Preset, table: pd.DataFrame, noise: list[pd.DataFrame], identity: ModelIdentity, prior: str, work: WorkDir
) -> dict[str, Path]:
    """One card per (strategy, budget), rebuilt from the verified table every time (cheap, and never stale)."""
    cards: dict[str, Path] = {}
    for budget in preset.budgets:
        for strategy in preset.strategies:
            path = work.card(f"{prior}-{strategy}-{budget:g}")
            build_profile(
                table,
                identity,
                prior_task=prior,
                strategy=strategy,
                metric=preset.metric,
                fraction=budget,
                stop_threshold=preset.stop_threshold,
                drift_settings=preset.drift.key(),
                normalization=preset.normalization,
                noise=noise,
            ).save(path)
            cards[f"{strategy}@{budget:g}"] = path
    return cards


def _grid(preset: Preset, cards: dict[str, Path], base: FinetuneConfig) -> list[tuple[str, FinetuneConfig]]:
    """Full FT, then per budget every card (its own stopping threshold) and LoRA at the high-drift card's budget."""
    grid: list[tuple[str, FinetuneConfig]] = (
        [("full", replace(base, method="full"))] if "full" in preset.baselines else []
    )
    for budget in preset.budgets:
        for name, card in cards.items():
            if name.endswith(f"@{budget:g}"):
                grid.append(
                    (f"profile:{name}", replace(base, method="profile", profile=str(card), stop_threshold="card"))
                )
        if "lora" in preset.baselines:
            grid.append(
                (
                    f"lora@{budget:g}",
                    replace(base, method="lora", lora_rank="match", profile=str(cards[f"high-drift@{budget:g}"])),
                )
            )
    return grid


def planned_runs(preset: Preset) -> int:
    """Fine-tunes of the comparison: the LR sweep on the first seed, one run per method on the others, constant-rate."""
    per_budget = {"profile": len(preset.strategies), "lora": int("lora" in preset.baselines)}
    sweep = int("full" in preset.baselines) * len(preset.lr_grid["full"]) + sum(
        len(preset.budgets) * n * len(preset.lr_grid[fam]) for fam, n in per_budget.items()
    )
    methods = int("full" in preset.baselines) + len(preset.budgets) * sum(per_budget.values())
    constant = len(preset.budgets) * sum(s in preset.constant_lr for s in preset.strategies)
    settings = sum(t != p for p in preset.prior_tasks for t in preset.target_tasks)
    return settings * (sweep + (len(preset.seeds) - 1) * methods + len(preset.seeds) * constant)


def _select(sweep: list[tuple[float, dict[str, Any]]]) -> float:
    """The rate with the best validation accuracy (the smaller rate on a tie)."""
    return max(sweep, key=lambda item: (item[1]["val_accuracy"], -item[0]))[0]


def run_comparison(preset: Preset, out_dir: str | Path, log: Callable[[str], None] = print) -> pd.DataFrame:
    """Run (or resume) the whole grid of ``preset`` under ``out_dir``; returns and writes the results table.

    Seeds are the outer loop, so an interrupted run has whole seeds done first. A seed sets both the training
    seed and which training rows are drawn; the test rows are the same for every seed (paired comparisons).
    """
    work = WorkDir(out_dir)
    for name in preset.other_models:  # fail now, not after the grid, when a second model is not installed
        if name in PACKAGED_MODELS:
            embedded_gguf_path(name)
    if preset.target.n_val < 1:
        raise ParameterError(
            "the comparison chooses learning rates on validation data, but the target config has n_val=0",
            "set n_val >= 1",
        )
    loaded = load_model(preset.model)
    pre = pretrained_snapshot(loaded, work.pretrained)
    identity = ModelIdentity.from_snapshot(pre)
    atomic.write_json(work.preset, {**asdict(preset), "planned_runs": planned_runs(preset)})
    noise = noise_tables_once(pre, work, preset.noise_seeds, preset.drift)
    cards = {}
    for prior in preset.prior_tasks:
        table = _prior_drift(preset, loaded, pre, prior, work, log)
        log(noise_check(table, noise, preset.metric, warn=True).message)
        cards[prior] = _cards_for_prior(preset, table, noise, identity, prior, work)
    for name in preset.other_models:  # drift only, before the long grid
        other, folder = load_model(name), work.model(name)
        _prior_drift_all(preset, other, folder, log)
        del other
    progress = Progress(planned_runs(preset), log)
    rows: list[dict[str, Any]] = []
    chosen: dict[tuple[str, str, str], float] = {}

    def record(prior: str, target: str, seed: int, name: str, cfg: FinetuneConfig, selected: bool) -> dict[str, Any]:
        res = progress.step(
            f"{prior}->{target} seed {seed} {name} lr {cfg.learning_rate:g}", lambda: finetune_once(loaded, cfg, log)
        )
        rows.append(_summary(prior, target, seed, name, res, selected, Path(cfg.output_dir).relative_to(work.root)))
        save_table(pd.DataFrame(rows), work.results)  # partial table after every run
        return res

    for seed in preset.seeds:
        for prior in preset.prior_tasks:
            for target in (t for t in preset.target_tasks if t != prior):  # transfer: never back to the prior task
                base = replace(preset.target, task=target, seed=seed, data_seed=seed)
                tag = f"{target}/seed{seed}"
                for name, cfg in _grid(preset, cards[prior], base):
                    key, run_dir = (prior, target, name), work.target_run(prior, tag, name)
                    if key not in chosen:  # first seed: sweep the rates, keep the best on validation
                        sweep = [
                            (
                                lr,
                                record(
                                    prior,
                                    target,
                                    seed,
                                    name,
                                    replace(cfg, learning_rate=lr, output_dir=str(run_dir / f"lr-{lr:g}")),
                                    False,
                                ),
                            )
                            for lr in preset.lr_grid[method_family(name)]
                        ]
                        chosen[key] = _select(sweep)
                        for row in rows[-len(sweep) :]:
                            row["selected"] = row["lr"] == chosen[key]
                        save_table(pd.DataFrame(rows), work.results)
                    else:
                        record(
                            prior,
                            target,
                            seed,
                            name,
                            replace(cfg, learning_rate=chosen[key], output_dir=str(run_dir / f"lr-{chosen[key]:g}")),
                            True,
                        )
                    if strategy_of(name) in preset.constant_lr:
                        constant = replace(
                            cfg,
                            learning_rate=chosen[key],
                            lr_scheduler="constant",
                            output_dir=str(run_dir / f"constant-lr-{chosen[key]:g}"),
                        )
                        record(prior, target, seed, f"{name}+constant", constant, False)
    results = pd.DataFrame(rows)
    save_table(results, work.results)
    atomic.write_text(work.root / "results.md", markdown_table(results) + "\n")
    _record_transfers(cards, results)
    return results


def _record_transfers(cards: dict[str, dict[str, Path]], results: pd.DataFrame) -> None:
    """The comparison's own cards (its outputs, never a user's input) list the tasks they were transferred to."""
    for prior, by_name in cards.items():
        targets = sorted(set(results.loc[results["prior"] == prior, "target"]))
        for path in by_name.values():
            card = ProfileCard.load(path)
            card.transferred_to = targets
            card.save(path)


def _prior_drift_all(preset: Preset, loaded: LoadedModel, work: WorkDir, log: Callable[[str], None]) -> None:
    pre = pretrained_snapshot(loaded, work.pretrained)
    for prior in preset.prior_tasks:
        _prior_drift(preset, loaded, pre, prior, work, log)


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


def _summary(
    prior: str, target: str, seed: int, name: str, res: dict[str, Any], selected: bool, run_dir: Path
) -> dict[str, Any]:
    epoch_acc = res.get("epoch_test_accuracy") or []
    stop_epoch = res.get("stop_epoch")
    topo_sec = [h.get("seconds", 0.0) for h in res.get("drift_history", [])]  # the stopping rule's own cost per epoch
    cfg = res.get("config", {})
    return {
        "prior": prior,
        "target": target,
        "seed": seed,
        "run": name,
        "lr": res["learning_rate"],
        "schedule": cfg.get("lr_scheduler"),
        "selected": selected,
        "val_acc": res.get("val_accuracy"),
        "test_acc": res["test_accuracy"],
        "train_acc": res["train_accuracy"],
        "gap": res["train_test_gap"],
        "ood_acc_before": res["ood_accuracy_before"],
        "ood_acc_after": res["ood_accuracy_after"],
        "ppl_before": res["perplexity_before"],
        "ppl_after": res["perplexity_after"],
        "trainable_pct": 100 * res["trainable_fraction"],
        "epochs_run": res["epochs_run"],
        "stop_epoch": stop_epoch,
        "acc_at_stop": epoch_acc[stop_epoch - 1] if stop_epoch and len(epoch_acc) >= stop_epoch else None,
        "train_sec_to_stop": sum(res["epoch_seconds"][:stop_epoch]) + sum(topo_sec[:stop_epoch])
        if stop_epoch
        else None,
        "topo_sec_per_epoch": sum(topo_sec) / len(topo_sec) if topo_sec else None,
        "drift_minus_lr_ratio": drift_minus_lr_ratio(res),
        "sec_per_epoch": res["seconds_per_epoch"],
        "train_sec": res["train_seconds"],
        "wall_sec": res.get("wall_seconds"),
        "peak_rss_mib": res.get("peak_rss_mib"),
        "rss_increase_mib": res.get("rss_increase_mib"),
        "run_dir": str(run_dir),
    }
