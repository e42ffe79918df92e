"""Comparing two profile cards: does a profile transfer, and do two tasks or models pick alike.

On the same model the cards' ids can be matched one to one (overlap, Jaccard index, rank
agreement). Across models the ids differ, so the comparison falls back to what the paper reads
off its profiles: which projection kinds get the trainable budget, and at what relative depth.

Before any card, :func:`selector_scores` and :func:`rank_agreement` ask how alike the strategies
rank one drift table's projections (topology, magnitude, the field's selectors, the joint selector).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
from scipy.stats import spearmanr

from topotuner_lab._io.errors import ProfileError
from topotuner_lab.drift import columns
from topotuner_lab.profiles.card import DEFAULT_NORMALIZATION, ProfileCard
from topotuner_lab.profiles.select import param_counts, strategy_scores
from topotuner_lab.weights.projections import KINDS, parse_pid


@dataclass(frozen=True)
class CardComparison:
    """What two cards share and how they differ; ``labels`` name them in tables and figures."""

    labels: tuple[str, str]
    same_model: bool
    both: list[str]
    only_a: list[str]
    only_b: list[str]
    jaccard: float | None  # trainable-set overlap; None across models
    rank_spearman: (
        float | None
    )  # Spearman of the two cards' pick orders (first pick = rank 1); -1 = opposite ends; None across models
    kind_share: pd.DataFrame  # share of each card's trainable parameters per projection kind (rows q, k, v, o)
    mean_depth: tuple[float, float]  # mean relative depth (0 = first layer, 1 = last) of each card's trainable ids

    def summary(self) -> pd.DataFrame:
        """One row per measure, for display beside the figure."""
        a, b = self.labels
        rows = {
            "same model": self.same_model,
            "trainable in both": len(self.both),
            f"only in {a}": len(self.only_a),
            f"only in {b}": len(self.only_b),
            "Jaccard index of the trainable sets": self.jaccard,
            "Spearman correlation of the pick orders (+1 same order, -1 opposite ends)": self.rank_spearman,
            f"mean relative depth, {a}": self.mean_depth[0],
            f"mean relative depth, {b}": self.mean_depth[1],
        }
        return pd.DataFrame({"value": list(rows.values())}, index=list(rows))


def _kind_share(card: ProfileCard) -> pd.Series:
    params = param_counts(card.model.shapes)
    per_kind = pd.Series({kind: 0 for kind in KINDS}, dtype=float)
    for pid in card.trainable:
        per_kind[parse_pid(pid)[1]] += params[pid]
    return per_kind / max(1.0, per_kind.sum())


def _mean_depth(card: ProfileCard) -> float:
    last = max(parse_pid(pid)[0] for pid in card.model.shapes)
    return sum(parse_pid(pid)[0] for pid in card.trainable) / len(card.trainable) / max(1, last)


def compare_cards(a: ProfileCard, b: ProfileCard, labels: tuple[str, str] = ("A", "B")) -> CardComparison:
    """Compare two cards' selections (same model: id by id; other models: by kind and depth).

    Parameters
    ----------
    a, b : ProfileCard
        The two cards.
    labels : tuple of str, default ("A", "B")
        Their names in the comparison's tables and figures.

    Returns
    -------
    CardComparison
        ``same_model``; on the same model the ids in ``both``, ``only_a``, ``only_b``, the Jaccard index of the
        trainable sets and the Spearman correlation of the two pick orders (None across models); always each card's
        share of trainable parameters per kind (``kind_share``) and mean relative depth; ``summary()`` as a table.

    Raises
    ------
    AttributeError
        ``a`` or ``b`` is not a :class:`ProfileCard`.

    Examples
    --------
    The two ends of the authors' published ordering pick disjoint sets, in opposite orders:

    >>> from topotuner_lab import compare_cards, upstream_card
    >>> high = upstream_card("Qwen3-8B-Base", size=3)
    >>> low = upstream_card("Qwen3-8B-Base", size=3, strategy="low-drift")
    >>> result = compare_cards(high, low, labels=("high", "low"))
    >>> result.same_model, result.jaccard, result.rank_spearman < -0.9
    (True, 0.0, True)
    >>> result.kind_share.round(3)["high"].to_dict()
    {'q': 0.667, 'k': 0.167, 'v': 0.167, 'o': 0.0}
    """
    same = a.model.weights_hash == b.model.weights_hash and a.model.shapes == b.model.shapes
    set_a, set_b = set(a.trainable), set(b.trainable)
    jaccard = spearman = None
    if same:
        jaccard = len(set_a & set_b) / len(set_a | set_b)
        # each card's ranking is ordered by its own strategy (high-drift: largest first, low-drift: smallest first), so
        # positions, not raw scores, say whether two cards would pick the same matrices first
        order_a = {r["pid"]: i for i, r in enumerate(a.ranking)}
        order_b = {r["pid"]: i for i, r in enumerate(b.ranking)}
        common = sorted(set(order_a) & set(order_b))
        if len(common) > 2:
            spearman = float(spearmanr([order_a[p] for p in common], [order_b[p] for p in common]).statistic)
    return CardComparison(
        labels=labels,
        same_model=same,
        both=sorted(set_a & set_b) if same else [],
        only_a=sorted(set_a - set_b) if same else sorted(set_a),
        only_b=sorted(set_b - set_a) if same else sorted(set_b),
        jaccard=jaccard,
        rank_spearman=spearman,
        kind_share=pd.DataFrame({labels[0]: _kind_share(a), labels[1]: _kind_share(b)}),
        mean_depth=(_mean_depth(a), _mean_depth(b)),
    )


#: correlations :func:`rank_agreement` offers (both compare rankings, not values)
RANK_METHODS: tuple[str, ...] = ("spearman", "kendall")


def selector_scores(
    table: pd.DataFrame,
    strategies: Sequence[str],
    metric: str = columns.DEFAULT_METRIC,
    normalization: str = DEFAULT_NORMALIZATION,
    *,
    noise: Sequence[pd.DataFrame] = (),
    seed: int = 0,
) -> pd.DataFrame:
    """Each strategy's scores of the table's projections, signed so that higher is picked first.

    One row per projection id (index ``pid``), one column per strategy, from the ranking a card of that strategy
    fills its budget from (:func:`~topotuner_lab.profiles.select.strategy_scores`; ``low-drift`` and ``kappa`` are
    negated). A joint strategy's scores are its unpooled ranking (the reference's pool over every projection): a card
    also pools at its budget. ``metric``, ``normalization``, ``noise`` and ``seed`` are the card options of the same
    names; the table needs the columns of every strategy (``with_signals``, ``with_gradient_signal``).
    """
    scores = {s: strategy_scores(table, s, metric, normalization, noise, seed=seed).oriented() for s in strategies}
    frame = pd.DataFrame(scores, columns=list(strategies))
    frame.index.name = "pid"
    return frame


def rank_agreement(scores: pd.DataFrame, method: str = "spearman") -> pd.DataFrame:
    """The rank correlation of every pair of columns of :func:`selector_scores`: a square frame, 1 on the diagonal.

    +1: two strategies pick in the same order; -1: in opposite order (high-drift against low-drift); a column with a
    single value (no ranking) correlates as NaN.
    """
    if method not in RANK_METHODS:
        raise ProfileError(f"unknown rank correlation {method!r}", f"use one of {', '.join(RANK_METHODS)}")
    return scores.corr(method=method)
