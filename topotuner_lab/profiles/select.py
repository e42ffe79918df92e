"""Which projections a card trains: rank a drift column (normalized across matrix sizes) and fill a budget.

A card keeps the top-k high-drift or low-drift projections trainable, k given as a count, a trainable-parameter
budget or counts per projection kind (:func:`matched_per_kind` turns a parameter budget into the same count per kind).
Random and magnitude-ranked cards with the same budget are the controls; the field's selectors (Spectrum's SNR,
WeightWatcher's alpha, KappaTune's kappa, the target task's gradient magnitude) and the authors' joint drift x
magnitude selector rank at the same budget. :func:`strategy_scores` is the one ranking every card and comparison uses.
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
from topotuner_lab.drift.tables import drift_columns
from topotuner_lab.profiles.card import (
    DEFAULT_NORMALIZATION,
    FIXED_RANKINGS,
    JOINT,
    NORMALIZATIONS,
    STRATEGIES,
    TEXT,
    ModelIdentity,
    ProfileCard,
    recipe_of,
)
from topotuner_lab.profiles.prior import prior_record
from topotuner_lab.weights.projections import KINDS, parse_pid

#: noise tables noise-z needs: its standard deviation from fewer draws is too rough to divide by (2 draws: the
#: estimate's own relative error is ~70%; 5: ~35%)
MIN_NOISE_DRAWS = 5


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
    order: Sequence[str] | None = None,
) -> tuple[list[str], list[str]]:
    """Rank ids by score and keep those the budget allows.

    The budget keeps the first ``count``, those fitting ``fraction`` of the parameters, or the first
    ``per_kind[kind]`` of each kind (one of the three, already checked by :class:`CardSettings`). Returns
    ``(ranked_ids, selected_ids)``. Ties keep the table order (stable sort). ``order``, when given, is the ranking
    itself (a joint strategy's pool first, see :func:`joint_ranking`) and ``scores`` are only recorded.
    """
    if order is None:
        order = scores.sort_values(ascending=not descending, kind="stable").index
    ranked = list(order)
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
            f"raise the budget fraction to at least {smallest / total_params:.3g} or give a count",
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
    pretrained matrices against small random perturbations (at least :data:`MIN_NOISE_DRAWS`).
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
    if len(noise) < MIN_NOISE_DRAWS:
        raise ProfileError(
            f"normalization 'noise-z' needs at least {MIN_NOISE_DRAWS} noise drift tables (its standard deviation "
            f"comes from them), got {len(noise)}",
            f"compute drift of the pretrained snapshot against {MIN_NOISE_DRAWS}+ perturbed copies "
            "(`topotuner-lab perturb --seed N`), or use per-point",
        )
    floor = pd.concat([n.set_index("pid")[metric].astype(float).reindex(scores.index) for n in noise], axis=1)
    if floor.isna().any().any():
        raise ProfileError(
            "a noise table lacks some projection ids of the drift table",
            "compute the noise tables from the same pretrained snapshot",
        )
    return (scores - floor.mean(axis=1)) / floor.std(axis=1, ddof=1).clip(lower=np.finfo(float).tiny)


#: below this a pool's sum of drift or magnitude counts as zero (the reference scripts' epsilon)
_EPS = 1e-12


def _pool_scores(
    drift: pd.Series, magnitude: pd.Series, high_drift: bool, high_magnitude: bool, size: int | None
) -> tuple[pd.Series, set[str]]:
    """One group's joint scores and its pool (all ids when ``size`` is None); see :func:`joint_ranking`."""
    if size is None:
        pool = set(drift.index)
    else:
        by_drift = drift.sort_values(ascending=not high_drift, kind="stable").index[:size]
        by_magnitude = magnitude.sort_values(ascending=not high_magnitude, kind="stable").index[:size]
        pool = set(by_drift) | set(by_magnitude)
    members = [pid for pid in drift.index if pid in pool]
    sum_w, sum_n = float(drift[members].sum()), float(magnitude[members].sum())
    w_hat = drift / sum_w if sum_w > _EPS else drift * 0.0
    n_hat = magnitude / sum_n if sum_n > _EPS else magnitude * 0.0
    return ((w_hat if high_drift else 1 - w_hat) + (n_hat if high_magnitude else 1 - n_hat)) / 2, pool


def joint_ranking(
    drift: pd.Series, magnitude: pd.Series, strategy: str, k: int | dict[str, int] | None = None
) -> tuple[pd.Series, list[str]]:
    """The authors' joint drift x magnitude ranking (HH/HL/LH/LL): scores by id, and the order they pick in.

    As in FDataLab/TopoTuner ``codes/helpers/joint_wass_norm_layer_selection.py``: the pool is the ``k`` ids of the
    strategy's end of the drift ranking together with the ``k`` of its end of the magnitude ranking (``joint-hl``:
    highest drift, lowest magnitude); drift and magnitude are divided by their sums over the pool; the score is the
    mean of the two, each taken as ``x`` (high) or ``1 - x`` (low); pool members rank first by score, best first,
    then the rest by the same score. ``k`` a mapping of kind to count pools and normalizes each projection kind on
    its own (the scripts' per-projection ranking); None pools every id (the ranking without a budget). Both inputs
    must be non-negative (the sums normalize them).
    """
    high_drift, high_magnitude = JOINT[strategy]
    if (drift < 0).any() or (magnitude < 0).any():
        raise ProfileError(
            f"the joint strategy {strategy!r} divides drift and magnitude by their sums, which needs non-negative "
            "scores",
            "rank by a Wasserstein or bottleneck column with normalization raw, per-point or relative",
        )
    if isinstance(k, dict):
        kinds = pd.Series([parse_pid(pid)[1] for pid in drift.index], index=drift.index)
        groups = [(list(ids), k.get(kind) or None) for kind, ids in kinds.groupby(kinds, sort=False).groups.items()]
    else:
        groups = [(list(drift.index), k)]
    scores, pooled = pd.Series(np.nan, index=drift.index, dtype=float), set()
    for ids, size in groups:
        group_scores, pool = _pool_scores(drift[ids], magnitude[ids], high_drift, high_magnitude, size)
        scores[ids] = group_scores
        pooled |= pool
    by_score = list(scores.sort_values(ascending=False, kind="stable").index)
    return scores, [pid for pid in by_score if pid in pooled] + [pid for pid in by_score if pid not in pooled]


@dataclass(frozen=True)
class Ranking:
    """A strategy's scores of a drift table's projections, before a budget picks from them.

    ``scores`` by projection id (table order); ``descending`` whether the highest is picked first; ``column`` the
    column ranked by (the card's ``metric``) and ``normalization`` the one applied; ``parts`` a joint strategy's
    drift and magnitude scores, which its budget pools (:func:`joint_ranking`).
    """

    scores: pd.Series
    descending: bool
    column: str
    normalization: str
    parts: tuple[pd.Series, pd.Series] | None = None

    def oriented(self) -> pd.Series:
        """The scores signed so that higher is picked first."""
        return self.scores if self.descending else -self.scores


def _missing_column(strategy: str, column: str, table: pd.DataFrame) -> ProfileError:
    """The error for a drift table without the column ``strategy`` ranks by, with the way to add it."""
    if column == FIXED_RANKINGS["magnitude"][0]:
        fix = "recompute the table with the magnitude baselines (without --no-magnitude)"
    elif strategy == "gradient":
        fix = (
            "add the target task's gradient magnitudes: training.transfer.with_gradient_signal(table, loaded, task) "
            "(the CLI does it with --gradient-task TASK --model MODEL)"
        )
    elif strategy == "relchange":
        fix = (
            "add the element-wise relative change from the pretrained to the prior fine-tune's weights: "
            "drift.signals.with_relchange(table, pretrained, after)"
        )
    elif strategy in FIXED_RANKINGS:
        fix = "add the selectors' columns: drift.signals.with_signals(table, pretrained) (the CLI does it)"
    else:
        fix = f"rank by one of {columns.rankable(table)}"
    return ProfileError(f"drift table has no measure column {column!r}", fix)


def _finite(scores: pd.Series, column: str) -> pd.Series:
    if not np.isfinite(scores.to_numpy()).all():
        raise ProfileError(
            f"drift column {column!r} holds NaN or infinite values", "recompute the drift table from healthy snapshots"
        )
    return scores


def strategy_scores(
    table: pd.DataFrame,
    strategy: str,
    metric: str = columns.DEFAULT_METRIC,
    normalization: str = DEFAULT_NORMALIZATION,
    noise: Sequence[pd.DataFrame] = (),
    *,
    seed: int = 0,
) -> Ranking:
    """How ``strategy`` scores the projections of ``table``: the ranking :func:`build_profile` fills a budget from.

    ``high-drift``/``low-drift`` rank ``metric`` normalized by ``normalization`` (:func:`normalized_scores`);
    :data:`FIXED_RANKINGS` strategies rank their own column, raw; ``random`` a permutation drawn with ``seed``; the
    :data:`JOINT` strategies the joint score of the normalized ``metric`` and ``rel_frobenius`` over all
    projections (a card's budget then pools them, :func:`joint_ranking`).
    """
    if strategy not in STRATEGIES:
        raise ProfileError(f"unknown strategy {strategy!r}", f"use one of {', '.join(STRATEGIES)}")
    column, descending = FIXED_RANKINGS.get(strategy, (metric, strategy != "low-drift"))
    unranked = strategy == "random" or strategy in FIXED_RANKINGS  # scores that need no size normalization
    magnitude_column = FIXED_RANKINGS["magnitude"][0]
    for needed in [column, *([magnitude_column] if strategy in JOINT else [])]:
        if needed not in columns.rankable(table):
            raise _missing_column(strategy, needed, table)
    used = "raw" if unranked else normalization
    scores = _finite(normalized_scores(table, column, used, noise), column)
    if strategy in JOINT:
        magnitude = _finite(table.set_index("pid")[magnitude_column].astype(float), magnitude_column)
        joint, _ = joint_ranking(scores, magnitude, strategy)
        return Ranking(joint, True, column, used, (scores, magnitude))
    if strategy == "random":
        scores = pd.Series(np.random.default_rng(seed).permutation(len(scores)).astype(float), index=scores.index)
    return Ranking(scores, descending, column, used)


def matched_per_kind(
    shapes: dict[str, list[int]], total_params: int, fraction: float, kinds: Sequence[str] | None = None
) -> dict[str, int]:
    """The per-kind budget of a parameter ``fraction``: the same count of each kind, the largest that fits.

    Whatever a per-kind ranking picks, ``n`` matrices of each of ``kinds`` (default: every kind the model has) hold
    at most the ``n`` largest of each kind; ``n`` is the largest count whose worst case fits ``fraction`` of
    ``total_params`` (every matrix of a kind has one shape in the usual models, so that is the exact count). A
    per-kind card (the reference recipe ranks within each projection type) so compares with a global card at the
    same budget.
    """
    sizes: dict[str, list[int]] = {}
    for pid, n in param_counts(shapes).items():
        sizes.setdefault(parse_pid(pid)[1], []).append(n)
    wanted = [kind for kind in KINDS if kind in sizes] if kinds is None else list(dict.fromkeys(kinds))
    absent = [kind for kind in wanted if kind not in sizes]
    if absent or not wanted:
        raise ProfileError(
            f"the model has no projections of kind(s) {absent or list(kinds or [])}",
            f"match over kinds it has: {', '.join(kind for kind in KINDS if kind in sizes)}",
        )
    largest = {kind: sorted(sizes[kind], reverse=True) for kind in wanted}
    limit = fraction * total_params
    best = 0
    for n in range(1, min(len(v) for v in largest.values()) + 1):
        if sum(sum(v[:n]) for v in largest.values()) > limit:
            break
        best = n
    if best == 0:
        one_each = sum(v[0] for v in largest.values())
        raise ProfileError(
            f"budget {100 * fraction:.3g}% = {limit:,.0f} parameters is below one matrix of each kind "
            f"({', '.join(wanted)}: {one_each:,} parameters)",
            f"raise the budget fraction to at least {one_each / total_params:.3g}, or give per-kind counts",
        )
    return {kind: best for kind in wanted}


def check_table_fits(table: pd.DataFrame, identity: ModelIdentity, *, allow_partial: bool = False) -> None:
    """Refuse a drift table that does not fit the model, or whose drift is not a distance.

    Refused: a table of another model (ids, shapes, the pretrained weight hash it records); one that lacks some of
    the model's projections, unless ``allow_partial`` (a card leaves those frozen without ranking them); a negative
    value in a drift column (a table edited by hand, or damaged).
    """
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
    missing = [p for p in identity.shapes if p not in set(table["pid"])]
    if missing and not allow_partial:
        raise ProfileError(
            f"drift table covers {len(identity.shapes) - len(missing)} of the {len(identity.shapes)} projections of "
            f"{identity.name} (missing {missing[:5]}{' ...' if len(missing) > 5 else ''}): a card would leave the "
            "others frozen without ranking them",
            "compute drift over every projection of the model, or allow it (allow_partial=True; `profile "
            "--allow-partial-table`) to rank only the table's projections",
        )
    negative = {c: table.loc[pd.to_numeric(table[c], errors="coerce") < 0, "pid"] for c in drift_columns(table)}
    negative = {c: pids for c, pids in negative.items() if len(pids)}
    if negative:
        raise ProfileError(
            "drift table holds negative drift ("
            + "; ".join(f"{c} at {list(pids)[:5]}" for c, pids in negative.items())
            + "): drift is a distance, never below 0, so the table was edited or damaged",
            "compute the table again with `topotuner-lab drift BEFORE AFTER -o FILE.parquet`",
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
    """How a card is built from a drift table: the options of ``topotuner-lab profile`` and of :func:`build_profile`.

    Parameters
    ----------
    prior_task : str
        The task the drift came from (recorded in the card).
    strategy : str, default "high-drift"
        Which matrices train: one of ``STRATEGIES`` (see :func:`build_profile`).
    metric : str, default "h0_w1"
        Drift-table column to rank by.
    normalization : {"per-point", "raw", "relative", "noise-z"}
        How matrices of different sizes are made comparable (default ``per-point``).
    count : int or None
        Budget as a number of trainable matrices.
    fraction : float or None
        Budget as a fraction in (0, 1] of the model's parameters (0.01 is 1%).
    per_kind : dict of str to int, or None
        Budget as matrices per projection kind (``{"k": 2, "v": 2}``), ranked within each kind.
    per_kind_budget : bool, default False
        With ``fraction``: the same number of matrices of each kind, the most that fits the budget.
    seed : int, default 0
        Seed of the random control.
    stop_threshold : float or None
        Early-stopping threshold recorded in the card, in (0, 1).
    allow_partial : bool, default False
        Accept a drift table without some of the model's projections (they stay frozen).

    Raises
    ------
    ProfileError
        A field out of its range or choices, not exactly one budget, ``per_kind_budget`` without ``fraction``, or a
        joint strategy with ``noise-z``.

    Examples
    --------
    >>> from topotuner_lab import CardSettings
    >>> settings = CardSettings(prior_task="sst2", fraction=0.01)  # 1% of the model's parameters, high drift
    >>> settings.strategy, settings.normalization, settings.metric
    ('high-drift', 'per-point', 'h0_w1')
    >>> CardSettings(prior_task="sst2", count=2, fraction=0.01)
    Traceback (most recent call last):
    topotuner_lab._io.errors.ProfileError: card settings: give exactly one of count (matrices), budget fraction ...
    """

    label = "card settings"
    error = ProfileError

    prior_task: str = opt(REQUIRED, "the task the drift came from (recorded in the card)", check=TEXT)
    strategy: str = opt("high-drift", "which matrices train", choices=STRATEGIES)
    metric: str = opt(columns.DEFAULT_METRIC, "drift-table column the strategy ranks by", check=TEXT)
    normalization: str = opt(
        DEFAULT_NORMALIZATION, "make matrices of different sizes comparable", choices=NORMALIZATIONS
    )
    count: int | None = opt(None, "number of trainable matrices", check=optional(POSITIVE_INT))
    fraction: float | None = opt(
        None,
        "trainable-parameter budget as a fraction of the model's parameters, e.g. 0.01 for 1%",
        check=optional(Check(lambda v: is_real(v) and 0 < v <= 1, "a fraction in (0, 1] (0.01 is 1%)")),
    )
    per_kind: dict[str, int] | None = opt(
        None,
        "matrices per projection kind, ranked within each kind, e.g. k=5,v=4,o=1 (a random card with a topology "
        "card's composition is the stratified control)",
        check=optional(PER_KIND),
        parse=_per_kind,
    )
    per_kind_budget: bool = opt(
        False,
        "with a fraction budget: rank within each projection kind, the same number of each kind, the most that fits "
        "the budget (a per-kind card at a global card's budget)",
    )
    seed: int = opt(0, "seed of the random control", check=NON_NEGATIVE_INT)
    stop_threshold: float | None = opt(
        None, "early-stopping threshold recorded in the card, in (0, 1)", check=optional(OPEN_UNIT)
    )
    allow_partial: bool = opt(
        False,
        "accept a drift table without some of the model's projections: the card ranks the table's and leaves the "
        "others frozen (else such a table is refused)",
        flags=("--allow-partial-table",),
    )

    def check(self) -> None:
        """Exactly one budget (a count, a fraction, counts per kind); a matched per-kind budget needs a fraction."""
        if sum(b is not None for b in (self.count, self.fraction, self.per_kind)) != 1:
            self.fail(
                "give exactly one of count (matrices), budget fraction or per-kind counts",
                "e.g. count=4, fraction=0.01 for 1% of the model, or per_kind={'k': 2, 'v': 2} (--count 4, "
                "--budget-fraction 0.01 or --per-kind k=2,v=2 on the command line)",
            )
        if self.per_kind_budget and self.fraction is None:
            self.fail(
                "per_kind_budget turns a fraction budget into counts per kind, and no fraction was given",
                "give the fraction with it (--budget-fraction 0.01 --per-kind-budget), or per-kind counts alone",
            )
        if self.strategy in JOINT and self.normalization == "noise-z":
            self.fail(
                f"strategy {self.strategy!r} divides drift by its sum over the pool (the reference scripts' scheme), "
                "and noise-z scores can be negative",
                "use normalization raw, per-point or relative with a joint strategy",
            )


def _budget(count: int | None, fraction: float | None, per_kind: dict[str, int] | None) -> dict[str, Any]:
    """The budget as the card records it."""
    if count is not None:
        return {"count": count}
    return {"fraction": fraction} if per_kind is None else {"per_kind": per_kind}


def build_profile(
    table: pd.DataFrame,
    identity: ModelIdentity,
    settings: CardSettings,
    *,
    noise: Sequence[pd.DataFrame] = (),
    drift_settings: dict[str, Any] | None = None,
) -> ProfileCard:
    """Build a profile card from a drift table (one row per projection id).

    Parameters
    ----------
    table : pandas.DataFrame
        Drift table (``drift_table`` / ``load_table``), one row per projection id. The card records its drift
        settings and their recipe, and ``attrs["aggregation"]`` (``final`` unless the table says ``mean``).
    identity : ModelIdentity
        The pretrained model (``ModelIdentity.from_snapshot``); the table must be of this model.
    settings : CardSettings
        How the card is chosen (checked when it is made): the prior task, the
        strategy, the metric, the normalization, exactly one budget, the seed, the stop threshold, ``allow_partial``.

        - ``strategy``: ``high-drift``, ``low-drift``, the controls ``random`` and ``magnitude``, the field's
          selectors ``snr`` (Spectrum), ``alpha`` (WeightWatcher), ``kappa`` (PEFT KappaTune), which rank by their
          columns (:func:`topotuner_lab.drift.signals.with_signals` adds them to a table), ``gradient`` (the target
          task's gradient magnitude ``grad_norm``, added with its task by ``training.transfer.with_gradient_signal``;
          the card records the task), or the authors' joint selectors ``joint-hh``, ``joint-hl``, ``joint-lh``,
          ``joint-ll`` (drift high/low, magnitude high/low; :func:`joint_ranking`, pooled at the budget's count).
        - ``metric``: drift column to rank by (``magnitude`` always ranks by ``rel_frobenius``).
        - ``count``, ``fraction``, ``per_kind``: the budget, exactly one: a number of matrices, a fraction in (0, 1]
          of all model parameters (0.01 is 1%, as ``--budget-fraction`` takes it), or a number of matrices per
          projection kind (ranked within each kind; ``strategy="random"`` with :func:`kind_composition` of a card is
          its stratified control: the same kinds and count, picked at random).
        - ``per_kind_budget``: with ``fraction``, the per-kind budget :func:`matched_per_kind` makes of it (the card
          records the per-kind counts).
        - ``normalization``: one of ``NORMALIZATIONS`` (see :func:`normalized_scores`).
        - ``allow_partial``: accept a table without some of the model's projections (they stay frozen, unranked);
          else such a table is refused, as is one of another model or with negative drift (:func:`check_table_fits`).
    noise : sequence of pandas.DataFrame
        Noise-floor tables, for ``normalization="noise-z"``.
    drift_settings : dict, optional
        The drift settings the table was computed with, recorded in the card (default: the table's
        ``attrs["settings"]``).

    Returns
    -------
    ProfileCard
        The card: the ranking, the trainable and frozen ids in model order, the budget and where it all came from.

    Raises
    ------
    ProfileError
        The table does not fit ``identity`` (another model or weights, missing projections without ``allow_partial``,
        negative drift), lacks the column the strategy ranks by or holds NaN there, or the budget cannot be met (a
        count beyond the projections, a fraction below the smallest matrix).

    Examples
    --------
    >>> import numpy as np
    >>> from topotuner_lab import DriftCache, DriftSettings, Snapshot, drift_table, perturb_snapshot
    >>> rng = np.random.default_rng(0)
    >>> matrices = {f"L{i}.{k}": rng.standard_normal((8, 4), dtype=np.float32) for i in (0, 1) for k in "qkvo"}
    >>> before = Snapshot(matrices, "toy", "toy", "r0", "llama", total_params=1000)
    >>> after = perturb_snapshot(before, scale=0.1, seed=1)  # stands in for a fine-tuned copy
    >>> table = drift_table(before, after, DriftSettings(maxdim=0), n_jobs=1, cache=DriftCache(None))
    >>> from topotuner_lab import CardSettings, ModelIdentity, build_profile
    >>> card = build_profile(table, ModelIdentity.from_snapshot(before), CardSettings(prior_task="sst2", count=2))
    >>> len(card.trainable), len(card.frozen), card.trainable_params, card.trainable_fraction
    (2, 6, 64, 0.064)
    >>> sorted(entry["pid"] for entry in card.ranking[:2]) == sorted(card.trainable)  # the two highest, in model order
    True
    """
    ranking = strategy_scores(
        table, settings.strategy, settings.metric, settings.normalization, noise, seed=settings.seed
    )
    check_table_fits(table, identity, allow_partial=settings.allow_partial)
    gradient_task = table.attrs.get("gradient_task") if settings.strategy == "gradient" else None
    if settings.strategy == "gradient" and not isinstance(gradient_task, str):
        raise ProfileError(
            "the drift table's grad_norm column records no task (table.attrs['gradient_task'])",
            "add the column with training.transfer.with_gradient_signal(table, loaded, task), which records the task",
        )
    count, fraction, per_kind = settings.count, settings.fraction, settings.per_kind
    if settings.per_kind_budget:
        assert fraction is not None  # checked by CardSettings
        per_kind, fraction = matched_per_kind(identity.shapes, identity.total_params, fraction), None
    params = param_counts(identity.shapes)
    budget: dict[str, Any] = {"count": count, "fraction": fraction, "per_kind": per_kind}
    scores, order = ranking.scores, None
    if ranking.parts is not None:  # a joint strategy pools at the budget's count, as the reference scripts do
        k = count if count is not None else per_kind
        if k is None:  # a fraction: the count it admits from the unpooled ranking
            k = len(select_projections(scores, params, identity.total_params, descending=True, **budget)[1])
        scores, order = joint_ranking(*ranking.parts, settings.strategy, k)
    ranked, chosen = select_projections(
        scores, params, identity.total_params, descending=ranking.descending, order=order, **budget
    )
    trainable_params = sum(params[p] for p in chosen)
    recorded = drift_settings or json.loads(table.attrs.get("settings", "{}"))
    in_model_order = list(identity.shapes)
    return ProfileCard(
        model=identity,
        prior_task=settings.prior_task,
        prior_spec=prior_record(settings.prior_task),
        strategy=settings.strategy,
        metric=ranking.column,
        drift_settings=recorded,
        ranking=[{"pid": p, "score": float(scores[p])} for p in ranked],
        trainable=[p for p in in_model_order if p in chosen],
        frozen=[p for p in in_model_order if p not in chosen],
        trainable_params=trainable_params,
        trainable_fraction=trainable_params / identity.total_params,
        budget=_budget(count, fraction, per_kind),
        stop_threshold=settings.stop_threshold,
        seed=settings.seed,
        normalization=ranking.normalization,
        recipe=recipe_of(recorded),
        aggregation=table.attrs.get("aggregation", "final"),
        gradient_task=gradient_task,
    )
