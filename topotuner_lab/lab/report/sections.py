"""The report's sections: pure functions from what a comparison computed (tables, claims, snapshots) to Markdown.

Nothing here reads a file or starts a computation; :mod:`.inputs` loads, :mod:`.figures` exports figures.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from topotuner_lab._io.errors import TaskError
from topotuner_lab.drift.noise import noise_check
from topotuner_lab.profiles.card import NORMALIZATIONS, ModelIdentity, ProfileCard
from topotuner_lab.profiles.select import MIN_NOISE_DRAWS, CardSettings, build_profile
from topotuner_lab.study.claims import (
    ClaimResult,
    ClaimRules,
    claims_frame,
    paper_count,
    paper_speed,
    recorded_metric,
    runs_at_chosen_rate,
    stopping_runs,
    summary_verdict,
)
from topotuner_lab.study.markdown import markdown_table
from topotuner_lab.study.matrix import check_predicts_gain, with_transfer_checks
from topotuner_lab.study.plan import extension_runs, plan
from topotuner_lab.study.presets import Preset
from topotuner_lab.study.sequential import at_look
from topotuner_lab.study.sizing import MIN_SEEDS, POWER, minutes_per_finetune, planned_seeds
from topotuner_lab.study.stability import drift_over_seeds, noise_null_sentence, stability_sentence, stability_table
from topotuner_lab.study.stopping import early_by, threshold_sweep
from topotuner_lab.tasks.specs import get_task
from topotuner_lab.training.data import PPL_TASK, ood_battery
from topotuner_lab.training.early_stopping import EARLIEST_STOP
from topotuner_lab.weights.projections import KINDS
from topotuner_lab.weights.snapshot import NOISE_SCALE


def spread_table(results: pd.DataFrame) -> pd.DataFrame:
    """Mean and standard deviation over seeds, per setting and run, at each run's selected learning rate."""
    ood_drop = pd.to_numeric(results["ood_acc_before"]) - pd.to_numeric(results["ood_acc_after"])  # None: NaN
    with_drop = runs_at_chosen_rate(results).assign(ood_drop=ood_drop)
    table = with_drop.groupby(["prior", "target", "run"], sort=False).agg(
        seeds=("seed", "nunique"),
        lr=("lr", "first"),
        val_acc_mean=("val_acc", "mean"),
        test_acc_mean=("test_acc", "mean"),
        test_acc_std=("test_acc", "std"),
        acc_at_stop_mean=("acc_at_stop", "mean"),
        stop_epoch_mean=("stop_epoch", "mean"),
        ood_drop_mean=("ood_drop", "mean"),
        sec_per_epoch_median=("sec_per_epoch", "median"),
        trainable_pct=("trainable_pct", "first"),
    )
    return table.reset_index()


def drift_by_kind(table: pd.DataFrame) -> pd.DataFrame:
    """Mean drift per projection kind; H0 W1 also per row (W1 sums over a diagram's points; kinds differ in rows)."""
    table = table.assign(h0_w1_per_row=table["h0_w1"] / table["rows"])
    shown = [c for c in ("h0_w1", "h0_w1_per_row", "h1_w1", "rel_frobenius") if c in table]  # H0-only tables too
    return table.groupby("kind")[shown].mean().reindex(list(KINDS))


def model_family_section(kinds: dict[tuple[str, str], pd.Series]) -> str:
    """Which projection kinds drift most, per model and prior task (paper: V/O in LLaMA and Mistral, K/Q in Qwen)."""
    table = pd.DataFrame(kinds).T.rename_axis(["model", "prior"])
    table["ranking"] = [" > ".join(row.sort_values(ascending=False).index) for _, row in table[list(KINDS)].iterrows()]
    tops = table.groupby(level="model")["ranking"].agg(lambda r: sorted({x.split(" > ")[0] for x in r}))
    return (
        "\n## Is the drift profile model-dependent?\n\nMean H0 W1 per row by projection kind, per model and prior "
        "task. The paper finds high "
        "V/O drift in LLaMA and Mistral and K/Q drift in Qwen. Most-drifting kind here: "
        + "; ".join(f"{model}: {', '.join(top)}" for model, top in tops.items())
        + ".\n\n"
        + table.reset_index().to_markdown(index=False, floatfmt=".4g")
        + "\n"
    )


