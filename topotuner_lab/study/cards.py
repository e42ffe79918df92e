"""The comparison's inputs: each prior's fine-tunes and drift tables, and the profile cards built from them.

prior fine-tune (one per prior seed) -> drift table per recipe -> cards: every strategy and control at each budget,
drift-ranked ones per further recipe, the target's own for the gradient selector, the ``Preset.match_kinds`` cards
and the random controls with the first topology card's count of each projection kind. Every step is reused when its
file verifies; cards are rebuilt from verified tables (cheap, never stale). :mod:`topotuner_lab.study.protocol`
orchestrates; this module makes the cards it trains with.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from topotuner_lab._io.errors import ParameterError
from topotuner_lab.drift.settings import DriftSettings
from topotuner_lab.drift.signals import SIGNALS, with_signals
from topotuner_lab.profiles.card import FIXED_RANKINGS, ModelIdentity, ProfileCard
from topotuner_lab.profiles.select import CardSettings, build_profile, kind_composition
from topotuner_lab.study.ledger_prior import RELCHANGE, kept_prior_tables, ledger_relchange
from topotuner_lab.study.plan import DEFAULT_RECIPE
from topotuner_lab.study.presets import RECIPE_CARDS, RECIPE_STRATEGIES, Preset
from topotuner_lab.study.weights_facts import record_weights_facts
from topotuner_lab.study.workspace import (
    WorkDir,
    drift_table_once,
    epoch_drift_once,
    finetune_once,
    run_epoch_snapshots,
    run_snapshot,
    task_tag,
)
from topotuner_lab.training.transfer import TransferCheckSettings, with_gradient_signal
from topotuner_lab.weights.models import LoadedModel
from topotuner_lab.weights.snapshot import Snapshot, load_snapshot

Log = Callable[[str], None]


@dataclass(frozen=True)
class CardKey:
    """Which card: prior task, strategy, budget, drift recipe, and the target for target-ranked selectors."""

    prior: str
    strategy: str
    budget: float
    recipe: str = DEFAULT_RECIPE
    target: str | None = None
    seed: int | None = None  # the training seed a stratified random control was drawn for


#: every card of a comparison, by key
Cards = dict[CardKey, Path]


def drift_settings(preset: Preset, recipe: str) -> DriftSettings:
    """The drift settings of a recipe's tables: the preset's own for ``default``, the named recipe's otherwise."""
    return preset.drift if recipe == DEFAULT_RECIPE else DriftSettings.recipe(recipe)


def prior_seed_dir(work: WorkDir, preset: Preset, seed: int) -> WorkDir:
    """Where a prior seed's fine-tunes and tables live: the folder itself for the preset's first, else its own."""
    return work if seed == preset.prior_seeds[0] else work.prior_seed(seed)


def prior_drift(
    preset: Preset,
    loaded: LoadedModel,
    pre: Snapshot,
    prior: str,
    work: WorkDir,
    log: Log,
    recipes: tuple[str, ...],
    seeds: tuple[int, ...] | None = None,
    *,
    builds_cards: bool = True,
) -> dict[tuple[int, str], pd.DataFrame]:
    """Prior full fine-tunes (one per prior seed) -> their drift tables per recipe, each step reused when verified.

    Returns ``(prior seed, recipe) -> table``. A recipe that aggregates over epochs has the prior keep a snapshot
    per epoch; its table averages the per-epoch tables. ``seeds``: these prior seeds only (None: every one).
    ``builds_cards``: whether ``work``'s cards are built from these tables (not so for a further model's drift).
    """
    per_epoch = any(RECIPE_CARDS[r][0] != "final" for r in recipes)
    tables: dict[tuple[int, str], pd.DataFrame] = {}
    for seed in preset.prior_seeds if seeds is None else seeds:
        folder = prior_seed_dir(work, preset, seed)
        prior_cfg = replace(
            preset.prior,
            method="full",
            task=prior,
            seed=seed,
            data_seed=seed,
            output_dir=str(folder.prior_run(prior)),
            save_snapshot=True,
            save_epoch_snapshots=per_epoch,
            eval_each_epoch=False,
            stop_threshold=None,
            n_val=0,
        )
        specs = [
            (recipe, folder.recipe(recipe).drift_table(prior), drift_settings(preset, recipe), RECIPE_CARDS[recipe][0])
            for recipe in recipes
        ]
        first = seed == preset.prior_seeds[0]
        relchange_from = folder if first and builds_cards and RELCHANGE in preset.strategies else None
        kept = kept_prior_tables(folder, prior_cfg, pre, specs, log, relchange_from=relchange_from)
        if kept is not None:  # a ledger resumed without the prior's weights: its verified tables, not a retrain
            tables.update({(seed, recipe): table for recipe, table in kept.items()})
            continue
        res = finetune_once(loaded, prior_cfg, log)
        for recipe, path, settings, aggregation in specs:
            if aggregation == "final":
                after = load_snapshot(run_snapshot(res, prior_cfg.output_dir))
                tables[seed, recipe] = drift_table_once(pre, after, path, settings, log=log)
            else:
                epochs = [load_snapshot(p) for p in run_epoch_snapshots(res, prior_cfg.output_dir)]
                tables[seed, recipe] = epoch_drift_once(pre, epochs, path, aggregation, settings, log=log)
        if not first:  # the first seed's facts are recorded with its folder's (protocol.prepare)
            record_weights_facts(folder, (prior,), pre)  # the hash a clone of the ledger checks its tables against
    return tables


