"""The paper's claims checked against a comparison's results, as data.

One :class:`ClaimResult` per claim and setting, with its estimate, bootstrap interval, threshold and verdict;
:mod:`report` renders them.

Only runs at each method's selected learning rate (chosen on validation data) with the linear schedule are
compared. "The card" of a claim is fixed before any run (:func:`topology_card`: the high-drift card of the default
recipe at each budget), never the better of several on any data; each control gets its own claim.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, cast

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from topotuner_lab._io.errors import ParameterError, TaskError
from topotuner_lab.study.claim_ids import ClaimId
from topotuner_lab.study.plan import CONTROLS, DEFAULT_RECIPE, PAPER_LORA, TOPOLOGY, RunKey, with_key_columns
from topotuner_lab.study.power import Design, runs_to_decide_ratio, size_to_decide, two_sided_z
from topotuner_lab.study.presets import CLAIM_MEASURES, DEFAULT_MARGIN_SHARE, Preset
from topotuner_lab.study.stats import (
    HELD,
    INCONCLUSIVE,
    INTERIM,
    LEVEL,
    NOT_HELD,
    PILOT,
    UNTESTABLE,
    Interval,
    bootstrap_ratio,
    conservative,
    holm,
    seed_level_interval,
    seed_level_p,
    two_sided_p,
    two_way_bootstrap,
    verdict,
)
from topotuner_lab.study.stopping import early_by, runs_to_decide_share, share_interval
from topotuner_lab.tasks.registry import get_task
from topotuner_lab.training.early_stopping import EARLIEST_STOP

#: the non-inferiority margin where the runs recorded no zero-shot score to derive it from (runs of earlier versions)
FALLBACK_MARGIN = 0.03
#: the paper: profile fine-tuning 20.4% faster per epoch than full FT and 5.5% faster than LoRA
FASTER_THAN_FULL = 0.8
FASTER_THAN_LORA = 1.0
#: two cards whose trainable shares differ by more than this share of the larger are not compared: the budget, not
#: the choice of matrices, could decide the claim (a per-kind recipe's card can hold far fewer weights than the budget)
SAME_BUDGET_RTOL = 0.1
#: "often stops after 2-3 of 6 epochs": more than this share of the card runs stop by half the budget
EARLY_STOP_SHARE = 0.5


@dataclass(frozen=True)
class ClaimResult:
    """One claim in one setting: what was compared, the estimate with its interval, the threshold, the verdict."""

    claim: str
    setting: str
    measure: str
    estimate: float
    low: float | None
    high: float | None
    threshold: float
    verdict: str
    #: for an inconclusive paired claim: the seeds (or examples) its measured variances say would decide it
    to_decide: str = ""
    #: two-sided bootstrap p-value against the threshold (paired claims), and the claim's role: ``primary`` (the
    #: preset's pre-registered claim) or ``secondary`` (Holm-corrected); empty before :func:`with_holm`
    p_value: float | None = None
    role: str = ""
    #: a difference claim's equivalence band (+-), where it has one
    band: float | None = None
    #: the confidence level of the interval (a group-sequential look's, for the paired claims judged at it)
    level: float = LEVEL
    #: the variance components behind a paired interval (for the size a corrected test needs); not a table column
    design: Design | None = field(default=None, repr=False, compare=False)

    def as_row(self) -> dict[str, object]:
        """The result as a table row (field name to value)."""
        row = asdict(self)
        del row["design"]
        return row


def runs_at_chosen_rate(results: pd.DataFrame) -> pd.DataFrame:
    """Runs at each arm's selected rate with the linear schedule (sweep runs and constant-rate runs left out)."""
    results = with_key_columns(results)
    return results[results["selected"].astype(bool) & (results["schedule"].fillna("linear") == "linear")]


def stopping_runs(results: pd.DataFrame) -> pd.DataFrame:
    """Card runs that say when the stopping rule fires: at the chosen rate, linear and constant schedules."""
    results = with_key_columns(results)
    constant = results["schedule"].fillna("linear") == "constant"
    return results[(results["method"] == "profile") & (results["selected"].astype(bool) | constant)]


def recorded_metric(group: pd.DataFrame) -> str:
    """The primary metric a target's runs record (``acc`` where runs of earlier versions recorded none)."""
    return str(group["metric"].dropna().iloc[0]) if "metric" in group and group["metric"].notna().any() else "acc"


@dataclass(frozen=True)
class Margin:
    """A target's non-inferiority margin and why it is that size."""

    value: float
    reason: str


