"""Few-shot prompts (``num_fewshot``): solved training rows before each scored prompt, drawn with a fixed seed.

Small spec files written into each test's tmp_path (a fixed-label set, a per-row-options set, a generation set) are
framed by :func:`with_fewshot`; the run-level paths (``load_run_data``, ``evaluate``, ``check-task``) are exercised on
tiny-llama.
"""

from __future__ import annotations

import json
import random

import pytest

from topotuner_lab._io.errors import ParameterError, TaskError
from topotuner_lab.cli import main
from topotuner_lab.tasks.fewshot import FEWSHOT_SEED, fewshot_count, with_fewshot
from topotuner_lab.tasks.loading import load_task
from topotuner_lab.tasks.registry import read_spec
from topotuner_lab.training.config import FinetuneConfig
from topotuner_lab.training.data import load_run_data

#: twelve rows: a review, its label (0 bad, 1 good), its five options and a worked answer
ROWS = [
    {"text": f"review {i}", "label": i % 2, "options": [f"opt{i}-{j}" for j in range(5)], "answer": f"answer {i}"}
    for i in range(12)
]
#: the spec's head by kind: fixed label words, each row's own options, generation
HEADS = {
    "labels": "output_type: multiple_choice\ndoc_to_choice: [bad, good]\ndoc_to_target: label\n",
    "options": "output_type: multiple_choice\ndoc_to_choice: options\ndoc_to_target: label\n",
    "generation": "output_type: generate_until\ndoc_to_target: answer\n",
}


def _spec(tmp_path, kind="labels", extra=""):
    """A spec over ROWS: rows 0-7 train, 8-11 test, of the given kind."""
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    path = tmp_path / f"{kind}.yaml"
    path.write_text(
        f"task: fewshot-{kind}\n{HEADS[kind]}"
        'doc_to_text: "Review: {{ text }}\\nVerdict:"\n'
        "data_files: {train: rows.jsonl, test: rows.jsonl}\n"
        'split_filter: {train: "_index < 8", test: "_index >= 8"}\n' + extra
    )
    return path


def _shot(spec, row):
    """How one training row reads as a few-shot example: prompt, delimiter and answer, then the few-shot delimiter."""
    return f"Review: {row['text']}\nVerdict:{spec.target_delimiter}{row['answer_text']}{spec.fewshot_delimiter}"


@pytest.mark.parametrize("kind", sorted(HEADS))
def test_k_shots_are_training_rows_in_lm_evals_seeded_order(tmp_path, kind):
    """Each prompt is k training rows (text and answer) then its own prompt, the rows drawn as lm-eval's default
    sampler draws them from the split in file order: one Random(1234), k rows per scored row."""
    spec = read_spec(_spec(tmp_path, kind))
    test = load_task(spec, "test")
    shots = with_fewshot(test, spec, 2)
    answers = {"labels": lambda r: ["bad", "good"][r["label"]], "generation": lambda r: r["answer"]}
    train = [{**r, "answer_text": answers.get(kind, lambda r: r["options"][r["label"]])(r)} for r in ROWS[:8]]
    draw = random.Random(FEWSHOT_SEED)
    for row, framed in zip(test, shots):
        expected = "".join(_shot(spec, r) for r in draw.sample(train, 2))
        assert framed["prompt"] == expected + row["prompt"]
        assert {k: v for k, v in framed.items() if k != "prompt"} == {k: v for k, v in row.items() if k != "prompt"}
    assert list(with_fewshot(test, spec, 2)["prompt"]) == list(shots["prompt"])  # the same seed, the same prompts
    assert len({p.split("Review: review 8")[0] for p in shots["prompt"][:1]}) == 1


def test_no_scored_row_is_shown_as_an_example(tmp_path):
    """Drawn from the scored split itself (fewshot_split: test), a prompt's examples are never scored rows."""
    spec = read_spec(_spec(tmp_path, extra="fewshot_split: test\n"))
    scored = load_task(spec, "test", n=2, seed=0)
    framed = with_fewshot(scored, spec, 2)
    texts = [row["prompt"].removeprefix("Review: ").split("\n")[0] for row in scored]
    for prompt in framed["prompt"]:
        examples = prompt.split("\n\n")[:-1]
        assert len(examples) == 2
        assert not any(text in example for text in texts for example in examples)
    with pytest.raises(TaskError, match=r"num_fewshot=3 .* holds 2 example\(s\)") as info:
        with_fewshot(scored, spec, 3)
    assert "give --num-fewshot 2 or fewer" in info.value.fix


