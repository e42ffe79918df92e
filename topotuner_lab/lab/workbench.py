"""Steps the notebooks share, so each notebook stays a few calls.

Prepare the pretrained and fine-tuned snapshots, compute (or reuse) the drift table and its noise floor, and train
the methods side by side. File names come from :class:`~topotuner_lab.study.workspace.WorkDir`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from topotuner_lab._io import atomic
from topotuner_lab._io.json_files import read_json
from topotuner_lab.drift import columns
from topotuner_lab.drift.noise import NoiseCheck, noise_check
from topotuner_lab.drift.settings import RECIPES, DriftSettings
from topotuner_lab.drift.tables import load_table
from topotuner_lab.profiles.card import ProfileCard
from topotuner_lab.profiles.select import CardSettings, build_profile
from topotuner_lab.study.protocol import select_rate
from topotuner_lab.study.stats import two_way_bootstrap
from topotuner_lab.study.workspace import (
    WorkDir,
    drift_table_once,
    finetune_once,
    noise_tables_once,
    run_snapshot,
    snapshot_once,
)
from topotuner_lab.training.config import FinetuneConfig, Method
from topotuner_lab.training.results import RunResults, load_results
from topotuner_lab.weights.models import LoadedModel, load_model
from topotuner_lab.weights.snapshot import Snapshot, load_snapshot

if TYPE_CHECKING:
    from topotuner_lab.training.transfer import TransferCheck

#: perturbation seeds of the noise floor (MIN_NOISE_DRAWS of them: enough for noise-z)
NOISE_SEEDS: tuple[int, ...] = (0, 1, 2, 3, 4)
#: the training seed of notebook 1's prior fine-tune (FinetuneConfig's default); further prior seeds are others
FIRST_PRIOR_SEED = 0
#: the selectors notebook 7 ranks side by side: topology (high- and low-drift), the magnitude control, and the field's
#: weight statistics (Spectrum's SNR, WeightWatcher's alpha, KappaTune's kappa)
SELECTORS: tuple[str, ...] = ("high-drift", "low-drift", "magnitude", "snr", "alpha", "kappa")


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
    return load_snapshot(run_snapshot(results, run_dir))


def prior_seed_snapshots(
    loaded: LoadedModel, work_dir: str | Path, task: str, seeds: Sequence[int], **config: Any
) -> dict[int, Snapshot]:
    """The prior fine-tune repeated per further seed (its training seed and rows), each once, in its own folder.

    The first prior run (seed ``FIRST_PRIOR_SEED``) lives in ``work_dir``; seed ``s`` in
    ``WorkDir(work_dir).prior_seed(s)``. Another prior run is the noise a card's ranking must beat
    (:func:`card_stability`).
    """
    _check_further_seeds(seeds)
    return {
        seed: finetuned_snapshot(
            loaded, WorkDir(work_dir).prior_seed(seed).root, task, **{**config, "seed": seed, "data_seed": seed}
        )
        for seed in seeds
    }


def _check_further_seeds(seeds: Sequence[int]) -> None:
    if FIRST_PRIOR_SEED in seeds or len(set(seeds)) != len(seeds):
        raise ValueError(
            f"further prior seeds {list(seeds)}: list distinct seeds other than {FIRST_PRIOR_SEED} (the first prior "
            "run's, in the work folder itself)"
        )


def card_stability(
    work_dir: str | Path, seeds: Sequence[int], card: str | Path = ""
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Would another prior run pick the same matrices? ``card`` (default: notebook 4's) against its prior seeds.

    Each further prior seed's drift table (from :func:`prior_seed_snapshots`, under the card's recipe, computed once)
    is ranked with the card's own settings. Returns the agreement per seed pair (Jaccard of the picks against random
    cards of the same size, Spearman of the whole rankings) and each matrix's score over the seeds (mean, 95%
    t-interval, how many seeds pick it).
    """
    from topotuner_lab.study.stability import drift_over_seeds, stability_table

    _check_further_seeds(seeds)
    work, profile = WorkDir(work_dir), ProfileCard.load(card or WorkDir(work_dir).card())
    recipe = card_recipe(profile)
    if recipe not in RECIPES:
        raise ValueError(
            f"card {profile.prior_task} {profile.strategy} was built with drift recipe {recipe!r}, which cannot be "
            f"recomputed for other prior seeds; build the card with one of {', '.join(RECIPES)}"
        )
    settings = DriftSettings.recipe(recipe)
    pretrained = load_snapshot(work.pretrained)
    noise = noise_tables_once(pretrained, recipe_work(work_dir, recipe), NOISE_SEEDS, settings)
    cards = {FIRST_PRIOR_SEED: profile}
    for seed in seeds:
        folder = work.prior_seed(seed)
        if not folder.finetuned(profile.prior_task).is_file():
            raise FileNotFoundError(
                f"no prior fine-tune of {profile.prior_task} with seed {seed} in {folder.root}: run notebook 1 with "
                f"extra_prior_seeds including {seed}"
            )
        table = cached_drift_table(
            pretrained,
            load_snapshot(folder.finetuned(profile.prior_task)),
            folder.recipe(recipe).drift_table(profile.prior_task),
            settings,
        )
        cards[seed] = build_profile(
            table,
            profile.model,
            CardSettings(
                prior_task=profile.prior_task,
                strategy=profile.strategy,
                metric=profile.metric,
                seed=profile.seed,
                normalization=profile.normalization,
                **profile.budget,
            ),
            noise=noise,
        )
    return stability_table(cards), drift_over_seeds(cards)


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


