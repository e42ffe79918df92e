"""The report's pure sections (lab.report.sections): the numbers they print come from their inputs."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from topotuner_lab.drift.cache import DriftCache
from topotuner_lab.drift.compute import drift_table
from topotuner_lab.lab.report import sections
from topotuner_lab.profiles.card import ModelIdentity
from topotuner_lab.profiles.select import CardSettings, build_profile
from topotuner_lab.study.claim_ids import ClaimId
from topotuner_lab.study.claims import ClaimResult, ClaimRules
from topotuner_lab.study.plan import RunKey
from topotuner_lab.study.presets import PRESETS, Preset
from topotuner_lab.training.config import FinetuneConfig
from topotuner_lab.weights.extract import extract_snapshot
from topotuner_lab.weights.models import build_tiny_model
from topotuner_lab.weights.projections import KINDS
from topotuner_lab.weights.snapshot import NOISE_SCALE, perturb_snapshot

HIGH = ("profile", "high-drift", 0.05)


def _row(seed, key, lr, selected, val, test, *, schedule="linear", ood_after=0.5, stop=None, acc_stop=None, **more):
    k = RunKey(*key)
    k = replace(k, schedule=schedule)
    row = {
        "prior": "sst2",
        "target": "agnews",
        "seed": seed,
        "run": k.name,
        **k.columns(),
        "lr": lr,
        "selected": selected,
        "val_acc": val,
        "test_acc": test,
        "ood_acc_before": 0.6,
        "ood_acc_after": ood_after,
        "trainable_pct": 100.0 if k.method == "full" else 5.0,
        "epochs_run": 4,
        "stop_epoch": stop,
        "acc_at_stop": acc_stop,
        "drift_minus_lr_ratio": None,
        "sec_per_epoch": 10.0 if k.method == "full" else 6.0,
        "wall_sec": 180.0 if k.method == "full" else 30.0,
        "run_dir": f"runs/prior-sst2/agnews/seed{seed}/{k.name}/lr-{lr:g}",
    }
    return {**row, **more}


def _results() -> pd.DataFrame:
    """Full FT and a high-drift card, two seeds: seed 0 sweeps (full 3 rates, the card 2), seed 1 at the chosen rate;
    the card also at a constant rate. Full FT's 1e-3 and the card's 1e-2 are chosen on validation accuracy."""
    return pd.DataFrame(
        [
            _row(0, ("full",), 1e-4, False, 0.60, 0.55, wall_sec=60.0),
            _row(0, ("full",), 1e-3, True, 0.70, 0.65, ood_after=0.4, wall_sec=180.0),
            _row(0, ("full",), 1e-2, False, 0.50, 0.45, wall_sec=120.0),
            _row(0, HIGH, 1e-3, False, 0.50, 0.50, stop=2, acc_stop=0.40),
            _row(0, HIGH, 1e-2, True, 0.80, 0.70, stop=2, acc_stop=0.60, drift_minus_lr_ratio=0.2),
            _row(0, HIGH, 1e-2, False, 0.75, 0.68, schedule="constant", stop=3, acc_stop=0.62),
            _row(1, ("full",), 1e-3, True, 0.72, 0.75, ood_after=0.2, wall_sec=180.0),
            _row(1, HIGH, 1e-2, True, 0.78, 0.80, drift_minus_lr_ratio=0.5),  # never stopped
            _row(1, HIGH, 1e-2, False, 0.74, 0.66, schedule="constant", stop=1, acc_stop=0.50),
        ]
    )


def _table_rows(markdown: str) -> list[list[str]]:
    """The body rows of every Markdown table in ``markdown``, as stripped cells."""
    rows = []
    for line in markdown.splitlines():
        if line.startswith("|") and not re.fullmatch(r"\|[-:| ]+\|", line):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def _row_of(markdown: str, *first_cells: str) -> list[str]:
    found = [r for r in _table_rows(markdown) if r[: len(first_cells)] == list(first_cells)]
    assert len(found) == 1, (first_cells, markdown)
    return found[0]


def _header_of(markdown: str) -> list[str]:
    return _table_rows(markdown)[0]


def _cell(markdown: str, column: str, *first_cells: str) -> str:
    return _row_of(markdown, *first_cells)[_header_of(markdown).index(column)]


# header --------------------------------------------------------------------------------------------------------
def test_header_names_the_command_and_machine_and_no_date():
    text = sections.header("make results", "AMD EPYC, 2 cores")
    assert text.startswith("# Results: the paper's comparison in miniature\n")
    assert "Produced by `make results` (AMD EPYC, 2 cores)." in text
    assert not re.search(r"\d{4}-\d\d-\d\d", text)  # a date would make the report differ on another day
    several = sections.header("make results", "2 CPU cores, no GPU; 16 CPU cores, NVIDIA H200")
    assert "(sittings on: 2 CPU cores, no GPU; 16 CPU cores, NVIDIA H200)." in several


# setup ---------------------------------------------------------------------------------------------------------
PRESET = Preset(
    model="tiny-llama",
    other_models=("tiny-qwen2",),
    prior_tasks=("sst2",),
    target_tasks=("agnews", "gsm8k"),
    budgets=(0.05, 0.1),
    strategies=("high-drift", "random"),
    seeds=(0, 1),
    lr_grid={"full": (1e-5, 3e-5), "lora": (1e-3,), "profile": (2e-4, 2e-3)},
    constant_lr=("high-drift",),
    stop_threshold=0.7,
    prior=FinetuneConfig(epochs=3, n_train=32, learning_rate=2e-4),
    target=FinetuneConfig(
        epochs=5, n_train=24, n_val=8, n_test=40, batch_size=4, max_length=40, observe_only=True, eval_each_epoch=True
    ),
)


def _lines(section: str) -> list[str]:
    return [line[2:] for line in section.splitlines() if line.startswith("- ")]


def test_setup_reports_the_presets_sizes_grids_and_arms():
    text = sections.setup_section(PRESET, 9, 9, _results())
    assert text.startswith("\n## Setup\n\n")
    model, prior, targets, rates, cards, stopping, cost, margin, forgetting, drift_only = _lines(text)
    assert model.startswith(
        "Model: tiny-llama; priors sst2, each card transferred to every target but its own prior (agnews, gsm8k); "
        "seeds 0, 1 (each"
    )
    assert prior == (
        "Prior fine-tune: full FT, 32 examples x 3 epoch(s), lr 0.0002, prior seeds 0; drift recipes default."
    )
    assert targets.startswith("Targets: 24 training, 8 validation (carved from the training split), 40 test examples;")
    assert "5 epochs, batch 4, 40 tokens" in targets
    assert (
        "swept over full 1e-05, 3e-05; lora 0.001 (one rate: fixed, not tuned here); profile 0.0002, 0.002 on the "
        "first seed" in rates
    )
    assert cards.startswith("Cards: high-drift, random ranked by `h0_w1` with `per-point` normalization")
    assert "at budgets 5%, 10% of all parameters" in cards
    assert stopping.startswith("Early stopping: threshold 0.7 on H0 W1")
    assert "observe mode" in stopping and "the card(s) high-drift also run at their chosen rate" in stopping
    # wall seconds: full 60, 180, 120, 180 (median 150 s = 2.5 min), the card 30 each (0.5 min); 690 s = 0.19 h
    assert cost == (
        "Cost on the machine(s) in the header (the medians pool every sitting's runs), median minutes per fine-tune "
        "including evaluation: full 2.5, profile 0.5; 9 fine-tunes in all, 0.2 h."
    )
    assert margin.startswith("Margin (agnews): a card is competitive when it loses at most 0.03 acc to full FT")
    assert forgetting == (
        "Forgetting (agnews): each held-out gsm8k text's NLL, and sst2 accuracy, zero-shot 0.600 (chance 0.50 for 2 "
        "answer words)."
    )
    assert drift_only == "Drift only (own prior fine-tunes, no transfer grid): tiny-qwen2."
    assert "Partial run" not in text and "lower bounds" not in text
    # runs resumed from a checkpoint that recorded no earlier time: their minutes are their last sitting's alone
    (resumed,) = [
        line
        for line in _lines(sections.setup_section(PRESET, 9, 9, _results(), last_sitting_runs=2))
        if line.startswith("Cost")
    ]
    assert resumed == cost + (
        " 2 of them resumed from a checkpoint that recorded no earlier time, so their minutes count their last "
        "sitting alone: the medians and hours are lower bounds."
    )


def test_setup_gives_the_presets_reasons_after_its_margins():
    reasons = ("SST-2 alone: BoolQ's gain is a label-prior shift.", "The margin is 0.25 x the pilot's gain.")
    lines = _lines(sections.setup_section(replace(PRESET, rationale=reasons), 9, 9, _results()))
    assert lines[-3:] == [*(f"Why (from the preset): {reason}" for reason in reasons), lines[-1]]
    assert lines[-4].startswith("Forgetting (agnews)") and lines[-1].startswith("Drift only")
    assert not any(line.startswith("Why") for line in _lines(sections.setup_section(PRESET, 9, 9, _results())))


def test_setup_warns_when_the_forgetting_probe_starts_below_chance():
    """cpu-decide's BoolQ probe scores 0.375 zero-shot: the model leans to "no", and full FT raises the score by
    moving that lean, so the accuracy probe cannot read forgetting there."""
    (line,) = sections.forgetting_lines(_results().assign(ood_acc_before=0.375), PRESET)
    assert "zero-shot 0.375 (chance 0.50 for 2 answer words); below chance, the model leans to one answer" in line
    assert "read the held-out NLL claim as the measure of forgetting" in line
    assert sections.forgetting_lines(_results().drop(columns="ood_acc_before"), PRESET) == []
    (gone,) = sections.forgetting_lines(_results().assign(target="moved/away.yaml"), PRESET)  # a spec file since moved
    assert gone == (
        "Forgetting (moved/away.yaml): each held-out gsm8k text's NLL, and moved/away.yaml's out-of-domain task "
        "accuracy, zero-shot 0.600."
    )


def test_setup_says_where_the_validation_rows_came_from():
    def targets(sources):
        return _lines(sections.setup_section(PRESET, 9, 9, _results(), 40, sources))[2]

    split = "the task's validation split (whole-sentences)"
    assert targets({"agnews": split}).startswith(f"Targets: 24 training, 8 validation ({split}), 40 test")
    both = targets({"agnews": split, "gsm8k": "carved from the training draw"})
    assert f"8 validation (agnews: {split}; gsm8k: carved from the training draw)" in both


def test_setup_of_a_partial_run_says_how_much_is_done():
    text = sections.setup_section(PRESET, 9, 26, _results())
    assert _lines(text)[-1].startswith("**Partial run**: 9 of the 26 planned fine-tunes are done")


def test_a_partial_run_counts_the_runs_its_extended_sweeps_added():
    results = _results().assign(role="chosen")
    results.loc[[0, 1, 2], "role"] = "sweep"
    results.loc[[0, 1, 2], "lr"] = [1e-5, 3e-5, 9.49e-5]  # full FT's grid is 1e-5, 3e-5: the third extends it
    partial = _lines(sections.setup_section(PRESET, 9, 9, results))[-1]
    assert partial.startswith(
        "**Partial run**: 9 of the 9 planned fine-tunes (plus 1 added by extending sweeps past a grid edge) are done"
    )
    assert "Partial run" not in sections.setup_section(PRESET, 10, 9, results)


def test_setup_without_the_optional_parts():
    preset = replace(
        PRESET,
        model=None,
        other_models=(),
        constant_lr=(),
        prior=replace(PRESET.prior, learning_rate=None),
        target=replace(PRESET.target, observe_only=False),
    )
    text = sections.setup_section(preset, 9, 9, _results().drop(columns=["wall_sec"]))
    lines = _lines(text)
    assert len(lines) == 8 and lines[-2].startswith("Margin (")  # no cost, drift-only or partial-run line
    assert lines[-1].startswith("Forgetting (")
    assert lines[0].startswith("Model: embedded SmolLM2-135M-Instruct;")
    assert lines[1].endswith("lr default, prior seeds 0; drift recipes default.")
    assert lines[5].endswith("normalized by the first epoch's.")
    assert "observe mode" not in text and "constant schedule" not in text


def test_setup_leaves_out_the_cost_when_no_run_recorded_it():
    results = _results().assign(wall_sec=np.nan)
    assert "Cost on the machine" not in sections.setup_section(PRESET, 9, 9, results)


# claims --------------------------------------------------------------------------------------------------------
CLAIMS = [
    ClaimResult(
        ClaimId.COMPETITIVE,
        "sst2 -> agnews",
        "profile:high-drift@0.05 - full (test accuracy)",
        0.0123,
        -0.0041,
        0.0291,
        -0.03,
        "held",
    ),
    ClaimResult(
        ClaimId.COMPETITIVE,
        "agnews -> sst2",
        "profile:high-drift@0.05 - full (test accuracy)",
        -0.05,
        -0.09,
        -0.04,
        -0.03,
        "did not hold",
    ),
    ClaimResult(
        ClaimId.FASTER_THAN_FULL,
        "all settings",
        "median profile / median full seconds per epoch",
        0.6,
        0.55,
        0.66,
        0.8,
        "held",
    ),
]


def test_claims_table_prints_each_estimate_interval_threshold_and_verdict():
    text = sections.claims_section(CLAIMS)
    assert text.startswith("\n## Claims, checked against these numbers\n")
    assert _table_rows(text)[1:] == [
        [
            ClaimId.COMPETITIVE,
            "sst2 -> agnews",
            "profile:high-drift@0.05 - full (test accuracy)",
            "+0.012 [-0.004, +0.029]",  # a difference: signed
            "-0.03",
            "held",
        ],
        [
            ClaimId.COMPETITIVE,
            "agnews -> sst2",
            "profile:high-drift@0.05 - full (test accuracy)",
            "-0.050 [-0.090, -0.040]",
            "-0.03",
            "did not hold",
        ],
        [
            ClaimId.FASTER_THAN_FULL,
            "all settings",
            "median profile / median full seconds per epoch",
            "0.6 [0.55, 0.66]",  # a ratio: plain
            "0.8",
            "held",
        ],
    ]


def test_claims_summary_holds_only_where_every_setting_agrees():
    text = sections.claims_section(CLAIMS)
    summary = text.split("where every setting agrees):\n\n")[1].split("\n\n")[0].splitlines()
    assert summary == [
        f"- {ClaimId.COMPETITIVE}: **inconclusive**",  # held in one setting, not in the other
        f"- {ClaimId.FASTER_THAN_FULL}: **held**",
    ]
    both_fail = [replace(CLAIMS[0], verdict="did not hold"), CLAIMS[1]]
    assert f"- {ClaimId.COMPETITIVE}: **did not hold**" in sections.claims_section(both_fail)


def test_claims_section_states_the_margin_and_earliest_stop():
    from topotuner_lab.training.early_stopping import EARLIEST_STOP

    text = sections.claims_section(CLAIMS)
    assert "Competitive means at most the target's margin below full FT (the threshold column" in text
    assert f"the earliest epoch the rule can fire, {EARLIEST_STOP}, needs a longer budget" in text


def test_no_claims_yet():
    assert sections.claims_section([]) == "\n## Claims\n\nNo complete setting to judge yet.\n"


# learning rates ------------------------------------------------------------------------------------------------
def test_lr_section_shows_the_first_seeds_sweep_and_the_chosen_rate():
    text = sections.lr_section(_results())
    assert _header_of(text) == [
        "prior",
        "target",
        "run",
        "val acc @ 0.0001",
        "val acc @ 0.001",
        "val acc @ 0.01",
        "chosen lr",
    ]
    full = _row_of(text, "sst2", "agnews", "full")
    assert full[3:] == ["0.6", "0.7", "0.5", "0.001"]
    card = _row_of(text, "sst2", "agnews", "profile:high-drift@0.05")
    assert card[4:] == ["0.5", "0.8", "0.01"]  # seed 1 (0.78) and the constant-rate run (0.75) are not the sweep
    assert "profile:high-drift@0.05+constant" not in text
    assert len(_table_rows(text)) == 3


def test_lr_section_averages_the_sweep_seeds_criterion_and_reads_the_chosen_runs():
    """With sweep seeds the table is the mean over them of the preset's criterion; result seeds are not the sweep."""

    def run(seed: int, lr: float, role: str, acc: float, logloss: float) -> dict[str, object]:
        keys = {"prior": "agnews", "target": "sst2", "run": "full", "schedule": "linear"}
        return keys | {
            "seed": seed,
            "lr": lr,
            "role": role,
            "selected": role == "chosen",
            "val_acc": acc,
            "val_logloss": logloss,
        }

    results = pd.DataFrame(
        [
            run(100, 1e-5, "sweep", 0.80, 0.40),
            run(101, 1e-5, "sweep", 0.84, 0.50),
            run(100, 1e-4, "sweep", 0.86, 0.70),
            run(101, 1e-4, "sweep", 0.88, 0.90),
            run(0, 1e-4, "chosen", 0.99, 0.10),  # a result seed: not part of the sweep's means
        ]
    )
    accuracy = sections.lr_section(results, "accuracy")
    assert "mean over seeds 100, 101" in accuracy
    assert _row_of(accuracy, "agnews", "sst2", "full")[3:] == ["0.82", "0.87", "0.0001"]
    logloss = sections.lr_section(results, "logloss")
    assert _header_of(logloss)[3] == "val log-loss @ 1e-05"
    assert _row_of(logloss, "agnews", "sst2", "full")[3:] == ["0.45", "0.8", "0.0001"]


