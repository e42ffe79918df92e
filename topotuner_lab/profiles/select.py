"""Which projections a card trains: rank a drift column (normalized across matrix sizes) and fill a budget.

A card keeps the top-k high-drift or low-drift projections trainable, k given as a count or a trainable-parameter
budget. Random and magnitude-ranked cards with the same budget are the controls.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from topotuner_lab._io.config import (
    NON_NEGATIVE_INT,
    OPEN_UNIT,
    POSITIVE_INT,
    REQUIRED,
    Check,
    Config,
    is_int,
    is_real,
    opt,
    optional,
)
from topotuner_lab._io.errors import ProfileError
from topotuner_lab.drift import columns
from topotuner_lab.profiles.card import (
    DEFAULT_NORMALIZATION,
    FIXED_RANKINGS,
    NORMALIZATIONS,
    STRATEGIES,
    TEXT,
    ModelIdentity,
    ProfileCard,
)
from topotuner_lab.weights.projections import KINDS, parse_pid


def param_counts(shapes: dict[str, list[int]]) -> dict[str, int]:
    """Parameters per projection id, from the shapes a card or snapshot records."""
    return {pid: int(np.prod(shape)) for pid, shape in shapes.items()}


def select_projections(
    scores: pd.Series,
    params: dict[str, int],
    total_params: int,
    *,
    descending: bool,
    count: int | None = None,
    fraction: float | None = None,
    per_kind: dict[str, int] | None = None,
) -> tuple[list[str], list[str]]:
    """Rank ids by score and keep those the budget allows.

    The budget keeps the first ``count``, those fitting ``fraction`` of the parameters, or the first
    ``per_kind[kind]`` of each kind (one of the three, already checked by :class:`CardSettings`). Returns
    ``(ranked_ids, selected_ids)``. Ties keep the table order (stable sort).
    """
    ranked = list(scores.sort_values(ascending=not descending, kind="stable").index)
    if per_kind is not None:
        by_kind = {kind: [pid for pid in ranked if parse_pid(pid)[1] == kind] for kind in per_kind}
        short = {kind: len(ids) for kind, ids in by_kind.items() if len(ids) < per_kind[kind]}
        if short:
            raise ProfileError(
                f"per-kind budget {per_kind} asks for more matrices than the model has of kind(s) {short}",
                "ask for at most as many matrices of each kind as the model has",
            )
        picked = {pid for kind, ids in by_kind.items() for pid in ids[: per_kind[kind]]}
        return ranked, [pid for pid in ranked if pid in picked]
    if count is not None:
        if not 1 <= count <= len(ranked):
            raise ProfileError(
                f"count={count} is outside 1..{len(ranked)} (the number of projections)",
                f"pick between 1 and {len(ranked)} matrices",
            )
        return ranked, ranked[:count]
    assert fraction is not None
    limit = fraction * total_params
    smallest = min(params.values())
    if limit < smallest:
        raise ProfileError(
            f"budget {100 * fraction:.3g}% = {limit:,.0f} parameters is below the smallest projection "
            f"({smallest:,} parameters)",
            f"raise the budget to at least {100 * smallest / total_params:.3g}% or give a count",
        )
    chosen: list[str] = []
    used = 0
    for pid in ranked:  # greedy in rank order; skip matrices that no longer fit
        if used + params[pid] <= limit:
            chosen.append(pid)
            used += params[pid]
    return ranked, chosen


def normalized_scores(
    table: pd.DataFrame, metric: str, normalization: str = DEFAULT_NORMALIZATION, noise: Sequence[pd.DataFrame] = ()
) -> pd.Series:
    """``metric`` per projection id, normalized so that matrices of different sizes compare fairly.

    ``raw``: the column itself. ``per-point``: divided by the pretrained diagram's number of points (W sums over
    points, so bigger matrices drift more by size alone). ``relative``: divided by the pretrained diagram's total
    persistence. ``noise-z``: (drift - mean noise drift) / std of the noise drift, over ``noise`` tables of the same
    pretrained matrices against small random perturbations (at least two).
    """
    if normalization not in NORMALIZATIONS:
        raise ProfileError(f"unknown normalization {normalization!r}", f"use one of {', '.join(NORMALIZATIONS)}")
    indexed = table.set_index("pid")
    scores = indexed[metric].astype(float)
    if normalization == "raw":
        return scores
    measure = columns.topological(metric)
    if normalization in ("per-point", "relative"):
        dim = -1 if measure is None else measure.dim
        column = columns.diagram_size(dim, "before") if normalization == "per-point" else columns.total_persistence(dim)
        if measure is None or column not in indexed:
            raise ProfileError(
                f"normalization {normalization!r} needs a topological column (h0_*, h1_*) of a current drift table; "
                f"{metric!r} has no {column!r}",
                "rank by e.g. h0_w1, or recompute the table with `topotuner-lab drift`",
            )
        return scores / indexed[column].astype(float).clip(lower=np.finfo(float).tiny)
    if len(noise) < 2:
        raise ProfileError(
            f"normalization 'noise-z' needs at least two noise drift tables, got {len(noise)}",
            "compute drift of the pretrained snapshot against 2+ perturbed copies (`topotuner-lab perturb --seed N`)",
        )
    floor = pd.concat([n.set_index("pid")[metric].astype(float).reindex(scores.index) for n in noise], axis=1)
    if floor.isna().any().any():
        raise ProfileError(
            "a noise table lacks some projection ids of the drift table",
            "compute the noise tables from the same pretrained snapshot",
        )
    return (scores - floor.mean(axis=1)) / floor.std(axis=1, ddof=1).clip(lower=np.finfo(float).tiny)


def check_table_fits(table: pd.DataFrame, identity: ModelIdentity) -> None:
    """Refuse a drift table of another model: ids, shapes, and the pretrained weight hash it records."""
    unknown = sorted(set(table["pid"]) - set(identity.shapes))
    if unknown:
        raise ProfileError(
            f"drift table ids {unknown[:5]} are not projections of {identity.name}",
            "use a drift table computed for this model",
        )
    differing = [
        p for p, r, c in zip(table["pid"], table["rows"], table["cols"]) if identity.shapes[p] != [int(r), int(c)]
    ]
    if differing:
        raise ProfileError(
            f"drift table shapes differ from the pretrained snapshot at {differing[:5]} "
            f"({identity.shapes[differing[0]]} in the snapshot): the table is of another model",
            "use a drift table computed for this model",
        )
    recorded = table.attrs.get("before_hash")
    if recorded is None:
        warnings.warn(
            "the drift table records no pretrained weight hash (a CSV table, or one written by an older version): "
            "only its ids "
            "and shapes were checked against the pretrained snapshot; Parquet tables carry the hash",
            stacklevel=2,
        )
    elif recorded != identity.weights_hash:
        raise ProfileError(
            f"drift table was computed from weights {str(recorded)[:12]}, the pretrained snapshot has "
            f"{identity.weights_hash[:12]}",
            "build the card from the pretrained snapshot the table was computed from (or recompute the table)",
        )


def _percent(text: str) -> float | str:
    """A budget in percent on the command line, as the fraction the card records (``1`` -> 0.01).

    Text that is no number is passed on for the field's check to refuse.
    """
    try:
        return float(text) / 100
    except ValueError:
        return text


PER_KIND = Check(
    lambda v: isinstance(v, dict) and v and all(k in KINDS and is_int(n) and n >= 0 for k, n in v.items()),
    f"a mapping of projection kind ({', '.join(KINDS)}) to a whole number of matrices",
)


def _per_kind(text: str) -> dict[str, int] | str:
    """``k=5,v=4,o=1`` on the command line as a mapping; other text goes on for the field's check to refuse."""
    try:
        return {kind.strip(): int(n) for kind, n in (part.split("=") for part in text.split(","))}
    except ValueError:
        return text