def competitive_margin(group: pd.DataFrame, share: float = DEFAULT_MARGIN_SHARE) -> Margin:
    """``share`` of the zero-shot -> full FT gain on one target's runs (at the chosen rates), in its own metric.

    The gain is full FT's mean test score over seeds minus the pretrained model's score on the same rows; a target
    with no full FT arm or no recorded zero-shot score falls back to :data:`FALLBACK_MARGIN`, and says so.
    """
    full = group.loc[group["method"] == "full", "test_acc"]
    zero = group["test_acc_before"].dropna() if "test_acc_before" in group else pd.Series(dtype=float)
    if full.empty or zero.empty:
        missing = "no full FT arm" if full.empty else "no zero-shot score recorded"
        return Margin(FALLBACK_MARGIN, f"the fixed {FALLBACK_MARGIN:g} ({missing} to derive it from)")
    gain = float(full.mean() - zero.iloc[0])
    return Margin(
        share * max(gain, 0.0),
        f"{share:g} x the zero-shot -> full FT gain ({zero.iloc[0]:.3f} -> {full.mean():.3f}"
        + (")" if gain > 0 else "; no gain, so no loss is allowed)"),
    )


def _default_cards(group: pd.DataFrame, budget: float) -> pd.DataFrame:
    """The card runs of the default drift recipe at ``budget``."""
    cards = group[(group["method"] == "profile") & (group["budget"] == budget)]
    return cards[cards["recipe"].fillna(DEFAULT_RECIPE) == DEFAULT_RECIPE]


def topology_card(group: pd.DataFrame, budget: float) -> str | None:
    """The card that claims about "the card" judge at ``budget``, named before any run.

    It is the high-drift card of the default recipe (the low-drift card where a comparison ran no high-drift one).

    Picking the better of two cards on validation data would make the treatment a best-of-two against baselines that
    get one shot, so no score enters the choice.
    """
    cards = _default_cards(group, budget)
    for strategy in TOPOLOGY:
        named = cards.loc[cards["strategy"] == strategy, "run"]
        if len(named):
            return str(named.iloc[0])
    return None


def _card_pair(
    claim: ClaimId,
    group: pd.DataFrame,
    setting: str,
    paired: Callable[[pd.DataFrame, str, str], Interval],
    a: str,
    b: str,
    band: float,
    measure: str,
) -> ClaimResult:
    """Card ``a`` minus card ``b`` (threshold 0, equivalence band +- ``band``), judged only at one trainable share."""
    result = _result(claim, setting, f"{a} - {b} ({_scored(group, measure)})", paired(group, a, b), 0.0, band=band)
    return _same_budget(group, result, a, b)


def _same_budget(group: pd.DataFrame, result: ClaimResult, a: str, b: str) -> ClaimResult:
    """``result`` of card ``a`` against card ``b``; *not testable here* where their trainable shares differ.

    A control must differ from the treatment only in the choice of matrices; each arm's share is its mean
    ``trainable_pct`` over seeds (a random card is drawn per seed). Runs that recorded no share are left as judged.
    """
    if "trainable_pct" not in group:
        return result
    share = group.groupby("run")["trainable_pct"].mean()
    sa, sb = float(share.get(a, np.nan)), float(share.get(b, np.nan))
    if not (np.isfinite(sa) and np.isfinite(sb)) or abs(sa - sb) <= SAME_BUDGET_RTOL * max(sa, sb):
        return result
    return replace(
        result, verdict=UNTESTABLE, to_decide=f"both cards at one trainable share (here {sa:.3g}% and {sb:.3g}%)"
    )


def _result(
    claim: ClaimId,
    setting: str,
    measure: str,
    interval: Interval,
    threshold: float,
    higher_is_better: bool = True,
    band: float | None = None,
) -> ClaimResult:
    """One judged claim, with the seeds or examples that would decide it where its interval does not.

    ``band`` is a difference claim's equivalence band (+-): a covered threshold reads *equivalent* when the whole
    interval lies inside it.
    """
    judged = verdict(
        interval, threshold, higher_is_better=higher_is_better, band=None if band is None else (-band, band)
    )
    to_decide = (
        size_to_decide(interval.design, interval.estimate, threshold)
        if judged == INCONCLUSIVE and interval.design is not None
        else ""
    )
    p = two_sided_p(interval.draws, threshold) if interval.draws is not None else None
    if p is not None and interval.seed_diffs is not None:  # the seed-level test too: the larger p-value counts
        p = max(p, seed_level_p(interval.seed_diffs, threshold))
    return ClaimResult(
        str(claim),
        setting,
        measure,
        interval.estimate,
        interval.low,
        interval.high,
        threshold,
        judged,
        to_decide,
        p,
        band=band,
        level=interval.level,
        design=interval.design,
    )


