import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from topotuner_lab.cli import main
from topotuner_lab.lab.report import write_report
from topotuner_lab.study.claim_ids import ClaimId


@pytest.mark.slow
def test_reproduce_tiny_runs_the_grid_resumes_and_reports(tmp_path, capsys):
    out = tmp_path / "rep"
    assert main(["reproduce", "--preset", "tiny", "-o", str(out)]) == 0
    results = pd.read_csv(out / "results.csv")
    cards = [f"profile:{s}@0.05" for s in ("high-drift", "low-drift", "random", "magnitude")]
    # seed 0 sweeps two rates per method (and runs each card once more at a constant rate);
    # seed 1 runs each method at the chosen rate
    seed0, seed1 = results[results.seed == 0], results[results.seed == 1]
    assert list(dict.fromkeys(seed0["run"])) == ["full", *[r for c in cards for r in (c, c + "+constant")], "lora@0.05"]
    assert len(seed0) == 2 + 4 * 3 + 2 and len(seed1) == 1 + 4 * 2 + 1 and len(results) == 26
    sweep = seed0[~seed0["run"].str.contains("constant")]
    assert (sweep.groupby("run")["selected"].sum() == 1).all()  # one chosen rate per method ...
    chosen = sweep[sweep["selected"]].set_index("run")
    assert (
        chosen["val_acc"] == sweep.groupby("run")["val_acc"].max().loc[chosen.index]
    ).all()  # ... the best on validation
    again = seed1[~seed1["run"].str.contains("constant")].set_index("run")
    assert again["selected"].all() and (again["lr"] == chosen["lr"].loc[again.index]).all()
    assert (results.loc[results.run != "full", "trainable_pct"] < 6).all()
    report = (out / "RESULTS.md").read_text()
    assert "## Claims, checked against these numbers" in report and "beats LoRA" in report and "[95% CI]" in report
    assert (
        "## Learning rates, chosen on validation data" in report
        and "## Early stopping apart from the schedule" in report
    )
    assert all(f"| {norm}" in report for norm in ("raw", "per-point (used)", "relative", "noise-z"))
    assert "The rule at other thresholds" in report  # the threshold sweep, from the stored drift
    from topotuner_lab.study.stopping import stop_epoch_at

    for run_dir in results.loc[results.method == "profile", "run_dir"]:
        res = json.loads((out / run_dir / "results.json").read_text())
        normalized = [h["normalized"] for h in res["drift_history"]]
        assert stop_epoch_at(normalized, 0.9) == res["stop_epoch"]  # the callback's own rule, replayed
    card = json.loads((out / "cards" / "sst2-high-drift-0.05.json").read_text())
    assert card["transferred_to"] == ["agnews"] and card["normalization"] == "per-point"
    assert (out / "figures" / "results_drift_sst2.html").is_file()
    # the second model gets its own prior fine-tune and drift table, compared by projection kind
    assert (out / "models" / "tiny-qwen2" / "drift-sst2.parquet").is_file() and (
        out / "figures" / "results_drift_tiny-qwen2_sst2.html"
    ).is_file()
    assert "## Is the drift profile model-dependent?" in report and "tiny-qwen2" in report
    # the comparison computed the second model's noise floor; a report only renders it, and never computes one
    noise = out / "models" / "tiny-qwen2" / "noise"
    assert sorted(p.name for p in noise.iterdir()) == [f"noise-{seed}.parquet" for seed in range(5)]
    shutil.rmtree(noise)
    write_report(out, out / "AGAIN.md", "test")
    assert not noise.exists() and "## Is the drift profile model-dependent?" in (out / "AGAIN.md").read_text()
    # a rerun resumes: every run is skipped, the table is the same, and the cards (which now list their transfers)
    # keep their files
    card_files = {path: path.read_bytes() for path in (out / "cards").iterdir()}
    assert main(["reproduce", "--preset", "tiny", "-o", str(out)]) == 0
    assert {path: path.read_bytes() for path in (out / "cards").iterdir()} == card_files
    drift = [out / "drift-sst2.parquet", out / "models" / "tiny-qwen2" / "drift-sst2.parquet"]
    log = capsys.readouterr().out
    assert log.count("skip (done)") == 26 + 2 + 1 + 2  # runs, priors, transfer check, drift tables
    assert all(f"skip (done): {path}\n" in log for path in drift)
    pd.testing.assert_frame_equal(pd.read_csv(out / "results.csv"), results)
    # so does a clone of its ledger (what .gitignore keeps of runs/reproduce-cpu-decide: no weights, no checkpoints):
    # the priors train again, bit-identically, so their drift tables verify and every finished run is reused
    clone = tmp_path / "clone"
    shutil.copytree(out, clone, ignore=shutil.ignore_patterns("*.safetensors", "checkpoint-*"))
    tables = {path: path.stat().st_mtime_ns for path in clone.rglob("drift-*.parquet")}
    from topotuner_lab._io.errors import InputFileError

    # its report renders from the facts of the weights recorded beside the ledger: the same text as with the weights
    again = write_report(clone, clone / "R.md", "test").read_text()
    assert again == write_report(out, out / "R.md", "test").read_text()
    for facts in clone.rglob("weights-facts.json"):  # a ledger of an earlier version: no record of the weights
        facts.unlink()
    with pytest.raises(InputFileError, match="not the pretrained snapshot"):  # its report says what to run first
        write_report(clone, clone / "R.md", "test")
    assert main(["reproduce", "--preset", "tiny", "-o", str(clone)]) == 0
    log = capsys.readouterr().out
    assert log.count("skip (done)") == 26 + 1 + 2 and log.count("recompute (stale") == 2  # the priors retrain
    assert all(f"skip (done): {clone / path.relative_to(out)}\n" in log for path in drift)  # verified, reused
    assert {path: path.stat().st_mtime_ns for path in tables} == tables and len(tables) == 2  # not recomputed
    pd.testing.assert_frame_equal(pd.read_csv(clone / "results.csv"), results)
    # a folder from the earlier protocol is refused with a clear message, not a KeyError
    old = tmp_path / "old"
    old.mkdir()
    results.drop(columns=["selected"]).to_csv(old / "results.csv", index=False)
    (old / "preset.json").write_text("{}")
    with pytest.raises(InputFileError, match="earlier protocol"):
        write_report(old, old / "R.md", "test")
    # a report of an interrupted comparison says how much is missing
    results.iloc[:4].to_csv(out / "results.csv", index=False)
    assert "**Partial run**: 4 of the 26 planned" in write_report(out, out / "PARTIAL.md", "test").read_text()