def test_validation_carved_from_training_rows_never_shows_a_validation_row(tmp_path):
    """A run's validation rows carved from the training draw get examples from the other training rows only."""
    cfg = FinetuneConfig(task=str(_spec(tmp_path)), n_train=4, n_val=3, n_test=4, n_ood=0, n_ppl=0, num_fewshot=2)
    data = load_run_data(cfg)
    val_texts = [p.split("\n\n")[-1] for p in data.val["prompt"]]
    for prompt in data.val["prompt"]:
        assert not any(text in example for text in val_texts for example in prompt.split("\n\n")[:-1])
    assert all(p.count("\n\n") == 2 for p in [*data.val["prompt"], *data.test["prompt"]])
    assert all("\n\n" not in p for p in data.train["prompt"])  # training rows stay zero-shot


def test_zero_shots_leave_every_prompt_as_it_was(tmp_path):
    """k 0 (the default everywhere) changes nothing: the rows object itself, and a run's data as plain load_task's."""
    path = _spec(tmp_path)
    spec = read_spec(path)
    test = load_task(spec, "test")
    assert with_fewshot(test, spec) is test and with_fewshot(test, spec, 0) is test
    data = load_run_data(FinetuneConfig(task=str(path), n_train=4, n_test=4, n_ood=0, n_ppl=0))
    assert list(data.test["prompt"]) == list(test["prompt"])


def test_the_spec_sets_k_and_the_option_overrides_it(tmp_path):
    spec = read_spec(_spec(tmp_path, extra='num_fewshot: 3\nfewshot_delimiter: "\\n###\\n"\n'))
    assert fewshot_count(spec) == 3 and fewshot_count(spec, 1) == 1 and fewshot_count(spec, 0) == 0
    test = load_task(spec, "test")
    assert all(p.count("\n###\n") == 3 for p in with_fewshot(test, spec)["prompt"])
    assert with_fewshot(test, spec, 0) is test


@pytest.mark.parametrize(
    "extra, message",
    [
        ("num_fewshot: -1\n", "num_fewshot=-1 is not a whole number >= 0"),
        ("num_fewshot: 2.5\n", "num_fewshot=2.5 is not a whole number >= 0"),
        ("fewshot_split: dev\n", "fewshot_split has split 'dev'"),
    ],
)
def test_a_bad_spec_value_is_one_line_naming_the_field(tmp_path, extra, message):
    with pytest.raises(TaskError, match=message):
        read_spec(_spec(tmp_path, extra=extra))


def test_bad_counts_name_the_fix(tmp_path, capsys):
    spec = read_spec(_spec(tmp_path))
    test = load_task(spec, "test")
    with pytest.raises(TaskError, match="num_fewshot=-1") as info:
        with_fewshot(test, spec, -1)
    assert "--num-fewshot 0" in info.value.fix
    with pytest.raises(TaskError, match=r"num_fewshot=9 .* its train split holds 8 example") as info:
        with_fewshot(test, spec, 9)
    assert "give --num-fewshot 8 or fewer" in info.value.fix
    with pytest.raises(ParameterError, match="num_fewshot=-2"):
        FinetuneConfig(num_fewshot=-2)
    assert main(["evaluate", "--task", "sst2", "--model", "tiny-llama", "--num-fewshot", "-1"]) == 2
    assert "--num-fewshot -1 is below 0" in capsys.readouterr().err