def test_lr_section_orders_the_rates_of_interleaved_grids():
    """Full FT's extension (3.16e-4) ran before the card's grid (3e-4, 1e-3): the columns still ascend."""
    rows = [
        {
            "prior": "agnews",
            "target": "sst2",
            "run": run,
            "schedule": "linear",
            "seed": 100,
            "lr": lr,
            "role": "sweep",
            "selected": False,
            "val_acc": 0.8,
            "val_logloss": 0.5,
        }
        for run, lr in [
            ("full", 1e-4),
            ("full", 3.16e-4),
            ("profile:high-drift@0.01", 3e-4),
            ("profile:high-drift@0.01", 1e-3),
        ]
    ]
    text = sections.lr_section(pd.DataFrame(rows), "accuracy")
    assert _header_of(text)[3:-1] == ["val acc @ 0.0001", "val acc @ 0.0003", "val acc @ 0.000316", "val acc @ 0.001"]
    # a rate a method never tried, and a rate not chosen yet (no result runs), are blank cells, not "nan"
    assert _row_of(text, "agnews", "sst2", "full")[3:] == ["0.8", "", "0.8", "", ""]


def test_lr_section_warns_about_rates_chosen_at_the_grids_edge():
    text = sections.lr_section(_results())
    warning = re.search(r"\*\*Chosen at the edge of its grid\*\*: (.*?)\. The best rate", text)
    assert warning and warning.group(1) == "profile:high-drift@0.05 (0.01)"  # full FT chose the middle of 3 rates
    middle = _results()
    middle.loc[len(middle)] = _row(0, HIGH, 1e-1, False, 0.2, 0.2)  # 1e-2 now lies inside the card's grid
    assert "edge of its grid" not in sections.lr_section(middle)


