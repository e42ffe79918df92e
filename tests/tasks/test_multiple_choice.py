"""Multiple choice with each row's own options (lm-evaluation-harness's per-row ``doc_to_choice``) and split carving.

A made-up five-option commonsense set, written as a JSONL fixture into the test's tmp_path, is read through a spec
whose options are each row's own, scored zero-shot on tiny-llama (every option's log-probability checked against its
own unbatched forward) and fine-tuned for one short epoch end to end. The MMLU specs' carve of the one offline test
file into train / validation / test is checked on the real file: disjoint by question, stratified by subject.
"""

from __future__ import annotations

import collections
import json
import math

import numpy as np
import pytest
import torch

from topotuner_lab._io.errors import TaskError
from topotuner_lab.tasks.carve import carve
from topotuner_lab.tasks.loading import data_dir, load_task
from topotuner_lab.tasks.registry import TASKS, get_task, read_spec
from topotuner_lab.training.config import FinetuneConfig
from topotuner_lab.training.evaluation import choice_metrics, encode_pair, option_logprobs
from topotuner_lab.training.scoring import TaskScorer
from topotuner_lab.training.trainer import tokenize_for_training

#: question, its five options, the gold option's index
COMMONSENSE = [
    ("Where do you keep milk cold?", ["oven", "fridge", "garden", "bookshelf", "bathtub"], 1),
    ("What do you use to cut paper?", ["spoon", "pillow", "scissors", "candle", "sock"], 2),
    ("What falls from clouds?", ["rain", "bricks", "shoes", "chairs", "books"], 0),
    ("Where do fish live?", ["desert", "attic", "water", "oven", "closet"], 2),
    ("What do you wear on your feet?", ["hat", "gloves", "scarf", "shoes", "belt"], 3),
    ("What do bees make?", ["milk", "honey", "glass", "paper", "steel"], 1),
    ("What do you sleep on?", ["bed", "stove", "roof", "fence", "sink"], 0),
    ("What helps you see in the dark?", ["sand", "soap", "lamp", "salt", "rope"], 2),
    ("What do cows eat?", ["grass", "rocks", "plastic", "coins", "glue"], 0),
    ("What do you drink when thirsty?", ["sand", "water", "paint", "oil", "ink"], 1),
    ("Where do planes land?", ["lake", "airport", "kitchen", "forest", "library"], 1),
    ("What tells the time?", ["clock", "spoon", "carpet", "lemon", "brush"], 0),
]
SPEC = """task: tiny-commonsense
output_type: multiple_choice
doc_to_text: "Question: {{ question }}\\nAnswer:"
doc_to_choice: options
doc_to_target: answer
metric_list:
  - metric: acc
  - metric: acc_norm
data_files: {train: commonsense.jsonl, test: commonsense.jsonl}
split_filter: {train: "_index >= 4", test: "_index < 4"}
"""


@pytest.fixture
def commonsense(tmp_path):
    """The spec file (options a field holding a list, the target an index) beside its JSONL rows."""
    rows = [{"question": q, "options": o, "answer": a, "gold": o[a]} for q, o, a in COMMONSENSE]
    (tmp_path / "commonsense.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp_path / "commonsense.yaml"
    path.write_text(SPEC)
    return path


@pytest.mark.parametrize(
    "choice, target",
    [
        ("options", "answer"),  # a field holding the list; the index
        ('"{{ options }}"', "gold"),  # a template rendering the list; the gold option's text
        ('"{{ [options[0], options[1], options[2], options[3], options[4]] }}"', '"{{ answer }}"'),  # a whole number
    ],
)
def test_rows_carry_their_own_options_and_learn_the_gold_option(commonsense, choice, target):
    spec = commonsense.with_name("variant.yaml")
    spec.write_text(
        SPEC.replace("doc_to_choice: options", f"doc_to_choice: {choice}").replace(
            "doc_to_target: answer", f"doc_to_target: {target}"
        )
    )
    rows = load_task(spec, "test")
    assert rows.column_names == ["prompt", "target", "label", "choices"]
    for row, (question, options, answer) in zip(rows, COMMONSENSE):
        assert row["prompt"] == f"Question: {question}\nAnswer:"
        assert (row["choices"], row["label"], row["target"]) == (options, answer, " " + options[answer])
    assert read_spec(spec).per_row_choices and read_spec(spec).labels == ()


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            ("doc_to_choice: options", 'doc_to_choice: "{{ question }}"'),
            "doc_to_choice of task 'tiny-commonsense' gives",
        ),
        (("doc_to_target: answer", "doc_to_target: question"), "is not one of task 'tiny-commonsense''s 5 labels"),
        (("doc_to_choice: options", "doc_to_choice: choices"), "has no column(s) ['choices'] named by doc_to_choice"),
    ],
)
def test_a_per_row_spec_that_does_not_fit_its_rows_fails_naming_the_field(commonsense, edit, message):
    commonsense.write_text(SPEC.replace(*edit))
    with pytest.raises(TaskError) as info:
        load_task(commonsense, "test")
    assert message in info.value.problem