def test_evaluate_two_shot_on_tiny_llama(tmp_path, capsys):
    """``evaluate --num-fewshot 2`` completes; it is recorded, and every saved prompt holds two solved SST-2 rows."""
    out = tmp_path / "ev"
    args = ["evaluate", "--task", "sst2", "--model", "tiny-llama", "--n-test", "4", "--max-length", "96"]
    assert main([*args, "--num-fewshot", "2", "-o", str(out)]) == 0
    assert "(zero-shot, 4 test rows, 2-shot)" in capsys.readouterr().out
    evaluation = json.loads((out / "evaluation.json").read_text())
    assert (evaluation["num_fewshot"], evaluation["fewshot_split"], evaluation["fewshot_seed"]) == (2, "train", 1234)
    prompts = [json.loads(line)["prompt"] for line in (out / "predictions.jsonl").read_text().splitlines()]
    zero = load_task("sst2", "test", 4, 0)["prompt"]
    assert len(prompts) == 4
    for prompt, plain in zip(prompts, zero):
        assert prompt.endswith("\n\n" + plain) and prompt.count("\nSentiment: ") == 2


def test_check_task_reports_what_few_shot_pushes_past_max_length(tmp_path):
    from topotuner_lab.training.task_check import check_task

    check = check_task(str(_spec(tmp_path)), model="tiny-llama", max_length=40, num_fewshot=2)
    test = next(s for s in check.splits if s.split == "test")
    assert test.prompts_cut == 0.0 and test.fewshot_cut == 1.0  # ~26 byte tokens each; three times that with shots
    assert next(s for s in check.splits if s.split == "train").fewshot_cut is None
    assert "with 2 few-shot examples: --max-length 40 cuts 100.0% of prompts (4 of 4 pushed past it" in check.text()
    assert check_task(str(_spec(tmp_path)), model="tiny-llama", max_length=40).splits[-1].fewshot_cut is None


def test_check_task_cli_counts_the_few_shot_tokens(tmp_path, capsys):
    """``check-task --num-fewshot 2`` reports the cut the examples cause; without it the spec's 0 shows no such line."""
    args = ["check-task", str(_spec(tmp_path)), "--model", "tiny-llama", "--max-length", "40"]
    assert main([*args, "--num-fewshot", "2"]) == 0
    assert "with 2 few-shot examples: --max-length 40 cuts 100.0% of prompts" in capsys.readouterr().out
    assert main(args) == 0
    assert "few-shot examples" not in capsys.readouterr().out


@pytest.mark.parametrize("kind", sorted(HEADS))
def test_prompts_are_lm_evals_fewshot_context(tmp_path, kind):
    """lm-eval 0.4.13's own ``fewshot_context`` (its default sampler, few-shot seed 1234) over the same train and test
    rows writes every few-shot prompt exactly as ours (no model: prompts only)."""
    import yaml
    from lm_eval.api.task import ConfigurableTask

    spec = read_spec(_spec(tmp_path, kind))
    for split, rows in (("train", ROWS[:8]), ("test", ROWS[8:])):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = yaml.safe_load(HEADS[kind]) | {
        "task": f"fewshot_{kind}",
        "dataset_path": "json",
        "dataset_kwargs": {
            "data_files": {s: str(tmp_path / f"{s}.jsonl") for s in ("train", "test")},
            "cache_dir": str(tmp_path / "hf-datasets"),
        },
        "training_split": "train",
        "test_split": "test",
        "doc_to_text": spec.doc_to_text,
        "num_fewshot": 2,
    }
    if kind == "generation":
        config["generation_kwargs"] = {"until": ["\n\n"]}
    task = ConfigurableTask(config=config)
    task.set_fewshot_seed(FEWSHOT_SEED)
    theirs = [task.fewshot_context(doc, 2) for doc in task.test_docs()]
    assert list(with_fewshot(load_task(spec, "test"), spec, 2)["prompt"]) == theirs


def test_finetune_with_the_option_records_it_and_scores_few_shot(tmp_path):
    """``finetune --num-fewshot 2`` on a spec of 0: recorded in the config and results, two examples per test prompt."""
    out = tmp_path / "run"
    args = ["finetune", "--model", "tiny-llama", "--task", str(_spec(tmp_path)), "--epochs", "1", "--n-train", "4"]
    args += ["--n-test", "4", "--n-ood", "0", "--n-ppl", "0", "--max-length", "96", "--no-save-checkpoints"]
    assert main([*args, "--num-fewshot", "2", "-o", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["num_fewshot"] == results["num_fewshot"] == 2
    prompts = [json.loads(line)["prompt"] for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(prompts) == 4 and all(p.count("\n\n") == 2 for p in prompts)
