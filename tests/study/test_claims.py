"""Claims as data: paired bootstrap intervals, three-way verdicts, and which runs a claim compares."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from scipy.stats import t as scipy_t
from scipy.stats import ttest_1samp

from topotuner_lab._io.errors import ParameterError
from topotuner_lab.study.claim_ids import ClaimId
from topotuner_lab.study.claims import (
    FALLBACK_MARGIN,
    ClaimRules,
    Margin,
    claim_results,
    competitive_margin,
    pilot_labels,
    runs_at_chosen_rate,
    stopping_runs,
    summary_verdict,
    topology_card,
)
from topotuner_lab.study.stats import (
    HELD,
    INCONCLUSIVE,
    NOT_HELD,
    PILOT,
    UNTESTABLE,
    Interval,
    bootstrap_ratio,
    bootstrap_stat,
    conservative,
    paired_bootstrap,
    seed_level_interval,
    seed_level_p,
    two_way_bootstrap,
    verdict,
)


def test_paired_bootstrap_centres_on_the_difference_and_narrows_with_pairing():
    rng = np.random.default_rng(0)
    base = rng.random(800) < 0.7
    better = base | (rng.random(800) < 0.2)  # the same examples right, plus some more
    interval = paired_bootstrap(better.astype(int), base.astype(int))
    assert interval.estimate == pytest.approx(better.mean() - base.mean())
    assert 0 < interval.low < interval.estimate < interval.high
    seeds = np.stack([better, better]).astype(int)  # several seeds are averaged per example first
    assert paired_bootstrap(seeds, np.stack([base, base]).astype(int)).estimate == pytest.approx(interval.estimate)
    with pytest.raises(ValueError, match=r"same non-empty examples on both sides, got \(2,\) and \(3,\)"):
        paired_bootstrap([1, 0], [1, 0, 1])


_RNG = np.random.default_rng(0)
_A, _B = (_RNG.random(200) < 0.6).astype(int), (_RNG.random(200) < 0.5).astype(int)
_X, _Y = _RNG.normal(8.0, 1.0, 30), _RNG.normal(10.0, 1.0, 30)


@pytest.mark.parametrize(
    "boot",
    [
        pytest.param(lambda seed: paired_bootstrap(_A, _B, n_boot=500, seed=seed), id="paired_bootstrap"),
        pytest.param(lambda seed: bootstrap_ratio(_X, _Y, n_boot=500, seed=seed), id="bootstrap_ratio"),
        pytest.param(lambda seed: bootstrap_stat(_X, n_boot=500, seed=seed), id="bootstrap_stat"),
    ],
)
def test_bootstrap_intervals_repeat_per_seed_and_move_with_it(boot):
    first, again, other = boot(3), boot(3), boot(4)
    assert first == again
    assert other.estimate == first.estimate  # the estimate is the data's; only the resampling moves
    assert (other.low, other.high) != (first.low, first.high)


def test_verdicts_are_three_way():
    assert verdict(Interval(0.05, 0.01, 0.09)) == HELD
    assert verdict(Interval(-0.05, -0.09, -0.01)) == NOT_HELD
    assert verdict(Interval(0.01, -0.02, 0.04)) == INCONCLUSIVE
    assert verdict(Interval(-0.01, -0.02, 0.0), -FALLBACK_MARGIN) == HELD  # within the non-inferiority margin
    assert verdict(Interval(0.7, 0.6, 0.75), 0.8, higher_is_better=False) == HELD  # a time ratio below 0.8
    ratio = bootstrap_ratio([8.0, 8.2, 7.9], [10.0, 10.1, 9.9])
    assert ratio.estimate == pytest.approx(0.8) and ratio.low <= ratio.estimate <= ratio.high < 0.85


def _results(card_correct, full_correct, lora_correct, control_correct, val=(0.8, 0.7)):
    rows, correct = [], {}
    for seed in (0, 1):
        for run, values, val_acc in (
            ("full", full_correct, 0.9),
            ("profile:high-drift@0.01", card_correct, val[0]),
            ("profile:low-drift@0.01", 1 - np.asarray(card_correct), val[1]),
            ("profile:random@0.01", control_correct, 0.5),
            ("profile:magnitude@0.01", 1 - np.asarray(control_correct), 0.4),
            ("lora@0.01", lora_correct, 0.6),
        ):
            run_dir = f"{run}/seed{seed}"
            correct[(run_dir, "test_correct")] = list(values)
            correct[(run_dir, "ood_correct_after")] = list(values)
            rows.append(
                {
                    "prior": "sst2",
                    "target": "agnews",
                    "seed": seed,
                    "run": run,
                    "lr": 1e-4,
                    "schedule": "linear",
                    "selected": True,
                    "val_acc": val_acc,
                    "test_acc": float(np.mean(values)),
                    "sec_per_epoch": 10.0 if run == "full" else 6.0,
                    "epochs_run": 4,
                    "stop_epoch": 2 if run.startswith("profile") else None,
                    "run_dir": run_dir,
                }
            )
    rows.append(
        {**rows[1], "run": "profile:high-drift@0.01", "selected": False, "val_acc": 0.99, "run_dir": "sweep"}
    )  # a sweep run
    return pd.DataFrame(rows), lambda run_dir, key: correct[(run_dir, key)]


def test_claims_compare_the_pre_specified_card_and_judge_each_claim():
    rng = np.random.default_rng(1)
    full = (rng.random(600) < 0.8).astype(int)
    card = full.copy()
    card[:90] = 0  # 15 points worse than full FT everywhere it was right there
    lora = (rng.random(600) < 0.3).astype(int)
    # the low-drift card and the magnitude control score better on validation: no claim may pick them for it
    control = (rng.random(600) < 0.5).astype(int)
    results, correct = _results(card, full, lora, control_correct=control, val=(0.7, 0.8))
    results.loc[results["run"] == "profile:magnitude@0.01", "val_acc"] = 0.95
    assert "sweep" not in set(runs_at_chosen_rate(results)["run_dir"])  # sweep runs never enter a claim
    every = claim_results(results, correct)
    claims = {c.claim: c for c in every}
    competitive = claims[ClaimId.COMPETITIVE]
    assert competitive.measure == "profile:high-drift@0.01 - full (test accuracy)"  # named before the runs
    assert claims[ClaimId.BEATS_LORA].measure.startswith("profile:high-drift@0.01 - lora@0.01")
    assert claims[ClaimId.LESS_FORGETTING].measure.startswith("profile:high-drift@0.01 - full")
    controls = [c.measure for c in every if c.claim == ClaimId.BEATS_CONTROLS]
    assert controls == [
        "profile:high-drift@0.01 - profile:magnitude@0.01 (test accuracy)",
        "profile:high-drift@0.01 - profile:random@0.01 (test accuracy)",
    ]  # one claim per control, not the better control
    assert competitive.verdict == NOT_HELD and competitive.high < competitive.threshold == -FALLBACK_MARGIN
    assert claims[ClaimId.BEATS_LORA].verdict == HELD
    assert claims[ClaimId.FASTER_THAN_FULL].verdict == HELD  # 6 s vs 10 s per epoch
    assert claims[ClaimId.STOPS_EARLY].estimate == 1.0  # every card run by epoch 2 of 4 ...
    assert claims[ClaimId.STOPS_EARLY].verdict == "not testable here"  # ... which is the rule's earliest
    assert summary_verdict(list(claims.values()), ClaimId.BEATS_LORA) == HELD
    # the thesis: low drift is the complement of the high-drift card's correctness here, so high drift wins
    thesis = claims[ClaimId.THESIS]
    assert thesis.measure == "profile:high-drift@0.01 - profile:low-drift@0.01 (test accuracy)"
    assert thesis.verdict == HELD and thesis.estimate > 0


def test_the_topology_card_is_named_by_strategy_and_recipe_never_by_a_score():
    def cards(*specs):
        return pd.DataFrame(
            [{"method": "profile", "run": run, "strategy": s, "budget": b, "recipe": r, "val_acc": v}
             for run, s, b, r, v in specs]
        )  # fmt: skip

    both = cards(
        ("profile:low-drift@0.01", "low-drift", 0.01, None, 0.9),
        ("profile:high-drift[reference]@0.01", "high-drift", 0.01, "reference", 0.95),
        ("profile:high-drift@0.01", "high-drift", 0.01, "default", 0.1),
        ("profile:high-drift@0.02", "high-drift", 0.02, "default", 0.5),
    )
    assert topology_card(both, 0.01) == "profile:high-drift@0.01"  # not the better low-drift or reference card
    assert topology_card(both, 0.02) == "profile:high-drift@0.02"
    assert topology_card(both.iloc[:2], 0.01) == "profile:low-drift@0.01"  # no default high-drift card: low drift
    assert topology_card(both.iloc[1:2], 0.01) is None  # only another recipe's card
    assert topology_card(both, 0.05) is None


def test_selectors_are_compared_with_the_same_named_card_as_every_other_claim():
    rng = np.random.default_rng(3)
    full, lora, control = ((rng.random(300) < q).astype(int) for q in (0.8, 0.3, 0.5))
    results, correct = _results(full.copy(), full, lora, control)
    results = results[results["run_dir"] != "sweep"]
    results["run"] = results["run"].replace("profile:high-drift@0.01", "profile:snr@0.01")  # no high-drift card ran
    every = claim_results(results, correct)
    named = {c.measure.split(" - ")[0] for c in every if c.claim == ClaimId.COMPETITIVE}
    assert named == {"profile:low-drift@0.01"}
    selectors = [c.measure for c in every if c.claim == ClaimId.BEATS_SELECTORS]
    assert selectors == ["profile:low-drift@0.01 - profile:snr@0.01 (test accuracy)"]


def test_cards_at_different_trainable_shares_are_not_compared():
    """A control differs only in its matrices: a per-kind recipe's card at 2/3 of the budget is not judged."""
    rng = np.random.default_rng(3)
    full, lora, control = ((rng.random(300) < q).astype(int) for q in (0.8, 0.3, 0.5))
    results, correct = _results(full.copy(), full, lora, control)
    results["trainable_pct"] = np.where(results["run"].str.startswith("profile"), 0.99, 0.5)
    controls = [c for c in claim_results(results, correct) if c.claim == ClaimId.BEATS_CONTROLS]
    assert UNTESTABLE not in {c.verdict for c in controls}
    results.loc[results["run"] == "profile:random@0.01", "trainable_pct"] = 0.66
    results.loc[results["run"] == "profile:low-drift@0.01", "trainable_pct"] = 0.95  # within 10%: still compared
    every = claim_results(results, correct)
    random = [c for c in every if c.measure.startswith("profile:high-drift@0.01 - profile:random@0.01")]
    assert random[0].verdict == UNTESTABLE and random[0].to_decide == (
        "both cards at one trainable share (here 0.99% and 0.66%)"
    )
    thesis = {c.claim: c for c in every}[ClaimId.THESIS]
    assert thesis.verdict == HELD  # 0.99% vs 0.95%
    assert {c.claim: c for c in every}[ClaimId.BEATS_LORA].verdict != UNTESTABLE  # card vs LoRA is another claim