def test_drift_against_the_learning_rate_schedule():
    from topotuner_lab.study.protocol import drift_minus_lr_ratio

    schedule = [
        1.0,
        9 / 11,
        7 / 11,
        5 / 11,
        3 / 11,
        1 / 11,
    ]  # linear decay over 6 epochs, per-epoch mean rate over the first's
    res = {
        "config": {"lr_scheduler": "linear", "epochs": 6},
        "drift_history": [{"epoch": k, "normalized": r} for k, r in enumerate(schedule, 1)],
    }
    assert abs(drift_minus_lr_ratio(res)) < 1e-12
    res["drift_history"] = [{"epoch": k, "normalized": r - 0.2} for k, r in enumerate(schedule, 1)]
    assert abs(drift_minus_lr_ratio(res) + 0.2) < 1e-12
    assert drift_minus_lr_ratio({**res, "config": {"lr_scheduler": "constant", "epochs": 6}}) is None


def test_the_time_left_is_measured_on_runs_trained_from_the_start():
    from topotuner_lab.study.protocol import Progress

    lines: list[str] = []
    progress = Progress(planned=5, log=lines.append, parallel=2)
    progress.record("skipped", {"test_accuracy": 0.8}, 0.01)  # finished before: read from the ledger
    progress.record("resumed", {"test_accuracy": 0.8, "resumed_from": "checkpoint-96"}, 60.0)  # its last epochs only
    assert [line.endswith("0.800") for line in lines] == [True, True]  # no estimate yet: nothing measured
    progress.record("whole", {"test_accuracy": 0.8, "resumed_from": None}, 1200.0)
    assert lines[-1].endswith("about 20 min left")  # 2 runs left x 20 min / 2 at once