def kind_composition(card: ProfileCard) -> dict[str, int]:
    """How many of each projection kind a card trains: the per-kind budget of its stratified random control."""
    counts = Counter(parse_pid(pid)[1] for pid in card.trainable)
    return {kind: counts[kind] for kind in KINDS if counts[kind]}


@dataclass(frozen=True)
class CardSettings(Config):
    """How a card is built from a drift table: the options of ``topotuner-lab profile`` and of :func:`build_profile`."""

    label = "card settings"
    error = ProfileError

    prior_task: str = opt(REQUIRED, "the task the drift came from (recorded in the card)", check=TEXT)
    strategy: str = opt("high-drift", "which matrices train", choices=STRATEGIES)
    metric: str = opt(columns.DEFAULT_METRIC, "drift-table column to rank by", check=TEXT)
    normalization: str = opt(
        DEFAULT_NORMALIZATION, "make matrices of different sizes comparable", choices=NORMALIZATIONS
    )
    count: int | None = opt(None, "number of trainable matrices", check=optional(POSITIVE_INT))
    fraction: float | None = opt(
        None,
        "trainable-parameter budget in percent of the model, e.g. 1",
        check=optional(Check(lambda v: is_real(v) and 0 < v <= 1, "a fraction in (0, 1] (0.01 is 1%)")),
        flags=("--budget",),
        parse=_percent,
    )
    per_kind: dict[str, int] | None = opt(
        None,
        "matrices per projection kind, ranked within each kind, e.g. k=5,v=4,o=1 (a random card with a topology "
        "card's composition is the stratified control)",
        check=optional(PER_KIND),
        parse=_per_kind,
    )
    seed: int = opt(0, "seed of the random control", check=NON_NEGATIVE_INT)
    stop_threshold: float | None = opt(
        None, "early-stopping threshold recorded in the card, in (0, 1)", check=optional(OPEN_UNIT)
    )

    def check(self) -> None:
        """Exactly one budget: a count of matrices, a fraction of the parameters, or counts per kind."""
        if sum(b is not None for b in (self.count, self.fraction, self.per_kind)) != 1:
            self.fail(
                "give exactly one of count (matrices), budget fraction or per-kind counts",
                "e.g. count=4, fraction=0.01 for 1% of the model, or per_kind={'k': 2, 'v': 2} (--count 4, --budget 1 "
                "or --per-kind k=2,v=2 on the command line)",
            )