def test_the_margin_is_a_share_of_the_zero_shot_to_full_ft_gain():
    rng = np.random.default_rng(1)
    full = (rng.random(600) < 0.8).astype(int)
    results, correct = _results(full, full, full, control_correct=full)
    gained = results.assign(test_acc_before=results["test_acc"] - 0.3)  # full FT gains 0.3 over zero-shot
    margin = competitive_margin(runs_at_chosen_rate(gained), share=0.1)
    assert margin.value == pytest.approx(0.03) and "0.1 x the zero-shot -> full FT gain" in margin.reason
    claims = {c.claim: c for c in claim_results(gained, correct, ClaimRules(margin_share=0.2))}
    assert claims[ClaimId.COMPETITIVE].threshold == pytest.approx(-0.06)
    lost = competitive_margin(runs_at_chosen_rate(results.assign(test_acc_before=1.0)), share=0.1)
    assert lost.value == 0.0 and "no gain, so no loss is allowed" in lost.reason
    assert competitive_margin(runs_at_chosen_rate(results)) == Margin(
        FALLBACK_MARGIN, "the fixed 0.03 (no zero-shot score recorded to derive it from)"
    )


def test_a_difference_the_interval_cannot_resolve_is_inconclusive():
    rng = np.random.default_rng(2)
    full = (rng.random(60) < 0.7).astype(int)
    card = full.copy()
    card[:2] = 1 - card[:2]  # two examples flip: no evidence either way at 60 examples
    results, correct = _results(card, full, lora_correct=full, control_correct=full)
    claims = {c.claim: c for c in claim_results(results, correct)}
    assert claims[ClaimId.BEATS_LORA].verdict == INCONCLUSIVE