def card_settings(preset: Preset, prior: str, strategy: str, **budget: Any) -> CardSettings:
    """How a card of ``preset`` is built from ``prior``'s drift, with ``budget`` (``fraction``, ``per_kind``...).

    The preset gives the metric, the normalization and the stopping threshold; ``budget`` may add any other
    :class:`CardSettings` field (``seed``, ``per_kind_budget``).
    """
    return CardSettings(
        prior_task=prior,
        strategy=strategy,
        metric=preset.metric,
        normalization=preset.normalization,
        stop_threshold=preset.stop_threshold,
        **budget,
    )


def _card_specs(preset: Preset) -> list[tuple[str, str, float]]:
    """(recipe, strategy, budget) of every card a prior gets: every strategy, drift-ranked ones per further recipe."""
    return [
        (recipe, strategy, budget)
        for budget in preset.budgets
        for recipe in preset.recipes
        for strategy in preset.strategies
        if recipe == DEFAULT_RECIPE or strategy in RECIPE_STRATEGIES
    ]


def cards_for_prior(
    preset: Preset,
    tables: dict[str, pd.DataFrame],
    noise: list[pd.DataFrame],
    pre: Snapshot,
    loaded: LoadedModel,
    prior: str,
    work: WorkDir,
    log: Log,
) -> Cards:
    """One card per (recipe, strategy, budget; target for the gradient selector), rebuilt from verified tables.

    Rebuilding is cheap and never stale. ``tables`` maps a recipe to the first prior seed's table. The field's
    selectors get their columns joined first (pretrained statistics; the target task's gradient).
    """
    identity = ModelIdentity.from_snapshot(pre)
    cards: Cards = {}
    if any(s in FIXED_RANKINGS and FIXED_RANKINGS[s][0] in SIGNALS for s in preset.strategies):
        tables = {recipe: with_signals(table, pre) for recipe, table in tables.items()}  # once: an SVD per matrix
    if RELCHANGE in preset.strategies:  # the authors' element-wise relative change of the prior fine-tune
        tables = {**tables, DEFAULT_RECIPE: ledger_relchange(tables[DEFAULT_RECIPE], pre, prior, work, log)}
    gradients: dict[str, pd.DataFrame] = {}
    stratified = any(s in RECIPE_STRATEGIES for s in preset.strategies)  # random controls drawn per seed below
    for recipe, strategy, budget in _card_specs(preset):
        if (strategy == "random" and stratified) or (recipe == DEFAULT_RECIPE and strategy in preset.match_kinds):
            continue  # drawn below, with the topology card's kinds
        table = tables[recipe]
        targets: list[str | None] = [None]
        if strategy == "gradient":
            targets = list(preset.target_tasks)
        per_kind = RECIPE_CARDS[recipe][1]
        for target in targets:
            ranked = table
            name = f"{task_tag(prior)}-{strategy}" + ("" if recipe == DEFAULT_RECIPE else f"-{recipe}")
            if target is not None:
                if target not in gradients:
                    log(f"gradient of {target} at the pretrained weights ({preset.transfer_rows} rows)")
                    gradients[target] = with_gradient_signal(
                        table, loaded, target, TransferCheckSettings(n_rows=preset.transfer_rows or 128)
                    )
                ranked, name = gradients[target], f"{name}-{task_tag(target)}"
            path = work.card(f"{name}-{budget:g}")
            build_profile(
                ranked,
                identity,
                card_settings(preset, prior, strategy, fraction=budget, per_kind_budget=per_kind),
                noise=noise if recipe == DEFAULT_RECIPE else (),
                drift_settings=drift_settings(preset, recipe).key(),
            ).save_unless_same(path)
            cards[CardKey(prior, strategy, budget, recipe, target)] = path
    cards.update(_kind_matched_cards(preset, cards, tables[DEFAULT_RECIPE], noise, identity, prior, work))
    cards.update(_stratified_controls(preset, cards, tables[DEFAULT_RECIPE], noise, identity, prior, work))
    return cards