def noise_floor_section(
    pre_share: float, post_share: float | None, table: pd.DataFrame, noise: list[pd.DataFrame], metric: str
) -> str:
    """Real drift beside the noise floor (the 4-bit grid effect); empty without noise tables (none were asked for).

    ``pre_share`` and ``post_share`` are the grid shares (:func:`~topotuner_lab.study.weights_facts.grid_share`) of
    the pretrained and the fine-tuned weights; the latter None where neither those weights nor a record of them are in
    the folder, which the section then says.
    """
    if not noise:
        return ""
    after = (
        f"after the fine-tune {100 * post_share:.1f}% do"
        if post_share is not None
        else "after the fine-tune: not shown (the prior fine-tune's weights are not in this folder and the comparison "
        "recorded no facts of them; run the same `topotuner-lab reproduce` into it, which trains the prior again and "
        "verifies its drift table against them)"
    )
    cols = [c for c in ("h0_w1", "h1_w1", "rel_frobenius", "row_cosine_change") if c in table and c in noise[0]]
    floor = pd.concat(noise)[cols].median()
    ratio = (table[cols].median() / floor).to_frame("median fine-tune drift / median noise drift")
    return (
        f"\nNoise floor: {100 * pre_share:.1f}% of the pretrained matrices' 32-weight blocks hold at most 16 "
        "distinct values (weights dequantized "
        f"from a 4-bit GGUF sit on such a grid; Q4_K_M keeps some matrices in 6 bits); {after}. A random "
        f"perturbation of std {NOISE_SCALE:g} x each matrix's std ({len(noise)} seeds) also leaves the grid; the "
        "real drift over that noise floor:\n\n"
        + ratio.to_markdown(floatfmt=".3g")
        + f"\n\n{noise_check(table, noise, metric).message}\n\n"
        "What this measures: a scale check. Drift grows with the size of any change, so the ratio says how far the "
        f"fine-tune moved the weights relative to a perturbation of {NOISE_SCALE:g} of their std, not whether the "
        "card's picks are real; that is the stability of the picks across prior seeds (its own section and claim, "
        "with three or more prior seeds).\n"
    )


def margin_lines(results: pd.DataFrame, rules: ClaimRules) -> list[str]:
    """Per target, the non-inferiority margin its claims use and where it comes from (:meth:`ClaimRules.margin`)."""
    runs = runs_at_chosen_rate(results)
    measure = "gold-label log-probability" if rules.measure == "logprob" else None
    return [
        f"Margin ({target}): a card is competitive when it loses at most {margin.value:.3g} "
        f"{measure or recorded_metric(group)} to full FT: {margin.reason}."
        for target, group in runs.groupby("target", sort=False)
        for margin in [rules.margin(str(target), group)]
    ]


def _answer_words(target: str, ood_tasks: tuple[str, ...]) -> tuple[str, int | None]:
    """The forgetting probe of ``target`` and its number of answer words.

    None where the probe is not multiple choice with fixed answer words, or its spec file is gone since the run (that
    must not stop a report of finished runs).
    """
    try:
        probe = ood_battery(target, ood_tasks)[0]
        spec = get_task(probe)
    except TaskError:
        return (ood_tasks or (f"{target}'s out-of-domain task",))[0], None
    fixed = spec.output_type == "multiple_choice" and not spec.per_row_choices  # each row's own options: no count
    return probe, len(spec.doc_to_choice) if fixed else None


def forgetting_lines(results: pd.DataFrame, preset: Preset) -> list[str]:
    """Per target, the accuracy probe of forgetting, and a warning where its zero-shot score sits below chance.

    Below chance the pretrained model leans to one answer word, so a fine-tune can move the probe's accuracy by
    moving that lean, up or down, with no knowledge gained or lost; the held-out NLL needs no answer format.
    """
    if "ood_acc_before" not in results:
        return []
    lines = []
    for target, group in results.groupby("target", sort=False):
        probe, words = _answer_words(str(target), preset.target.ood_tasks)
        before = float(pd.to_numeric(group["ood_acc_before"]).median())
        if np.isnan(before):  # runs without a forgetting battery (n_ood 0)
            continue
        line = f"Forgetting ({target}): each held-out {PPL_TASK} text's NLL, and {probe} accuracy"
        line += f", zero-shot {before:.3f}"
        if words:
            line += f" (chance {1 / words:.2f} for {words} answer words)"
            if before < 1 / words:
                line += (
                    "; below chance, the model leans to one answer, so a fine-tune can move this accuracy by moving "
                    "that lean rather than by forgetting: read the held-out NLL claim as the measure of forgetting"
                )
        lines.append(line + ".")
    return lines