@pytest.mark.parametrize("epochs, expected", [(4, "did not hold"), (3, "not testable here")])
def test_a_stop_threshold_below_the_earliest_possible_stop_is_not_testable(epochs, expected):
    # "2-3 of 6 epochs" is half the budget: 2 of 4 is judged; 1.5 of 3 lies before epoch 2, where the rule first fires
    full = np.ones(50, dtype=int)
    results, correct = _results(full, full, full, full)
    results["epochs_run"] = epochs
    results["stop_epoch"] = results["stop_epoch"].where(results["stop_epoch"].isna(), 3)
    claims = {c.claim: c for c in claim_results(results, correct)}
    assert claims[ClaimId.STOPS_EARLY].verdict == expected


def test_a_stopping_share_too_few_runs_could_never_decide_is_not_testable_and_sized():
    full = np.ones(50, dtype=int)
    results, correct = _results(full, full, full, full)
    few = results[(results["seed"] == 0) & results["run"].isin(["full", "profile:high-drift@0.01"])]
    few = few[few["selected"]]
    five = pd.concat([few.assign(seed=s) for s in range(5)], ignore_index=True)  # five seeds, one card
    share = {c.claim: c for c in claim_results(five, correct)}[ClaimId.STOPS_EARLY]
    assert share.estimate == 1.0 and share.verdict == "not testable here" and share.to_decide == "6 runs or more"
    later = results.assign(epochs_run=6, stop_epoch=results["stop_epoch"].where(results["stop_epoch"].isna(), 3))
    eight = {c.claim: c for c in claim_results(later, correct)}[ClaimId.STOPS_EARLY]
    assert eight.verdict == HELD  # 8 card runs all stopping at epoch 3 of 6