def recipe_work(work_dir: str | Path, recipe: str = "default") -> WorkDir:
    """The work folder of a drift recipe's tables: ``work_dir`` itself for ``default``, else ``recipes/<name>`` in it.

    Each recipe keeps its own drift and noise tables (same file names), so switching recipes never recomputes over
    the other's, and the folder's ``drift-*.parquet`` stay the default recipe's.
    """
    DriftSettings.recipe(recipe)  # an unknown name is refused here
    return WorkDir(work_dir).recipe(recipe)


def recipe_drift(
    pretrained: Snapshot, finetuned: Snapshot, work_dir: str | Path, prior_task: str, recipe: str = "default"
) -> tuple[pd.DataFrame, list[pd.DataFrame]]:
    """The drift table of ``prior_task`` under ``recipe`` and its noise floor, each computed once (then reused)."""
    settings, work = DriftSettings.recipe(recipe), recipe_work(work_dir, recipe)
    table = cached_drift_table(pretrained, finetuned, work.drift_table(prior_task), settings)
    return table, noise_tables_once(pretrained, work, NOISE_SEEDS, settings)


def drift_source(work_dir: str | Path, prior_task: str) -> Callable[[str], tuple[pd.DataFrame, list[pd.DataFrame]]]:
    """Recipe name -> (drift table, noise tables) of the prior task, for the profile builder's recipe control.

    The snapshots of notebook 1 are read on the first call; each recipe's tables are computed once
    (:func:`recipe_drift`).
    """
    pair: list[tuple[Snapshot, Snapshot]] = []

    def load(recipe: str) -> tuple[pd.DataFrame, list[pd.DataFrame]]:
        if not pair:
            pair.append(load_pair(work_dir, prior_task))
        return recipe_drift(*pair[0], work_dir, prior_task, recipe)

    return load


def card_recipe(card: ProfileCard) -> str:
    """The drift recipe a card was built with (``custom`` for other settings, ``unknown`` when it records none)."""
    if not card.drift_settings:
        return "unknown"
    return DriftSettings.from_key(card.drift_settings).recipe_name


def check_transfer(
    loaded: LoadedModel,
    work_dir: str | Path,
    target_task: str,
    card: str | Path = "",
    **settings: Any,
) -> TransferCheck:
    """The transfer check of a card (default: notebook 4's) from its prior task to ``target_task``, before training.

    ``settings`` are :class:`~topotuner_lab.training.transfer.TransferCheckSettings` fields (``n_rows``,
    ``max_length``, ``batch_size``, ``seed``).
    """
    from topotuner_lab.training.transfer import TransferCheckSettings, transfer_check

    profile = ProfileCard.load(card or WorkDir(work_dir).card())
    return transfer_check(loaded, profile, target_task, TransferCheckSettings(**settings))


def check_noise(work_dir: str | Path, prior_task: str, metric: str = "h0_w1") -> NoiseCheck:
    """How far the prior task's drift stands above the noise floor (warns when it does not)."""
    work = WorkDir(work_dir)
    table = load_table(work.drift_table(prior_task))
    noise = [load_table(work.noise_table(seed)) for seed in NOISE_SEEDS if work.noise_table(seed).is_file()]
    return noise_check(table, noise, metric, warn=True)


def noise_ratios(work_dir: str | Path, prior_task: str, measures: Sequence[str]) -> pd.DataFrame:
    """The noise check of each drift column: the ratio and share :func:`check_noise` prints, one row per column.

    ``ratio`` is the median fine-tune drift over the median of every noise draw pooled (all seeds), the figure the
    check's sentence states; ``above_every_draw`` the share of matrices drifting more than each of their noise draws.
    """
    work = WorkDir(work_dir)
    table = load_table(work.drift_table(prior_task))
    noise = [load_table(work.noise_table(seed)) for seed in NOISE_SEEDS if work.noise_table(seed).is_file()]
    checks = [noise_check(table, noise, measure) for measure in measures]
    return pd.DataFrame(
        {"fine-tune / noise (median)": [c.ratio for c in checks], "above_every_draw": [c.share_above for c in checks]},
        index=pd.Index(list(measures), name="measure"),
    )