def test_time_to_stop_counts_the_stopping_rules_own_cost():
    from topotuner_lab.study.plan import RunKey, RunSpec
    from topotuner_lab.study.protocol import summary_row

    res = {
        "test_accuracy": 0.8,
        "train_accuracy": 0.9,
        "train_test_gap": 0.1,
        "ood_accuracy_before": 0.5,
        "ood_accuracy_after": 0.4,
        "perplexity_before": 10.0,
        "perplexity_after": 11.0,
        "trainable_fraction": 0.01,
        "epochs_run": 3,
        "stop_epoch": 2,
        "epoch_test_accuracy": [0.6, 0.7, 0.8],
        "epoch_seconds": [10.0, 10.0, 10.0],
        "seconds_per_epoch": 10.0,
        "train_seconds": 30.0,
        "peak_rss_mib": 900.0,
        "rss_increase_mib": 1.0,
        "config": {"lr_scheduler": "linear", "epochs": 3},
        "drift_history": [{"epoch": k, "normalized": 1.0, "seconds": 0.5} for k in (1, 2, 3)],
    }
    spec = RunSpec("sst2", "agnews", 0, RunKey("full"), "chosen")
    row = summary_row(spec, {**res, "learning_rate": 1e-4}, True, Path("runs/x"))
    assert (row["method"], row["strategy"], row["budget"], row["run"]) == ("full", None, None, "full")
    assert row["train_sec_to_stop"] == 21.0 and row["topo_sec_per_epoch"] == 0.5 and row["acc_at_stop"] == 0.7


def test_plan_of_the_tiny_preset_is_the_grid_the_comparison_runs():
    from topotuner_lab.study.plan import RunKey, plan
    from topotuner_lab.study.presets import PRESETS

    specs = plan(PRESETS["tiny"])
    assert len(specs) == 26
    first = [s for s in specs if s.seed == 0]
    cards = [RunKey("profile", s, 0.05) for s in ("high-drift", "low-drift", "random", "magnitude")]
    assert [s.key for s in first if s.role == "sweep"][::2] == [RunKey("full"), *cards, RunKey("lora", None, 0.05)]
    assert all(s.lr is not None for s in first if s.role == "sweep") and {s.role for s in specs if s.seed == 1} == {
        "chosen",
        "constant",
    }
    constant = [s.key for s in specs if s.role == "constant"]
    assert constant[:4] == [RunKey("profile", c.strategy, 0.05, "constant") for c in cards]
    assert constant[0].name == "profile:high-drift@0.05+constant" and RunKey.parse(constant[0].name) == constant[0]


def test_lora_matches_the_budgets_first_card_when_high_drift_is_not_run(tmp_path):
    from dataclasses import replace

    from topotuner_lab.study.cards import CardKey
    from topotuner_lab.study.plan import plan
    from topotuner_lab.study.presets import PRESETS
    from topotuner_lab.study.protocol import config_for

    preset = replace(PRESETS["tiny"], strategies=("random", "magnitude"), constant_lr=())
    cards = {CardKey("sst2", s, 0.05): tmp_path / f"{s}.json" for s in preset.strategies}
    lora = next(s for s in plan(preset) if s.key.method == "lora")
    cfg = config_for(preset, lora, cards, 1e-3, tmp_path / "run")
    assert cfg.method == "lora" and cfg.lora_rank == "match" and cfg.profile == str(tmp_path / "random.json")
    assert cfg.output_dir == str(tmp_path / "run" / "lr-0.001") and cfg.learning_rate == 1e-3


