"""A report trusts no ledger file it has not verified; cards and epoch aggregates refuse incomplete or negative drift.

The ledger cases edit a copy of the committed comparison ``runs/reproduce-cpu-decide`` (never the ledger itself). It
holds no weights; without them and the record of their facts (``weights-facts.json``, removed from each copy), a ledger
that verifies stops at the missing pretrained snapshot: the verification comes first.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from topotuner_lab._io.errors import InputFileError, ParameterError, ProfileError
from topotuner_lab._io.outputs import check_writable
from topotuner_lab.cli import main
from topotuner_lab.drift.cache import DriftCache
from topotuner_lab.drift.compute import drift_table
from topotuner_lab.lab.report.inputs import load_study
from topotuner_lab.profiles.card import ModelIdentity
from topotuner_lab.profiles.select import CardSettings, build_profile
from topotuner_lab.training.results import write_results
from topotuner_lab.weights.snapshot import perturb_snapshot, save_snapshot

LEDGER = Path(__file__).resolve().parents[2] / "runs" / "reproduce-cpu-decide"
VERIFIED = "not the pretrained snapshot"  # what a verified ledger without weights stops at


@pytest.fixture
def ledger(tmp_path) -> Path:
    copy = Path(shutil.copytree(LEDGER, tmp_path / "reproduce-cpu-decide"))
    (copy / "weights-facts.json").unlink()  # the report would render from it: stop at the weights instead
    return copy


def _results(folder: Path) -> pd.DataFrame:
    return pd.read_csv(folder / "results.csv")


def _card_run(folder: Path) -> Path:
    """The results.json of the pre-named card's first run at its chosen rate (what the primary claim reads)."""
    results = _results(folder)
    chosen = results[(results["run"] == "profile:high-drift@0.01") & results["selected"]]
    return folder / chosen["run_dir"].iloc[0] / "results.json"


def _edit_json(path: Path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _report(capsys, folder: Path, *extra: str) -> tuple[int, str]:
    code = main(["report", str(folder), *extra])
    return code, capsys.readouterr().err


def test_the_committed_ledger_verifies(ledger):
    with pytest.raises(InputFileError, match=VERIFIED):
        load_study(ledger)


def test_a_results_json_edited_by_hand_is_refused(ledger, capsys):
    path = _card_run(ledger)
    res = json.loads(path.read_text())
    _edit_json(path, test_correct=[1] * len(res["test_correct"]))  # the primary claim would move; the checksum stays
    code, err = _report(capsys, ledger)
    assert code == 2 and "internal error" not in err
    assert f"results file {path} does not match its checksum" in err
    assert "git checkout --" in err and "topotuner-lab reproduce --preset cpu-decide -o" in err


def test_a_results_csv_value_edited_by_hand_is_refused(ledger):
    results = _results(ledger)
    results.loc[40, "test_acc"] = 0.999
    results.to_csv(ledger / "results.csv", index=False)
    with pytest.raises(
        InputFileError, match=r"line 42 says test_acc = 0\.999; the run's runs/.*results\.json gives 0\.8"
    ):
        load_study(ledger)


def test_a_row_marked_selected_at_another_rate_is_refused(ledger):
    results = _results(ledger)
    sweep = results.index[(results["role"] == "sweep") & (results["run"] == "full")]
    results.loc[sweep, "selected"] = ~results.loc[sweep, "selected"].astype(bool)
    results.to_csv(ledger / "results.csv", index=False)
    with pytest.raises(InputFileError, match="disagrees with the rate its sweep chooses"):
        load_study(ledger)


@pytest.mark.parametrize(
    "changes, message",
    [
        pytest.param({"seeds": [0, 1, 2, 3, 4, 5]}, "plans 78 runs but records planned_runs 71", id="seed-added"),
        pytest.param(
            {"seeds": [0, 1, 2], "planned_runs": 57}, "holds seed 3, which preset.json does not name", id="cut"
        ),
        pytest.param({"strategies": ["high-drift", "low-drift", "random"], "planned_runs": 60}, "the arm", id="arm"),
        pytest.param({"sweep_seeds": [7, 8]}, "holds seed 100", id="sweep-seeds"),
        # the first strategy is the card named before the runs: a reordered list would name another
        pytest.param({"strategies": ["low-drift", "high-drift", "random", "magnitude"]}, "reordered", id="first-card"),
        pytest.param({"seeds": [4, 3, 2, 1, 0]}, "reordered", id="seed-order"),
    ],
)
def test_a_preset_that_disagrees_with_its_runs_is_refused(ledger, changes, message):
    _edit_json(ledger / "preset.json", **changes)
    with pytest.raises(InputFileError, match=message):
        load_study(ledger)


def test_a_preset_whose_run_config_was_edited_is_refused(ledger):
    recorded = json.loads((ledger / "preset.json").read_text())
    _edit_json(ledger / "preset.json", target={**recorded["target"], "epochs": 8})
    with pytest.raises(InputFileError, match="records another config than .*preset.json plans"):
        load_study(ledger)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])