def _validation_from(sources: dict[str, str]) -> str:
    """Where the validation rows came from: one source for every target, else per target."""
    if not sources:
        return "carved from the training split"
    if len(set(sources.values())) == 1:
        return next(iter(sources.values()))
    return "; ".join(f"{target}: {source}" for target, source in sources.items())


def setup_section(
    preset: Preset,
    runs: int,
    planned: int,
    results: pd.DataFrame,
    test_rows: int | None = None,
    val_sources: dict[str, str] | None = None,
    looks: list[dict[str, Any]] | None = None,
) -> str:
    """What was run and what each run costs here, from the preset the comparison recorded.

    ``test_rows`` is how many test examples the runs scored (a split can hold fewer than the preset asks for);
    ``val_sources`` where each target's validation rows came from, as its runs recorded it; ``looks`` the
    group-sequential looks the study took (a study that stopped at a look planned only its seeds so far).
    """
    prior, target = preset.prior, preset.target
    grids = "; ".join(f"{fam} {', '.join(f'{lr:g}' for lr in lrs)}" for fam, lrs in preset.lr_grid.items())
    prior_line = (
        f"Prior fine-tune: full FT, {prior.n_train} examples x {prior.epochs} epoch(s), lr "
        f"{prior.learning_rate or 'default'}, prior seeds {', '.join(map(str, preset.prior_seeds))}; drift recipes "
        f"{', '.join(preset.recipes)}."
    )
    if not preset.target_tasks:
        lines = [
            f"Drift only: {preset.model or 'embedded SmolLM2-135M-Instruct'} and {', '.join(preset.other_models)}, "
            f"each fine-tuned on {', '.join(preset.prior_tasks)}; no transfer, no target fine-tunes.",
            prior_line,
            f"Cards compared: {preset.strategies[0]} at {100 * preset.budgets[0]:g}% of all parameters, ranked by "
            f"`{preset.metric}` with `{preset.normalization}` normalization, one per prior seed.",
        ]
        return "\n## Setup\n\n" + "".join(f"- {line}\n" for line in lines)
    lines = [
        f"Model: {preset.model or 'embedded SmolLM2-135M-Instruct'}; priors {', '.join(preset.prior_tasks)}, "
        f"each card transferred to every target but its own prior ({', '.join(preset.target_tasks)}); "
        f"seeds {', '.join(map(str, preset.seeds))} (each sets the training seed and "
        "which training rows are drawn; "
        "the test rows are the same for every seed and method, so comparisons are paired).",
        prior_line,
        f"Targets: {target.n_train} training, {target.n_val} validation ({_validation_from(val_sources or {})}), "
        f"{test_rows if test_rows is not None else target.n_test} test examples"
        + (
            f" (all the split holds; the preset asked for {target.n_test})"
            if test_rows and test_rows < target.n_test
            else ""
        )
        + "; "
        f"{target.epochs} epochs, batch {target.batch_size}, {target.max_length} tokens, linear "
        "learning-rate decay.",
        f"Learning rates: each method (full FT, LoRA, each card strategy at each budget) swept over {grids} on "
        + (
            f"sweep seeds {', '.join(map(str, preset.sweep_seeds))} (their runs are never results; the criterion is "
            "averaged over them)"
            if preset.sweep_seeds
            else "the first seed"
        )
        + (
            f", extended past an edge by up to {preset.lr_extend} rates while the best lies on it"
            if preset.lr_extend
            else ""
        )
        + (
            ", the rate with the best validation accuracy"
            if preset.rate_criterion == "accuracy"
            else ", the rate with the lowest validation log-loss (the best validation accuracy where a run recorded no "
            "log-loss)"
        )
        + " kept for "
        + ("every seed" if preset.sweep_seeds else "the other seeds")
        + "; the chosen rates are in the learning-rate section.",
        f"Cards: {', '.join(preset.strategies)} ranked by `{preset.metric}` with `{preset.normalization}` "
        "normalization (see the normalization "
        f"section), at budgets {', '.join(f'{100 * b:g}%' for b in preset.budgets)} of all parameters; LoRA on "
        "q/k/v/o with the rank closest to the "
        "high-drift card's parameter count.",
        f"Early stopping: threshold {preset.stop_threshold} on H0 W1 epoch-to-epoch drift normalized by the "
        "first epoch's"
        + (", observe mode (a stopped run is the full-budget run cut at its stop epoch)" if target.observe_only else "")
        + (
            "; the card(s) "
            + ", ".join(list(preset.constant_lr))
            + " also run at their chosen rate with a constant schedule, to see the rule apart from a decaying rate."
            if list(preset.constant_lr)
            else "."
        ),
    ]
    if "wall_sec" in results and results["wall_sec"].notna().any():
        cost = results.groupby("method")["wall_sec"].median() / 60
        lines.append(
            "Cost on the machine(s) in the header (the medians pool every sitting's runs), median minutes per "
            "fine-tune including evaluation: "
            + ", ".join(f"{k} {v:.1f}" for k, v in cost.items())
            + f"; {runs} fine-tunes in all, {results['wall_sec'].sum() / 3600:.1f} h."
        )
    lines += margin_lines(results, ClaimRules.of(preset))
    lines += forgetting_lines(results, preset)
    if preset.other_models:
        lines.append(f"Drift only (own prior fine-tunes, no transfer grid): {', '.join(preset.other_models)}.")
    lines += look_lines(preset, looks or [])
    if looks and not looks[-1]["adds_seeds"]:  # stopped at a look: the later blocks were never planned to run
        planned = len(plan(at_look(preset, int(looks[-1]["seeds"]))))
    added = extension_runs(results, preset)  # runs the plan did not list: a sweep extended past its grid's edge
    if runs < planned + added:
        extended = f" (plus {added} added by extending sweeps past a grid edge)" if added else ""
        lines.append(
            f"**Partial run**: {runs} of the {planned} planned fine-tunes{extended} are done (seeds are the outer "
            "loop, so earlier seeds are complete); rerunning the command resumes the rest."
        )
    return "\n## Setup\n\n" + "".join(f"- {line}\n" for line in lines)