def with_holm(claims: list[ClaimResult], primary: str) -> list[ClaimResult]:
    """The claims with their roles: ``primary`` as judged; the secondary paired claims under Holm's correction.

    A secondary claim that held (or did not hold) by its own interval but whose p-value Holm's step-down procedure
    does not reject over all the secondary paired claims is *inconclusive (Holm)*; claims without a p-value (ratios,
    shares, stability) keep their verdict, and a claim the setup cannot test is not counted in the family.

    A secondary claim that is inconclusive either way has its *to_decide* sized at Bonferroni's level (alpha / family
    size, the strictest bound Holm applies), which is enough for Holm's procedure to reject it wherever it ranks.
    """
    tested = [
        i for i, c in enumerate(claims) if c.claim != primary and c.p_value is not None and c.verdict != UNTESTABLE
    ]
    rejected = dict(zip(tested, holm([cast(float, claims[i].p_value) for i in tested])))
    strictest = two_sided_z((1 - LEVEL) / max(len(tested), 1))

    def holm_size(c: ClaimResult) -> str:
        if c.design is None:
            return ""
        size = size_to_decide(c.design, c.estimate, c.threshold, z=strictest)
        return f"{size} (Holm: at {1 - LEVEL:g}/{len(tested)})"

    out = []
    for index, c in enumerate(claims):
        if c.claim == primary:
            out.append(replace(c, role="primary"))
        elif index in rejected and not rejected[index] and c.verdict in (HELD, NOT_HELD):
            out.append(replace(c, role="secondary", verdict=f"{INCONCLUSIVE} (Holm)", to_decide=holm_size(c)))
        elif index in rejected and c.verdict == INCONCLUSIVE:  # sized for the family, not for a lone 95% interval
            out.append(replace(c, role="secondary", to_decide=holm_size(c)))
        else:
            out.append(replace(c, role="secondary"))
    return out


def pilot_labels(
    claims: list[ClaimResult], pilot: bool = False, *, seeds: int | None = None, prior_seeds: int | None = None
) -> list[ClaimResult]:
    """Verdicts that cannot decide read *pilot*, with the size that would decide them where it can be measured.

    Every claim of a pilot study (``Preset.pilot``) is one; so is any claim resting on one training seed (a paired
    claim whose design has one, or every claim of runs at ``seeds`` < 2: their seed noise is unmeasured) or on fewer
    than :data:`~topotuner_lab.study.stability.MIN_PRIOR_SEEDS` prior seeds (``prior_seeds``: the card every claim
    judges comes from one prior fine-tune, whose own noise is then unmeasured). ``seeds`` and ``prior_seeds`` are
    None for claims they do not bear on (the drift claims judge prior seeds themselves). Claims the setup cannot
    test keep saying so.
    """
    from topotuner_lab.study.stability import MIN_PRIOR_SEEDS  # stability judges claims too: imported when called

    few_priors = prior_seeds is not None and prior_seeds < MIN_PRIOR_SEEDS
    out = []
    for c in claims:
        one_seed = (c.design is not None and c.design.seeds < 2) or (seeds is not None and seeds < 2)
        if c.verdict == UNTESTABLE or not (pilot or one_seed or few_priors):
            out.append(c)
            continue
        size = c.to_decide
        if not size and c.design is not None and c.design.seeds >= 2:
            size = size_to_decide(c.design, c.estimate, c.threshold)
        elif not size and one_seed:
            size = "2 seeds or more to measure the seed noise, then sized from it"
        if few_priors:
            size = f"{MIN_PRIOR_SEEDS} prior seeds or more (here {prior_seeds})" + (f"; {size}" if size else "")
        out.append(replace(c, verdict=PILOT, to_decide=size))
    return out


def interim_labels(
    claims: list[ClaimResult], blocks: Sequence[int], looked: Sequence[int], seeds: int
) -> list[ClaimResult]:
    """Between the looks of a group-sequential study, every verdict of its runs reads *interim*.

    Such a study decides only at its pre-registered looks (``blocks``: seed counts); ``looked`` are the looks it
    has taken (``looks.json``). Runs at ``seeds`` past the last look taken (a look still running, or the next block
    started) show their estimates, and the verdict waits for the next look: judging them now would be a look the
    alpha spending never planned. Claims the setup cannot test keep saying so.
    """
    last = max(looked, default=0)
    if not blocks or seeds <= last:
        return claims
    after = min((b for b in blocks if b > last), default=max(blocks))
    wait = f"judged at the pre-registered look after {after} seeds ({seeds} begun)"
    return [c if c.verdict == UNTESTABLE else replace(c, verdict=INTERIM, to_decide=wait) for c in claims]