def _duplicate_row(folder: Path) -> None:
    lines = (folder / "results.csv").read_text().splitlines(keepends=True)
    (folder / "results.csv").write_text("".join([*lines, lines[5]]))


@pytest.mark.parametrize(
    "damage, named, problem",
    [
        (lambda f: _truncate(_card_run(f)), "results.json", "is not valid JSON"),
        (lambda f: _card_run(f).write_text("{}"), "results.json", "is not a fine-tune's results"),
        (lambda f: _truncate(f / "preset.json"), "preset.json", "is not valid JSON"),
        (lambda f: (f / "preset.json").write_text("[]"), "preset.json", "holds a JSON list"),
        (lambda f: _edit_json(f / "preset.json", target="x"), "preset.json", "is not a valid preset"),
        (lambda f: _edit_json(f / "preset.json", prior=None), "preset.json", "prior is not a fine-tune config"),
        (lambda f: _edit_json(f / "preset.json", seeds="x"), "preset.json", "is not a valid preset"),
        (_duplicate_row, "results.csv", "lists one run more than once (lines 6, 77)"),
        (lambda f: (f / "results.csv").write_text(""), "results.csv", "cannot be read"),
        (lambda f: _truncate(next((f / "transfer").glob("*.json"))), "transfer", "is not valid JSON"),
        (lambda f: _edit_json(next((f / "transfer").glob("*.json")), prior="sst2"), "transfer", "does not run"),
    ],
    ids=[
        "results-truncated",
        "results-empty",
        "preset-truncated",
        "preset-list",
        "preset-target",
        "preset-prior",
        "preset-field",
        "csv-duplicate",
        "csv-empty",
        "transfer-truncated",
        "transfer-other",
    ],
)
def test_a_damaged_ledger_file_is_a_one_line_error_naming_it_and_the_fix(ledger, capsys, damage, named, problem):
    damage(ledger)
    code, err = _report(capsys, ledger)
    assert code == 2 and err.startswith("error: ") and "internal error" not in err and "save_pretrained" not in err
    first, fix = err.splitlines()[:2]
    assert named in first and problem in first
    assert "git checkout --" in fix and "topotuner-lab reproduce --preset cpu-decide -o" in fix