def test_lr_section_calls_a_one_rate_grid_fixed_not_chosen_at_an_edge():
    one_rate = _results()
    one_rate = one_rate[(one_rate["run"] != "full") | (one_rate["lr"] == 1e-3)]  # full FT ran its one rate
    text = sections.lr_section(one_rate)
    fixed = re.search(r"\*\*Fixed, not swept\*\*: (.*?)\. Each ran", text)
    assert fixed and fixed.group(1) == "full (0.001)"
    edge = re.search(r"\*\*Chosen at the edge of its grid\*\*: (.*?)\. The best rate", text)
    assert edge and edge.group(1) == "profile:high-drift@0.05 (0.01)"  # a real sweep still warns


# spread over seeds ---------------------------------------------------------------------------------------------
def test_spread_table_means_over_seeds_at_the_chosen_rate():
    table = sections.spread_table(_results()).set_index("run")
    assert list(table.index) == ["full", "profile:high-drift@0.05"]  # sweeps and the constant-rate runs left out
    full, card = table.loc["full"], table.loc["profile:high-drift@0.05"]
    assert full["seeds"] == 2 and full["lr"] == 1e-3 and card["lr"] == 1e-2
    assert full["val_acc_mean"] == pytest.approx(0.71) and full["test_acc_mean"] == pytest.approx(0.70)
    assert full["test_acc_std"] == pytest.approx(np.std([0.65, 0.75], ddof=1))
    assert full["ood_drop_mean"] == pytest.approx(((0.6 - 0.4) + (0.6 - 0.2)) / 2)
    assert card["val_acc_mean"] == pytest.approx(0.79) and card["test_acc_mean"] == pytest.approx(0.75)
    assert card["acc_at_stop_mean"] == pytest.approx(0.6) and card["stop_epoch_mean"] == 2.0  # one run stopped
    assert card["ood_drop_mean"] == pytest.approx(0.1)
    assert full["sec_per_epoch_median"] == 10.0 and card["trainable_pct"] == 5.0
    assert np.isnan(full["acc_at_stop_mean"])