def train_methods(
    loaded: LoadedModel,
    card: str | Path,
    work_dir: str | Path,
    task: str,
    methods: tuple[Method, ...] = ("full", "lora", "profile"),
    *,
    stop_threshold: float | None = None,
    lr_grid: Mapping[str, Sequence[float]] | None = None,
    **config: Any,
) -> dict[str, RunResults]:
    """Run each method on ``task`` (LoRA at the card's budget); finished runs of the same config are reused.

    With ``lr_grid`` (method -> rates) every method runs each of its rates and keeps the one the comparison's rule
    chooses on validation rows (lowest label log-loss, else accuracy: :func:`~topotuner_lab.study.protocol.select_rate`;
    give ``n_val``); the sweep is under ``compare/<task>/<method>/lr-<rate>`` and ``chosen.json`` names the chosen
    rate. With ``stop_threshold`` the profile run also records topological early stopping (observe mode, test
    accuracy every epoch), so notebook 6 reads it instead of training the same run again.
    """
    work = WorkDir(work_dir)
    results: dict[str, RunResults] = {}
    for method in methods:
        extra: dict[str, Any] = {"lora_rank": "match"} if method == "lora" else {}
        if method == "profile" and stop_threshold is not None:
            extra.update(stop_threshold=stop_threshold, observe_only=True, eval_each_epoch=True)
        folder = work.compare_run(task, method)
        rates = list(lr_grid.get(method, ())) if lr_grid else []
        if not rates:
            cfg = FinetuneConfig(method=method, task=task, output_dir=str(folder), profile=str(card), **extra, **config)
            results[method] = finetune_once(loaded, cfg)
            continue
        sweep = []
        for lr in rates:
            out = folder / f"lr-{lr:g}"
            cfg = FinetuneConfig(
                method=method, task=task, output_dir=str(out), profile=str(card), learning_rate=lr, **extra, **config
            )
            sweep.append((lr, finetune_once(loaded, cfg)))
        chosen = select_rate(sweep)
        atomic.write_json(folder / CHOSEN, {"learning_rate": chosen, "run": f"lr-{chosen:g}", "rates": rates})
        results[method] = dict(sweep)[chosen]
    return results


#: the file naming the rate a tuned method chose (beside its ``lr-<rate>`` runs)
CHOSEN = "chosen.json"
_REDO_CHOSEN = "run the comparison again with the same rates: it rewrites the file and reuses the finished runs"


def rate_sweeps(work_dir: str | Path, task: str) -> pd.DataFrame:
    """Every rate each method ran on ``task`` (notebook 5's sweep): validation log-loss and accuracy, test score."""
    rows = []
    for folder in sorted(WorkDir(work_dir).compare_folder(task).glob("*")):
        chosen = read_json(folder / CHOSEN, "chosen rate record", _REDO_CHOSEN) if (folder / CHOSEN).is_file() else None
        for run in sorted(folder.glob("lr-*/results.json")):
            res = load_results(run)
            rows.append(
                {
                    "method": folder.name,
                    "lr": res["learning_rate"],
                    "val_logloss": res.get("val_logloss"),
                    "val_accuracy": res.get("val_accuracy"),
                    "test_accuracy": res["test_accuracy"],
                    "chosen": chosen is not None and chosen["run"] == run.parent.name,
                }
            )
    return pd.DataFrame(rows)


def method_run(work_dir: str | Path, task: str, method: str = "profile") -> RunResults:
    """The results of one run of notebook 5's comparison (its chosen rate when tuned; a clear error if not run)."""
    folder = WorkDir(work_dir).compare_run(task, method)
    if (folder / CHOSEN).is_file():
        folder = folder / str(read_json(folder / CHOSEN, "chosen rate record", _REDO_CHOSEN)["run"])
    return load_results(folder / "results.json")


def stop_summary(result: RunResults) -> str:
    """What the early-stopping rule, recorded in observe mode, did in one run.

    Where it fired, the epochs that saves, and the test accuracy at the stop epoch beside the full budget's.
    """
    stop, epochs, threshold = result["stop_epoch"], result["config"]["epochs"], result["stop_threshold"]
    if not stop:
        return f"normalized drift stayed above {threshold}: no stop within {epochs} epochs"
    acc = result["epoch_test_accuracy"]
    saved = (
        f"{epochs - stop} of {epochs} epochs saved"
        if stop < epochs
        else "only at the last epoch: nothing saved at this budget (more epochs give the rule room)"
    )
    return (
        f"would stop after epoch {stop} of {epochs} ({saved}); test accuracy at the stop epoch {acc[stop - 1]:.3f} "
        f"vs the full budget {acc[-1]:.3f}"
    )