def test_a_stopping_share_reached_at_the_rules_earliest_epoch_is_not_testable():
    full = np.ones(50, dtype=int)
    results, correct = _results(full, full, full, full)
    results = results.assign(epochs_run=6)
    cards = results["run_dir"].isin(stopping_runs(results)["run_dir"])  # the card runs the claim counts
    assert cards.sum() == 8
    for at_floor, expected in ((5, "not testable here"), (4, HELD)):  # of the 8 card runs; the others stop at 3
        stops = [2] * at_floor + [3] * (8 - at_floor)
        runs = results.copy()
        runs.loc[cards, "stop_epoch"] = stops
        share = {c.claim: c for c in claim_results(runs, correct)}[ClaimId.STOPS_EARLY]
        assert share.estimate == 1.0 and share.verdict == expected
        assert f"{at_floor} at epoch 2, the earliest the rule allows" in share.measure
    assert share.to_decide == ""
    runs.loc[cards, "stop_epoch"] = 2  # cpu-decide's case: the rule fires at its first chance
    share = {c.claim: c for c in claim_results(runs, correct)}[ClaimId.STOPS_EARLY]
    assert share.to_decide == "a threshold or budget at which most runs do not stop at epoch 2"


def test_timings_from_different_machines_are_not_judged():
    full = np.ones(50, dtype=int)
    results, correct = _results(full, full, full, full)
    faster = ClaimId.FASTER_THAN_FULL
    assert {c.claim: c for c in claim_results(results, correct)}[faster].verdict == HELD  # 6 s vs 10 s, one machine
    results["machine"] = np.where(results["run"] == "full", "2 CPU cores, no GPU", "16 CPU cores, NVIDIA H200")
    speed = {c.claim: c for c in claim_results(results, correct)}[faster]
    assert speed.verdict == "not testable here"
    assert speed.setting == "all settings, timed on 2 machines, none of which timed both"
    results["machine"] = [None] * (len(results) - 1) + ["2 CPU cores, no GPU"]  # earlier runs recorded none
    assert {c.claim: c for c in claim_results(results, correct)}[faster].verdict == HELD