def test_spread_section_prints_the_rounded_table():
    text = sections.spread_section(_results())
    assert text.startswith("\n## Mean and spread over seeds\n")
    assert _cell(text, "test_acc_std", "sst2", "agnews", "full") == "0.0707"
    assert _cell(text, "ood_drop_mean", "sst2", "agnews", "full") == "0.3"
    assert _cell(text, "val_acc_mean", "sst2", "agnews", "profile:high-drift@0.05") == "0.79"
    assert _cell(text, "acc_at_stop_mean", "sst2", "agnews", "full") == ""  # missing, not "nan"


# early stopping ------------------------------------------------------------------------------------------------
def test_stopping_section_by_schedule():
    text = sections.stopping_section(_results())
    assert text.startswith("\n## Early stopping apart from the schedule\n")
    assert _header_of(text) == ["schedule", "runs", "stopped", "median_stop", "mean_test_acc", "mean_acc_at_stop"]
    # constant: both seeds, stopped at 3 and 1; linear: the chosen-rate runs only, one stopped (at 2)
    assert _row_of(text, "constant") == ["constant", "2", "2", "2", "0.67", "0.56"]
    assert _row_of(text, "linear") == ["linear", "2", "1", "2", "0.75", "0.6"]


def test_stopping_section_median_drift_minus_rate_per_method():
    text = sections.stopping_section(_results().query("method == 'profile'"))
    assert "median per method: profile +0.35." in text  # the median of 0.2 and 0.5
    none = _results().assign(drift_minus_lr_ratio=np.nan)
    assert "median per method" not in sections.stopping_section(none)