def look_lines(preset: Preset, looks: list[dict[str, Any]]) -> list[str]:
    """The seed blocks a group-sequential study planned and what each look it took decided."""
    if not preset.seed_blocks:
        return []
    out = [
        f"Seeds in pre-registered blocks: claims judged after {', '.join(map(str, preset.seed_blocks))} seeds "
        "(O'Brien-Fleming-type alpha spending, 5% over all looks); seeds are added only while the thesis or a "
        "control claim is undecided."
    ]
    for look in looks:
        undecided = look["undecided"]
        state = (
            "judged no thesis or control claim"
            if undecided is None
            else f"left {len(undecided)} undecided"
            if undecided
            else "decided every thesis and control claim"
        )
        then = "seeds added" if look["adds_seeds"] else "no seeds added"
        out.append(f"Look at {look['seeds']} seeds (intervals at {look['level']:.2%}): {state}; {then}.")
    return out


def sizing_section(sizes: pd.DataFrame, results: pd.DataFrame, margin_share: float) -> str:
    """What the study this pilot plans needs: per target and measure, each difference's variances and seeds."""
    if sizes.empty:
        return ""
    shown = sizes.assign(
        measured=sizes["seeds"].astype(str) + " x " + sizes["examples"].astype(str),
        needs=[
            f"{int(s)} seeds" if pd.notna(s) else (f"{int(e)} examples" if pd.notna(e) else "no margin")
            for s, e in zip(sizes["seeds_needed"], sizes["examples_needed"])
        ],
    )[["target", "measure", "comparison", "gain", "margin", "estimate", "measured", "seed_sd", "example_sd", "needs"]]
    minutes = minutes_per_finetune(results)
    plans = {measure: planned_seeds(sizes, measure) for measure in sizes["measure"].unique()}
    lines = [
        f"{measure}: " + ", ".join(f"{t} {n if n else 'not by seeds'}" for t, n in per_target.items())
        for measure, per_target in plans.items()
    ]
    return (
        "\n## What the study this pilot plans needs\n\n"
        f"Margins are {margin_share:g} x each target's zero-shot -> full FT gain on the measure. A difference is "
        f"decided when its 95% interval excludes 0 or lies within +-margin; the seeds below decide a true difference "
        f"of 0 with probability {POWER:g} at the pilot's test rows (`study.sizing`), or name the test rows needed "
        "where seeds cannot. The pilot's own estimates are not results.\n\n"
        + markdown_table(shown)
        + "\n\nSeeds to plan per target (every card-against-card difference, at least "
        f"{MIN_SEEDS}): "
        + "; ".join(lines)
        + ".\n\nMedian minutes per fine-tune here (training and evaluation): "
        + ", ".join(f"{t} {m} {v:.1f}" for (t, m), v in minutes.items())
        + ".\n"
    )