def test_a_study_resumed_on_another_machine_judges_its_speed_on_the_machine_that_timed_most_of_both():
    full = np.ones(50, dtype=int)
    results, correct = _results(full, full, full, full)
    on_one = {c.claim: c for c in claim_results(results, correct)}[ClaimId.FASTER_THAN_FULL]
    later = results["seed"] == results["seed"].max()  # the last seed's runs, on a machine twice as slow
    results["machine"] = np.where(later, "B", "A")
    results.loc[later, "sec_per_epoch"] *= 2
    speed = {c.claim: c for c in claim_results(results, correct)}[ClaimId.FASTER_THAN_FULL]
    runs = runs_at_chosen_rate(results)  # the runs a claim reads
    both = runs["method"].isin(("profile", "full"))
    n_a, n = int((both & (runs["machine"] == "A")).sum()), int(both.sum())
    assert speed.setting == (
        f"all settings, timed on A ({n_a} of {n} runs; those timed on 1 other machine(s) or with no machine recorded "
        "left out)"
    )
    assert speed.verdict == HELD and speed.estimate == pytest.approx(on_one.estimate)  # 6 s against 10 s on A
    base = results[results["seed"] <= 1].assign(machine="A")
    four = pd.concat([base, *(base[base["seed"] == 1].assign(seed=s) for s in (2, 3))], ignore_index=True)
    full = four["run"] == "full"
    four["machine"] = np.where((full & (four["seed"] > 0)) | (~full & (four["seed"] == 3)), "B", "A")
    picked = {c.claim: c for c in claim_results(four, correct)}[ClaimId.FASTER_THAN_FULL]
    assert picked.setting.startswith("all settings, timed on B (")  # A: many card runs, one full FT; B: 3 of it


def test_an_inconclusive_speed_claim_names_the_runs_that_would_decide_it():
    full = np.ones(50, dtype=int)
    results, correct = _results(full, full, full, full)
    lora = results["run"] == "lora@0.01"
    results.loc[lora, "sec_per_epoch"] = np.where(results.loc[lora, "seed"] == 0, 5.0, 8.0)  # cards at 6 s
    speed = {c.claim: c for c in claim_results(results, correct)}[ClaimId.FASTER_THAN_LORA]
    assert speed.verdict == "inconclusive" and speed.low < 1 < speed.high
    assert re.fullmatch(r"~\d+ runs of each method \(here 2 of the rarer\)", speed.to_decide), speed.to_decide
    assert {c.claim: c for c in claim_results(results, correct)}[ClaimId.FASTER_THAN_FULL].to_decide == ""  # held


def test_report_flags_a_rate_chosen_at_the_edge_of_its_grid():
    from topotuner_lab.lab.report.sections import lr_section

    rows = [
        {
            "prior": "sst2",
            "target": "agnews",
            "seed": 0,
            "run": run,
            "lr": lr,
            "val_acc": acc,
            "selected": chosen,
            "schedule": "linear",
        }
        for run, grid, best in (("full", (1e-5, 3e-5, 1e-4), 3e-5), ("lora@0.01", (3e-4, 1e-3, 3e-3), 3e-3))
        for lr, acc, chosen in ((lr, 0.9 if lr == best else 0.8, lr == best) for lr in grid)
    ]
    text = lr_section(pd.DataFrame(rows))
    assert "**Chosen at the edge of its grid**: lora@0.01 (0.003)." in text  # full's 3e-05 is inside its grid
    inside = pd.DataFrame([r for r in rows if r["run"] == "full"])
    assert "edge of its grid" not in lr_section(inside)