def test_the_report_creates_missing_folders_only_in_the_comparison_or_the_current_folder(
    ledger, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(ledger)
    elsewhere = tmp_path / "elsewhere" / "deep" / "R.md"
    code, err = _report(capsys, ledger, "--report", str(elsewhere))
    assert code == 2 and "missing folders are created only below" in err and not elsewhere.parent.parent.exists()
    for allowed in (ledger / "new" / "R.md", Path("sub/R.md")):  # inside the comparison, or the current folder
        assert check_writable(allowed, "report", new_folders_under=(ledger, ".")) == allowed.resolve()
    code, err = _report(capsys, ledger, "--report", str(ledger / "new" / "R.md"))
    assert code == 2 and VERIFIED in err  # the path is accepted; the ledger has no weights to draw drift from
    with pytest.raises(ParameterError, match="does not exist"):
        check_writable(tmp_path / "x" / "R.md", "report", new_folders_under=(ledger,))


# cards from drift tables ---------------------------------------------------------------------------------------
@pytest.fixture
def table(tiny_snapshot):
    return drift_table(tiny_snapshot, perturb_snapshot(tiny_snapshot, 0.05), n_jobs=1, cache=DriftCache(None))


def test_a_table_without_some_projections_needs_an_explicit_allowance(tiny_snapshot, table):
    identity = ModelIdentity.from_snapshot(tiny_snapshot)
    one = table.iloc[:1].copy()
    one.attrs = table.attrs
    with pytest.raises(ProfileError, match=r"(?s)covers 1 of the 8 projections .*allow_partial=True"):
        build_profile(one, identity, CardSettings(prior_task="sst2", count=1))
    card = build_profile(one, identity, CardSettings(prior_task="sst2", count=1, allow_partial=True))
    assert card.trainable == [table["pid"].iloc[0]] and len(card.frozen) == 7


def test_a_partial_table_on_the_command_line(tmp_path, tiny_snapshot, table, capsys):
    pre = save_snapshot(tiny_snapshot, tmp_path / "pre.safetensors")
    table.iloc[:1].to_csv(tmp_path / "one.csv", index=False)
    argv = ["profile", str(tmp_path / "one.csv"), "--pretrained", str(pre), "--prior-task", "sst2", "--count", "1"]
    assert main([*argv, "-o", str(tmp_path / "a.json")]) == 2
    assert "covers 1 of the 8 projections" in capsys.readouterr().err and not (tmp_path / "a.json").exists()
    assert main([*argv, "--allow-partial-table", "-o", str(tmp_path / "b.json")]) == 0
    assert len(json.loads((tmp_path / "b.json").read_text())["frozen"]) == 7


@pytest.mark.parametrize("column", ["h0_w1", "h1_bottleneck", "rel_frobenius"])
def test_negative_drift_is_refused(tiny_snapshot, table, column):
    table.loc[3, column] = -0.01
    with pytest.raises(ProfileError, match=rf"negative drift \({column} at \['{table['pid'].iloc[3]}'\]\)"):
        build_profile(table, ModelIdentity.from_snapshot(tiny_snapshot), CardSettings(prior_task="sst2", count=2))


# drift aggregated over a run's epochs --------------------------------------------------------------------------
@pytest.fixture
def run_folder(tmp_path, tiny_snapshot):
    pre = save_snapshot(tiny_snapshot, tmp_path / "pre.safetensors")
    run = tmp_path / "run"
    for epoch in (1, 2):
        save_snapshot(perturb_snapshot(tiny_snapshot, 0.01 * epoch, seed=epoch), run / f"epoch-{epoch}.safetensors")
    write_results(run / "results.json", {"test_accuracy": 0.5, "epochs_run": 2})
    return pre, run


def _aggregate(pre: Path, run: Path, out: Path) -> int:
    return main(["drift", str(pre), str(run), "--aggregate", "mean", "-o", str(out), "--maxdim", "0", "--no-cache"])


def test_an_aggregate_needs_every_epoch_the_run_recorded(tmp_path, run_folder, capsys):
    pre, run = run_folder
    assert _aggregate(pre, run, tmp_path / "all.parquet") == 0 and "mean over 2 epochs" in capsys.readouterr().out
    (run / "epoch-2.safetensors").unlink()
    assert _aggregate(pre, run, tmp_path / "one.parquet") == 2
    err = capsys.readouterr().err
    assert f"run folder {run} ran 2 epoch(s) (as its results.json records) but lacks epoch-2.safetensors" in err
    assert not (tmp_path / "one.parquet").exists()


def test_an_aggregate_refuses_a_gap_or_a_stray_epoch(tmp_path, run_folder, capsys):
    pre, run = run_folder
    shutil.copy(run / "epoch-2.safetensors", run / "epoch-3.safetensors")
    assert _aggregate(pre, run, tmp_path / "a.parquet") == 2
    assert "ran 2 epoch(s) (as its results.json records) but also holds epoch-3.safetensors" in capsys.readouterr().err
    (run / "results.json").unlink()
    (run / "epoch-2.safetensors").unlink()
    assert _aggregate(pre, run, tmp_path / "b.parquet") == 2
    assert "ran 3 epoch(s) (its snapshots go up to that epoch) but lacks epoch-2.safetensors" in capsys.readouterr().err