def method_intervals(results: Mapping[str, RunResults], reference: str = "full") -> pd.DataFrame:
    """Each method's test score and its difference from ``reference`` with a paired 95% interval over test rows.

    One seed: the interval resamples test examples only (training noise is not in it; the decisive presets resample
    seeds too). A demo's numbers, not a verdict.
    """
    base = np.asarray(results[reference]["test_correct"], dtype=float)
    rows = []
    for name, res in results.items():
        mine = np.asarray(res["test_correct"], dtype=float)
        diff = two_way_bootstrap(mine[None, :], base[None, :]) if name != reference else None
        rows.append(
            {
                "method": name,
                "test_score": res["test_accuracy"],
                f"minus {reference}": diff.estimate if diff else 0.0,
                "95% low": diff.low if diff else np.nan,
                "95% high": diff.high if diff else np.nan,
            }
        )
    return pd.DataFrame(rows)


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
    same drift table (the prior task's, under the card's recipe: topology's pick against magnitude's).
    """
    work = WorkDir(work_dir)
    a = ProfileCard.load(card_a or work.card())
    if card_b:
        b = ProfileCard.load(card_b)
    else:
        recipe = card_recipe(a)  # the control ranks the same table: the prior task's, under the card's recipe
        table = load_table(recipe_work(work_dir, recipe if recipe in RECIPES else "default").drift_table(a.prior_task))
        b = build_profile(
            table, a.model, CardSettings(prior_task=a.prior_task, strategy="magnitude", seed=a.seed, **a.budget)
        )
    label = lambda c: f"{c.model.name} {c.prior_task} {c.strategy}"
    labels = (label(a), label(b))
    return a, b, labels if labels[0] != labels[1] else ("A: " + labels[0], "B: " + labels[1])


def selector_agreement(
    work_dir: str | Path, card: str | Path = "", strategies: tuple[str, ...] = SELECTORS, method: str = "spearman"
) -> tuple[pd.DataFrame, str]:
    """How alike the selectors rank the series' projections: the rank-agreement matrix and a sentence reading it.

    The table is the one ``card`` (default: notebook 4's) was built from: its prior task under its recipe, with the
    signal columns of the pretrained matrices joined; topology ranks by the card's drift metric and normalization
    (noise-z against the recipe's noise tables).
    """
    from topotuner_lab.drift.signals import with_signals
    from topotuner_lab.profiles.compare import rank_agreement, selector_scores

    profile = ProfileCard.load(card or WorkDir(work_dir).card())
    recipe = card_recipe(profile)
    work = recipe_work(work_dir, recipe if recipe in RECIPES else "default")
    pretrained = load_snapshot(WorkDir(work_dir).pretrained)
    table = with_signals(load_table(work.drift_table(profile.prior_task)), pretrained)
    metric = profile.metric if columns.topological(profile.metric) is not None else columns.DEFAULT_METRIC
    noise = [load_table(work.noise_table(seed)) for seed in NOISE_SEEDS if work.noise_table(seed).is_file()]
    scores = selector_scores(table, strategies, metric, profile.normalization, noise=noise, seed=profile.seed)
    matrix = rank_agreement(scores, method)
    return matrix, agreement_sentence(matrix, f"{method.capitalize()} rho", f"high-drift by {metric}")


def agreement_sentence(
    matrix: pd.DataFrame,
    measure: str = "Spearman rho",
    topology: str = "high-drift",
    reference: str = "high-drift",
    mirror: str = "low-drift",
) -> str:
    """One sentence read off a rank-agreement matrix: which selector agrees most and least with topology.

    ``reference`` is topology's column; its ``mirror`` (the same ranking reversed) is left out of the comparison.
    The strongest relation either way (largest absolute value: agreement or its opposite), named with its selector, is
    strong from 0.7, moderate from 0.3, weak below; values are read as printed (two decimals).
    """
    others = matrix[reference].drop([reference, mirror], errors="ignore").dropna().round(2)  # as printed
    if others.empty:
        return f"No other selector ranks the projections comparably with topology ({topology})."
    best, worst, closest = str(others.idxmax()), str(others.idxmin()), str(others.abs().idxmax())
    value = float(others[closest])
    strength = "strong" if abs(value) >= 0.7 else "moderate" if abs(value) >= 0.3 else "weak"
    if strength == "weak":
        reading = "topology ranks the matrices in an order of its own"
    elif value > 0:
        reading = f"topology {'largely' if strength == 'strong' else 'partly'} picks as {closest} would"
    else:
        reading = f"topology {'largely' if strength == 'strong' else 'partly'} picks the opposite of {closest}"
    return (
        f"Topology ({topology}) agrees most with {best} ({measure} {others[best]:+.2f}) and least with {worst} "
        f"({others[worst]:+.2f}); the strongest relation either way is {strength}, with {closest} "
        f"({others[closest]:+.2f}): {reading}."
    )
