"""The runs of a comparison, as data, computed before anything trains.

A typed :class:`RunKey` per arm and the ordered :class:`RunSpec` list a preset plans (:func:`plan`).

Seeds are the outer loop, so an interrupted comparison has whole seeds done first (with side arms, the claims'
arms' seeds come first). With ``Preset.sweep_seeds`` every arm first sweeps its rate grid on each sweep seed (runs
that are never results), then every seed runs each arm at the chosen rate; without them, the first seed sweeps and
its run at the chosen rate is its result. Card strategies listed in ``Preset.constant_lr`` also run at the chosen
rate with a constant schedule, every seed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
import pandas as pd

from topotuner_lab.study.presets import RECIPE_STRATEGIES, Preset
from topotuner_lab.training.config import LrScheduler, Method

#: the strategy of the LoRA arm as the paper runs it (rank 16, alpha 32, on q, k, v, o), not matched to a card
PAPER_LORA = "r16"
PAPER_LORA_RANK = 16
Role = Literal["sweep", "chosen", "constant"]
#: the columns a run's identity adds to ``results.csv``
KEY_COLUMNS: tuple[str, ...] = ("method", "strategy", "budget", "schedule", "recipe")
#: the drift recipe of a card arm unless the preset names another (cards of other recipes are labelled with it)
DEFAULT_RECIPE = "default"
#: the card strategies the thesis compares, and the controls topology must beat (study.claims)
TOPOLOGY: tuple[str, ...] = ("high-drift", "low-drift")
CONTROLS: tuple[str, ...] = ("random", "magnitude")


@dataclass(frozen=True)
class RunKey:
    """One arm of the comparison.

    Method, card strategy and budget (profile runs; LoRA matches a budget), schedule, and the drift recipe whose
    table ranked the card (:data:`~topotuner_lab.drift.settings.RECIPES`).
    """

    method: Method
    strategy: str | None = None
    budget: float | None = None
    schedule: LrScheduler = "linear"
    recipe: str = DEFAULT_RECIPE

    @property
    def name(self) -> str:
        """Label in tables and folders: ``full``, ``lora:r16``, ``profile:high-drift[reference]@0.01+constant``."""
        head = self.method if self.strategy is None else f"{self.method}:{self.strategy}"
        recipe = "" if self.recipe == DEFAULT_RECIPE else f"[{self.recipe}]"
        budget = "" if self.budget is None else f"@{self.budget:g}"
        return head + recipe + budget + ("" if self.schedule == "linear" else f"+{self.schedule}")

    @property
    def sequential(self) -> bool:
        """Whether the thesis and control claims (judged at each look) read this arm.

        They read the default recipe's topology and control cards, and full FT, whose gain sets their margins unless
        the preset fixes them (:func:`every_seed`).
        """
        if self.method == "full":
            return True
        return self.method == "profile" and self.recipe == DEFAULT_RECIPE and self.strategy in (*TOPOLOGY, *CONTROLS)

    @property
    def family(self) -> Method:
        """The method family whose learning-rate grid the arm sweeps."""
        return self.method

    def columns(self) -> dict[str, Any]:
        """The key as ``results.csv`` columns."""
        return {
            "method": self.method,
            "strategy": self.strategy,
            "budget": self.budget,
            "schedule": self.schedule,
            "recipe": self.recipe,
        }

    @classmethod
    def parse(cls, name: str) -> RunKey:
        """The key of a run label written by a version that kept no key columns (read-only compatibility)."""
        head, _, schedule = name.partition("+")
        head, _, budget = head.partition("@")
        head, _, recipe = head.removesuffix("]").partition("[")
        method, _, strategy = head.partition(":")
        return cls(
            method,  # type: ignore[arg-type]
            strategy or None,
            float(budget) if budget else None,
            schedule or "linear",  # type: ignore[arg-type]
            recipe or DEFAULT_RECIPE,
        )


@dataclass(frozen=True)
class RunSpec:
    """One planned fine-tune: the transfer (prior -> target), the seed, the arm, and its rate.

    ``role`` is ``sweep`` (a rate of the grid on a sweep seed, or on the first seed without sweep seeds; ``lr`` set),
    ``chosen`` (a seed at the arm's chosen rate) or ``constant`` (the chosen rate with a constant schedule); the last
    two learn their rate from the sweep.
    """

    prior: str
    target: str
    seed: int
    key: RunKey
    role: Role
    lr: float | None = None

    @property
    def arm(self) -> tuple[str, str, RunKey]:
        """What shares one chosen rate: the transfer and the arm at its linear schedule."""
        return self.prior, self.target, replace(self.key, schedule="linear")


def arms(preset: Preset) -> list[RunKey]:
    """Every arm: full FT, paper LoRA, Spectrum top-5% where asked, then per budget the cards and matched LoRA.

    Per budget: every card strategy, the drift-ranked strategies again per further recipe, and LoRA matched to the
    budget's card.
    """
    keys: list[RunKey] = [RunKey("full")] if "full" in preset.baselines else []
    keys += [RunKey("lora", PAPER_LORA)] if "lora-paper" in preset.baselines else []
    keys += [RunKey("spectrum-top5")] if "spectrum-top5" in preset.baselines else []
    for budget in preset.budgets:
        keys += [RunKey("profile", strategy, budget) for strategy in preset.strategies]
        for recipe in preset.recipes[1:]:
            keys += [RunKey("profile", s, budget, recipe=recipe) for s in preset.strategies if s in RECIPE_STRATEGIES]
        keys += [RunKey("lora", None, budget)] if "lora" in preset.baselines else []
    return keys


def transfers(preset: Preset) -> list[tuple[str, str]]:
    """Every (prior, target) pair, never back to the prior task."""
    return [(prior, target) for prior in preset.prior_tasks for target in preset.target_tasks if target != prior]


def every_seed(preset: Preset, key: RunKey) -> bool:
    """Whether ``key`` runs every seed of ``preset``: the arms the thesis and control claims read.

    Full FT is one of them only while its gain sets a margin: where the preset fixes every target's margin, full FT
    is a side arm like LoRA (its claims are judged on the side arms' seeds). Cards at a budget outside
    ``claim_budgets`` are side arms too.
    """
    if key.method == "full":
        return not set(preset.target_tasks) <= set(preset.margins)
    return key.sequential and claim_budget(preset, key.budget)


def claim_budget(preset: Preset, budget: float | None) -> bool:
    """Whether the thesis and control claims at ``budget`` decide the study (``Preset.claim_budgets``; all if empty)."""
    return not preset.claim_budgets or budget in preset.claim_budgets


def plan(preset: Preset) -> list[RunSpec]:
    """Every fine-tune of the comparison, in the order they run (an arm's sweep runs are contiguous, seeds inner).

    With ``side_arm_seeds`` the arms no sequential claim reads (:func:`every_seed`) run only that many seeds, after
    every run of the claims' arms: a study cut short has its decisions' runs first.
    """
    specs: list[RunSpec] = []
    for prior, target in transfers(preset) if preset.sweep_seeds else []:
        for key in arms(preset):
            grid = preset.lr_grid[key.family]
            specs += [RunSpec(prior, target, s, key, "sweep", lr) for lr in grid for s in preset.sweep_seeds]
    for index, seed in enumerate(preset.seeds):
        for prior, target in transfers(preset):
            for key in arms(preset):
                if 0 < preset.side_arm_seeds <= index and not every_seed(preset, key):
                    continue
                if index == 0 and not preset.sweep_seeds:
                    specs += [RunSpec(prior, target, seed, key, "sweep", lr) for lr in preset.lr_grid[key.family]]
                else:
                    specs.append(RunSpec(prior, target, seed, key, "chosen"))
                if key.strategy in preset.constant_lr:
                    specs.append(RunSpec(prior, target, seed, replace(key, schedule="constant"), "constant"))
    if preset.side_arm_seeds:
        specs.sort(key=lambda spec: not every_seed(preset, spec.key))  # stable: plan order within each group
    return specs


def run_owner(preset: Preset, spec: RunSpec) -> str:
    """The prior whose folder holds a run: its own, but an arm without a card is one run shared by every prior's row.

    Full FT, the paper's LoRA and Spectrum on a target never read the prior, so each runs once per target, seed and
    rate, in the first transferring prior's folder; the other priors' rows reuse it (the same config:
    ``finetune_once`` finds it done).
    """
    if spec.key.method == "profile" or (spec.key.method == "lora" and spec.key.strategy != PAPER_LORA):
        return spec.prior
    return next(prior for prior in preset.prior_tasks if prior != spec.target)


def extension_runs(results: pd.DataFrame, preset: Preset) -> int:
    """The sweep runs at rates beyond their grid: those extend-until-interior added to the :func:`plan`."""
    if "role" not in results or results.empty:
        return 0
    results = with_key_columns(results)
    sweeps = results[results["role"] == "sweep"]
    beyond = [not np.isclose(lr, preset.lr_grid[method]).any() for lr, method in zip(sweeps["lr"], sweeps["method"])]
    return int(sum(beyond))


def with_key_columns(results: pd.DataFrame) -> pd.DataFrame:
    """``results`` with the key columns, derived from the run labels where an older ``results.csv`` lacks them."""
    if set(KEY_COLUMNS) <= set(results.columns):
        return results
    keys = pd.DataFrame([RunKey.parse(name).columns() for name in results["run"]], index=results.index)
    return results.drop(columns=[c for c in KEY_COLUMNS if c in results.columns]).join(keys)
