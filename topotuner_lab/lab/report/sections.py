"""The report's sections: pure functions from what a comparison computed (tables, claims, snapshots) to Markdown.

Each section computes its numbers, verdicts and table rows; its template (``templates/*.md.j2``, filled by
:mod:`.prose`) holds the prose and lays them out. Nothing here reads a ledger file or starts a computation;
:mod:`.inputs` loads, :mod:`.figures` exports figures.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from topotuner_lab._io.errors import TaskError
from topotuner_lab.drift.noise import noise_check
from topotuner_lab.lab.report import prose
from topotuner_lab.profiles.card import NORMALIZATIONS, ModelIdentity, ProfileCard
from topotuner_lab.profiles.select import MIN_NOISE_DRAWS, CardSettings, build_profile
from topotuner_lab.study.claims import (
    MEASURE_LABELS,
    SAME_BUDGET_RTOL,
    ClaimResult,
    ClaimRules,
    claims_frame,
    common_level,
    level_percent,
    paper_count,
    paper_speed,
    recorded_metric,
    runs_at_chosen_rate,
    stopping_runs,
    summary_verdict,
)
from topotuner_lab.study.matrix import check_predicts_gain, with_transfer_checks
from topotuner_lab.study.plan import extension_runs, plan
from topotuner_lab.study.presets import Preset
from topotuner_lab.study.sequential import at_look
from topotuner_lab.study.sizing import MIN_SEEDS, POWER, minutes_per_finetune, planned_seeds
from topotuner_lab.study.stability import drift_over_seeds, noise_null_sentence, stability_sentence, stability_table
from topotuner_lab.study.stats import INTERIM
from topotuner_lab.study.stopping import early_by, threshold_sweep
from topotuner_lab.tasks.registry import get_task
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
    return prose.render("model_family", tops=tops, table=table.reset_index())


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
    cols = [c for c in ("h0_w1", "h1_w1", "rel_frobenius", "row_cosine_change") if c in table and c in noise[0]]
    floor = pd.concat(noise)[cols].median()
    ratio = (table[cols].median() / floor).to_frame("median fine-tune drift / median noise drift")
    return prose.render(
        "noise_floor",
        pre_share=pre_share,
        post_share=post_share,
        scale=NOISE_SCALE,
        draws=len(noise),
        ratio=ratio,
        check=noise_check(table, noise, metric).message,
    )


def margin_lines(results: pd.DataFrame, rules: ClaimRules) -> list[str]:
    """Per target, the non-inferiority margin its claims use and where it comes from (:meth:`ClaimRules.margin`)."""
    runs = runs_at_chosen_rate(results)
    measure = MEASURE_LABELS.get(rules.measure)
    return [
        prose.sentence(
            "setup_lines",
            "margin",
            target=target,
            value=margin.value,
            measure=measure or recorded_metric(group),
            reason=margin.reason,
        )
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
        below_chance = before < 1 / words if words else False
        lines.append(
            prose.sentence(
                "setup_lines",
                "forgetting",
                target=target,
                text=PPL_TASK,
                probe=probe,
                before=before,
                words=words,
                below_chance=below_chance,
            )
        )
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
    last_sitting_runs: int = 0,
) -> str:
    """What was run and what each run costs here, from the preset the comparison recorded.

    ``test_rows`` is how many test examples the runs scored (a split can hold fewer than the preset asks for);
    ``val_sources`` where each target's validation rows came from, as its runs recorded it; ``looks`` the
    group-sequential looks the study took (a study that stopped at a look planned only its seeds so far);
    ``last_sitting_runs`` the runs whose wall time counts their last sitting alone (the hours are then a lower bound).
    """
    if not preset.target_tasks:  # drift only: no target fine-tunes to cost, judge or count (the template says so)
        return prose.render("setup", preset=preset)
    cost = None
    if "wall_sec" in results and results["wall_sec"].notna().any():
        cost = results.groupby("method")["wall_sec"].median() / 60
    if looks and not looks[-1]["adds_seeds"]:  # stopped at a look: the later blocks were never planned to run
        planned = len(plan(at_look(preset, int(looks[-1]["seeds"]))))
    added = extension_runs(results, preset)  # runs the plan did not list: a sweep extended past its grid's edge
    return prose.render(
        "setup",
        preset=preset,
        validation=_validation_from(val_sources or {}),
        test_rows=test_rows,
        cost=cost,
        hours=results["wall_sec"].sum() / 3600 if cost is not None else None,
        runs=runs,
        margins=margin_lines(results, ClaimRules.of(preset)),
        forgetting=forgetting_lines(results, preset),
        looks=look_lines(preset, looks or []),
        partial=runs < planned + added,
        planned=planned,
        added=added,
        last_sitting_runs=last_sitting_runs,
    )


def look_lines(preset: Preset, looks: list[dict[str, Any]]) -> list[str]:
    """The seed blocks a group-sequential study planned and what each look it took decided."""
    if not preset.seed_blocks:
        return []
    return [
        prose.sentence("setup_lines", "blocks", seed_blocks=preset.seed_blocks, seed_floor=preset.seed_floor),
        *(
            prose.sentence(
                "setup_lines",
                "look",
                seeds=look["seeds"],
                level=look["level"],
                undecided=look["undecided"],
                adds_seeds=look["adds_seeds"],
                seed_floor=look.get("seed_floor", 0),  # looks recorded before the field: no floor
            )
            for look in looks
        ),
    ]


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
    return prose.render(
        "sizing",
        margin_share=margin_share,
        power=POWER,
        table=shown,
        min_seeds=MIN_SEEDS,
        plans={measure: planned_seeds(sizes, measure) for measure in sizes["measure"].unique()},
        minutes=minutes_per_finetune(results),
    )


def claims_section(claims: list[ClaimResult], forest: str | None = None) -> str:
    """The claims table with one verdict per claim, the paper's counts, and the forest plot of the paired claims.

    The table holds each estimate, its interval (its level in the header where every claim shares one, else in a
    column), threshold and verdict; the paper's counts are the settings the
    card beats LoRA in and the time it saves; ``forest`` is the forest plot's PNG path.
    """
    if not claims:
        return prose.render("claims", judged=False)
    table = claims_frame(claims)
    fmt = lambda v, signed: f"{v:+.3f}" if signed else f"{v:.3g}"  # noqa: E731 - differences signed, ratios and epochs plain
    common = common_level(claims)  # a group-sequential look widens the paired claims' intervals past 95%
    estimate = f"estimate [{common} CI]" if common else "estimate [CI]"
    table[estimate] = [
        f"{fmt(e, ' - ' in m)} [{fmt(lo, ' - ' in m)}, {fmt(hi, ' - ' in m)}]"
        for e, lo, hi, m in zip(table["estimate"], table["low"], table["high"], table["measure"])
    ]
    table["CI level"] = [level_percent(level) for level in table["level"]]
    roles = "role" in table and (table["role"].fillna("") != "").any()
    columns = [
        *(["role"] if roles else []),
        *("claim", "setting", "measure", estimate),
        *([] if common else ["CI level"]),
        *("threshold", "verdict"),
    ]
    sized = "to_decide" in table and (table["to_decide"].fillna("") != "").any()
    interim = bool((table["verdict"] == INTERIM).any())
    return prose.render(
        "claims",
        judged=True,
        earliest_stop=EARLIEST_STOP,
        same_budget_pct=round(100 * SAME_BUDGET_RTOL),
        interim=interim,
        roles=roles,
        sized=sized,
        table=table[[*columns, "to_decide"]] if sized else table[columns],
        overall=[(claim, summary_verdict(claims, claim)) for claim in dict.fromkeys(table["claim"])],
        counts=[line for line in (paper_count(claims), paper_speed(claims)) if line],
        forest=forest,
        common=common,
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
    low, high = grid["min"].reindex(chosen.index), grid["max"].reindex(chosen.index)
    at_edge, fixed = chosen[((chosen == low) | (chosen == high)) & (low < high)], chosen[low == high]
    return prose.render(
        "learning_rates",
        label=label,
        seeds=sorted(swept["seed"].unique()),
        table=table,
        edges=[(run, lr) for (_, _, run), lr in at_edge.items()],
        fixed=[(run, lr) for (_, _, run), lr in fixed.items()],
    )


def stopping_section(
    results: pd.DataFrame,
    histories: list[tuple[list[float], list[float]]] | None = None,
    rules: pd.DataFrame | None = None,
    figure: str | None = None,
) -> str:
    """Stop epochs by schedule, a threshold sweep over the stored drift, the rules compared, drift against the rate.

    ``rules`` is the first table of :func:`~topotuner_lab.lab.report.inputs.stop_rules` (empty or None: not shown);
    ``figure`` the path of the threshold rules' sweeps drawn on the same runs (shown with the comparison).
    """
    cards = stopping_runs(results)
    if cards.empty:
        return ""
    compared = None
    if rules is not None and len(rules):
        compared = rules.assign(
            **{
                "stops early [95% CI]": [
                    f"{e:.2f} [{lo:.2f}, {hi:.2f}]"
                    for e, lo, hi in zip(rules["early_share"], rules["early_low"], rules["early_high"])
                ],
                "score at stop - end [95% CI]": [
                    f"{e:+.3f} [{lo:+.3f}, {hi:+.3f}]"
                    for e, lo, hi in zip(rules["change"], rules["change_low"], rules["change_high"])
                ],
            }
        )[["target", "tolerance", "rule", "parameter", "runs", "mean_stop", "at_minimum", "stops early [95% CI]",
           "score at stop - end [95% CI]"]]  # fmt: skip
    table = cards.groupby(cards["schedule"].fillna("linear")).agg(
        runs=("run", "size"),
        stopped=("stop_epoch", "count"),
        median_stop=("stop_epoch", "median"),
        mean_test_acc=("test_acc", "mean"),
        mean_acc_at_stop=("acc_at_stop", "mean"),
    )
    budget = int(cards["epochs_run"].max())
    sweep = threshold_sweep(histories, budget) if histories else None  # from each linear run's stored drift
    gap = None
    if results["drift_minus_lr_ratio"].notna().any():
        gap = results.groupby("method")["drift_minus_lr_ratio"].median().dropna()  # methods with a drift record
    return prose.render(
        "stopping", table=table, sweep=sweep, gap=gap, compared=compared, figure=figure, early=early_by(budget),
        budget=budget,
    )  # fmt: skip


def budget_curves_section(curves: pd.DataFrame, figure: str | None = None, measure: str = "accuracy") -> str:
    """Each arm's score against the share of the model it trains, one point per budget (two budgets or more).

    Upd.% and the mean relative change stand beside Train.% where the runs recorded them.
    """
    if curves.empty:
        return ""
    table = curves.assign(
        **{
            "Train.%": curves["share"] * 100,
            "Upd.%": curves["updated"] * 100,
            "mean rel. change": curves["rel_change"],
            "score [95% CI]": [
                f"{e:.3f} [{lo:.3f}, {hi:.3f}]" for e, lo, hi in zip(curves["score"], curves["low"], curves["high"])
            ],
        }
    )
    updates = ["Upd.%", "mean rel. change"] if table["Upd.%"].notna().any() else []
    table = table[["target", "curve", "budget", "Train.%", *updates, "seeds", "score [95% CI]"]]
    label = MEASURE_LABELS.get(measure, "test accuracy")
    return prose.render("budget_curves", table=table, figure=figure, measure=label, updates=bool(updates))


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
    return prose.render("normalization", prior=prior, table=pd.DataFrame(rows))


def header(command: str, machine: str) -> str:
    """The title and where the numbers come from (``machine``: ``; ``-separated when sittings ran on several).

    No date: the report is a function of the ledger, so the same command renders it again byte for byte.
    """
    return prose.render("header", command=command, machine=machine)


def spread_section(results: pd.DataFrame) -> str:
    """Mean and spread over seeds at each arm's chosen rate."""
    return prose.render("spread", table=spread_table(results))