def claims_section(claims: list[ClaimResult], forest: str | None = None) -> str:
    """The claims table with one verdict per claim, the paper's counts, and the forest plot of the paired claims.

    The table holds each estimate, its 95% interval, threshold and verdict; the paper's counts are the settings the
    card beats LoRA in and the time it saves; ``forest`` is the forest plot's PNG path.
    """
    if not claims:
        return "\n## Claims\n\nNo complete setting to judge yet.\n"
    table = claims_frame(claims)
    fmt = lambda v, signed: f"{v:+.3f}" if signed else f"{v:.3g}"  # noqa: E731 - differences signed, ratios and epochs plain
    table["estimate [95% CI]"] = [
        f"{fmt(e, ' - ' in m)} [{fmt(lo, ' - ' in m)}, {fmt(hi, ' - ' in m)}]"
        for e, lo, hi, m in zip(table["estimate"], table["low"], table["high"], table["measure"])
    ]
    roles = "role" in table and (table["role"].fillna("") != "").any()
    columns = [*(["role"] if roles else []), "claim", "setting", "measure", "estimate [95% CI]", "threshold", "verdict"]
    sized = "to_decide" in table and (table["to_decide"].fillna("") != "").any()
    shown = table[[*columns, "to_decide"]] if sized else table[columns]
    overall = "\n".join(f"- {claim}: **{summary_verdict(claims, claim)}**" for claim in dict.fromkeys(table["claim"]))
    return (
        "\n## Claims, checked against these numbers\n\nEach line compares runs at their own selected learning "
        "rates on the same test examples. "
        "Accuracy differences carry paired bootstrap intervals that resample both the training seeds and the test "
        "examples (the trained models are a sample too); timing and "
        "stop epochs are bootstrapped over runs. A claim *held* when the whole interval clears the threshold, *did "
        "not hold* when it lies wholly on "
        "the other side, and is *inconclusive* when it covers the threshold, unless it is a difference claim "
        "(threshold 0: beats LoRA, high vs low drift, topology vs a control or a selector, out-of-domain accuracy) "
        "whose whole interval lies within +- the target's margin: then the two are *equivalent*; *not testable "
        "here* when the setup "
        "cannot decide it either way (timings from runs on different machines; "
        "a stop-epoch threshold below the earliest epoch the rule can fire, "
        f"{EARLIEST_STOP}, needs a longer budget; a share of so few runs that not even all or none of them could "
        "clear its threshold names the runs it needs in *to_decide*). Competitive means at most the "
        "target's margin below full FT (the threshold column; the setup says how each margin was derived). "
        '"The card" is the one named before the runs: the high-drift card of the default recipe at each budget '
        "(the low-drift one where no high-drift card ran), never the better of two."
        + (
            " The *primary* claim was named before the runs (the preset's `primary_claim`) and is judged on its own "
            "interval; every *secondary* paired claim is also judged after Holm's correction of its two-sided "
            "bootstrap p-value over all of them (claims the setup cannot test are not counted), and one its own "
            "interval decides but Holm does not reject reads *inconclusive (Holm)*."
            if roles
            else ""
        )
        + (
            " For an inconclusive paired claim, *to_decide* is the size its measured variances say would decide it: "
            "the seeds (at these test examples) for the 95% half-width to shrink below the distance from the "
            "estimate to the threshold, or the examples when seeds alone cannot (`study.power`; the estimate is "
            "assumed to stay where it is); for a secondary claim (inconclusive, or inconclusive (Holm)), the size at "
            "Bonferroni's level (0.05 over the family's size), which Holm's procedure rejects wherever it ranks."
            if sized
            else ""
        )
        + "\n\n"
        + shown.to_markdown(index=False, floatfmt=".3g")
        + "\n\nOver all settings (held or did not hold only where every setting agrees):\n\n"
        + overall
        + "\n"
        + "".join(f"\n{line}\n" for line in (paper_count(claims), paper_speed(claims)) if line)
        + (
            f"\n![Every paired claim: estimate, 95% interval, threshold (dashed) and, for difference claims, the "
            f"equivalence band (shaded); colour is the verdict]({forest})\n"
            if forest
            else ""
        )
    )