def test_stopping_section_is_empty_without_card_runs():
    assert sections.stopping_section(_results().query("method == 'full'")) == ""


def test_stopping_section_leaves_out_methods_without_a_drift_record():
    text = sections.stopping_section(_results())
    assert "nan" not in text and "median per method: profile +0.35." in text


# all runs ------------------------------------------------------------------------------------------------------
def test_all_runs_lists_every_run_without_folders():
    results = _results()
    text = sections.all_runs_section(results)
    assert text.startswith("\n## All runs\n")
    header, rows = _header_of(text), _table_rows(text)[1:]
    assert len(rows) == len(results) and "run_dir" not in header and "runs/prior-sst2" not in text
    assert header[:4] == ["prior", "target", "seed", "run"]
    lrs = [r[header.index("lr")] for r in rows]
    assert lrs == ["0.0001", "0.001", "0.01", "0.001", "0.01", "0.01", "0.001", "0.01", "0.01"]
    assert [r[header.index("wall_sec")] for r in rows][:3] == ["60", "180", "120"]


def test_all_runs_of_one_seed_leave_the_seed_column_out():
    text = sections.all_runs_section(_results().query("seed == 0"))
    assert "seed" not in _header_of(text) and len(_table_rows(text)) == 1 + 6


# drift by kind -------------------------------------------------------------------------------------------------
def _drift(values: dict[str, tuple[int, float, float, float]]) -> pd.DataFrame:
    """pid -> (rows, h0_w1, h1_w1, rel_frobenius)."""
    return pd.DataFrame(
        [
            {"pid": pid, "kind": pid[-1], "rows": r, "h0_w1": h0, "h1_w1": h1, "rel_frobenius": f}
            for pid, (r, h0, h1, f) in values.items()
        ]
    )


DRIFT = _drift(
    {
        "L0.q": (64, 6.4, 1.0, 0.1),
        "L1.q": (64, 12.8, 3.0, 0.3),
        "L0.k": (32, 3.2, 2.0, 0.2),
        "L1.k": (32, 1.6, 4.0, 0.4),
        "L0.v": (32, 8.0, 5.0, 0.5),
        "L1.v": (32, 9.6, 7.0, 0.7),
    }
)


def test_drift_by_kind_means_per_kind_and_per_row():
    by_kind = sections.drift_by_kind(DRIFT)
    assert list(by_kind.index) == list(KINDS) and list(by_kind.columns) == [
        "h0_w1",
        "h0_w1_per_row",
        "h1_w1",
        "rel_frobenius",
    ]
    assert by_kind.loc["q"].tolist() == pytest.approx([9.6, 0.15, 2.0, 0.2])
    assert by_kind.loc["k"].tolist() == pytest.approx([2.4, 0.075, 3.0, 0.3])
    assert by_kind.loc["v"].tolist() == pytest.approx([8.8, 0.275, 6.0, 0.6])
    assert by_kind.loc["o"].isna().all()  # no o projection in the table: a row of NaN, kinds stay in order


def test_drift_section_ranks_kinds_per_row():
    text = sections.drift_section("tiny-llama", "sst2", "figures/drift.html", sections.drift_by_kind(DRIFT))
    assert text.startswith(
        "\n## tiny-llama: drift after the sst2 prior fine-tune\n\n![drift heatmaps](figures/drift.html)"
    )
    # raw H0 W1 would rank q (9.6) above v (8.8); per row v (0.275) > q (0.15) > k (0.075), o last (NaN)
    assert "since W1 sums over a diagram's points: v > q > k > o):" in text
    assert _cell(text, "h0_w1_per_row", "v") == "0.275"


# model family --------------------------------------------------------------------------------------------------
def test_model_family_names_each_models_most_drifting_kinds():
    kinds = {
        ("tiny-llama", "sst2"): pd.Series({"q": 0.1, "k": 0.2, "v": 0.5, "o": 0.4}),
        ("tiny-llama", "agnews"): pd.Series({"q": 0.1, "k": 0.2, "v": 0.3, "o": 0.6}),
        ("tiny-qwen2", "sst2"): pd.Series({"q": 0.5, "k": 0.6, "v": 0.1, "o": 0.2}),
    }
    text = sections.model_family_section(kinds)
    assert text.startswith("\n## Is the drift profile model-dependent?\n")
    assert "Most-drifting kind here: tiny-llama: o, v; tiny-qwen2: k." in text
    assert _cell(text, "ranking", "tiny-llama", "sst2") == "v > o > k > q"
    assert _cell(text, "ranking", "tiny-llama", "agnews") == "o > v > k > q"
    assert _cell(text, "ranking", "tiny-qwen2", "sst2") == "k > q > o > v"
    assert _row_of(text, "tiny-qwen2", "sst2")[2:6] == ["0.5", "0.6", "0.1", "0.2"]