def test_further_recipes_add_arms_of_the_topology_strategies_only():
    from dataclasses import replace

    from topotuner_lab.study.plan import RunKey, arms
    from topotuner_lab.study.presets import PRESETS

    preset = replace(
        PRESETS["tiny"], recipes=("default", "reference"), strategies=("high-drift", "random", "snr"), constant_lr=()
    )
    keys = [k for k in arms(preset) if k.method == "profile"]
    assert [k.name for k in keys] == [
        "profile:high-drift@0.05",
        "profile:random@0.05",
        "profile:snr@0.05",
        "profile:high-drift[reference]@0.05",
    ]
    assert RunKey.parse(keys[-1].name) == keys[-1] and keys[-1].columns()["recipe"] == "reference"
    assert RunKey.parse("profile:high-drift@0.05+constant").recipe == "default"


@pytest.mark.slow
def test_reproduce_families_tiny_scores_every_task_type_on_its_own_metric(tmp_path):
    out = tmp_path / "fam"
    assert main(["reproduce", "--preset", "families-tiny", "-o", str(out)]) == 0
    results = pd.read_csv(out / "results.csv")
    assert results.drop_duplicates("target").set_index("target")["metric"].to_dict() == {
        "boolq": "acc",
        "dialogsum": "rougeL",
        "mbpp": "pass@1",
        "scifact": "ndcg@10",
        "ifeval": "prompt_level_strict_acc",
    }
    assert len(results) == 2 * 5 * 3 and results["test_acc"].between(0, 1).all()
    full = results[results["method"] == "full"].groupby("target")["run_dir"].nunique()
    assert (full == 1).all()  # full FT never reads the prior: one run per target serves both priors' rows
    run = json.loads(next(out.glob("runs/prior-gsm8k/dialogsum/seed0/full/*/results.json")).read_text())
    assert set(run["test_example_metrics"]) == {"rougeL", "rouge1", "rouge2"} and len(run["test_correct"]) == 4
    assert run["test_metrics"]["rougeL"] == pytest.approx(run["test_accuracy"])
    report = (out / "RESULTS.md").read_text()
    assert "## Transfer across task families" in report and "| dialogsum \u2020 |" in report
    assert "(test rougeL)" in report and "(test ndcg@10)" in report and "(test accuracy)" in report
    assert (out / "figures" / "results_transfer_matrix.html").is_file()


@pytest.mark.slow
def test_reproduce_tiny_selectors_runs_every_selector_both_recipes_and_the_drift_claims(tmp_path):
    out = tmp_path / "sel"
    assert main(["reproduce", "--preset", "tiny-selectors", "-o", str(out)]) == 0
    results = pd.read_csv(out / "results.csv")
    runs = set(results["run"])
    for strategy in ("high-drift", "random", "magnitude", "snr", "alpha", "kappa", "gradient", "joint-hl"):
        assert f"profile:{strategy}@0.1" in runs
    assert "profile:high-drift[reference]@0.1" in runs
    assert set(results.loc[results["run"] == "profile:high-drift[reference]@0.1", "recipe"]) == {"reference"}
    # the reference recipe's card: cosine H0 drift averaged over the prior's two epochs, ranked within each kind
    ref = json.loads((out / "cards" / "sst2-high-drift-reference-0.1.json").read_text())
    assert ref["recipe"] == "reference" and ref["aggregation"] == "mean" and "per_kind" in ref["budget"]
    assert len(set(ref["budget"]["per_kind"].values())) == 1  # the same count of each kind
    default = json.loads((out / "cards" / "sst2-high-drift-0.1.json").read_text())
    assert default["recipe"] == "default" and default["aggregation"] == "final"
    grad = json.loads((out / "cards" / "sst2-gradient-agnews-0.1.json").read_text())  # ranked on the target
    assert grad["strategy"] == "gradient"
    # the second prior seed has its own fine-tune and table, and the transfer check is recorded
    assert (out / "prior-seeds" / "seed1" / "drift-sst2.parquet").is_file()
    assert (out / "models" / "tiny-qwen2" / "prior-seeds" / "seed1" / "drift-sst2.parquet").is_file()
    (record,) = [json.loads(p.read_text()) for p in (out / "transfer").glob("*.json")]
    assert record["prior"] == "sst2" and record["target"] == "agnews" and -1 <= record["rank_agreement"] <= 1
    report = (out / "RESULTS.md").read_text()
    assert ClaimId.BEATS_SELECTORS in report and "profile:snr@0.1" in report
    assert ClaimId.PICKS_HOLD in report
    assert ClaimId.KINDS_DEPEND_ON_FAMILY in report and "(Qwen)" in report  # LLaMA vs Qwen2
    assert "## Transfer check before training" in report and "## Which kinds the high-drift card picks" in report
    # the report renders again from the folder alone; a folder without a comparison is a one-line error
    assert main(["report", str(out), "--report", str(tmp_path / "again.md")]) == 0
    assert "## Transfer check before training" in (tmp_path / "again.md").read_text()
    assert main(["report", str(tmp_path / "nothing")]) == 2


