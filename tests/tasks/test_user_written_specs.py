"""A new user's own tasks, written from the README's task section alone, checked, scored zero-shot and fine-tuned.

Two shapes the built-in tasks do not have: yes / no / maybe answers about a passage (three fixed label words) and
multiple choice where each row brings its own options (a field holding a list, the gold answer as an index).
"""

from __future__ import annotations

import json

import pytest

from topotuner_lab.cli import main

YES_NO_MAYBE = """task: passage-qa
output_type: multiple_choice
doc_to_text: "Passage: {{ passage | trim }}\\nQuestion: {{ question }}\\nAnswer:"
doc_to_target: answer
doc_to_choice: ["yes", "no", "maybe"]
data_files: {train: qa-train.csv, test: qa-test.csv}
"""

OWN_OPTIONS = """task: own-options
output_type: multiple_choice
doc_to_text: "Question: {{ question }}\\nAnswer:"
doc_to_target: gold
doc_to_choice: options
data_files: {train: mc-train.jsonl, test: mc-test.jsonl}
"""


def _write_yes_no_maybe(folder, rows: int) -> None:
    for split in ("train", "test"):
        lines = ["passage,question,answer"]
        for i in range(rows):
            answer = ("yes", "no", "maybe")[i % 3]
            lines.append(f'"Trial {i} of the drug reported outcome {answer}.","Did trial {i} work?",{answer}')
        (folder / f"qa-{split}.csv").write_text("\n".join(lines) + "\n")


def _write_own_options(folder, rows: int) -> None:
    for split in ("train", "test"):
        with (folder / f"mc-{split}.jsonl").open("w") as out:
            for i in range(rows):
                options = [f"colour {i}", f"shape {i}", f"sound {i}", f"smell {i}", f"taste {i}"][: 3 + i % 3]
                out.write(json.dumps({"question": f"What is thing {i}?", "options": options, "gold": i % 3}) + "\n")


@pytest.fixture
def specs(tmp_path):
    _write_yes_no_maybe(tmp_path, 24)
    _write_own_options(tmp_path, 24)
    (tmp_path / "passage-qa.yaml").write_text(YES_NO_MAYBE)
    (tmp_path / "own-options.yaml").write_text(OWN_OPTIONS)
    return tmp_path


@pytest.mark.parametrize("name", ["passage-qa", "own-options"])
def test_a_new_users_spec_is_checked_before_training(specs, name, capsys):
    assert main(["check-task", str(specs / f"{name}.yaml"), "--model", "tiny-llama", "--rows", "24"]) == 0
    shown = capsys.readouterr().out
    assert "train" in shown and "test" in shown
    if name == "passage-qa":
        assert "maybe" in shown  # the label balance names all three answers


@pytest.mark.slow
@pytest.mark.parametrize("name", ["passage-qa", "own-options"])
def test_a_new_users_spec_scores_zero_shot_and_fine_tunes(specs, name, tmp_path_factory):
    spec = str(specs / f"{name}.yaml")
    scored = tmp_path_factory.mktemp("zero-shot")
    assert main(["evaluate", "--task", spec, "--model", "tiny-llama", "--n-test", "12", "-o", str(scored)]) == 0
    predictions = [json.loads(line) for line in (scored / "predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == 12 and all("prediction" in p for p in predictions)
    run = tmp_path_factory.mktemp("run")
    args = ["finetune", "--model", "tiny-llama", "--task", spec, "--method", "full", "--epochs", "1", "--n-train", "12"]
    args += ["--n-val", "0", "--n-test", "12", "--n-ood", "0", "--n-ppl", "0", "--max-length", "96", "-o", str(run)]
    assert main(args) == 0
    results = json.loads((run / "results.json").read_text())
    assert len(results["test_correct"]) == len(results["test_correct_before"]) == 12