def test_forgetting_by_text_nll_and_accuracy_at_the_stop_epoch_are_paired_claims():
    rng = np.random.default_rng(3)
    full = (rng.random(400) < 0.8).astype(int)
    results, correct = _results(full, full, full, full)
    before = rng.normal(2.0, 0.3, 50)
    extra = {}
    for run_dir in results["run_dir"]:
        is_full = run_dir.startswith("full")
        extra[(run_dir, "ppl_nll_before")] = list(before)
        extra[(run_dir, "ppl_nll_after")] = list(before + (0.5 if is_full else 0.05) + rng.normal(0, 0.02, 50))
        stopped = full.copy()
        stopped[:100] = 0  # the stop epoch is 25 points worse than the full budget
        extra[(run_dir, "stop_epoch_test_correct")] = list(stopped) if "high-drift" in run_dir else None

    def more(run_dir, key):
        return extra[(run_dir, key)] if (run_dir, key) in extra else correct(run_dir, key)

    claims = claim_results(results, more)
    (nll,) = [c for c in claims if c.claim == ClaimId.LESS_FORGETTING_NLL]
    assert nll.verdict == HELD and nll.estimate == pytest.approx(-0.45, abs=0.02)  # the card's texts rise less
    stops = {c.measure.split(":")[1]: c for c in claims if c.claim == ClaimId.STOP_KEEPS_ACCURACY}
    lost = -full[:100].sum() / 400  # the correct answers among the first 100 are lost at the stop epoch
    assert stops["high-drift@0.01"].verdict == NOT_HELD and stops["high-drift@0.01"].estimate == pytest.approx(lost)
    assert set(stops) == {"high-drift@0.01"}  # the pre-specified card's rule, not every arm's
    # a run whose rule never fired keeps its full budget on both sides: seed 1 not stopping halves the loss
    once = results.copy()
    once.loc[(once["run"] == "profile:high-drift@0.01") & (once["seed"] == 1), "stop_epoch"] = None
    (half,) = [c for c in claim_results(once, more) if c.claim == ClaimId.STOP_KEEPS_ACCURACY]
    assert half.estimate == pytest.approx(lost / 2)
    # a rule that fires only at the last epoch leaves the final scores: whatever an older version logged for it
    last = results.assign(stop_epoch=results["stop_epoch"].where(results["stop_epoch"].isna(), 4))
    at_last = {c.measure.split(":")[1]: c for c in claim_results(last, more) if c.claim.startswith("early stopping k")}
    assert at_last["high-drift@0.01"].estimate == 0 and at_last["high-drift@0.01"].verdict == "not testable here"
    # results of a version without per-text values: no claim, no error
    assert not [c for c in claim_results(results, correct) if "NLL" in c.claim]
    # at a group-sequential look both take the look's level, as every paired claim does
    looked = claim_results(results, more, ClaimRules(level=0.9944))
    at_look = {c.claim: c for c in looked if c.claim in (ClaimId.LESS_FORGETTING_NLL, ClaimId.STOP_KEEPS_ACCURACY)}
    assert {c.level for c in at_look.values()} == {0.9944} and nll.level == 0.95
    wider = at_look[ClaimId.LESS_FORGETTING_NLL]
    assert wider.high - wider.low > nll.high - nll.low


def _seed_noisy(seeds: int, shift: float, seed_sd: float, examples: int = 4000) -> tuple[np.ndarray, np.ndarray]:
    """Per-seed scores of two arms on shared examples: ``a`` beats ``b`` by ``shift`` plus a per-seed offset."""
    rng = np.random.default_rng(7)
    base = rng.normal(0.0, 1.0, examples)
    offsets = rng.normal(shift, seed_sd, seeds)
    a = np.stack([base + o + rng.normal(0, 0.01, examples) for o in offsets])
    return a, np.stack([base] * seeds)


