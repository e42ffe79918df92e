"""``evaluate``: zero-shot and run-folder scoring with intervals and predictions; probes switched off in finetune."""

import json
import shutil

import numpy as np
import pytest

from topotuner_lab._io.errors import ParameterError
from topotuner_lab.cli import main
from topotuner_lab.tasks.registry import get_task
from topotuner_lab.training.config import FinetuneConfig
from topotuner_lab.training.evaluate import evaluate, mean_interval
from topotuner_lab.training.results import load_results, results_checksum

SIZES = ["--n-train", "8", "--n-test", "8", "--max-length", "40", "--batch-size", "8", "--lr", "1e-3"]


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    """One tiny full fine-tune that keeps its checkpoint and switches both forgetting probes off."""
    root = tmp_path_factory.mktemp("run")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TOPOTUNER_CACHE", str(root / "cache"))
        args = ["finetune", "--model", "tiny-llama", "--epochs", "1", *SIZES, "--n-ood", "0", "--n-ppl", "0"]
        assert main([*args, "--keep-checkpoints", "-o", str(root / "full")]) == 0
    return root / "full"


def test_zero_shot_sst2_metrics_intervals_and_predictions(tmp_path, capsys):
    out = tmp_path / "ev"
    args = ["evaluate", "--task", "sst2", "--model", "tiny-llama", "--n-test", "8", "--max-length", "40"]
    assert main([*args, "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "sst2 on tiny-llama (zero-shot, 8 test rows): acc " in printed
    evaluation = json.loads((out / "evaluation.json").read_text())
    assert evaluation.pop("checksum") == results_checksum(evaluation)
    acc = evaluation["metrics"]["acc"]
    assert 0 <= acc["low"] <= acc["mean"] <= acc["high"] <= 1 and acc["low"] < acc["high"]
    lines = _lines(out / "predictions.jsonl")
    assert len(lines) == 8
    words = get_task("sst2").doc_to_choice
    for line in lines:
        assert line["prediction"] in words and line["target"] in words and line["prompt"]
        assert line["acc"] == float(line["prediction"] == line["target"])
    assert np.mean([line["acc"] for line in lines]) == pytest.approx(acc["mean"])


def test_mean_interval_covers_the_mean_and_narrows_with_examples():
    small, large = mean_interval([0, 1] * 5), mean_interval([0, 1] * 500)
    assert small["mean"] == large["mean"] == 0.5
    assert small["low"] < large["low"] < 0.5 < large["high"] < small["high"]
    assert mean_interval([1, 1, 1]) == {"mean": 1.0, "low": 1.0, "high": 1.0}


def test_finetune_without_probes_records_none_and_keeps_predictions(run_folder):
    results = load_results(run_folder / "results.json")
    for field in ("ood_accuracy_before", "ood_accuracy_after", "ood_correct_after", "ood_battery", "forgetting_ood"):
        assert results[field] is None, field
    for field in ("perplexity_before", "perplexity_after", "ppl_nll_before", "ppl_nll_after", "perplexity_change"):
        assert results[field] is None, field
    lines = _lines(run_folder / "predictions.jsonl")
    assert [int(line["acc"]) for line in lines] == results["test_correct"]
    assert all(line["prediction"] in get_task("sst2").doc_to_choice for line in lines)


def test_finetune_line_shows_zero_shot_and_after(tmp_path, capsys):
    args = ["finetune", "--model", "tiny-llama", "--epochs", "1", *SIZES, "--n-ood", "4", "--n-ppl", "0"]
    assert main([*args, "--no-save-checkpoints", "-o", str(tmp_path / "run")]) == 0
    results = load_results(tmp_path / "run" / "results.json")
    expected = f"test acc {results['test_accuracy_before']:.3f} zero-shot -> {results['test_accuracy']:.3f} after"
    assert expected in capsys.readouterr().out
    assert results["ood_accuracy_before"] is not None and results["perplexity_before"] is None


def test_zero_probe_counts_are_accepted_negative_refused():
    FinetuneConfig(n_ood=0, n_ppl=0)
    with pytest.raises(ParameterError, match="n_ood=-1"):
        FinetuneConfig(n_ood=-1)


def test_run_folder_scores_as_the_run_did(run_folder, tmp_path):
    results = load_results(run_folder / "results.json")
    evaluation = evaluate(run=run_folder, output_dir=tmp_path / "ev")
    assert evaluation["source"] == str(run_folder) and "checkpoint-" in evaluation["weights"]
    assert evaluation["n_test"] == 8
    assert evaluation["metrics"]["acc"]["mean"] == pytest.approx(results["test_accuracy"])
    assert [int(v) for v in evaluation["example_metrics"]["acc"]] == results["test_correct"]
    # the fine-tuned weights, not the base's: each row's label log-loss is the run's, not the zero-shot one
    logloss = evaluation["example_metrics"]["logloss"]
    assert logloss == pytest.approx(results["test_example_metrics"]["logloss"], rel=1e-4)
    zero_shot = evaluate("sst2", model="tiny-llama", n_test=8, max_length=40)["example_metrics"]["logloss"]
    assert logloss != pytest.approx(zero_shot, rel=1e-3)


def test_run_without_weights_is_one_line_error(run_folder, tmp_path, capsys):
    bare = tmp_path / "bare"
    shutil.copytree(run_folder, bare, ignore=shutil.ignore_patterns("checkpoint-*"))
    assert main(["evaluate", str(bare), "-o", str(tmp_path / "ev")]) == 2
    err = capsys.readouterr().err
    assert "kept no weights" in err and "--keep-checkpoints" in err and "--save-snapshot" in err
    assert "Traceback" not in err


def test_folder_that_is_not_a_run_is_one_line_error(tmp_path, capsys):
    (tmp_path / "notarun").mkdir()
    assert main(["evaluate", str(tmp_path / "notarun"), "-o", str(tmp_path / "ev")]) == 2
    err = capsys.readouterr().err
    assert "is not a finished fine-tune's folder" in err and "Traceback" not in err


def test_lora_run_with_only_its_snapshot_scores_as_the_run_did(tmp_path):
    args = ["finetune", "--model", "tiny-llama", "--method", "lora", "--epochs", "1", *SIZES]
    assert main([*args, "--n-ood", "0", "--n-ppl", "0", "--save-snapshot", "-o", str(tmp_path / "lora")]) == 0
    results = load_results(tmp_path / "lora" / "results.json")
    assert not list((tmp_path / "lora").glob("checkpoint-*"))  # the snapshot is all the run kept
    evaluation = evaluate(run=tmp_path / "lora")
    assert evaluation["weights"].endswith("after.safetensors")
    assert [int(v) for v in evaluation["example_metrics"]["acc"]] == results["test_correct"]
    # the merged LoRA weights (W + BA in float32) give the run's own log-loss up to rounding
    logloss = evaluation["example_metrics"]["logloss"]
    assert logloss == pytest.approx(results["test_example_metrics"]["logloss"], rel=1e-4)


def test_report_and_claims_read_runs_without_probes():
    """Runs with the forgetting battery off (None) leave the forgetting columns empty and make no forgetting claim."""
    from tests.lab.test_report_sections import PRESET
    from tests.lab.test_report_sections import _results as report_frame
    from tests.study.test_claims import _results as claims_frame
    from topotuner_lab.lab.report import sections
    from topotuner_lab.study.claim_ids import ClaimId
    from topotuner_lab.study.claims import claim_results

    no_battery = report_frame().assign(ood_acc_before=None, ood_acc_after=None)
    assert sections.spread_table(no_battery)["ood_drop_mean"].isna().all()
    assert sections.forgetting_lines(no_battery, PRESET) == []
    correct = (np.random.default_rng(1).random(200) < 0.8).astype(int)
    results, read = claims_frame(correct, correct, correct, correct)
    forgetting = ClaimId.LESS_FORGETTING
    with_battery = claim_results(results, read)
    without = claim_results(results, lambda run_dir, key: None if key == "ood_correct_after" else read(run_dir, key))
    assert any(c.claim == forgetting for c in with_battery)
    assert [c for c in with_battery if c.claim != forgetting] == without