def _scored(where: str | pd.DataFrame, measure: str = "accuracy") -> str:
    """``test <metric>`` of a target task (or of a group of runs on one target): what its claims compare."""
    if measure in MEASURE_LABELS:
        return f"test {MEASURE_LABELS[measure]}"
    task = where if isinstance(where, str) else str(where["target"].iloc[0])
    try:
        return f"test {get_task(task).metric_label}"
    except TaskError:  # a spec file that is gone: its results still hold the task's primary metric
        return "test score"


@dataclass(frozen=True)
class ClaimRules:
    """How a comparison's paired claims are judged, fixed in its preset before any run.

    ``margins`` fixes a target's non-inferiority margin (and the difference claims' equivalence band) in the claim
    measure's units; a target without one gets ``margin_share`` of its zero-shot -> full FT gain. ``seed_level``
    widens every paired interval to cover a Student-t interval over the per-seed differences (the verdict must hold
    under both). ``measure`` is what the target-score claims compare per test example: ``accuracy`` (the task
    metric) or ``logprob`` (the gold label's log-probability among the labels, a continuous measure with less
    example noise; label-likelihood tasks only). ``level`` is every paired interval's confidence level (95% at a
    single look, higher at a group-sequential look).
    """

    margin_share: float = DEFAULT_MARGIN_SHARE
    margins: Mapping[str, float] = field(default_factory=dict)
    seed_level: bool = False
    measure: str = "accuracy"
    level: float = LEVEL

    @classmethod
    def of(cls, preset: Preset, seeds_run: int | None = None) -> ClaimRules:
        """The rules a preset fixed before its runs, at the look ``seeds_run`` result seeds reached.

        With ``seed_blocks`` (group-sequential looks) the intervals take the confidence level of the last look the
        seeds reached (the first look's before any), from :func:`~topotuner_lab.study.sequential.look_level`.
        """
        level = LEVEL
        if preset.seed_blocks:
            from topotuner_lab.study.sequential import look_level  # scipy's multivariate normal: only when asked

            reached = [i for i, block in enumerate(preset.seed_blocks) if block <= (seeds_run or 0)]
            fractions = [block / len(preset.seeds) for block in preset.seed_blocks]
            level = look_level(fractions, reached[-1] if reached else 0)
        return cls(preset.margin_share, dict(preset.margins), preset.seed_level, preset.claim_measure, level)

    def margin(self, target: str, group: pd.DataFrame) -> Margin:
        """The target's margin: the fixed one where the preset states it, else a share of the measured gain."""
        if target in self.margins:
            return Margin(float(self.margins[target]), f"{self.margins[target]:g}, fixed in the preset before the runs")
        if self.measure != "accuracy":
            raise ParameterError(
                f"claims measured by {self.measure} on {target} need a margin fixed in the preset",
                f"add {target}: <margin in {self.measure} units> to the preset's margins",
            )
        return competitive_margin(group, self.margin_share)


#: the per-example key a claim measure reads from ``results.json`` (``logprob`` and ``prob`` are derived from the
#: label log-loss)
MEASURE_KEYS = {"accuracy": "test_correct", "logprob": "logprob", "prob": "prob"}
#: how a report names a measure derived from the label log-loss (accuracy takes the task's metric name)
MEASURE_LABELS = {"logprob": "gold-label log-probability (nats)", "prob": "gold-label probability"}


def measure_values(read: Callable[[str, str], Any], run_dir: str, measure: str, *, before: bool = False) -> np.ndarray:
    """A run's per-example test values of ``measure``: after fine-tuning, or zero-shot (``before``) on the same rows.

    ``logprob`` is the gold label's log-probability (minus the recorded log-loss) and ``prob`` its exponential; a run
    that recorded no zero-shot log-loss (older runs) raises ``KeyError``.
    """
    if measure == "accuracy":
        return np.asarray(read(run_dir, "test_correct_before" if before else "test_correct"), dtype=float)
    if measure not in MEASURE_LABELS:
        raise ValueError(f"unknown measure {measure!r}: one of {CLAIM_MEASURES}")
    metrics = read(run_dir, "test_example_metrics_before" if before else "test_example_metrics")
    if not metrics or "logloss" not in metrics:
        raise KeyError(f"{run_dir} recorded no {'zero-shot ' if before else ''}log-loss per example")
    logprob = -np.asarray(metrics["logloss"], dtype=float)
    return logprob if measure == "logprob" else np.exp(logprob)