def _sweep(*pairs):
    return [(lr, {"val_accuracy": acc}) for lr, acc in pairs]


@pytest.mark.parametrize(
    "pairs, expected",
    [
        (((1e-4, 0.8), (3e-4, 0.7)), 3.33e-5),  # best at the low edge: one grid step below
        (((1e-4, 0.7), (3e-4, 0.8)), 9e-4),  # best at the high edge: one step above
        (((1e-4, 0.7), (3e-4, 0.8), (1e-3, 0.75)), None),  # interior: the sweep is done
        (((3.33e-5, 0.85), (1e-4, 0.8), (3e-4, 0.7)), 1.11e-5),  # still at the edge after one extension
        (((1.11e-5, 0.9), (3.33e-5, 0.85), (1e-4, 0.8), (3e-4, 0.7)), None),  # the cap (2 beyond the grid)
    ],
)
def test_extend_until_interior(pairs, expected):
    from topotuner_lab.study.protocol import extension

    beyond = extension(_sweep(*pairs), (1e-4, 3e-4), cap=2)
    assert beyond == (None if expected is None else pytest.approx(expected, rel=1e-2))


def test_extension_needs_a_grid_step_and_stays_a_rate():
    from topotuner_lab.study.protocol import extension

    assert extension(_sweep((1e-3, 0.8)), (1e-3,), cap=2) is None  # one rate: no step to extend by
    assert extension(_sweep((0.1, 0.7), (0.5, 0.8)), (0.1, 0.5), cap=2) is None  # 2.5 is not a learning rate
    assert extension(_sweep((1e-4, 0.8), (3e-4, 0.7)), (1e-4, 3e-4), cap=0) is None  # the rule switched off


def _one_card_tiny(**changes):
    """The tiny preset cut to one card arm (high drift), no baselines and no second model, with ``changes``."""
    from dataclasses import replace

    from topotuner_lab.study.presets import PRESETS

    return replace(
        PRESETS["tiny"], other_models=(), strategies=("high-drift",), constant_lr=(), baselines=(), **changes
    )