@pytest.mark.parametrize(
    "carving, message",
    [
        ("{by: question, shares: {train: 3, test: 1}, seed: x}", "split_carve.seed='x' is not a whole number"),
        ("{by: question, shares: {train: 3, tset: 1}}", "split_carve.shares has split 'tset'"),
        ("{by: question, shares: {train: 3}}", "is not 2 or more splits with positive shares"),
        ("{by: '{{ question }}', shares: {train: 3, test: 1}}", "split_carve.by='{{ question }}' is not a field name"),
        ("{by: question, shares: {train: 3, validation: 1, test: 1}}", "names splits ['test', 'train', 'validation']"),
    ],
)
def test_a_bad_split_carve_is_refused_when_the_spec_is_read(commonsense, carving, message):
    commonsense.write_text(
        SPEC.replace('split_filter: {train: "_index >= 4", test: "_index < 4"}', f"split_carve: {carving}")
    )
    with pytest.raises(TaskError) as info:
        read_spec(commonsense)
    assert message in info.value.problem


@torch.no_grad()
def _alone(model, tokenizer, prompt: str, option: str, max_length: int) -> float:
    """log p(option | prompt) from one unbatched, unpadded forward of the pair's last ``max_length`` tokens."""
    context, continuation = encode_pair(tokenizer, prompt, option)
    ids = (context + continuation)[-max_length:]
    logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)
    positions = range(len(ids) - len(continuation) - 1, len(ids) - 1)
    return float(sum(logp[p, t] for p, t in zip(positions, continuation)))


@torch.no_grad()
@pytest.mark.parametrize("max_length", [64, 24])  # 24: the longer prompts are cut from the left
def test_each_rows_options_score_as_their_own_unbatched_forward(tiny_llama, max_length):
    model, tok = tiny_llama.model, tiny_llama.tokenizer
    prompts = [f"Question: {q}\nAnswer:" for q, _, _ in COMMONSENSE[:5]]
    options = [[" " + o for o in opts] for _, opts, _ in COMMONSENSE[:5]]
    options[2] = options[2][:3]  # rows may have fewer options than others: -inf pads them
    got = option_logprobs(model, tok, prompts, options, max_length=max_length, batch_size=3)
    assert got.shape == (5, 5) and np.isneginf(got[2, 3:]).all()
    for i, (prompt, row) in enumerate(zip(prompts, options)):
        for j, option in enumerate(row):
            assert got[i, j] == pytest.approx(_alone(model, tok, prompt, option, max_length), abs=1e-4), (i, j)
    # one-token options (a byte each here): one forward per prompt, each row reading its own tokens
    letters = [[" a", " b"], [" c", " d", " e"], [" f", " g"], [" h", " i"], [" j", " k"]]
    fast = option_logprobs(model, tok, prompts, [[o[1] for o in row] for row in letters], max_length=max_length)
    for i, row in enumerate(letters):
        for j, option in enumerate(row):
            assert fast[i, j] == pytest.approx(_alone(model, tok, prompts[i], option[1], max_length), abs=1e-4)
    assert np.isneginf(fast[[0, 2, 3, 4], 2]).all()


def test_choice_metrics_are_lm_evals_acc_acc_norm_and_acc_bytes():
    # lm-eval 0.4.13's process_results: argmax(lls), argmax(lls / len(text)), argmax(lls / len(text.encode("utf-8")))
    options = [["a", "bbbb"], ["éé", "ab", "x"], ["aa", "bb"]]
    scores = np.array([[-2.0, -4.0, -np.inf], [-4.0, -3.0, -5.0], [-1.0, -1.0, -np.inf]])
    metrics = choice_metrics(scores, options, [1, 0, 1])
    assert metrics["acc"].tolist() == [False, False, False]  # the likeliest: 0, 1, and 0 (a tie goes to the first)
    assert metrics["acc_norm"].tolist() == [True, False, False]  # per character: -1 > -2; -1.5 > -2 > -5
    assert metrics["acc_bytes"].tolist() == [True, True, False]  # "éé" is 4 bytes: -1 > -1.5 > -5


def test_zero_shot_scores_of_a_per_row_spec(commonsense, tiny_llama):
    rows = load_task(commonsense, "test")
    scorer = TaskScorer(commonsense, tiny_llama.tokenizer, 64, batch_size=7)
    scores = scorer.score_all(tiny_llama.model, rows)
    assert set(scores) == {"acc", "acc_norm", "logloss"} and scorer.metric == "acc"
    expected = np.array(
        [[_alone(tiny_llama.model, tiny_llama.tokenizer, r["prompt"], " " + o, 64) for o in r["choices"]] for r in rows]
    )
    np.testing.assert_array_equal(scores["acc"], expected.argmax(axis=1) == np.asarray(rows["label"]))
    lengths = np.array([[len(o) for o in r["choices"]] for r in rows])
    np.testing.assert_array_equal(scores["acc_norm"], (expected / lengths).argmax(axis=1) == np.asarray(rows["label"]))
    assert (scores["logloss"] > 0).all() and np.isfinite(scores["logloss"]).all()