def paired_interval(a: ArrayLike, b: ArrayLike, seed_level: bool = False, level: float = LEVEL) -> Interval:
    """The two-way bootstrap interval of mean(a) - mean(b) at ``level``, widened to the seed-level one when asked."""
    interval = two_way_bootstrap(a, b, level=level)
    return conservative(interval, seed_level_interval(a, b, level=level)) if seed_level else interval


def claim_results(
    results: pd.DataFrame, correct: Callable[[str, str], list[int]], rules: ClaimRules | None = None
) -> list[ClaimResult]:
    """Every claim for every (prior, target) setting of ``results``, judged by ``rules`` (:class:`ClaimRules`).

    Non-inferiority claims use each target's margin (:meth:`ClaimRules.margin`).

    ``correct(run_dir, key)`` returns a run's per-example list under ``key`` of its ``results.json``
    (``test_correct``, ``ood_correct_after``, ``stop_epoch_test_correct``, ``ppl_nll_before``...); a key the run
    did not record raises ``KeyError``.
    """
    rules = rules or ClaimRules()
    runs = runs_at_chosen_rate(results)
    claims: list[ClaimResult] = []

    def read(run_dir: str, key: str) -> Sequence[float]:
        if key in MEASURE_LABELS:
            return cast(list[float], measure_values(correct, run_dir, key).tolist())
        values = correct(run_dir, key)
        if values is None:  # a probe the run switched off (n_ood 0, n_ppl 0): not recorded
            raise KeyError(key)
        return values

    def stacked(group: pd.DataFrame, name: str, seeds: list[int], key: str) -> np.ndarray:
        rows = group[group["run"] == name].set_index("seed").loc[seeds]
        return np.array([read(run_dir, key) for run_dir in rows["run_dir"]])

    def paired(group: pd.DataFrame, a: str, b: str, key: str = MEASURE_KEYS[rules.measure]) -> Interval:
        seeds = sorted(set(group.loc[group["run"] == a, "seed"]) & set(group.loc[group["run"] == b, "seed"]))
        return paired_interval(
            stacked(group, a, seeds, key), stacked(group, b, seeds, key), rules.seed_level, rules.level
        )

    margins = {t: rules.margin(t, g).value for t, g in runs.groupby("target", sort=False)}
    for (prior, target), group in runs.groupby(["prior", "target"], sort=False):
        setting = f"{prior} -> {target}"
        margin = margins[target]  # the competitive claim's allowance, and the difference claims' equivalence band
        has_full = (group["run"] == "full").any()
        budgets = sorted(group.loc[group["method"] == "profile", "budget"].dropna().unique())
        cards = {b: c for b in budgets if (c := topology_card(group, b))}
        for card in cards.values():
            if has_full:
                claims.append(
                    _result(
                        ClaimId.COMPETITIVE,
                        setting,
                        f"{card} - full ({_scored(target, rules.measure)})",
                        paired(group, card, "full"),
                        -margin,
                    )
                )
                with contextlib.suppress(KeyError):  # runs without a forgetting battery (n_ood 0) make no claim
                    claims.append(
                        _result(
                            ClaimId.LESS_FORGETTING,
                            setting,
                            f"{card} - full (out-of-domain accuracy after)",
                            paired(group, card, "full", "ood_correct_after"),
                            0.0,
                            band=margin,
                        )
                    )
        loras = group[group["method"] == "lora"].drop_duplicates("run").sort_values("run")
        for lora, budget in zip(loras["run"], loras["budget"]):
            if budget in cards:
                claims.append(
                    _result(
                        ClaimId.BEATS_LORA,
                        setting,
                        f"{cards[budget]} - {lora} ({_scored(target, rules.measure)})",
                        paired(group, cards[budget], lora),
                        0.0,
                        band=margin,
                    )
                )
        paper_lora = RunKey("lora", PAPER_LORA).name
        if (group["run"] == paper_lora).any():
            for card in cards.values():
                claims.append(
                    _result(
                        ClaimId.BEATS_PAPER_LORA,
                        setting,
                        f"{card} - {paper_lora} ({_scored(target, rules.measure)})",
                        paired(group, card, paper_lora),
                        0.0,
                        band=margin,
                    )
                )
        claims += _selector_claims(group, setting, paired, margin, cards, rules.measure) + _thesis_claims(
            group, setting, paired, margin, rules.measure
        )
        if has_full:
            for card in cards.values():
                claims += _forgetting_nll_claim(group, setting, card, correct, rules.seed_level, rules.level)
        claims += _stop_accuracy_claims(
            group, setting, correct, margin, list(cards.values()), rules.seed_level, rules.level
        )
        for budget, card in cards.items():
            controls = _default_cards(group, budget)
            for control in sorted(set(controls.loc[controls["strategy"].isin(CONTROLS), "run"])):
                claims.append(
                    _card_pair(ClaimId.BEATS_CONTROLS, group, setting, paired, card, control, margin, rules.measure)
                )
    claims += _speed_claims(runs) + _stopping_claims(results)
    return claims