@pytest.mark.slow
def test_run_study_extends_a_sweep_that_ends_on_an_edge(tmp_path, monkeypatch):
    """With validation accuracy falling with the rate, the sweep walks down past the grid until the cap."""

    from topotuner_lab.study import protocol

    real = protocol.finetune_once

    def fake(loaded, cfg, log):
        res = real(loaded, cfg, log)
        return {**res, "val_accuracy": 1 - cfg.learning_rate, "val_logloss": cfg.learning_rate}  # smaller is better

    monkeypatch.setattr(protocol, "finetune_once", fake)
    preset = _one_card_tiny(seeds=(0, 1), lr_extend=1, noise_seeds=(0, 1))
    results = protocol.run_study(preset, tmp_path / "ext", log=lambda _: None)
    sweep = results[results["seed"] == 0]
    assert sorted(sweep["lr"]) == pytest.approx([1e-4, 1e-3, 1e-2])  # one grid step (x10) below the grid
    assert sweep.loc[sweep["selected"], "lr"].tolist() == pytest.approx([1e-4])
    assert results.loc[results["seed"] == 1, "lr"].tolist() == pytest.approx([1e-4])


@pytest.mark.slow
def test_the_random_control_is_stratified_and_drawn_per_seed(tmp_path):
    from dataclasses import replace

    from topotuner_lab.profiles.card import ProfileCard
    from topotuner_lab.profiles.select import kind_composition
    from topotuner_lab.study.plan import plan
    from topotuner_lab.study.presets import PRESETS
    from topotuner_lab.study.protocol import WorkDir, config_for, prepare

    preset = replace(
        PRESETS["tiny"], other_models=(), seeds=(0, 1, 2), sweep_seeds=(100,), constant_lr=(), baselines=()
    )
    _, cards = prepare(preset, WorkDir(tmp_path), log=lambda _: None)
    topology = ProfileCard.load(tmp_path / "cards" / "sst2-high-drift-0.05.json")
    seeds = (100, *preset.seeds)  # the sweep seed's runs train with a control of their own
    controls = [ProfileCard.load(tmp_path / "cards" / f"sst2-random-seed{s}-0.05.json") for s in seeds]
    assert all(kind_composition(c) == kind_composition(topology) for c in controls)  # same kinds and count
    assert len({tuple(c.trainable) for c in controls}) > 1  # a fresh draw per seed
    assert not (tmp_path / "cards" / "sst2-random-0.05.json").exists()  # no unused unstratified card
    runs = [s for s in plan(preset) if s.key.strategy == "random"]
    used = {s.seed: config_for(preset, s, cards, 1e-3, tmp_path / "r").profile for s in runs}
    assert used == {s: str(tmp_path / "cards" / f"sst2-random-seed{s}-0.05.json") for s in seeds}
    for spec in plan(preset):  # every planned run, sweeps included, finds its card (KeyError where not)
        config_for(preset, spec, cards, 1e-3, tmp_path / "r")


@pytest.mark.slow
def test_a_drift_only_study_reports_model_dependence_and_stability(tmp_path):
    from dataclasses import replace

    from topotuner_lab.study.presets import PRESETS
    from topotuner_lab.study.protocol import run_study

    preset = replace(
        PRESETS["tiny"],
        target_tasks=(),
        strategies=("high-drift",),
        constant_lr=(),
        prior_seeds=(0, 1, 2),
        transfer_rows=0,
    )
    results = run_study(preset, tmp_path / "m", log=lambda _: None)
    assert results.empty and {"run", "recipe", "selected"} <= set(results.columns)
    report = write_report(tmp_path / "m", tmp_path / "m" / "R.md", "test").read_text()
    assert "- Drift only: tiny-llama and tiny-qwen2" in report and "## Learning rates" not in report
    assert report.count(ClaimId.PICKS_HOLD) >= 2  # one line per model
    assert ClaimId.KINDS_DEPEND_ON_FAMILY in report and "(prior seeds: 3 and 3)" in report