def lr_section(results: pd.DataFrame, criterion: str = "logloss") -> str:
    """The criterion of every rate tried (mean over the sweep's seeds), per setting and method, and the rate chosen.

    The sweep is the runs of role ``sweep`` (sweep seeds, or the first seed where a preset has none; results without
    roles: the first seed's runs); the chosen rate is the one its ``selected`` runs used.
    """
    linear = results[results["schedule"].fillna("linear") == "linear"]
    swept = (
        linear[linear["role"] == "sweep"]
        if "role" in linear and (linear["role"] == "sweep").any()
        else linear[linear["seed"] == linear["seed"].min()]
    )
    field, label = (
        ("val_logloss", "val log-loss")
        if criterion == "logloss" and "val_logloss" in swept and swept["val_logloss"].notna().all()
        else ("val_acc", "val acc")
    )
    keys = ["prior", "target", "run"]
    sweep = swept.pivot_table(index=keys, columns="lr", values=field, aggfunc="mean", sort=False)
    sweep = sweep[sorted(sweep.columns)]  # one rate axis for every method, whatever order the sweeps ran in
    sweep.columns = [f"{label} @ {lr:g}" for lr in sweep.columns]
    chosen = linear[linear["selected"].astype(bool)].groupby(keys, sort=False)["lr"].first().rename("chosen lr")
    table = sweep.join(chosen).reset_index()
    grid = swept.groupby(keys, sort=False)["lr"].agg(["min", "max"])
    at_edge = chosen[(chosen == grid["min"].reindex(chosen.index)) | (chosen == grid["max"].reindex(chosen.index))]
    edges = [f"{run} ({lr:g})" for (_, _, run), lr in at_edge.items()]
    warning = (
        f"\n**Chosen at the edge of its grid**: {', '.join(edges)}. The best rate may lie outside the grid; widen "
        "`Preset.lr_grid` past that edge before reading these methods' comparisons as tuned.\n"
        if edges
        else ""
    )
    seeds = sorted(swept["seed"].unique())
    return (
        f"\n## Learning rates, chosen on validation data\n\nEach method's sweep ({label} per rate, the mean over "
        f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}; the test set is not looked at) and the "
        "rate kept for every seed.\n\n" + markdown_table(table) + "\n" + warning
    )


def stopping_section(results: pd.DataFrame, histories: list[tuple[list[float], list[float]]] | None = None) -> str:
    """Stop epochs by schedule, a threshold sweep over the stored drift, how closely drift followed the rate."""
    cards = stopping_runs(results)
    if cards.empty:
        return ""
    table = cards.groupby(cards["schedule"].fillna("linear")).agg(
        runs=("run", "size"),
        stopped=("stop_epoch", "count"),
        median_stop=("stop_epoch", "median"),
        mean_test_acc=("test_acc", "mean"),
        mean_acc_at_stop=("acc_at_stop", "mean"),
    )
    lines = [
        "\n## Early stopping apart from the schedule\n\nCard runs at their chosen rate with the linear decay and "
        "with a constant rate "
        "(observe mode: `acc_at_stop` is the accuracy when the rule fired, `test_acc` after the whole budget).\n\n"
        + table.to_markdown(floatfmt=".3g")
        + "\n"
    ]
    if histories:
        budget = int(cards["epochs_run"].max())
        sweep = threshold_sweep(histories, budget)
        lines.append(
            f"\nThe rule at other thresholds, from each linear run's stored drift per epoch (no retraining): the share "
            f"of runs stopping by epoch {early_by(budget)} of {budget} with its exact binomial interval, and test "
            "accuracy at the stop epoch minus after the whole budget (runs that evaluated every epoch; a run that "
            "never stops counts 0).\n\n" + sweep.to_markdown(index=False, floatfmt=".3g") + "\n"
        )
    if results["drift_minus_lr_ratio"].notna().any():
        gap = results.groupby("method")["drift_minus_lr_ratio"].median().dropna()  # methods with a drift record
        lines.append(
            "\nNormalized epoch drift minus the epoch's learning rate relative to the first epoch's (linear runs), "
            "median per method: "
            + ", ".join(f"{k} {v:+.2f}" for k, v in gap.items())
            + ". Near 0 the drift only tracked the schedule.\n"
        )
    return "".join(lines)