def _per_seed(group: pd.DataFrame, name: str, read: Callable[[str], Sequence[float]]) -> dict[int, Sequence[float]]:
    """``read(run_dir)`` for each seed's run of arm ``name``."""
    rows = group[group["run"] == name]
    return {int(seed): read(str(run_dir)) for seed, run_dir in zip(rows["seed"], rows["run_dir"])}


def _forgetting_nll_claim(
    group: pd.DataFrame,
    setting: str,
    card: str,
    correct: Callable[[str, str], list[int]],
    seed_level: bool = False,
    level: float = LEVEL,
) -> list[ClaimResult]:
    """Forgetting as the rise of each held-out text's NLL (after - before), the card against full FT, paired.

    Each text counts once (the per-text mean token NLL); runs recorded before the per-text values existed give no
    claim.
    """

    def rise(run_dir: str) -> list[float]:
        after, before = correct(run_dir, "ppl_nll_after"), correct(run_dir, "ppl_nll_before")
        if after is None or before is None:  # no perplexity probe (n_ppl 0)
            raise KeyError("ppl_nll_after")
        return list(np.asarray(after) - np.asarray(before))

    try:
        a, b = _per_seed(group, card, rise), _per_seed(group, "full", rise)
    except KeyError:
        return []
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return []
    x, y = np.array([a[s] for s in seeds]), np.array([b[s] for s in seeds])
    keep = np.isfinite(x).all(axis=0) & np.isfinite(y).all(axis=0)  # one-token texts have no mean NLL
    return [
        _result(
            ClaimId.LESS_FORGETTING_NLL,
            setting,
            f"{card} - full (rise of each held-out text's mean NLL, nats)",
            paired_interval(x[:, keep], y[:, keep], seed_level, level),
            0.0,
            higher_is_better=False,
        )
    ]


def _stop_accuracy_claims(
    group: pd.DataFrame,
    setting: str,
    correct: Callable[[str, str], list[int]],
    margin: float,
    cards: list[str],
    seed_level: bool = False,
    level: float = LEVEL,
) -> list[ClaimResult]:
    """Accuracy at the stop epoch against the same runs' full budget, per topology card (non-inferiority, paired).

    A run whose rule never fired before its last epoch counts at its full budget (a difference of 0): its scores at
    the stop epoch are its final scores (which also keeps graded scores that earlier versions logged per epoch
    truncated to 0/1 out of the claim).
    """
    out = []
    cut = group["stop_epoch"].notna() & (group["stop_epoch"] < group["epochs_run"])
    stopped_early = set(group.loc[cut, "run_dir"])
    for name in cards:

        def at_stop(run_dir: str) -> list[int]:
            stopped = correct(run_dir, "stop_epoch_test_correct") if run_dir in stopped_early else None
            return list(stopped) if stopped else correct(run_dir, "test_correct")

        try:
            stop, full = _per_seed(group, name, at_stop), _per_seed(group, name, lambda d: correct(d, "test_correct"))
        except KeyError:
            continue
        seeds = sorted(stop)
        fired = bool(cut[group["run"] == name].any())
        result = _result(
            ClaimId.STOP_KEEPS_ACCURACY,
            setting,
            f"{name}: accuracy at the stop epoch - after the full budget",
            paired_interval([stop[s] for s in seeds], [full[s] for s in seeds], seed_level, level),
            -margin,
        )
        # a rule that never fired before the full budget says nothing about the accuracy it keeps
        out.append(result if fired else replace(result, verdict=UNTESTABLE))
    return out


def _thesis_claims(
    group: pd.DataFrame,
    setting: str,
    paired: Callable[[pd.DataFrame, str, str], Interval],
    band: float,
    measure: str = "accuracy",
) -> list[ClaimResult]:
    """The direct test of the thesis: the high-drift card against the low-drift card at the same budget and recipe."""
    cards = group[group["method"] == "profile"].drop_duplicates("run")
    out = []
    for (_, _), same in cards.groupby([cards["budget"], cards["recipe"].fillna(DEFAULT_RECIPE)]):
        high, low = (same.loc[same["strategy"] == s, "run"] for s in TOPOLOGY)
        if len(high) and len(low):
            out.append(
                _card_pair(ClaimId.THESIS, group, setting, paired, str(high.iloc[0]), str(low.iloc[0]), band, measure)
            )
    return out


