"""``check-task`` / ``check_task``: a task's rows, labels, lengths and problems, with the tokenizer alone."""

from __future__ import annotations

import json
import re

import pytest

from topotuner_lab.cli import main
from topotuner_lab.tasks.loading import load_task
from topotuner_lab.training.task_check import check_task, load_tokenizer

ROWS = 48  # rows drawn per split: enough to see labels and lengths, quick on the large built-in splits


@pytest.fixture(autouse=True)
def no_model_is_built(monkeypatch):
    """A check reads the tokenizer alone: building any model (tiny, loaded or from a config) fails the test."""
    from transformers import PreTrainedModel

    def refuse(*args, **kwargs):
        raise AssertionError("check_task built a model")

    monkeypatch.setattr(PreTrainedModel, "__init__", refuse)


def test_sst2_rows_labels_majority_and_sample():
    check = check_task("sst2", model="tiny-llama", rows=ROWS)
    assert [s.split for s in check.splits] == ["train", "validation", "test"] and check.problems == ()
    for s in check.splits:
        labels = load_task("sst2", s.split, ROWS, 0)["label"]  # the rows a fine-tune draws with the same seed
        assert s.rows == ROWS and s.label_counts == {"negative": labels.count(0), "positive": labels.count(1)}
        word, share = s.majority
        assert share == max(labels.count(0), labels.count(1)) / ROWS
        assert s.label_counts[word] == max(s.label_counts.values())
        assert s.target_words is None and s.over_max_gen_toks is None  # classification: no answer lengths
    prompt, target = check.splits[0].sample
    assert prompt.startswith("Review: ") and prompt.endswith("\nSentiment:") and target in (" negative", " positive")


def test_boolq_has_no_validation_split_and_long_passages_are_cut():
    check = check_task("boolq", model="tiny-llama", rows=ROWS, max_length=64)
    assert [s.split for s in check.splits] == ["train", "test"] and check.problems == ()
    assert set(check.splits[1].label_counts) == {"no", "yes"}
    assert all(s.prompts_cut > 0.9 for s in check.splits)  # passages of hundreds of bytes, 64 byte tokens


@pytest.mark.parametrize("max_length", [40, 80, 4096])
def test_the_share_of_cut_prompts_follows_the_training_rule(max_length):
    """With tiny-llama's byte tokenizer (no BOS) a training row is cut when prompt + target + end token exceed it."""
    check = check_task("sst2", model="tiny-llama", rows=ROWS, max_length=max_length)
    train, test = check.splits[0], check.splits[-1]
    rows = load_task("sst2", "train", ROWS, 0)
    cut = [len(p.encode()) + len(t.encode()) + 1 > max_length for p, t in zip(rows["prompt"], rows["target"])]
    assert train.prompts_cut == pytest.approx(sum(cut) / ROWS)
    rows = load_task("sst2", "test", ROWS, 0)  # scored: prompt + label word within max_length (no end token)
    cut = [len(p.encode()) + len(t.encode()) > max_length for p, t in zip(rows["prompt"], rows["target"])]
    assert test.prompts_cut == pytest.approx(sum(cut) / ROWS)
    assert (train.prompts_cut == 0) is (max_length == 4096)


def test_cli_prints_the_report(capsys):
    assert main(["check-task", "boolq", "--model", "tiny-llama", "--rows", "16"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("task boolq: multiple_choice, metric acc; tokens by the tokenizer of tiny-llama")
    assert "train: 16 rows drawn (--rows)" in out and "majority baseline" in out and "validation" not in out
    assert re.search(r"sample \(train, first row\):\n  prompt: ['\"]Passage: ", out)
    assert out.rstrip().endswith("problems: none")


def _generation_spec(tmp_path, answers):
    rows = [{"question": f"What is {i} + {i}?", "answer": a} for i, a in enumerate(answers)]
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = tmp_path / "qa.yaml"
    spec.write_text(
        "task: qa\noutput_type: generate_until\ndoc_to_text: 'Q: {{ question }}\\nA:'\ndoc_to_target: answer\n"
        "generation_kwargs: {until: ['\\n'], max_gen_toks: 8}\ndata_files: {train: qa.jsonl, test: qa.jsonl}\n"
    )
    return spec


def test_a_generation_task_reports_answer_lengths(tmp_path):
    spec = _generation_spec(tmp_path, ["two", "four four", "six six six six six six"])
    check = check_task(str(spec), model="tiny-llama", max_length=24)
    train = check.splits[0]
    assert train.label_counts == {} and train.majority is None and check.max_gen_toks == 8
    assert (train.target_words.p50, train.target_words.max) == (2, 6)
    # byte tokens of " two", " four four", " six six ...": 4, 10, 24; longer than max_gen_toks 8: two of three
    assert train.target_tokens.max == 24 and train.over_max_gen_toks == pytest.approx(2 / 3)
    assert train.targets_cut == pytest.approx(1 / 3)  # training keeps max_length - 2 = 22 target tokens
    assert "answers p50 / p90 / p99 / max: 2 / " in check.text() and "of targets" in check.text()


def test_a_bad_spec_is_one_clear_error_exit_2(tmp_path, capsys):
    spec = tmp_path / "bad.yaml"
    spec.write_text("task: bad\noutput_type: multiple_choice\ndoc_to_txt: '{{ x }}'\n")
    assert main(["check-task", str(spec), "--model", "tiny-llama"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert captured.err.startswith("error: task spec") and "unknown field 'doc_to_txt'" in captured.err
    assert "did you mean 'doc_to_text'?" in captured.err


def test_every_split_the_loader_refuses_is_a_problem_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "train.csv").write_text("text,verdict\ngood film,good\nbad film,bad\n")
    (tmp_path / "test.csv").write_text("review,verdict\ngood film,good\nawful film,awful\n")
    spec = tmp_path / "reviews.yaml"
    spec.write_text(
        "task: reviews\noutput_type: multiple_choice\ndoc_to_text: 'Review: {{ review }}'\ndoc_to_target: verdict\n"
        "doc_to_choice: [bad, good]\ndata_files: {train: train.csv, test: test.csv}\n"
    )
    assert main(["check-task", str(spec), "--model", "tiny-llama"]) == 2
    captured = capsys.readouterr()
    problems = [line for line in captured.out.splitlines() if line.startswith("problem: ")]
    assert len(problems) == 2
    assert problems[0].startswith("problem: train: ") and "no column(s) ['review']" in problems[0]
    assert problems[1].startswith("problem: test: ") and "label 'awful'" in problems[1]
    assert "how to fix:" in problems[0] and "has 2 problem(s)" in captured.err


@pytest.mark.parametrize(
    "option, message",
    [
        (["--max-length", "1"], "--max-length 1 leaves no room"),
        (["--rows", "0"], "--rows 0 reads"),
        (["--num-fewshot", "-1"], "--num-fewshot -1 is below 0"),
    ],
)
def test_bad_sizes_are_refused_before_any_work(option, message, capsys):
    assert main(["check-task", "sst2", "--model", "tiny-llama", *option]) == 2
    assert message in capsys.readouterr().err


def test_an_unknown_model_is_a_model_load_error(tmp_path):
    from topotuner_lab._io.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="no tokenizer could be read"):
        load_tokenizer(str(tmp_path / "no-such-folder"))
