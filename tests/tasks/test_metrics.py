"""Task metrics per example: SQuAD EM/F1 with the official normalization, ROUGE from rouge-score, nDCG/MRR from
ir-measures, pass@1."""

from __future__ import annotations

import pytest

from topotuner_lab.tasks.metrics import normalize_answer, pass_at_1, ranking_scores, rouge_scores, squad_scores


@pytest.mark.parametrize(
    "text, normalized",
    [
        pytest.param("The Denver Broncos!", "denver broncos", id="article-punctuation-case"),
        pytest.param("  a  cat,  an apple ", "cat apple", id="articles-spaces"),
        pytest.param("theatre", "theatre", id="article-only-as-a-word"),
    ],
)
def test_the_official_normalization(text, normalized):
    assert normalize_answer(text) == normalized


def test_squad_scores_take_the_best_reference():
    scores = squad_scores("Denver Broncos", ["the Denver Broncos", "Broncos"])
    assert scores == {"exact_match": 1.0, "f1": 1.0}
    partial = squad_scores("the Broncos of Denver", ["Denver Broncos"])
    assert partial["exact_match"] == 0.0 and partial["f1"] == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))
    assert squad_scores("Seattle", ["Denver"]) == {"exact_match": 0.0, "f1": 0.0}


def test_rouge_uses_rouge_score_and_the_best_reference():
    from rouge_score import rouge_scorer

    prediction, references = "the cat sat on the mat", ["a dog lay on a rug", "the cat was on the mat"]
    scores = rouge_scores(prediction, references)
    direct = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True).score(references[1], prediction)
    assert scores == pytest.approx({name: direct[name].fmeasure for name in direct})
    assert rouge_scores("identical words", ["identical words"])["rougeL"] == 1.0


def test_ranking_scores_per_query():
    run = {"q1": {"d1": 0.9, "d2": 0.5, "d3": 0.1}, "q2": {"d4": 0.2, "d5": 0.8}}
    qrels = {"q1": {"d3": 1}, "q2": {"d5": 1}}
    table = ranking_scores(run, qrels).set_index("query")
    assert table.loc["q1", "mrr@10"] == pytest.approx(1 / 3) and table.loc["q2", "mrr@10"] == 1.0
    assert table.loc["q1", "ndcg@10"] == pytest.approx(0.5) and table.loc["q2", "ndcg@10"] == 1.0  # 1/log2(4)


def test_pass_at_1():
    assert pass_at_1(["pass", "fail", "timeout", "pass"]) == 0.5 and pass_at_1([]) != pass_at_1([])