def _selector_claims(
    group: pd.DataFrame,
    setting: str,
    paired: Callable[[pd.DataFrame, str, str], Interval],
    band: float,
    topology: dict[float, str],
    measure: str = "accuracy",
) -> list[ClaimResult]:
    """Each budget's pre-specified topology card (``topology``, :func:`topology_card`) against every other selector.

    The other selectors are the field's (Spectrum SNR, WeightWatcher alpha, PEFT kappa, gradient magnitude), the joint
    drift x magnitude quadrants and the cards of other drift recipes; the controls have their own claim.
    """
    cards = group[group["method"] == "profile"].drop_duplicates("run")
    recipe = cards["recipe"].fillna(DEFAULT_RECIPE)
    out = []
    for budget, name in topology.items():
        at_budget = cards[cards["budget"] == budget]
        others = at_budget[
            ~at_budget["strategy"].isin((*TOPOLOGY, *CONTROLS)) | (recipe[at_budget.index] != DEFAULT_RECIPE)
        ]
        for other in sorted(others["run"]):
            out.append(_card_pair(ClaimId.BEATS_SELECTORS, group, setting, paired, name, other, band, measure))
    return out


def _speed_claims(runs: pd.DataFrame) -> list[ClaimResult]:
    """Seconds per epoch of the card runs against full FT and LoRA, both timed on one machine.

    A study resumed on other machines times its runs on each: a ratio across machines would measure the machines, so
    each comparison is judged on the machine that timed the most runs of both methods (:func:`_one_machine`), and is
    not testable where no machine timed both. Runs of earlier versions recorded no machine: they count as timed where
    the others were when one machine is named, and are left out when several are.
    """
    out = []
    for name, threshold, claim in (
        ("full", FASTER_THAN_FULL, ClaimId.FASTER_THAN_FULL),
        ("lora", FASTER_THAN_LORA, ClaimId.FASTER_THAN_LORA),
    ):
        both = runs[runs["method"].isin(("profile", name))]
        if not ((both["method"] == "profile").any() and (both["method"] == name).any()):
            continue
        timed, setting = _one_machine(both, name)
        judged = both if timed is None else timed
        ratio = bootstrap_ratio(
            judged.loc[judged["method"] == "profile", "sec_per_epoch"],
            judged.loc[judged["method"] == name, "sec_per_epoch"],
        )
        measure = f"median profile / median {name} seconds per epoch"
        result = _result(claim, setting, measure, ratio, threshold, higher_is_better=False)
        if result.verdict == INCONCLUSIVE:  # sized by the rarer method's runs, which bound the interval
            rarer = int(judged["method"].value_counts().min())
            result = replace(
                result, to_decide=runs_to_decide_ratio(ratio.estimate, ratio.low, ratio.high, threshold, rarer)
            )
        out.append(result if timed is not None else replace(result, verdict=UNTESTABLE))  # it measures the machines
    return out


def _one_machine(both: pd.DataFrame, other: str) -> tuple[pd.DataFrame | None, str]:
    """(the card and ``other`` runs of the one machine that timed most of both, or None; the setting it names).

    "Most of both" is the larger count of the rarer method, then the larger total: a machine with 4 runs of each
    beats one with 5 card runs and 1 full FT run. Where several machines are named, a run without one is left out
    (where it was timed is unknown).
    """
    machine = both["machine"] if "machine" in both else pd.Series(None, index=both.index, dtype=object)
    named = machine.dropna().unique()
    if len(named) <= 1:
        return both, "all settings"
    counts = {}
    for m in sorted(named):
        methods = both.loc[machine == m, "method"]
        rarer = min(int((methods == "profile").sum()), int((methods == other).sum()))
        if rarer:
            counts[m] = (rarer, len(methods))
    if not counts:
        return None, f"all settings, timed on {len(named)} machines, none of which timed both"
    best = max(counts, key=lambda m: counts[m])
    return both[machine == best], (
        f"all settings, timed on {best} ({counts[best][1]} of {len(both)} runs; those timed on {len(named) - 1} other "
        f"machine(s) or with no machine recorded left out)"
    )