# noise floor ---------------------------------------------------------------------------------------------------
NOISE_COLUMNS = ["h0_w1", "h1_w1", "rel_frobenius", "row_cosine_change"]


def _values(pids: list[str], **columns: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"pid": pids, **columns})


def test_noise_floor_section_puts_the_real_drift_over_the_floor():
    pre, post = 1.0, 0.75  # grid shares of the pretrained and fine-tuned weights
    pids = ["L0.q", "L0.k"]
    # medians: table 5, 1, 0.4, 0.3; both noise tables together 2, 0.5, 0.1, 0.3
    table = _values(pids, h0_w1=[4.0, 6.0], h1_w1=[0.5, 1.5], rel_frobenius=[0.4, 0.4], row_cosine_change=[0.3, 0.3])
    noise = [
        _values(pids, h0_w1=[1.0, 2.0], h1_w1=[0.5, 0.5], rel_frobenius=[0.1, 0.1], row_cosine_change=[0.3, 0.3]),
        _values(pids, h0_w1=[2.0, 3.0], h1_w1=[0.5, 0.5], rel_frobenius=[0.1, 0.1], row_cosine_change=[0.3, 0.3]),
    ]
    text = sections.noise_floor_section(pre, post, table, noise, "h0_w1")
    assert "Noise floor: 100.0% of the pretrained matrices' 32-weight blocks hold at most 16" in text
    assert "after the fine-tune 75.0% do." in text
    assert f"A random perturbation of std {NOISE_SCALE:g} x each matrix's std (2 seeds)" in text
    ratios = {r[0]: r[1] for r in _table_rows(text)[1:]}
    assert ratios == {"h0_w1": "2.5", "h1_w1": "2", "rel_frobenius": "4", "row_cosine_change": "1"}
    # the noise check of the metric: 4 > 2 and 6 > 3 exceed every draw
    assert "fine-tune drift is 2.50x the noise floor (median); 100% of matrices drift more than every noise draw." in (
        text
    )
    low = sections.noise_floor_section(pre, post, table, noise, "row_cosine_change")
    assert "WARNING: noise check on row_cosine_change: fine-tune drift is 1.00x" in low


def test_noise_floor_section_is_empty_without_noise_and_says_when_the_weights_are_missing():
    pre = 1.0
    noise = [_values(["L0.q"], **{c: [1.0] for c in NOISE_COLUMNS})]
    table = _values(["L0.q"], **{c: [1.0] for c in NOISE_COLUMNS})
    assert sections.noise_floor_section(pre, pre, table, [], "h0_w1") == ""  # no noise draws asked for
    missing = sections.noise_floor_section(pre, None, table, noise, "h0_w1")
    assert "after the fine-tune: not shown (the prior fine-tune's weights are not in this folder" in missing
    assert "reproduce" in missing and "Noise floor: 100.0% of the pretrained" in missing
    assert "| h0_w1 " in missing  # the drift over the floor needs only the tables


# normalization -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_drift():
    """The tiny model's identity, a drift table against a perturbed copy, and five noise tables."""
    pre = extract_snapshot(build_tiny_model("tiny-llama", seed=0))
    fast = {"n_jobs": 1, "cache": DriftCache(None)}
    table = drift_table(pre, perturb_snapshot(pre, 0.05, seed=1), **fast)
    noise = [drift_table(pre, perturb_snapshot(pre, NOISE_SCALE, seed), **fast) for seed in range(5)]
    return ModelIdentity.from_snapshot(pre), table, noise


def test_normalization_section_compares_each_normalizations_picks(tiny_drift):
    identity, table, noise = tiny_drift
    preset = replace(PRESETS["tiny"], budgets=(0.05, 0.1))
    text = sections.normalization_section(table, identity, noise, preset, "sst2")
    assert text.startswith("\nHigh-drift selections of the sst2 prior under each normalization")
    assert _header_of(text) == ["budget", "normalization", "trainable", "Jaccard vs per-point"]
    rows = _table_rows(text)[1:]
    assert [(r[0], r[1]) for r in rows] == [
        (budget, norm) for budget in ("5%", "10%") for norm in ("raw", "per-point (used)", "relative", "noise-z")
    ]
    for budget_text, budget in (("5%", 0.05), ("10%", 0.1)):
        picks = {
            norm: build_profile(
                table, identity, CardSettings(prior_task="sst2", fraction=budget, normalization=norm), noise=noise
            ).trainable
            for norm in ("raw", "per-point", "relative", "noise-z")
        }
        used = set(picks["per-point"])
        for norm, chosen in picks.items():
            label = norm + (" (used)" if norm == "per-point" else "")
            row = _row_of(text, budget_text, label)
            assert row[2] == ", ".join(chosen)
            assert row[3] == f"{len(used & set(chosen)) / len(used | set(chosen)):.2f}"
        assert _row_of(text, budget_text, "per-point (used)")[3] == "1.00"


