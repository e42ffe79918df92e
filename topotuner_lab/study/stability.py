"""Whether a card's picks survive another prior run, and whether which kinds drift depends on the model family.

Both questions are asked of the cards that several prior fine-tunes (``Preset.prior_seeds``) would build:

- **stability**: the Jaccard index of the trainable sets of every pair of prior seeds, against what cards built the
  same way from noise-only drift tables share (the pretrained weights against perturbed copies: :func:`noise_null`).
  Those cards agree far more than random cards of the same sizes (:func:`random_jaccard`, shown beside), since a
  normalized ranking carries the matrices' own structure whatever moved them; picks that agree across prior seeds
  no more than noise-only cards agree with each other show no stability of their own.
- **ranking noise per matrix**: each matrix's ranking score with a t-interval over the prior seeds, and how many
  seeds' cards pick it (:func:`drift_over_seeds`); the Spearman correlation of the whole ranking per seed pair.
- **model dependence**: the share of value and output matrices among a card's picks, per model, with an interval
  over the prior seeds. The paper reports that LLaMA and Mistral drift in V/O and Qwen in K/Q.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from itertools import combinations

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from topotuner_lab.profiles.card import ProfileCard
from topotuner_lab.study.claim_ids import ClaimId
from topotuner_lab.study.claims import ClaimResult
from topotuner_lab.study.power import ON_THRESHOLD, ON_THRESHOLD_TOL, Z95
from topotuner_lab.study.stats import (
    INCONCLUSIVE,
    LEVEL,
    N_BOOT,
    PILOT,
    UNTESTABLE,
    Interval,
    bootstrap_stat,
    percentile_interval,
    verdict,
)
from topotuner_lab.weights.projections import KINDS, parse_pid

#: the kinds the paper says LLaMA/Mistral drift in (the rest, q and k, it says Qwen drifts in)
VALUE_OUTPUT: tuple[str, ...] = ("v", "o")
#: architectures (``model_type``) of the families the paper names, by family
FAMILIES: dict[str, str] = {
    "llama": "LLaMA",
    "mistral": "Mistral",
    "qwen2": "Qwen",
    "qwen3": "Qwen",
    "gemma3_text": "Gemma",
    "gemma3": "Gemma",
}
#: prior seeds per model (per card) below which the bootstrap over seeds is too coarse for a verdict
MIN_PRIOR_SEEDS = 3
#: checkpoints per family below which a difference between two checkpoints cannot stand for their families (one
#: checkpoint confounds its family with its size, quantization and training)
MIN_CHECKPOINTS_PER_FAMILY = 2
#: families the paper says drift in V/O, and the families it places at all (Qwen: in K/Q)
VO_FAMILIES: tuple[str, ...] = ("LLaMA", "Mistral")
PAPER_FAMILIES: tuple[str, ...] = (*VO_FAMILIES, "Qwen")


def jaccard(a: Sequence[str], b: Sequence[str]) -> float:
    """Shared picks over all picks of two cards (1: the same set; 0: nothing in common)."""
    sa, sb = set(a), set(b)
    return len(sa & sb) / len(sa | sb) if sa | sb else 1.0


def random_jaccard(n: int, k_a: int, k_b: int, *, draws: int = 20_000, seed: int = 0) -> float:
    """The expected Jaccard index of two random sets of ``k_a`` and ``k_b`` ids out of ``n`` (simulated)."""
    rng = np.random.default_rng(seed)
    a = rng.random((draws, n)).argsort(axis=1) < k_a
    b = rng.random((draws, n)).argsort(axis=1) < k_b
    inter, union = (a & b).sum(axis=1), (a | b).sum(axis=1)
    return float(np.mean(inter / np.maximum(union, 1)))


def ranking_scores(card: ProfileCard) -> pd.Series:
    """The score a card ranked each projection by (its strategy's, in its normalization), by projection id."""
    return pd.Series({entry["pid"]: float(entry["score"]) for entry in card.ranking}, dtype=float)


def stability_table(cards: Mapping[int, ProfileCard]) -> pd.DataFrame:
    """One row per pair of prior seeds: Jaccard of their picks, what random cards would share, rank agreement.

    ``spearman`` correlates the two cards' whole rankings: how alike they rank beyond the picks.
    """
    rows = []
    for (sa, a), (sb, b) in combinations(sorted(cards.items()), 2):
        n = len(a.trainable) + len(a.frozen)
        pair = pd.concat([ranking_scores(a), ranking_scores(b)], axis=1, join="inner")
        rows.append(
            {
                "seed_a": sa,
                "seed_b": sb,
                "picks_a": len(a.trainable),
                "picks_b": len(b.trainable),
                "jaccard": jaccard(a.trainable, b.trainable),
                "random_jaccard": random_jaccard(n, len(a.trainable), len(b.trainable)),
                "spearman": float(pair.corr(method="spearman").iloc[0, 1]),
            }
        )
    return pd.DataFrame(rows)


def noise_null(cards: Mapping[int, ProfileCard], noise_cards: Mapping[int, ProfileCard]) -> pd.DataFrame:
    """The null a card's stability must beat: Jaccard of every pair of noise-only cards, and of each card with each.

    ``cards`` are the prior seeds' cards, ``noise_cards`` the cards the same settings give from each noise-only drift
    table (by noise seed). One row per pair: ``pair`` is ``noise-noise`` (the null distribution) or ``card-noise``
    (how much a prior seed's card shares with noise-only picks).
    """
    rows = [
        {
            "pair": "noise-noise",
            "seed_a": a,
            "seed_b": b,
            "jaccard": jaccard(noise_cards[a].trainable, noise_cards[b].trainable),
        }
        for a, b in combinations(sorted(noise_cards), 2)
    ]
    rows += [
        {
            "pair": "card-noise",
            "seed_a": a,
            "seed_b": b,
            "jaccard": jaccard(cards[a].trainable, noise_cards[b].trainable),
        }
        for a in sorted(cards)
        for b in sorted(noise_cards)
    ]
    return pd.DataFrame(rows, columns=["pair", "seed_a", "seed_b", "jaccard"])


def noise_null_sentence(null: pd.DataFrame) -> str:
    """One sentence read off :func:`noise_null`: how much noise-only cards share with each other and with the cards."""
    noise_pairs = null[null["pair"] == "noise-noise"]
    inner, cross = noise_pairs["jaccard"], null.loc[null["pair"] == "card-noise", "jaccard"]
    if inner.empty:
        return ""
    tables = len(set(noise_pairs["seed_a"]) | set(noise_pairs["seed_b"]))
    span = lambda v: f"{v.min():.2f}-{v.max():.2f}" if len(v) > 1 else f"{v.iloc[0]:.2f}"  # noqa: E731
    return (
        f"The null: cards built the same way from the {tables} noise-only drift tables share a Jaccard index of "
        f"{span(inner)} with each other (mean {inner.mean():.2f})"
        + (f" and {span(cross)} with the prior seeds' cards" if len(cross) else "")
        + "."
    )


def stability_sentence(pairs: pd.DataFrame, over: pd.DataFrame) -> str:
    """One sentence read off :func:`stability_table` and :func:`drift_over_seeds` of the same cards."""
    picked = over[over["picked_by"] > 0]
    seeds = int(over["seeds"].iloc[0]) if len(over) else 0
    every = int((picked["picked_by"] == seeds).sum())
    if pairs.empty:
        return f"One prior run only: {len(picked)} matrices picked, nothing to compare them with."
    span = lambda column: (
        f"{pairs[column].min():.2f}"
        + (  # noqa: E731
            f"-{pairs[column].max():.2f}" if len(pairs) > 1 else ""
        )
    )
    return (
        f"Across {seeds} prior runs the picks share a Jaccard index of {span('jaccard')} (random cards of the same "
        f"size: {pairs['random_jaccard'].mean():.2f}), the whole rankings agree at Spearman {span('spearman')}, and "
        f"{every} of {len(picked)} matrices are picked by every run."
    )


def drift_over_seeds(cards: Mapping[int, ProfileCard]) -> pd.DataFrame:
    """Per matrix: its ranking score's mean over the prior seeds with a 95% t-interval, and how many seeds pick it.

    Sorted by the mean, highest first. An interval needs two seeds or more (NaN with one); with three it is wide by
    construction (t = 4.3), which is the honest size of three prior runs.
    """
    frame = pd.DataFrame({seed: ranking_scores(cards[seed]) for seed in sorted(cards)})
    n = frame.shape[1]
    mean = frame.mean(axis=1)
    half = (
        scipy_stats.t.ppf(0.5 + LEVEL / 2, n - 1) * frame.std(axis=1, ddof=1) / np.sqrt(n)
        if n > 1
        else pd.Series(np.nan, index=frame.index)
    )
    picked = Counter(pid for card in cards.values() for pid in card.trainable)
    out = pd.DataFrame(
        {
            "mean": mean,
            "low": mean - half,
            "high": mean + half,
            "picked_by": [picked.get(pid, 0) for pid in frame.index],
            "seeds": n,
        },
        index=frame.index,
    )
    out.index.name = "pid"
    return out.sort_values("mean", ascending=False)


def prior_seeds_to_decide(jaccards: Sequence[float], estimate: float, threshold: float, seeds: int) -> str:
    """The prior seeds whose pairs would bring the 95% half-width of the mean Jaccard below its gap to the threshold.

    The normal approximation over the measured spread of the pairs, as if they were independent (k seeds give
    k(k-1)/2 pairs): pairs share seeds, so the count is a floor. The estimate is assumed to stay where it is.
    """
    gap = abs(estimate - threshold)
    if gap < ON_THRESHOLD_TOL:
        return ON_THRESHOLD
    if len(jaccards) < 2:
        return "a second pair to measure the spread"
    pairs = math.ceil((Z95 * float(np.std(jaccards, ddof=1)) / gap) ** 2)
    k = seeds + 1
    while k * (k - 1) // 2 < pairs:
        k += 1
    return f"~{k} prior seeds or more ({k * (k - 1) // 2} pairs; pairs share seeds, so this is a floor)"


def stability_claim(table: pd.DataFrame, setting: str, null: pd.DataFrame | None = None) -> ClaimResult | None:
    """Whether picks agree across prior seeds more than cards from noise-only drift tables do (mean over pairs).

    ``null`` is :func:`noise_null` of the same cards: the mean Jaccard of its noise-only card pairs is the threshold.
    Without noise tables the threshold is what random cards of the same sizes share, a null any normalized ranking
    beats by structure alone, which the measure then says. The interval resamples the seed pairs, which share seeds,
    so it is optimistic; with three prior seeds it rests on three pairs: read it as a first look, not a test. Fewer
    than :data:`MIN_PRIOR_SEEDS` seeds get no verdict; an inconclusive one names the prior seeds that would decide
    it (:func:`prior_seeds_to_decide`).
    """
    if table.empty:
        return None
    interval = bootstrap_stat(table["jaccard"].to_numpy(float), stat=np.mean)
    inner = null.loc[null["pair"] == "noise-noise", "jaccard"] if null is not None else pd.Series(dtype=float)
    threshold = float(inner.mean()) if len(inner) else float(table["random_jaccard"].mean())
    against = (
        f"cards from noise-only drift tables, mean over {len(inner)} pairs"
        if len(inner)
        else "random cards of the same size, no noise tables"
    )
    seeds = len(set(table["seed_a"]) | set(table["seed_b"]))
    judged = verdict(interval, threshold) if seeds >= MIN_PRIOR_SEEDS else UNTESTABLE
    return ClaimResult(
        ClaimId.PICKS_HOLD.value,
        setting,
        f"mean Jaccard of the picks over {len(table)} pairs of prior seeds (threshold: {against})",
        interval.estimate,
        interval.low,
        interval.high,
        threshold,
        judged,
        prior_seeds_to_decide(table["jaccard"], interval.estimate, threshold, seeds) if judged == INCONCLUSIVE else "",
    )


def kind_counts(card: ProfileCard) -> dict[str, int]:
    """Picks per projection kind, every kind listed."""
    counts = Counter(parse_pid(pid)[1] for pid in card.trainable)
    return {kind: counts[kind] for kind in KINDS}


def value_output_share(card: ProfileCard) -> float:
    """The share of a card's picks that are value or output matrices."""
    counts = kind_counts(card)
    total = sum(counts.values())
    return sum(counts[k] for k in VALUE_OUTPUT) / total if total else float("nan")


def family(architecture: str) -> str:
    """The model family of an architecture name (``model_type``), or the name itself when the paper names none."""
    return FAMILIES.get(architecture, architecture)


def _difference_interval(a: np.ndarray, b: np.ndarray, *, n_boot: int = N_BOOT, seed: int = 0) -> Interval:
    """Mean of ``a`` minus mean of ``b``, prior seeds resampled within each model (percentile interval)."""
    rng = np.random.default_rng(seed)
    draws = rng.choice(a, (n_boot, len(a))).mean(axis=1) - rng.choice(b, (n_boot, len(b))).mean(axis=1)
    return percentile_interval(float(a.mean() - b.mean()), draws, LEVEL)


def model_dependence_claims(shares: Mapping[str, tuple[str, Sequence[float]]]) -> list[ClaimResult]:
    """The V/O share of the picks, first model minus each other model, with intervals over prior seeds.

    ``shares`` maps a model's name to ``(architecture, [V/O share per prior seed])``, the main model first. Where the
    paper names both families and puts exactly one of them in V/O, the claim is that one's share is the larger;
    other pairs are reported the same way, marked as not a paper claim. The interval is over prior seeds of two
    checkpoints; where either family has fewer than :data:`MIN_CHECKPOINTS_PER_FAMILY` checkpoints here, a verdict
    would credit the family with what may be the checkpoint's size, quantization or training, so it reads *pilot*.
    """
    names = list(shares)
    checkpoints = Counter(family(architecture) for architecture, _ in shares.values())
    claims: list[ClaimResult] = []
    first = names[0]
    arch_a, a = shares[first]
    for other in names[1:]:
        arch_b, b = shares[other]
        fam_a, fam_b = family(arch_a), family(arch_b)
        paper = (fam_a in VO_FAMILIES) != (fam_b in VO_FAMILIES) and {fam_a, fam_b} <= set(PAPER_FAMILIES)
        sign = 1.0 if fam_a in VO_FAMILIES or not paper else -1.0
        interval = _difference_interval(np.asarray(a, float), np.asarray(b, float))
        if sign < 0:
            interval = Interval(-interval.estimate, -interval.high, -interval.low, interval.level)
        lead, trail = (first, other) if sign > 0 else (other, first)
        judged = verdict(interval, 0.0) if min(len(a), len(b)) >= MIN_PRIOR_SEEDS else UNTESTABLE
        few = {fam: checkpoints[fam] for fam in (fam_a, fam_b) if checkpoints[fam] < MIN_CHECKPOINTS_PER_FAMILY}
        to_decide = ""
        if few and judged != UNTESTABLE:
            judged = PILOT
            here = ", ".join(f"{count} {fam}" for fam, count in few.items())
            to_decide = f"{MIN_CHECKPOINTS_PER_FAMILY} checkpoints or more per family (here {here})"
        claims.append(
            ClaimResult(
                (ClaimId.KINDS_DEPEND_ON_FAMILY if paper else ClaimId.KINDS_DEPEND_ON_FAMILY_UNCLAIMED).value,
                f"{lead} ({family(shares[lead][0])}) vs {trail} ({family(shares[trail][0])})",
                f"V/O share of the high-drift picks, {lead} - {trail} (prior seeds: {len(a)} and {len(b)})",
                interval.estimate,
                interval.low,
                interval.high,
                0.0,
                judged,
                to_decide,
            )
        )
    return claims