def test_training_rows_learn_the_gold_option_text(commonsense, tiny_llama):
    tok = tiny_llama.tokenizer
    rows = load_task(commonsense, "train")
    tokenized = tokenize_for_training(tok, rows, 64)
    for row, ids in zip(rows, tokenized):
        learned = [t for t, label in zip(ids["input_ids"], ids["labels"]) if label != -100]
        assert learned == tok(row["target"], add_special_tokens=False).input_ids + [tok.eos_token_id]
        assert row["target"] == " " + row["choices"][row["label"]]


@pytest.mark.slow
def test_one_finetune_epoch_on_a_per_row_spec(commonsense, tiny_llama, tmp_path):
    from topotuner_lab.training.finetune import run_finetune

    cfg = FinetuneConfig(
        method="full",
        task=str(commonsense),
        output_dir=str(tmp_path / "run"),
        epochs=1,
        n_train=8,
        n_val=0,
        n_test=4,
        n_ood=4,
        n_ppl=2,
        batch_size=4,
        max_length=40,
        learning_rate=1e-3,
    )
    res = run_finetune(tiny_llama, cfg)
    assert res.epochs_run == 1 and res.metric == "acc" and res.log_history
    assert set(res.test_metrics) == {"acc", "acc_norm"} and len(res.test_correct) == 4
    assert 0.0 <= res.test_accuracy <= 1.0 and res.test_metrics["acc"] == res.test_accuracy


# ---- carving one file into splits


def test_carve_is_disjoint_by_key_stratified_and_independent_of_row_order():
    keys = [f"q{i % 90}" for i in range(200)]  # 90 distinct keys, most of them on two or three rows
    strata = ["even" if (i % 90) % 2 == 0 else "odd" for i in range(200)]  # 45 keys each
    shares = [("train", 60), ("validation", 10), ("test", 30)]
    splits = carve(keys, strata, shares, seed=0)
    split_of = {}
    for key, stratum, split in zip(keys, strata, splits):
        assert split_of.setdefault(key, (stratum, split)) == (stratum, split)  # a key's rows share a split
    # 45 keys: round(27) train, round(31.5) - 27 = 5 validation, the other 13 test, in each stratum
    counts = collections.Counter(split_of.values())
    assert counts == {
        (s, split): n for s in ("even", "odd") for split, n in (("train", 27), ("validation", 5), ("test", 13))
    }
    assert carve(keys[::-1], strata[::-1], shares, seed=0)[::-1] == splits  # the rows' order does not matter
    assert carve(keys, strata, shares, seed=1) != splits  # the seed salts the order


def test_mmlu_is_carved_by_question_stratified_by_subject():
    spec = TASKS["mmlu"]
    assert TASKS["mmlu-text"].split_carve == spec.split_carve
    text = (data_dir() / spec.data_files["test"]).read_text(encoding="utf-8")
    rows = [json.loads(line) for line in text.split("\n") if line.strip()]  # not splitlines(): texts hold U+2028
    carving = spec.split_carve
    shares = [(s, carving["shares"][s]) for s in ("train", "validation", "test")]
    splits = carve([r["question"] for r in rows], [r["topic"] for r in rows], shares, carving["seed"])
    assert collections.Counter(splits) == {"train": 8416, "validation": 1408, "test": 4218}
    owner = collections.defaultdict(set)
    for row, split in zip(rows, splits):
        owner[row["question"]].add(split)
    assert all(len(s) == 1 for s in owner.values())  # no question text in two splits
    first = {}  # a question text counts in the subject of its first row
    for row, split in zip(rows, splits):
        first.setdefault(row["question"], (row["topic"], split))
    per_subject = collections.Counter(first.values())
    subjects = {topic for topic, _ in first.values()}
    assert len(subjects) == 57
    for topic in subjects:  # each subject's questions cut at round(60%) and round(70%) exactly
        n = sum(per_subject[topic, split] for split, _ in shares)
        assert per_subject[topic, "train"] == math.floor(n * 0.6 + 0.5)
        assert per_subject[topic, "train"] + per_subject[topic, "validation"] == math.floor(n * 0.7 + 0.5)
    validation = load_task("mmlu-text", "validation")
    assert len(validation) == 1408 and all(len(c) == 4 for c in validation["choices"])


def test_a_per_row_spec_is_described_without_a_fixed_answer_count():
    from topotuner_lab.lab.report.sections import _answer_words
    from topotuner_lab.lab.widgets import task_summary

    assert "each row's own options" in task_summary(get_task("mmlu-text"))  # not the template's characters
    assert _answer_words("sst2", ("mmlu-text",)) == ("mmlu-text", None)  # no chance level from a count of words
    assert _answer_words("sst2", ("boolq",)) == ("boolq", 2)