def test_the_seed_level_interval_uses_seeds_as_units():
    a, b = _seed_noisy(seeds=5, shift=0.05, seed_sd=0.05)
    seed_level = seed_level_interval(a, b)
    diffs = (a - b).mean(axis=1)
    half = scipy_t.ppf(0.975, 4) * diffs.std(ddof=1) / np.sqrt(5)
    assert (seed_level.low, seed_level.high) == pytest.approx((diffs.mean() - half, diffs.mean() + half))
    assert seed_level_interval(a[:1], b[:1]).low == -np.inf  # one seed measures no training noise
    assert seed_level_p(diffs) == pytest.approx(ttest_1samp(diffs, 0.0).pvalue)


def test_a_verdict_must_hold_under_both_intervals():
    # 5 seeds with large seed noise: the two-way bootstrap clears 0, the t interval on 4 degrees of freedom does not
    a, b = _seed_noisy(seeds=5, shift=0.02, seed_sd=0.03)
    boot, seed_level = two_way_bootstrap(a, b), seed_level_interval(a, b)
    assert boot.low > 0 > seed_level.low
    both = conservative(boot, seed_level)
    assert (both.low, both.high) == (min(boot.low, seed_level.low), max(boot.high, seed_level.high))
    assert verdict(boot) == HELD and verdict(both) == INCONCLUSIVE


def test_rules_fix_margins_before_the_runs_and_measure_by_log_probability_or_probability():
    rng = np.random.default_rng(1)
    full = (rng.random(600) < 0.8).astype(int)
    results, correct = _results(full, full, full, control_correct=full)
    fixed = {c.claim: c for c in claim_results(results, correct, ClaimRules(margins={"agnews": 0.02}))}
    assert fixed[ClaimId.COMPETITIVE].threshold == pytest.approx(-0.02)  # not the fallback 0.03

    def with_logloss(run_dir, key):
        if key == "test_example_metrics":
            return {"logloss": [0.5 if c else 2.0 for c in correct(run_dir, "test_correct")]}
        return correct(run_dir, key)

    rules = ClaimRules(margins={"agnews": 0.1}, measure="logprob", seed_level=True)
    by_logprob = {c.claim: c for c in claim_results(results, with_logloss, rules)}
    thesis = by_logprob[ClaimId.THESIS]
    assert thesis.measure.endswith("(test gold-label log-probability (nats))")
    assert thesis.estimate == pytest.approx(1.5 * (2 * full.mean() - 1))  # -0.5 vs -2.0 where high / low is right
    by_prob = {c.claim: c for c in claim_results(results, with_logloss, replace(rules, measure="prob"))}
    assert by_prob[ClaimId.THESIS].measure.endswith("(test gold-label probability)")
    assert by_prob[ClaimId.THESIS].estimate == pytest.approx((np.exp(-0.5) - np.exp(-2.0)) * (2 * full.mean() - 1))
    with pytest.raises(ParameterError, match="need a margin fixed in the preset"):
        claim_results(results, with_logloss, ClaimRules(measure="logprob"))


def test_a_pilot_or_one_seed_per_arm_decides_nothing():
    rng = np.random.default_rng(1)
    full = (rng.random(600) < 0.8).astype(int)
    card = full.copy()
    card[:90] = 0
    results, correct = _results(card, full, full, control_correct=full)
    claims = claim_results(results, correct)
    assert {c.verdict for c in claims} - {PILOT} == {c.verdict for c in pilot_labels(claims)} - {PILOT}  # 2 seeds
    labelled = pilot_labels(claims, pilot=True)
    paired = [c for c in labelled if c.design is not None]
    assert paired and all(c.verdict == PILOT and c.to_decide for c in paired)  # with the size that would decide
    one_seed = results[results["seed"] == 0]
    alone = [c for c in pilot_labels(claim_results(one_seed, correct)) if c.design is not None]
    assert alone and all(c.verdict == PILOT and "2 seeds or more" in c.to_decide for c in alone)
