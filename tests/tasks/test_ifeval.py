import json
import subprocess
import sys

import pytest

from topotuner_lab._io.errors import TaskError
from topotuner_lab.tasks.ifeval import IFEVAL_METRICS, ifeval_follow, ifeval_scores, inst_level_micro
from topotuner_lab.tasks.loading import data_dir


def row(*instructions: tuple[str, dict], prompt: str = "Write something.") -> dict:
    return {
        "key": 1,
        "prompt": prompt,
        "instruction_id_list": [i for i, _ in instructions],
        "kwargs": [kw for _, kw in instructions],
    }


LOWER = ("change_case:english_lowercase", {})
AT_LEAST_8_WORDS = ("length_constraints:number_words", {"relation": "at least", "num_words": 8})
JSON = ("detectable_format:json_format", {})


def test_metric_names_are_lm_evals():
    assert IFEVAL_METRICS == (
        "prompt_level_strict_acc",
        "inst_level_strict_acc",
        "prompt_level_loose_acc",
        "inst_level_loose_acc",
    )
    assert set(ifeval_scores("all lowercase here.", row(LOWER))) == set(IFEVAL_METRICS)


@pytest.mark.parametrize(
    ("instruction", "followed", "broken"),
    [
        (LOWER, "this answer is written in lowercase only.", "This answer has One Capital."),
        (AT_LEAST_8_WORDS, "one two three four five six seven eight", "one two three four five six seven"),
        (
            ("length_constraints:number_words", {"relation": "less than", "num_words": 5}),
            "just four words here",
            "these are five whole words",
        ),
        (JSON, '{"name": "Ada", "born": 1815}', "name: Ada, born 1815"),
        (JSON, '```json\n{"a": [1, 2]}\n```', '{"a": [1, 2]'),
        (("punctuation:no_comma", {}), "no commas at all here", "one, two"),
        (("keywords:existence", {"keywords": ["topology", "drift"]}), "Topology and drift.", "Only topology."),
        (("change_case:english_capital", {}), "THIS IS ALL IN ENGLISH CAPITALS.", "This is not all capitals."),
    ],
)
def test_followed_and_broken(instruction, followed, broken):
    ok, bad = ifeval_scores(followed, row(instruction)), ifeval_scores(broken, row(instruction))
    assert ok == dict.fromkeys(IFEVAL_METRICS, 1.0)
    assert bad == dict.fromkeys(IFEVAL_METRICS, 0.0)


def test_sentence_count_uses_punkt_abbreviations():
    """``number_sentences`` needs NLTK's English Punkt model (the offline substitute here): "Dr." ends no sentence."""
    at_most_two = row(("length_constraints:number_sentences", {"relation": "less than", "num_sentences": 3}))
    assert ifeval_scores("Dr. Smith went home. He slept.", at_most_two)["prompt_level_strict_acc"] == 1.0
    assert ifeval_scores("Smith went home. He slept. Then he woke.", at_most_two)["prompt_level_strict_acc"] == 0.0
    import nltk

    nltk.data.find("tokenizers/punkt_tab/english/")  # findable after the first score, installed or substituted


def test_capital_word_frequency_runs_nltk_word_tokenize():
    kwargs = {"capital_relation": "less than", "capital_frequency": 2}
    few_capitals = row(("change_case:capital_word_frequency", kwargs))
    assert ifeval_scores("Only ONE word shouts. The rest do not.", few_capitals)["inst_level_strict_acc"] == 1.0
    assert ifeval_scores("WE ALL SHOUT HERE.", few_capitals)["inst_level_strict_acc"] == 0.0


def test_loose_forgives_a_preamble_line_and_markdown_stars():
    response = 'Sure, here is the JSON:\n{"a": 1}'
    scores = ifeval_scores(response, row(JSON))
    assert scores["prompt_level_strict_acc"] == 0.0 and scores["prompt_level_loose_acc"] == 1.0
    end = row(("startend:end_checker", {"end_phrase": "Any other questions?"}))
    starred = ifeval_scores("Here you go. **Any other questions?**", end)
    assert starred["prompt_level_strict_acc"] == 0.0 and starred["prompt_level_loose_acc"] == 1.0
    assert ifeval_scores("Here you go. Any more?", end)["prompt_level_loose_acc"] == 0.0