def drift_section(model: str, prior: str, figure: str, by_kind: pd.DataFrame) -> str:
    """One prior fine-tune's drift: the heatmap figure and the mean drift per projection kind."""
    ranked = by_kind["h0_w1_per_row"].sort_values(ascending=False)
    return prose.render("drift", model=model, prior=prior, figure=figure, ranked=ranked.index, by_kind=by_kind)


def all_runs_section(results: pd.DataFrame) -> str:
    """Every fine-tune, the sweeps included."""
    return prose.render("all_runs", text=PPL_TASK, table=results.drop(columns=["run_dir"]))


def seed_picks_section(picks: pd.DataFrame, strategy: str, budget: float) -> str:
    """The kinds a card picks after each prior seed, per model (the data of the stability and model claims)."""
    if picks.empty or picks["prior seed"].nunique() < 2:
        return ""
    return prose.render("seed_picks", strategy=strategy, budget=budget, picks=picks)


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
    settings = []
    for (model, prior), by_seed in cards.items():
        over, pairs = drift_over_seeds(by_seed), stability_table(by_seed)
        null = (nulls or {}).get((model, prior))
        settings.append(
            {
                "model": model,
                "prior": prior,
                "pairs": pairs,
                "picked": over[over["picked_by"] > 0].reset_index(),
                "stability": stability_sentence(pairs, over),
                "null": noise_null_sentence(null) if null is not None else "",
            }
        )
    return prose.render("prior_seeds", strategy=strategy, settings=settings)