def test_the_preset_record_names_every_machine_a_comparisons_sittings_ran_on(tmp_path, monkeypatch):
    from topotuner_lab.study import presets, protocol
    from topotuner_lab.study.workspace import WorkDir

    work = WorkDir(tmp_path)
    preset = presets.get_preset("tiny")
    here = ["2 CPU cores, no GPU"]
    monkeypatch.setattr(protocol, "machine", lambda: here[0])

    def record(text: str) -> dict:
        work.preset.write_text(text)
        return protocol.check_same_preset(preset, work, lambda _: None)

    assert protocol.machines_so_far(protocol.check_same_preset(preset, work, print)) == "2 CPU cores, no GPU"
    work.preset.parent.mkdir(parents=True, exist_ok=True)
    here[0] = "16 CPU cores, NVIDIA H200"
    both = protocol.machines_so_far(record(json.dumps({**preset.to_dict(), "machine": "2 CPU cores, no GPU"})))
    assert both == "2 CPU cores, no GPU; 16 CPU cores, NVIDIA H200"
    assert protocol.machines_so_far(record(json.dumps({**preset.to_dict(), "machine": both}))) == both  # named once
    assert protocol.machines_so_far(record("[1, 2")) == "16 CPU cores, NVIDIA H200"  # damaged: nothing earlier


@pytest.mark.slow
def test_the_further_prior_seeds_train_after_the_fine_tunes(tmp_path, monkeypatch):
    """The cards come from the first prior seed, so the claims' runs are not kept waiting for the others."""

    from topotuner_lab.study import cards, protocol
    from topotuner_lab.study.presets import PRESETS

    order = []
    real = protocol.finetune_once

    def recorded(loaded, cfg, log):
        order.append(("prior", cfg.seed) if cfg.task == "sst2" and cfg.n_val == 0 else ("target", cfg.seed))
        return real(loaded, cfg, log)

    monkeypatch.setattr(protocol, "finetune_once", recorded)
    monkeypatch.setattr(cards, "finetune_once", recorded)
    preset = _one_card_tiny(
        seeds=(0,), lr_grid={**PRESETS["tiny"].lr_grid, "profile": (1e-3,)}, prior_seeds=(0, 1), transfer_rows=0
    )
    protocol.run_study(preset, tmp_path / "s", log=lambda _: None)
    assert order == [("prior", 0), ("target", 0), ("prior", 1)]
    assert (tmp_path / "s" / "prior-seeds" / "seed1").is_dir()


@pytest.mark.slow
def test_a_ledger_resumed_without_the_prior_weights_keeps_its_tables_and_cards(tmp_path):
    """A clone of a ledger (no weights, maybe another CPU) goes on from its verified tables, not a retrained prior."""
    from dataclasses import replace

    from topotuner_lab.study.presets import PRESETS
    from topotuner_lab.study.protocol import WorkDir, further_prior_seeds, prepare

    preset = replace(
        PRESETS["tiny-selectors"], other_models=(), strategies=("high-drift", "random", "relchange"), prior_seeds=(0, 1)
    )
    work = WorkDir(tmp_path)
    loaded, _ = prepare(preset, work, log=lambda _: None)
    further_prior_seeds(preset, loaded, work, log=lambda _: None)
    kept = {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.suffix in (".json", ".md", ".parquet")}
    for weights in tmp_path.rglob("prior-sst2/*.safetensors"):  # git keeps no weights (every prior seed's)
        weights.unlink()
    said: list[str] = []
    prepare(preset, work, log=said.append)
    further_prior_seeds(preset, loaded, work, log=said.append)
    assert sum(line.startswith("kept from the ledger:") for line in said) == 2  # prior seeds 0 and 1
    assert not any(line.startswith("run:") for line in said)  # the prior did not train again
    assert any("relative change of the sst2 prior read from its relchange cards" in line for line in said)
    assert {p: p.read_bytes() for p in kept} == kept  # results, tables and cards as they were

    facts = json.loads(work.weights_facts.read_text())
    facts["finetuned"]["sst2"]["weights_hash"] = "0" * 32  # a table no longer names the prior's recorded weights
    work.weights_facts.write_text(json.dumps(facts))
    said.clear()
    prepare(preset, work, log=said.append)
    assert any("train the prior again" in line and "not computed from the prior's recorded" in line for line in said)
    assert any(line.startswith("run:") for line in said)