def normalization_section(
    table: pd.DataFrame, identity: ModelIdentity, noise: list[pd.DataFrame], preset: Preset, prior: str
) -> str:
    """Which matrices a high-drift card picks under each normalization, and how far from the one the claims use."""
    rows = []
    for budget in preset.budgets:
        picks = {
            norm: build_profile(
                table,
                identity,
                CardSettings(prior_task=prior, metric=preset.metric, fraction=budget, normalization=norm),
                noise=noise,
            ).trainable
            for norm in NORMALIZATIONS
            if norm != "noise-z" or len(noise) >= MIN_NOISE_DRAWS
        }
        used = set(picks[preset.normalization])
        for norm, chosen in picks.items():
            rows.append(
                {
                    "budget": f"{100 * budget:g}%",
                    "normalization": norm + (" (used)" if norm == preset.normalization else ""),
                    "trainable": ", ".join(chosen),
                    f"Jaccard vs {preset.normalization}": len(used & set(chosen)) / len(used | set(chosen)),
                }
            )
    return (
        f"\nHigh-drift selections of the {prior} prior under each normalization (raw W sums over a diagram's "
        "points, so big matrices "
        "rank high by size alone):\n\n" + pd.DataFrame(rows).to_markdown(index=False, floatfmt=".2f") + "\n"
    )


def header(command: str, machine: str) -> str:
    """The title and where the numbers come from (``machine``: ``; ``-separated when sittings ran on several).

    No date: the report is a function of the ledger, so the same command renders it again byte for byte.
    """
    where = f"sittings on: {machine}" if "; " in machine else machine
    return (
        f"# Results: the paper's comparison in miniature\n\nProduced by `{command}` ({where}). Every number below "
        "comes from that run's `results.csv` and run folders; nothing is typed in by hand, and the same command "
        "renders this file again byte for byte from the same ledger.\n"
    )


def spread_section(results: pd.DataFrame) -> str:
    """Mean and spread over seeds at each arm's chosen rate."""
    return (
        "\n## Mean and spread over seeds\n\nAt each method's chosen rate. `test_acc_std` is the standard deviation "
        "over seeds; `ood_drop_mean` = out-of-domain accuracy before minus after (forgetting).\n\n"
        + markdown_table(spread_table(results))
        + "\n"
    )


def drift_section(model: str, prior: str, figure: str, by_kind: pd.DataFrame) -> str:
    """One prior fine-tune's drift: the heatmap figure and the mean drift per projection kind."""
    ranked = by_kind["h0_w1_per_row"].sort_values(ascending=False)
    return (
        f"\n## {model}: drift after the {prior} prior fine-tune\n\n![drift heatmaps]({figure})\n\n"
        "The first heatmap is the score the cards rank by (the preset's metric and normalization); the others are "
        "raw drift columns.\n\n"
        "Mean drift per projection kind (ranked by H0 W1 per row, since W1 sums over a diagram's points: "
        f"{' > '.join(ranked.index)}):\n\n" + by_kind.to_markdown(floatfmt=".4g") + "\n"
    )


def all_runs_section(results: pd.DataFrame) -> str:
    """Every fine-tune, the sweeps included."""
    return (
        "\n## All runs\n\nEvery fine-tune, the learning-rate sweeps included (`selected` marks the runs at the "
        "chosen rate). `gap` = train - test accuracy; `ood_*` = accuracy on the other task (forgetting); `ppl_*` = "
        f"perplexity on held-out {PPL_TASK} text; `stop_epoch` = where topological early stopping fired; "
        "`peak_rss_mib` = the process's resident peak during training, `rss_increase_mib` = that peak minus the "
        "resident size when training began (sampled every 20 ms).\n\n"
        + markdown_table(results.drop(columns=["run_dir"]))
        + "\n"
    )


def seed_picks_section(picks: pd.DataFrame, strategy: str, budget: float) -> str:
    """The kinds a card picks after each prior seed, per model (the data of the stability and model claims)."""
    if picks.empty or picks["prior seed"].nunique() < 2:
        return ""
    return (
        f"\n## Which kinds the {strategy} card picks, per prior run\n\nThe {strategy} card at {100 * budget:g}% that "
        "each prior fine-tune's drift table gives (one row per prior seed): the claims above compare the V/O share "
        "across models with intervals over these seeds, and the Jaccard index of the picks across seeds with what "
        "cards built from noise-only drift tables share.\n\n" + picks.to_markdown(index=False, floatfmt=".3g") + "\n"
    )