def _stopping_claims(results: pd.DataFrame) -> list[ClaimResult]:
    """The share of card runs that stop by half the budget, with an exact binomial interval, per schedule.

    "Often stops after 2-3 of 6 epochs" is read as: most runs (more than half) stop by epoch 3 of 6 (half the
    budget, :func:`~topotuner_lab.study.stopping.early_by`); a run that never stopped did not stop early. Where
    most runs stop at the earliest epoch the rule allows, that majority is the rule's floor, not a sign the training
    had settled (a fixed epoch would give the same): the claim is then not testable here.
    """
    out = []
    cards = stopping_runs(results)
    for schedule, group in cards.groupby(cards["schedule"].fillna("linear")):
        budget = int(group["epochs_run"].max())
        by = early_by(budget)
        early = int((group["stop_epoch"].notna() & (group["stop_epoch"] <= by)).sum())
        at_floor = int((group["stop_epoch"] == EARLIEST_STOP).sum())
        claim = ClaimId.STOPS_EARLY if schedule == "linear" else ClaimId.STOPS_EARLY_CONSTANT_LR
        result = _result(
            claim,
            f"{schedule} schedule, {len(group)} runs",
            f"share of runs stopped by epoch {by} of {budget} (the card runs of every strategy; exact binomial "
            f"interval; {at_floor} at epoch {EARLIEST_STOP}, the earliest the rule allows)",
            share_interval(early, len(group)),
            EARLY_STOP_SHARE,
        )
        if by < EARLIEST_STOP:  # too few epochs: even the earliest possible stop misses it
            result = replace(result, verdict=UNTESTABLE)
        elif len(group) < (needed := runs_to_decide_share(EARLY_STOP_SHARE)):  # no outcome of so few runs decides
            result = replace(result, verdict=UNTESTABLE, to_decide=f"{needed} runs or more")
        elif at_floor > EARLY_STOP_SHARE * len(group):  # the majority sits at the rule's floor
            result = replace(
                result,
                verdict=UNTESTABLE,
                to_decide=f"a threshold or budget at which most runs do not stop at epoch {EARLIEST_STOP}",
            )
        out.append(result)
    return out


def paper_count(claims: list[ClaimResult], claim: str = ClaimId.BEATS_PAPER_LORA) -> str:
    """The paper's way of counting one claim ("beats LoRA in 7 of 9 settings"), beside what the intervals say.

    The paper counts settings (model x task) where the card's score is above LoRA's; here a setting is one transfer
    at one card budget, the count is by the point estimate, and the verdicts say how many of those the intervals
    decide.
    """
    rows = [c for c in claims if c.claim == claim]
    if not rows:
        return ""
    ahead = sum(c.estimate > c.threshold for c in rows)
    held = sum(c.verdict == HELD for c in rows)
    return (
        f"The card {claim} in {ahead} of {len(rows)} settings (a setting: one transfer at one card budget) by the "
        f"point estimate (the paper's count); its interval clears zero in {held} of {len(rows)}."
    )


def paper_speed(claims: list[ClaimResult]) -> str:
    """The speed claims as the paper states them: how much less time per epoch a card run takes (its 20.4% and 5.5%)."""
    paper = {ClaimId.FASTER_THAN_FULL: ("full FT", 20.4), ClaimId.FASTER_THAN_LORA: ("LoRA", 5.5)}
    parts = [
        f"{abs(100 * (1 - c.estimate)):.1f}% {'less' if c.estimate <= 1 else 'more'} than {name} (the paper: {share}%)"
        for c in claims
        for claim, (name, share) in paper.items()
        if c.claim == claim
    ]
    return f"A card run takes {' and '.join(parts)} of the time per epoch, median against median." if parts else ""


def claims_frame(claims: list[ClaimResult]) -> pd.DataFrame:
    """The claim results as a table, one row each."""
    return pd.DataFrame([c.as_row() for c in claims])


def level_percent(level: float) -> str:
    """A confidence level as a report writes it: 0.95 -> "95%", a look's 0.99443 -> "99.44%"."""
    return f"{100 * level:.4g}%"


def common_level(claims: Sequence[ClaimResult]) -> str | None:
    """The claims' shared confidence level (:func:`level_percent`), or None where their levels differ."""
    levels = {c.level for c in claims}
    return level_percent(levels.pop()) if len(levels) == 1 else None


def summary_verdict(claims: list[ClaimResult], claim: str) -> str:
    """One verdict for a claim over its settings: held or did not hold only when every setting agrees."""
    verdicts = {c.verdict for c in claims if c.claim == claim}
    return verdicts.pop() if len(verdicts) == 1 else INCONCLUSIVE