def test_normalization_section_needs_two_noise_tables_for_noise_z(tiny_drift):
    identity, table, noise = tiny_drift
    text = sections.normalization_section(table, identity, noise[:1], PRESETS["tiny"], "sst2")
    assert [r[1] for r in _table_rows(text)[1:]] == ["raw", "per-point (used)", "relative"]


def test_normalization_section_follows_the_presets_normalization_and_metric(tiny_drift):
    identity, table, noise = tiny_drift
    preset = replace(PRESETS["tiny"], normalization="raw", metric="h1_w1")
    text = sections.normalization_section(table, identity, noise, preset, "agnews")
    assert "selections of the agnews prior" in text and _header_of(text)[3] == "Jaccard vs raw"
    raw = build_profile(
        table, identity, CardSettings(prior_task="agnews", metric="h1_w1", fraction=0.05, normalization="raw")
    )
    assert _row_of(text, "5%", "raw (used)")[2:] == [", ".join(raw.trainable), "1.00"]


def test_an_h0_only_table_renders_its_drift_and_noise_sections():
    table = pd.DataFrame(
        {
            "pid": ["L0.q", "L0.k", "L0.v", "L0.o"],
            "kind": ["q", "k", "v", "o"],
            "rows": [8, 4, 4, 8],
            "h0_w1": [0.8, 0.4, 0.2, 0.1],
            "rel_frobenius": [0.1, 0.2, 0.3, 0.4],
            "row_cosine_change": [0.01, 0.02, 0.03, 0.04],
        }
    )
    by_kind = sections.drift_by_kind(table)  # a table of DriftSettings(maxdim=0) has no h1 column
    assert (
        list(by_kind.columns) == ["h0_w1", "h0_w1_per_row", "rel_frobenius"]
        and by_kind.loc["q", "h0_w1_per_row"] == 0.1
    )


def test_setup_section_prints_the_test_rows_scored_not_the_count_asked_for():
    preset = replace(PRESET, target=replace(PRESET.target, n_test=1000))
    text = sections.setup_section(preset, 9, 9, _results(), test_rows=872)
    assert "872 test examples (all the split holds; the preset asked for 1000)" in text
    assert "1000 test examples" in sections.setup_section(preset, 9, 9, _results())


def _family_runs() -> pd.DataFrame:
    rows = []
    for prior in ("gsm8k", "squad"):
        for target, metric in (("boolq", "acc"), ("dialogsum", "rougeL")):
            for seed in (0, 1):
                for run, method, strategy, budget, score in (
                    ("full", "full", None, None, 0.60),
                    ("profile:high-drift@0.01", "profile", "high-drift", 0.01, 0.55 + 0.1 * seed),
                    ("profile:random@0.01", "profile", "random", 0.01, 0.99),
                    ("lora@0.01", "lora", None, 0.01, 0.50),
                ):
                    rows.append(
                        dict(prior=prior, target=target, seed=seed, run=run, method=method, strategy=strategy,
                             budget=budget, recipe="default", lr=1e-3, schedule="linear", selected=True,
                             val_acc=0.5, test_acc=score, metric=metric)
                    )  # fmt: skip
    return pd.DataFrame(rows)


def test_transfer_matrix_takes_the_pre_specified_card_against_each_baseline_on_the_target_metric():
    from topotuner_lab.study.matrix import transfer_matrix

    matrix = transfer_matrix(_family_runs())
    assert list(zip(matrix["prior"], matrix["target"])) == [
        ("gsm8k", "boolq"),
        ("gsm8k", "dialogsum"),
        ("squad", "boolq"),
        ("squad", "dialogsum"),
    ]
    assert matrix["card"].tolist() == pytest.approx([0.6] * 4)  # the high-drift card's mean over seeds, not random's
    assert matrix["card_minus_full"].tolist() == pytest.approx([0.0] * 4)
    assert matrix["card_minus_lora"].tolist() == pytest.approx([0.1] * 4)
    assert matrix["metric"].tolist() == ["acc", "rougeL"] * 2 and matrix["seeds"].tolist() == [2] * 4
    assert matrix["non_commercial"].tolist() == [False, True] * 2
    assert matrix["target_family"].tolist() == ["question answering", "summarization"] * 2


def test_transfer_matrix_section_marks_non_commercial_targets_and_needs_two_settings():
    from topotuner_lab.lab.report.sections import transfer_matrix_section
    from topotuner_lab.study.matrix import transfer_matrix

    matrix = transfer_matrix(_family_runs())
    text = transfer_matrix_section(matrix, "figures/m.png")
    assert "## Transfer across task families" in text and "| dialogsum \u2020 |" in text
    assert "non-commercial data" in text and "![transfer matrix](figures/m.png)" in text
    assert transfer_matrix_section(matrix.iloc[:1], None) == ""
    assert "\u2020" not in transfer_matrix_section(matrix[matrix["target"] == "boolq"], None)


def test_the_margin_line_says_how_each_target_margin_was_derived():
    runs = _family_runs().assign(test_acc_before=0.40)
    lines = sections.margin_lines(runs, ClaimRules(margin_share=0.1))
    # full FT scores 0.60 on both targets: a gain of 0.20, of which a tenth is the margin
    assert lines == [
        "Margin (boolq): a card is competitive when it loses at most 0.02 acc to full FT: 0.1 x the zero-shot -> "
        "full FT gain (0.400 -> 0.600).",
        "Margin (dialogsum): a card is competitive when it loses at most 0.02 rougeL to full FT: 0.1 x the "
        "zero-shot -> full FT gain (0.400 -> 0.600).",
    ]
    assert sections.margin_lines(_family_runs(), ClaimRules(margin_share=0.1))[0].endswith(
        "0.03 acc to full FT: the fixed 0.03 (no zero-shot score recorded to derive it from)."
    )