def _topology_composition(preset: Preset, cards: Cards, prior: str, budget: float) -> dict[str, int] | None:
    """How many matrices of each kind the preset's first topology card picks at ``budget`` (None: no such card)."""
    topology = next((s for s in preset.strategies if s in RECIPE_STRATEGIES and s not in preset.match_kinds), None)
    if topology is None:
        return None
    return kind_composition(ProfileCard.load(cards[CardKey(prior, topology, budget)]))


def _kind_matched_cards(
    preset: Preset,
    cards: Cards,
    table: pd.DataFrame,
    noise: list[pd.DataFrame],
    identity: ModelIdentity,
    prior: str,
    work: WorkDir,
) -> Cards:
    """The cards of ``Preset.match_kinds`` ranked within each kind, with the topology card's count of each kind.

    A low-drift card ranked over all matrices can pick other kinds than the high-drift card (4 output projections
    against 9 key/value ones), so the thesis would compare kinds as much as drift; with the same composition the two
    differ only in which matrices of each kind they train.
    """
    matched: Cards = {}
    for strategy in (s for s in preset.strategies if s in preset.match_kinds):
        for budget in preset.budgets:
            composition = _topology_composition(preset, cards, prior, budget)
            if composition is None:
                raise ParameterError(
                    f"match_kinds names {strategy!r} but the preset has no other topology card to match",
                    "add high-drift (or low-drift) to strategies, or empty match_kinds",
                )
            path = work.card(f"{task_tag(prior)}-{strategy}-kinds-{budget:g}")
            matched[CardKey(prior, strategy, budget)] = _per_kind_card(
                preset, table, noise, identity, prior, strategy, composition, path
            )
    return matched


def _per_kind_card(
    preset: Preset,
    table: pd.DataFrame,
    noise: list[pd.DataFrame],
    identity: ModelIdentity,
    prior: str,
    strategy: str,
    composition: dict[str, int],
    path: Path,
    seed: int = 0,
) -> Path:
    """A kind-matched card or a stratified control, saved at ``path`` (unless the same card is there).

    It holds ``composition``'s count of each projection kind, ranked within each kind (drawn with ``seed`` for
    ``random``).
    """
    settings = card_settings(preset, prior, strategy, per_kind=composition, seed=seed)
    build_profile(table, identity, settings, noise=noise, drift_settings=preset.drift.key()).save_unless_same(path)
    return path


def card_for(
    cards: Cards, prior: str, target: str, strategy: str, budget: float, recipe: str, seed: int | None = None
) -> Path:
    """The card an arm trains with: the seed's own (random control), the target's own (gradient), or the prior's."""
    key = CardKey(prior, strategy, budget, recipe, target, seed)
    for candidate in (key, replace(key, target=None), replace(key, seed=None), replace(key, target=None, seed=None)):
        if candidate in cards:
            return cards[candidate]
    raise KeyError(key)


def _stratified_controls(
    preset: Preset,
    cards: Cards,
    table: pd.DataFrame,
    noise: list[pd.DataFrame],
    identity: ModelIdentity,
    prior: str,
    work: WorkDir,
) -> Cards:
    """A random control per training seed, sweep seeds too, with the first topology card's kinds and count.

    The control differs from the topology card only in which matrices of each kind it picks, and a fresh draw per
    seed makes the control's own randomness part of the seed-to-seed spread. Without a topology card the plain
    random card (a fraction budget) stays the control.
    """
    if "random" not in preset.strategies or not any(s in RECIPE_STRATEGIES for s in preset.strategies):
        return {}
    controls: Cards = {}
    for budget in preset.budgets:
        composition = _topology_composition(preset, cards, prior, budget)
        if composition is None:
            return {}
        for seed in (*preset.sweep_seeds, *preset.seeds):  # a sweep seed's run draws its own control too
            path = work.card(f"{task_tag(prior)}-random-seed{seed}-{budget:g}")
            controls[CardKey(prior, "random", budget, seed=seed)] = _per_kind_card(
                preset, table, noise, identity, prior, "random", composition, path, seed=seed
            )
    return controls