def prior_seed_section(
    cards: dict[tuple[str, str], dict[int, ProfileCard]],
    strategy: str,
    nulls: dict[tuple[str, str], pd.DataFrame] | None = None,
) -> str:
    """How far a card's ranking holds across prior runs: agreement per seed pair, and each picked matrix's score.

    ``nulls`` (:func:`~topotuner_lab.study.stability.noise_null` per model and prior) is what that agreement must
    beat: the agreement of cards built from noise-only drift tables.
    """
    if not cards:
        return ""
    parts = [
        f"\n## Does the {strategy} card hold across prior runs?\n\nEach prior seed is another prior fine-tune (its own "
        "training seed and training rows): the noise a card's ranking must beat. Per pair of seeds, the Jaccard "
        "index of the picks (beside what random cards of the same size share) and the Spearman correlation of the "
        "whole rankings; then every matrix some seed's card picks, with its ranking score's mean and 95% "
        "t-interval over the seeds and how many seeds pick it. The null the picks' agreement is judged against is "
        "not random cards: the same card built from each noise-only drift table (the pretrained weights against a "
        "perturbed copy, no fine-tune), whose picks share what the matrices' own structure gives any ranking.\n"
    ]
    for (model, prior), by_seed in cards.items():
        over, pairs = drift_over_seeds(by_seed), stability_table(by_seed)
        picked = over[over["picked_by"] > 0].reset_index()
        null = (nulls or {}).get((model, prior))
        sentence = noise_null_sentence(null) if null is not None else ""
        parts.append(
            f"\n### {model}, prior {prior}\n\n"
            + pairs.to_markdown(index=False, floatfmt=".3g")
            + "\n\n"
            + picked.to_markdown(index=False, floatfmt=".3g")
            + f"\n\n{stability_sentence(pairs, over)}\n"
            + (f"\n{sentence}\n" if sentence else "")
        )
    return "".join(parts)


def transfer_section(records: list[dict[str, Any]]) -> str:
    """The transfer check recorded before training, one line per transfer and budget."""
    if not records:
        return ""
    table = pd.DataFrame(records)[
        ["prior", "target", "strategy", "median_cosine_card", "median_cosine_all", "rank_agreement", "overlap"]
    ]
    return (
        "\n## Transfer check before training\n\nPer transfer, the gradient of each attention matrix on a few hundred "
        "rows of the prior and of the target task at the pretrained weights: their cosine (median over the card's "
        "matrices and over all), the Spearman correlation of the card's pick order with the target's own gradient "
        "ranking, and the share of the card's picks among the target's top matrices.\n\n"
        + table.to_markdown(index=False, floatfmt=".3g")
        + "\n\n"
        + "".join(f"- {r['verdict']}\n" for r in records)
    )


def transfer_matrix_section(
    matrix: pd.DataFrame, figure: str | None, checks: list[dict[str, Any]] | None = None
) -> str:
    """The transfer matrix across task families: per prior x target, card minus full FT and minus LoRA.

    With the transfer checks recorded before training, also their gradient cosine per setting and whether it
    predicted the card's gain (Spearman over the settings).
    """
    if len(matrix) < 2:
        return ""
    predicted = ""
    if checks:
        matrix = with_transfer_checks(matrix, checks)
        lines = []
        for gain, (rho, n) in check_predicts_gain(matrix).items():
            read = f"Spearman {rho:+.2f} over {n} settings" if np.isfinite(rho) else f"{n} settings: not readable"
            lines.append(f"{gain.replace('_', ' ')}: {read}")
        predicted = (
            "\n\nDid the transfer check predict the card's gain? Its median gradient cosine over the card's matrices "
            "(recorded before training) against the card's difference from each baseline: " + "; ".join(lines) + "."
        )
    shown = matrix.assign(
        target=[f"{t} \u2020" if nc else t for t, nc in zip(matrix["target"], matrix["non_commercial"])]
    ).drop(columns=["non_commercial"])
    note = (
        "\n\n\u2020 non-commercial data (research use only): DialogSum CC BY-NC-SA 4.0, Alpaca CC BY-NC 4.0.\n"
        if matrix["non_commercial"].any()
        else "\n"
    )
    picture = f"\n\n![transfer matrix]({figure})" if figure else ""
    return (
        "\n## Transfer across task families\n\nPer prior and target, the mean test score over seeds of the card "
        "(the pre-specified high-drift card, default recipe), full FT and LoRA at their chosen rates, each target on "
        "its own metric, and the card's differences from both (positive: the card scores higher). Intervals for the "
        "same differences are in the claims above.\n\n"
        + shown.to_markdown(index=False, floatfmt=".3f")
        + note
        + predicted
        + picture
        + "\n"
    )