def transfer_section(records: list[dict[str, Any]]) -> str:
    """The transfer check recorded before training, one line per transfer and budget."""
    if not records:
        return ""
    table = pd.DataFrame(records)[
        ["prior", "target", "strategy", "median_cosine_card", "median_cosine_all", "rank_agreement", "overlap"]
    ]
    return prose.render("transfer", table=table, verdicts=[r["verdict"] for r in records])


def transfer_matrix_section(
    matrix: pd.DataFrame, figure: str | None, checks: list[dict[str, Any]] | None = None
) -> str:
    """The transfer matrix across task families: per prior x target, card minus full FT and minus LoRA.

    With the transfer checks recorded before training, also their gradient cosine per setting and whether it
    predicted the card's gain (Spearman over the settings).
    """
    if len(matrix) < 2:
        return ""
    predictions = []
    if checks:
        matrix = with_transfer_checks(matrix, checks)
        predictions = [
            (gain, rho if np.isfinite(rho) else None, n) for gain, (rho, n) in check_predicts_gain(matrix).items()
        ]
    shown = matrix.assign(
        target=[f"{t} \u2020" if nc else t for t, nc in zip(matrix["target"], matrix["non_commercial"])]
    ).drop(columns=["non_commercial"])
    return prose.render(
        "transfer_matrix",
        table=shown,
        non_commercial=matrix["non_commercial"].any(),
        predictions=predictions,
        figure=figure,
    )