def _budget(count: int | None, fraction: float | None, per_kind: dict[str, int] | None) -> dict[str, Any]:
    """The budget as the card records it."""
    if count is not None:
        return {"count": count}
    return {"fraction": fraction} if per_kind is None else {"per_kind": per_kind}


def build_profile(
    table: pd.DataFrame,
    identity: ModelIdentity,
    *,
    prior_task: str,
    strategy: str = "high-drift",
    metric: str = columns.DEFAULT_METRIC,
    count: int | None = None,
    fraction: float | None = None,
    per_kind: dict[str, int] | None = None,
    seed: int = 0,
    stop_threshold: float | None = None,
    drift_settings: dict[str, Any] | None = None,
    normalization: str = DEFAULT_NORMALIZATION,
    noise: Sequence[pd.DataFrame] = (),
) -> ProfileCard:
    """Build a profile card from a drift table (one row per projection id).

    Parameters
    ----------
    table : drift table (``drift_table`` / ``load_table``), one row per projection id.
    identity : the pretrained model (``ModelIdentity.from_snapshot``); the table must be of this model.
    strategy : ``high-drift``, ``low-drift``, the controls ``random`` and ``magnitude``, or the field's selectors
        ``snr`` (Spectrum), ``alpha`` (WeightWatcher), ``kappa`` (PEFT KappaTune), which rank by their columns
        (:func:`topotuner_lab.drift.signals.with_signals` adds them to a table).
    metric : drift column to rank by (``magnitude`` always ranks by ``rel_frobenius``).
    count, fraction, per_kind : the budget, exactly one: a number of matrices, a fraction in (0, 1] of all model
        parameters (0.01 is 1%; the CLI's ``--budget`` takes percent), or a number of matrices per projection kind
        (ranked within each kind; ``strategy="random"`` with :func:`kind_composition` of a card is its stratified
        control: the same kinds and count, picked at random).
    normalization : one of ``NORMALIZATIONS`` (see :func:`normalized_scores`); ``noise`` tables for ``noise-z``.
    """
    CardSettings(prior_task, strategy, metric, normalization, count, fraction, per_kind, seed, stop_threshold)
    rank_col, descending = FIXED_RANKINGS.get(strategy, (metric, strategy != "low-drift"))
    unranked = strategy == "random" or strategy in FIXED_RANKINGS  # scores that need no size normalization
    if rank_col not in columns.rankable(table):
        raise ProfileError(
            f"drift table has no measure column {rank_col!r}",
            "recompute the table with the magnitude baselines (without --no-magnitude)"
            if strategy == "magnitude"
            else "add the selectors' columns: drift.signals.with_signals(table, pretrained) (the CLI does it)"
            if strategy in FIXED_RANKINGS
            else f"rank by one of {columns.rankable(table)}",
        )
    check_table_fits(table, identity)
    scores = normalized_scores(table, rank_col, "raw" if unranked else normalization, noise)
    if not np.isfinite(scores.to_numpy()).all():
        raise ProfileError(
            f"drift column {rank_col!r} holds NaN or infinite values",
            "recompute the drift table from healthy snapshots",
        )
    if strategy == "random":
        scores = pd.Series(np.random.default_rng(seed).permutation(len(scores)).astype(float), index=scores.index)
    params = param_counts(identity.shapes)
    ranked, chosen = select_projections(
        scores,
        params,
        identity.total_params,
        descending=descending,
        count=count,
        fraction=fraction,
        per_kind=per_kind,
    )
    trainable_params = sum(params[p] for p in chosen)
    order = list(identity.shapes)
    return ProfileCard(
        model=identity,
        prior_task=prior_task,
        strategy=strategy,
        metric=rank_col,
        drift_settings=drift_settings or json.loads(table.attrs.get("settings", "{}")),
        ranking=[{"pid": p, "score": float(scores[p])} for p in ranked],
        trainable=[p for p in order if p in chosen],
        frozen=[p for p in order if p not in chosen],
        trainable_params=trainable_params,
        trainable_fraction=trainable_params / identity.total_params,
        budget={"count": count}
        if count is not None
        else {"fraction": fraction}
        if per_kind is None
        else {"per_kind": per_kind},
        stop_threshold=stop_threshold,
        seed=seed,
        normalization="raw" if unranked else normalization,
    )
