"""Presets of the comparison: sizes, grids and which arms run (:class:`Preset`), by name (:data:`PRESETS`).

Each shipped preset is a commented YAML file in ``preset_files/`` beside this module (``NAME.yaml``: what it is for,
its size, its cost and the command that runs it); a user's preset is a file of the same fields, passed by its path.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from topotuner_lab._io.config import NON_NEGATIVE_INT, OPEN_UNIT, POSITIVE_INT, Check, Config, is_real, opt
from topotuner_lab._io.errors import ParameterError
from topotuner_lab._io.yaml_files import SUFFIXES, YamlFolder, in_file, read_mapping
from topotuner_lab.drift.columns import DEFAULT_METRIC
from topotuner_lab.drift.settings import RECIPES, DriftSettings
from topotuner_lab.profiles.card import DEFAULT_NORMALIZATION, NORMALIZATIONS, STRATEGIES
from topotuner_lab.study.claim_ids import CLAIM_TITLES, ClaimId
from topotuner_lab.training.config import FinetuneConfig
from topotuner_lab.training.early_stopping import DEFAULT_STOP_THRESHOLD

#: a card "competitive with full FT" may lose this share of what full fine-tuning adds over the zero-shot model: the
#: usual non-inferiority convention of preserving half the active control's effect (FDA 2016 guidance, M2 = 50% of
#: M1). On SST-2 here (SmolLM2 zero-shot 0.784 on the 872 test sentences, full FT ~0.86) it is ~0.04 accuracy.
DEFAULT_MARGIN_SHARE = 0.5

#: learning-rate grids per method family (log-spaced), searched on validation accuracy
DEFAULT_LR_GRID: dict[str, tuple[float, ...]] = {
    "full": (1e-5, 3e-5, 1e-4, 3e-4),
    "lora": (1e-4, 3e-4, 1e-3, 3e-3),
    "profile": (1e-4, 3e-4, 1e-3, 3e-3),
}
#: the arms beside the cards: full FT, LoRA matched to each budget's card, LoRA as the paper runs it (rank 16, alpha
#: 32, on q, k, v, o) and Spectrum's top 5% of every weight type with the embeddings and head (the authors' runs)
BASELINES: tuple[str, ...] = ("full", "lora", "lora-paper", "spectrum-top5")
#: the method family (learning-rate grid) of a baseline whose name is not its method
BASELINE_FAMILY: dict[str, str] = {"lora-paper": "lora"}
#: what the target-score claims can compare per test example (study.claims.ClaimRules): the task metric, or the gold
#: label's log-probability or probability among the labels (label-likelihood tasks only)
CLAIM_MEASURES: tuple[str, ...] = ("accuracy", "logprob", "prob")
#: how each drift recipe turns its tables into cards: drift aggregated over the prior's epochs (``final``: the last
#: epoch's snapshot only) and whether the budget is spent per projection kind (the same count of each kind, matched
#: to the parameter budget) rather than over the global ranking
RECIPE_CARDS: dict[str, tuple[str, bool]] = {"default": ("final", False), "reference": ("mean", True)}
#: the topology strategies: ranked by a drift column alone, so each further drift recipe gives them a card of its own
RECIPE_STRATEGIES: tuple[str, ...] = ("high-drift", "low-drift")


def _names(allowed: tuple[str, ...]) -> Check:
    return Check(lambda v: isinstance(v, tuple) and all(x in allowed for x in v), f"a tuple of {', '.join(allowed)}")


TASKS = Check(lambda v: isinstance(v, tuple) and len(v) > 0 and all(isinstance(x, str) for x in v), "task names")
TARGETS = Check(lambda v: isinstance(v, tuple) and all(isinstance(x, str) for x in v), "task names (may be empty)")
RECIPE_NAMES = Check(
    lambda v: isinstance(v, tuple) and len(v) > 0 and v[0] == "default" and all(r in RECIPES for r in v),
    f"a tuple of drift recipes ({', '.join(RECIPES)}) starting with 'default' (the preset's own drift settings)",
)
BUDGETS = Check(
    lambda v: isinstance(v, tuple) and len(v) > 0 and all(is_real(b) and 0 < b <= 1 for b in v),
    "a non-empty tuple of fractions in (0, 1] (0.01 is 1%)",
)
SEEDS = Check(lambda v: isinstance(v, tuple) and len(v) > 0 and all(NON_NEGATIVE_INT(s) for s in v), "seeds >= 0")
LR_GRID = Check(
    lambda v: (
        isinstance(v, dict)
        and all(isinstance(lrs, tuple) and lrs and all(OPEN_UNIT(lr) for lr in lrs) for lrs in v.values())
    ),
    "a mapping of method family to a tuple of learning rates in (0, 1)",
)


@dataclass(frozen=True)
class Preset(Config):
    """Sizes, grids and arms of one comparison (written to ``preset.json`` beside its results)."""

    label = "preset"

    model: str | None = opt(None, "the model (None: the embedded SmolLM2-135M)")
    other_models: tuple[str, ...] = opt(
        (),
        "further models, drift only: their own prior fine-tunes and drift tables (under models/<name>/), to see "
        "whether which projection kinds drift depends on the model family",
        check=Check(lambda v: isinstance(v, tuple), "a tuple of model names"),
    )
    prior_tasks: tuple[str, ...] = opt(("sst2",), "tasks whose drift ranks the projections", check=TASKS)
    target_tasks: tuple[str, ...] = opt(
        ("agnews",), "tasks each card is transferred to (none: drift, cards and their stability only)", check=TARGETS
    )
    budgets: tuple[float, ...] = opt((0.01,), "trainable-parameter budgets (fractions of the model)", check=BUDGETS)
    strategies: tuple[str, ...] = opt(
        ("high-drift", "low-drift", "random", "magnitude"), "card strategies", check=_names(STRATEGIES)
    )
    baselines: tuple[str, ...] = opt(
        ("full", "lora"),
        "baselines beside the cards: full (full FT), lora (LoRA matched to each budget's card), lora-paper (rank 16, "
        "alpha 32 on q, k, v, o, as the paper runs it), spectrum-top5 (Spectrum's top 5% with embeddings and head)",
        check=_names(BASELINES),
    )
    seeds: tuple[int, ...] = opt((0, 1, 2), "training seeds (each also draws the training rows)", check=SEEDS)
    sweep_seeds: tuple[int, ...] = opt(
        (),
        "seeds of the learning-rate sweep alone: every rate runs on each, the criterion is averaged over them, and "
        "their runs are never results (then every seed of `seeds` runs at the chosen rate); empty: the first seed "
        "sweeps and its run at the chosen rate is its result",
        check=Check(lambda v: isinstance(v, tuple) and all(NON_NEGATIVE_INT(s) for s in v), "seeds >= 0 (or none)"),
    )
    lr_grid: dict[str, tuple[float, ...]] = opt(
        DEFAULT_LR_GRID, "learning rates per method family, searched on validation data", check=LR_GRID
    )
    lr_extend: int = opt(
        2,
        "extend-until-interior: when a sweep's best rate lies on an edge of its grid, add the next rate beyond it (the "
        "grid's own step), up to this many per arm, the same rule for every method (0: never)",
        check=NON_NEGATIVE_INT,
    )
    rate_criterion: str = opt(
        "logloss",
        "what chooses a learning rate on validation rows: logloss (label log-loss, smooth; accuracy where a task has "
        "none) or accuracy (the task metric, what the claims judge)",
        choices=("logloss", "accuracy"),
    )
    constant_lr: tuple[str, ...] = opt(
        ("high-drift", "low-drift", "random", "magnitude"),
        "card strategies that also run at their chosen rate with a constant schedule, every seed (early stopping "
        "seen apart from a decaying rate)",
        check=_names(STRATEGIES),
    )
    stop_threshold: float = opt(DEFAULT_STOP_THRESHOLD, "early-stopping threshold of the cards", check=OPEN_UNIT)
    primary_claim: str = opt(
        ClaimId.COMPETITIVE.value,
        "the pre-registered primary claim, judged on its own interval; every other paired claim is secondary and "
        "judged after Holm's correction",
        check=Check(lambda v: isinstance(v, str) and v.strip() != "", "a claim's name"),
    )
    margin_share: float = opt(
        DEFAULT_MARGIN_SHARE,
        "non-inferiority margin of the 'competitive' and 'stopping keeps the score' claims, as a share of the "
        "target's zero-shot -> full FT gain (so one rule fits accuracy, ROUGE-L and pass@1 alike)",
        check=OPEN_UNIT,
    )
    pilot: bool = opt(
        False,
        "a pilot: its runs size or check a later study and decide nothing, so every verdict of its report reads "
        "'pilot' with the size that would decide it",
    )
    margins: dict[str, float] = opt(
        {},
        "non-inferiority margins fixed before any run, per target task, in the claim measure's units (also the "
        "difference claims' equivalence band); a target without one gets margin_share of its measured gain",
        check=Check(lambda v: isinstance(v, dict) and all(is_real(m) and m > 0 for m in v.values()), "positive"),
    )
    seed_level: bool = opt(
        False,
        "judge every paired claim also by a Student-t interval over the per-seed differences: the verdict must hold "
        "under both it and the seed x example bootstrap",
    )
    seed_blocks: tuple[int, ...] = opt(
        (),
        "group-sequential looks: the number of seeds (of `seeds`, in order) after which the claims are judged, "
        "ending at all of them; seeds are added block by block only while the thesis or a control claim is "
        "undecided, and each look's intervals use its O'Brien-Fleming-type critical value (study.sequential) so "
        "that all looks together err at 5%; empty: one look at every seed",
        check=Check(lambda v: isinstance(v, tuple) and all(POSITIVE_INT(b) for b in v), "seed counts >= 1 (or none)"),
    )
    seed_floor: int = opt(
        0,
        "seeds the claim arms run whatever the looks decide: a look before this many seeds judges and records the "
        "thesis and control claims but does not end the study (0: a look that decides them ends it)",
        check=NON_NEGATIVE_INT,
    )
    side_arm_seeds: int = opt(
        0,
        "the arms that neither the thesis nor the control claims read (LoRA, Spectrum, SNR, relative change, further "
        "drift recipes; full FT too where `margins` fixes every target's) run only the first N seeds, and the claims "
        "about them are judged on those; the seeds go to the claims that need them (0: every arm runs every seed)",
        check=NON_NEGATIVE_INT,
    )
    claim_budgets: tuple[float, ...] = opt(
        (),
        "the budgets whose thesis and control cards run every seed and decide whether a look adds seeds; the cards "
        "of the other budgets are side arms (the first `side_arm_seeds` seeds: a budget curve, not a decision); "
        "empty: every budget",
        check=Check(lambda v: isinstance(v, tuple) and all(is_real(b) and 0 < b <= 1 for b in v), "budgets (or none)"),
    )
    claim_measure: str = opt(
        "accuracy",
        "what the target-score claims compare per test example: accuracy (the task metric), logprob (the gold label's "
        "log-probability among the labels) or prob (that probability, continuous and bounded: one confidently wrong "
        "answer cannot outweigh many right ones, as it can in log-probability); the last two on label-likelihood "
        "tasks only, margins fixed in the measure's units",
        choices=CLAIM_MEASURES,
    )
    match_kinds: tuple[str, ...] = opt(
        (),
        "card strategies ranked within each projection kind, with as many of each kind as the first other topology "
        "card picks (a kind-matched low-drift card: the thesis then compares drift, not kinds)",
        check=_names(STRATEGIES),
    )
    epoch_eval: tuple[str, ...] = opt(
        ("full", "lora", "profile", "spectrum-top5"),
        "methods whose runs are scored on the test rows after every epoch when the target config asks for it (the "
        "cards' stopping claims read those scores); the others are scored once, at the end",
        check=_names(("full", "lora", "profile", "spectrum-top5")),
    )
    target_overrides: dict[str, dict[str, Any]] = opt(
        {},
        "per target task, fine-tune fields that differ from the target config (e.g. boolq: {max_length: 256})",
        check=Check(lambda v: isinstance(v, dict) and all(isinstance(o, dict) for o in v.values()), "a mapping"),
    )
    rationale: tuple[str, ...] = opt(
        (),
        "why the preset is as it is (its targets, margins, size, any amendment), a few sentences written with the "
        "choices they explain; the report's setup prints them. Words only: a comparison resumes under reworded ones",
        check=Check(
            lambda v: isinstance(v, tuple) and all(isinstance(s, str) and s.strip() for s in v), "non-empty sentences"
        ),
        compare=False,
    )
    metric: str = opt(DEFAULT_METRIC, "drift column the cards rank by")
    normalization: str = opt(DEFAULT_NORMALIZATION, "how drift is compared across sizes", choices=NORMALIZATIONS)
    noise_seeds: tuple[int, ...] = opt(
        (0, 1, 2, 3, 4), "perturbation seeds of the noise floor (noise-z needs 5: MIN_NOISE_DRAWS)", check=SEEDS
    )
    drift: DriftSettings = opt(DriftSettings(), "drift settings of the default recipe's tables")
    recipes: tuple[str, ...] = opt(
        ("default",),
        "drift recipes whose tables rank cards: 'default' is the drift field above; 'reference' (the authors' "
        "scripts: cosine rows, H0, W1 with internal_p inf, ranked within each projection kind at a matched budget, "
        "drift averaged over the prior's epochs) adds a card of every drift-ranked strategy",
        check=RECIPE_NAMES,
    )
    transfer_rows: int = opt(
        128,
        "rows per task of the transfer check recorded for every transfer (and of the gradient selector's ranking); "
        "0 skips the check",
        check=NON_NEGATIVE_INT,
    )
    prior_seeds: tuple[int, ...] = opt(
        (0,),
        "seeds of the prior fine-tune: the first one's drift ranks the cards; every one gives a drift table, so the "
        "report can say how stable a card's picks are and compare models with intervals over prior runs",
        check=SEEDS,
    )
    prior: FinetuneConfig = opt(
        FinetuneConfig(epochs=2, n_train=256, learning_rate=1e-4), "the prior fine-tune (full FT on each prior task)"
    )
    target: FinetuneConfig = opt(
        FinetuneConfig(epochs=4, n_train=128, n_val=64, eval_each_epoch=True, observe_only=True),
        "every fine-tune on a target task (method, task, rate and seed set per run)",
    )

    def check(self) -> None:
        """Every family that runs has a rate grid; rates are chosen on validation data; LoRA has a card to match.

        The primary claim is one the comparison judges (:class:`~topotuner_lab.study.claim_ids.ClaimId`).
        """
        if self.primary_claim not in CLAIM_TITLES:
            close = difflib.get_close_matches(self.primary_claim, CLAIM_TITLES, n=1)
            self.fail(
                f"primary_claim={self.primary_claim!r} is not a claim the comparison judges"
                + (f" (did you mean {close[0]!r}?)" if close else ""),
                f"name one of the claims: {'; '.join(map(repr, CLAIM_TITLES))}",
            )
        blocks = list(self.seed_blocks)
        if blocks and (blocks != sorted(set(blocks)) or blocks[-1] != len(self.seeds)):
            self.fail(
                f"seed_blocks={blocks} is not a sequence of looks ending at all {len(self.seeds)} seeds",
                f"give increasing seed counts ending at len(seeds), e.g. seed_blocks=({len(self.seeds) // 2}, "
                f"{len(self.seeds)})",
            )
        if self.seed_floor > len(self.seeds):
            self.fail(
                f"seed_floor={self.seed_floor} is more seeds than the preset has ({len(self.seeds)})",
                f"give seed_floor at most len(seeds) = {len(self.seeds)}, or add seeds",
            )
        if not set(self.claim_budgets) <= set(self.budgets):
            self.fail(
                f"claim_budgets {sorted(set(self.claim_budgets) - set(self.budgets))} are not budgets of the preset",
                f"list only budgets the preset runs ({', '.join(f'{b:g}' for b in self.budgets)})",
            )
        shared = sorted(set(self.sweep_seeds) & set(self.seeds))
        if shared:
            self.fail(
                f"sweep_seeds and seeds share {shared}: a sweep run would be reused as a result",
                "give the sweep its own seeds, e.g. sweep_seeds=(100, 101)",
            )
        families = {"profile"} | {BASELINE_FAMILY.get(b, b) for b in self.baselines}
        missing = sorted(families - set(self.lr_grid))
        if missing:
            self.fail(f"lr_grid has no rates for {missing}", "give lr_grid a tuple of rates for every method family")
        if self.target.n_val < 1:
            self.fail(
                "the comparison chooses learning rates on validation data, but the target config has n_val=0",
                "set n_val >= 1",
            )
        if not self.strategies:
            self.fail("no card strategy", f"give strategies some of {', '.join(STRATEGIES)}")
        if "gradient" in self.strategies and len(self.target_tasks) > 1:
            self.fail(
                "the gradient strategy ranks by the target task's gradient, so its card belongs to one target; "
                f"this preset has {len(self.target_tasks)}",
                "give a preset with the gradient strategy one target task",
            )
        if not set(self.match_kinds) <= set(self.strategies):
            self.fail(
                f"match_kinds names strategies {sorted(set(self.match_kinds) - set(self.strategies))} the preset "
                "does not run",
                "list only strategies the preset runs",
            )
        for task, fields in self.target_overrides.items():
            try:
                replace(self.target, **fields)
            except TypeError as exc:
                self.fail(f"target_overrides.{task}: {exc}", "give fields of the fine-tune config (finetune --help)")
        if not set(self.constant_lr) <= set(self.strategies):
            self.fail(
                f"constant_lr names strategies {sorted(set(self.constant_lr) - set(self.strategies))} the preset "
                "does not run",
                "list only strategies the preset runs",
            )


#: the presets shipped with the package: one commented YAML file each
PRESET_DIR = Path(__file__).parent / "preset_files"


def read_preset(path: str | os.PathLike[str]) -> Preset:
    """The preset in the YAML file ``path``: :class:`Preset` fields, those left out at their defaults.

    ``prior`` and ``target`` are mappings of fine-tune fields (those left out take the fine-tune defaults), ``drift``
    one of drift settings. A missing or malformed file, an unknown field or a bad value is a
    :class:`ParameterError` naming the file and the field.
    """
    data = read_mapping(path, "preset", f"check the path, or use a preset: {', '.join(PRESETS)}")
    with in_file(path):
        return Preset.from_dict(data)


#: the shipped presets by name (the file's stem), each file read on first use
PRESETS: YamlFolder[Preset] = YamlFolder(PRESET_DIR, read_preset, "preset")


def get_preset(name: str) -> Preset:
    """The shipped preset called ``name``, or the preset in the YAML file at the path ``name``."""
    if name in PRESETS:
        return PRESETS[name]
    if name.lower().endswith(SUFFIXES) or "/" in name or os.sep in name:
        return read_preset(name)
    raise ParameterError(
        f"unknown preset {name!r}", f"use one of {', '.join(PRESETS)}, or give the path of a preset .yaml file"
    )