def test_prompt_level_needs_every_instruction_and_inst_level_is_the_fraction():
    doc = row(LOWER, AT_LEAST_8_WORDS, JSON)
    scores = ifeval_scores("only a few lowercase words", doc)  # lowercase: yes; 8 words: no; JSON: no
    assert scores == {
        "prompt_level_strict_acc": 0.0,
        "inst_level_strict_acc": pytest.approx(1 / 3),
        "prompt_level_loose_acc": 0.0,
        "inst_level_loose_acc": pytest.approx(1 / 3),
    }
    assert ifeval_follow("only a few lowercase words", doc) == ([True, False, False], [True, False, False])


def test_hub_style_none_kwargs_are_dropped():
    padded = {"relation": "at least", "num_words": 8, "keywords": None, "num_sentences": None, "language": None}
    doc = row(("length_constraints:number_words", padded))
    assert ifeval_scores("one two three four five six seven eight", doc)["prompt_level_strict_acc"] == 1.0
    assert ifeval_scores("one two", doc)["prompt_level_strict_acc"] == 0.0


def test_repeat_prompt_checker():
    doc = row(("combination:repeat_prompt", {"prompt_to_repeat": "Say hi."}), prompt="Say hi. Then answer.")
    assert ifeval_scores("Say hi. Hi!", doc)["prompt_level_strict_acc"] == 1.0
    assert ifeval_scores("Hi!", doc)["prompt_level_strict_acc"] == 0.0


@pytest.mark.parametrize("response", ["", "   \n  "])
def test_empty_response_follows_nothing(response):
    assert ifeval_scores(response, row(LOWER, ("punctuation:no_comma", {}))) == dict.fromkeys(IFEVAL_METRICS, 0.0)


def test_bad_rows_are_errors():
    with pytest.raises(ValueError, match="unknown instruction"):
        ifeval_scores("x", row(("no:such_instruction", {})))
    with pytest.raises(ValueError, match="no instructions"):
        ifeval_scores("x", row())
    with pytest.raises(ValueError, match="kwargs"):
        ifeval_scores("x", {**row(LOWER, JSON), "kwargs": [{}]})


def test_micro_average_weights_instructions_not_rows():
    rows = [[True, False, False], [True]]
    assert inst_level_micro(rows) == pytest.approx(2 / 4)
    assert sum(sum(r) / len(r) for r in rows) / len(rows) == pytest.approx(2 / 3)  # the per-row mean differs
    with pytest.raises(ValueError):
        inst_level_micro([])


def test_language_detection_is_repeatable():
    doc = row(("language:response_language", {"language": "de"}))
    assert ifeval_scores("Das ist ein kurzer deutscher Satz über das Wetter.", doc)["prompt_level_strict_acc"] == 1.0
    assert ifeval_scores("This is an English sentence about the weather.", doc)["prompt_level_strict_acc"] == 0.0
    # unseeded, langdetect calls this mix German about 4 times in 5 and English otherwise
    mixed = {ifeval_scores("The Kindergarten ist heute closed", doc)["prompt_level_strict_acc"] for _ in range(40)}
    assert len(mixed) == 1


def test_module_imports_without_the_verifier_packages():
    code = (
        "import sys\n"
        "for name in ('if_verifiable', 'punkt', 'langdetect', 'nltk'): sys.modules[name] = None\n"
        "import topotuner_lab.tasks.ifeval as m\n"
        "assert len(m.IFEVAL_METRICS) == 4\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def ifeval_rows() -> list[dict]:
    try:
        path = data_dir() / "ifeval" / "input_data.jsonl"
    except TaskError:
        pytest.skip("no offline data folder (shared/data)")
    if not path.is_file():
        pytest.skip("no shared/data/ifeval")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_every_ifeval_row_scores_with_a_trivial_and_an_empty_response():
    rows = ifeval_rows()
    assert len(rows) == 541 and sum(len(r["instruction_id_list"]) for r in rows) == 834
    prompt_level = []
    for r in rows:
        scores = ifeval_scores(r["prompt"], r)  # the prompt echoed back as the answer
        assert set(scores) == set(IFEVAL_METRICS) and all(0.0 <= v <= 1.0 for v in scores.values())
        assert scores["prompt_level_loose_acc"] >= scores["prompt_level_strict_acc"]
        assert scores["inst_level_loose_acc"] >= scores["inst_level_strict_acc"]
        assert scores["prompt_level_strict_acc"] <= scores["inst_level_strict_acc"]
        assert ifeval_scores("", r) == dict.fromkeys(IFEVAL_METRICS, 0.0)
        prompt_level.append(scores["prompt_level_strict_acc"])
    assert 0.1 < sum(prompt_level) / len(prompt_level) < 0.5  # an echo follows some rows (0.25 here), not all