def test_the_drift_figure_shows_the_score_the_cards_rank_by_first(tiny_drift):
    from topotuner_lab.lab.report.figures import HEATMAP_COLUMNS, ranking_column, with_ranking_score
    from topotuner_lab.profiles.select import normalized_scores

    _, table, noise = tiny_drift
    shown, columns = with_ranking_score(table, "h0_w1", "per-point", [])
    column = ranking_column("h0_w1", "per-point")
    assert columns == [column, *HEATMAP_COLUMNS]
    expected = normalized_scores(table, "h0_w1", "per-point")
    assert shown.set_index("pid")[column].to_dict() == pytest.approx(expected.to_dict())
    # noise-z without its five noise draws cannot be shown: the raw columns only
    assert with_ranking_score(table, "h0_w1", "noise-z", noise[:2])[1] == HEATMAP_COLUMNS
    assert with_ranking_score(table, "h0_w1", "noise-z", noise)[1][0] == ranking_column("h0_w1", "noise-z")


def test_the_matrix_asks_whether_the_transfer_check_predicted_the_gain():
    from topotuner_lab.lab.report.sections import transfer_matrix_section
    from topotuner_lab.study.matrix import check_predicts_gain, transfer_matrix, with_transfer_checks

    matrix = transfer_matrix(_family_runs())
    checks = [
        {"prior": p, "target": t, "median_cosine_card": c, "rank_agreement": 0.1, "overlap": 0.5, "verdict": "v"}
        for (p, t), c in zip(zip(matrix["prior"], matrix["target"]), (0.1, 0.2, 0.3, 0.4))
    ]
    joined = with_transfer_checks(matrix, checks)
    assert joined["median_cosine_card"].tolist() == [0.1, 0.2, 0.3, 0.4]
    assert np.isnan(check_predicts_gain(joined)["card_minus_full"][0])  # 4 settings: too few to read
    text = transfer_matrix_section(matrix, None, checks)
    assert "median_cosine_card" in text and "card minus full: 4 settings: not readable" in text
    five = pd.DataFrame({"median_cosine_card": [0.1, 0.2, 0.3, 0.4, 0.5], "card_minus_full": [1, 2, 3, 4, 5],
                         "card_minus_lora": [5, 4, 3, 2, 1]})  # fmt: skip
    assert np.isnan(check_predicts_gain(five.assign(card_minus_full=0.0))["card_minus_full"][0])  # constant gains
    predicted = check_predicts_gain(five)
    assert predicted["card_minus_full"] == (pytest.approx(1.0), 5) and predicted["card_minus_lora"][0] == pytest.approx(
        -1
    )


def test_prior_seed_section_shows_agreement_and_each_picked_matrix(tiny_drift):
    from topotuner_lab.profiles.select import build_profile

    identity, table, noise = tiny_drift
    card = build_profile(table, identity, CardSettings(prior_task="sst2", count=3))
    cards = {("tiny", "sst2"): {0: card, 1: card}}  # two prior runs that agree exactly
    text = sections.prior_seed_section(cards, "high-drift")
    assert text.startswith("\n## Does the high-drift card hold across prior runs?")
    assert "### tiny, prior sst2" in text and "3 of 3 matrices are picked by every run." in text
    agreement = text.split("### tiny, prior sst2\n\n")[1].splitlines()
    assert agreement[0].split("|")[1:-1] == [
        "   seed_a ",
        "   seed_b ",
        "   picks_a ",
        "   picks_b ",
        "   jaccard ",
        "   random_jaccard ",
        "   spearman ",
    ]
    assert agreement[2].replace(" ", "").startswith("|0|1|3|3|1|") and agreement[2].replace(" ", "").endswith("|1|")
    assert sections.prior_seed_section({}, "high-drift") == ""


def test_markdown_tables_round_numbers_and_leave_missing_cells_blank():
    from topotuner_lab.study.markdown import markdown_table

    table = pd.DataFrame(
        {"seed": [0, 0], "run": ["full", "profile:high-drift@0.01"], "strategy": [float("nan"), "high-drift"],
         "budget": [float("nan"), 0.01], "test_acc": [0.86234, 0.8]}
    )  # fmt: skip
    rows = _table_rows(markdown_table(table))
    assert rows == [["run", "strategy", "budget", "test_acc"], ["full", "", "", "0.862"],
                    ["profile:high-drift@0.01", "high-drift", "0.01", "0.8"]]  # fmt: skip


def test_a_value_a_template_names_but_its_section_does_not_pass_fails_loudly():
    import jinja2

    from topotuner_lab.lab.report import prose

    with pytest.raises(jinja2.UndefinedError, match="machine"):
        prose.render("header", command="topotuner-lab report x")  # no machine: an error, never a blank


def test_every_report_template_ships_as_package_data():
    import fnmatch
    from pathlib import Path

    import tomllib

    from topotuner_lab.lab.report import prose

    package = Path(prose.__file__).parents[2]
    shipped = tomllib.loads((package.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    templates = sorted((Path(prose.__file__).parent / "templates").iterdir())
    assert templates
    for path in templates:
        name = path.relative_to(package).as_posix()
        assert any(fnmatch.fnmatch(name, glob) for glob in shipped["topotuner_lab"]), f"{name} is not package data"
