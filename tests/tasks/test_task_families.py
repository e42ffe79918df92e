"""The paper's task families as built-in specs: rows read right, and each task's scorer gives its reference answers
full marks (and a wrong answer none), without a model: the answers are put in place of generation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.tasks.test_sandbox import needs_bwrap
from topotuner_lab._io.errors import TaskError
from topotuner_lab.tasks.loading import load_task
from topotuner_lab.tasks.registry import TASKS, read_spec
from topotuner_lab.training.scoring import TaskScorer

FAMILIES = ("squad", "dialogsum", "xsum", "alpaca", "ifeval", "mbpp", "humaneval")


def _scores(task: str, rows, answers: list[str]) -> dict[str, np.ndarray]:
    scorer = TaskScorer(task, tokenizer=None)
    scorer.answers = lambda model, ds: answers  # type: ignore[method-assign]  # these answers are scored, no model
    return scorer.score_all(None, rows)


@pytest.mark.parametrize("task", FAMILIES)
def test_every_family_reads_train_and_test_rows(task):
    for split in ("train", "test"):
        rows = load_task(task, split, 4, 0)
        assert len(rows) == 4 and all(p.strip() for p in rows["prompt"])
        assert rows.column_names == ["prompt", "target", "label", "references", "doc"]


def test_squad_json_is_read_one_row_per_question_with_every_reference():
    rows = load_task("squad", "test")
    assert len(rows) == 10570  # the official dev set's questions
    assert max(len(r) for r in rows["references"]) >= 3


def test_split_filters_give_mbpp_its_official_split_and_xsum_disjoint_halves():
    ids = {s: {json.loads(d)["task_id"] for d in load_task("mbpp", s)["doc"]} for s in ("train", "validation", "test")}
    assert ids["test"] == set(range(11, 511)) and ids["validation"] == set(range(511, 601))
    assert ids["train"] == set(range(601, 975))
    xsum = {s: {json.loads(d)["id"] for d in load_task("xsum", s)["doc"]} for s in ("train", "test")}
    assert len(xsum["train"]) == len(xsum["test"]) == 500 and not xsum["train"] & xsum["test"]


def test_a_train_task_trains_ifeval_on_alpaca_and_tests_on_its_own_rows():
    assert load_task("ifeval", "train", 5, 3)["prompt"] == load_task("alpaca", "train", 5, 3)["prompt"]
    assert len(load_task("ifeval", "test")) == 541


def test_reference_answers_get_full_marks_and_wrong_ones_none():
    squad = load_task("squad", "test", 20, 0)
    right = _scores("squad", squad, [refs[-1] for refs in squad["references"]])
    assert right["exact"].tolist() == [1.0] * 20 and right["f1"].tolist() == [1.0] * 20
    wrong = _scores("squad", squad, ["zzz"] * 20)
    assert wrong["exact"].sum() == 0 and wrong["f1"].sum() == 0
    dialogs = load_task("dialogsum", "test", 10, 0)
    assert np.allclose(_scores("dialogsum", dialogs, [r[1] for r in dialogs["references"]])["rougeL"], 1.0)
    gsm8k = load_task("gsm8k", "test", 10, 0)
    assert _scores("gsm8k", gsm8k, list(gsm8k["target"]))["exact_match"].tolist() == [1.0] * 10


@needs_bwrap  # the programs run in the sandbox
@pytest.mark.parametrize("task", ["mbpp", "humaneval"])
def test_reference_programs_pass_and_broken_ones_fail(task):
    rows = load_task(task, "test", 6, 0)
    solutions = [t.removesuffix("[DONE]") for t in rows["target"]]
    assert _scores(task, rows, solutions)["pass@1"].tolist() == [1.0] * 6
    assert _scores(task, rows, ["    return None\n" if task == "humaneval" else "x = 1\n"] * 6)["pass@1"].sum() == 0


def test_the_primary_metric_comes_first_and_every_built_in_has_a_license_note():
    assert TASKS["squad"].metrics == ("f1", "exact") and TASKS["dialogsum"].metric == "rougeL"
    assert TASKS["mbpp"].metric == TASKS["humaneval"].metric == "pass@1"
    for spec in TASKS.values():
        assert spec.metadata.get("license"), spec.task


def _spec(tmp_path, **fields) -> str:
    (tmp_path / "rows.jsonl").write_text('{"q": "1 + 1", "a": "2", "n": 1}\n{"q": "2 + 2", "a": "4", "n": 2}\n')
    base = {
        "task": "mine",
        "output_type": "generate_until",
        "doc_to_text": "{{ q }} =",
        "doc_to_target": "{{ a }}",
        "data_files": {"train": "rows.jsonl", "test": "rows.jsonl"},
    }
    path = tmp_path / "mine.yaml"
    import yaml

    path.write_text(yaml.safe_dump({**base, **fields}))
    return str(path)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"split_filter": {"tests": "n > 1"}}, "split_filter has split 'tests'"),
        ({"split_filter": {"test": "n >"}}, "split_filter.test='n >' is not a valid Jinja2 expression"),
        ({"doc_to_program": "print(1)"}, "doc_to_program does not use {{ completion }}"),
        ({"metric_list": [{"metric": "pass@1"}]}, "pass@1 needs doc_to_program"),
        ({"metric_list": [{"metric": "bleu"}]}, "metric_list[0].metric='bleu'"),
        ({"train_task": "mine"}, "train_task names the task itself"),
    ],
)
def test_bad_family_fields_are_named(tmp_path, fields, named):
    with pytest.raises(TaskError) as err:
        read_spec(_spec(tmp_path, **fields))
    assert named in err.value.problem


def test_a_split_filter_that_fails_on_a_row_names_the_row(tmp_path):
    spec = _spec(tmp_path, split_filter={"test": "missing_field > 1"})
    with pytest.raises(TaskError, match="split_filter.test of task 'mine' fails on row 0"):
        load_task(spec, "test")
    kept = load_task(_spec(tmp_path, split_filter={"test": "n > 1 and _index == 1"}), "test")
    assert kept["prompt"] == ["2 + 2 ="]


def test_scifact_rows_carry_their_relevant_abstract_and_bm25_candidates():
    test = load_task("scifact", "test")
    assert len(test) == 300 and len(load_task("scifact", "train")) == 809  # claims with a relevant abstract
    row = json.loads(test["doc"][0])
    ranking = json.loads(row["ranking"])
    assert len(ranking["candidates"]) == 20 and any(rel > 0 for rel in ranking["qrels"].values())
    assert test["prompt"][0].startswith("Abstract: ") and test["target"][0] == " " + row["query"].strip()


def test_scifact_scorer_gives_a_model_that_prefers_the_relevant_abstract_full_marks(monkeypatch):
    import topotuner_lab.training.scoring as scoring

    rows = load_task("scifact", "test", 12, 0)

    def oracle(model, tokenizer, rows, doc_to_prompt, query_to_target, **kwargs):
        return [{c["id"]: float(r["qrels"].get(c["id"], 0)) for c in r["candidates"]} for r in rows]

    monkeypatch.setattr(scoring, "rerank_scores", oracle)
    scores = TaskScorer("scifact", None).score_all(None, rows)
    found = [any(c["id"] in r["qrels"] for c in r["candidates"]) for r in map(_ranking, rows["doc"])]
    assert set(scores) == {"ndcg@10", "mrr@10"}
    assert scores["mrr@10"].tolist() == [1.0 if f else 0.0 for f in found]  # the first candidate is relevant


def _ranking(doc: str) -> dict:
    return json.loads(json.loads(doc)["ranking"])


def test_a_chat_template_spec_wraps_prompts_as_one_user_turn(tiny_llama, tmp_path):
    from topotuner_lab.training.data import chat_framed

    path = _spec(tmp_path, chat_template=True, target_delimiter="")
    rows = load_task(path, "test")
    with pytest.raises(TaskError, match="chat_template: true"):  # the tiny model's tokenizer has no template
        chat_framed(rows, path, tiny_llama.tokenizer)
    tokenizer = tiny_llama.tokenizer
    tokenizer.chat_template = "{% for m in messages %}<u>{{ m['content'] }}</u>{% endfor %}<a>"
    try:
        framed = chat_framed(rows, path, tokenizer)
    finally:
        tokenizer.chat_template = None
    assert framed["prompt"] == ["<u>1 + 1 =</u><a>", "<u>2 + 2 =</u><a>"] and framed["target"] == ["2", "4"]
    assert chat_framed(rows, "sst2", tokenizer) is rows  # a spec without chat_template is left as it is
