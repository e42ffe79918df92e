"""Per-example task metrics, from the libraries that define them where there is one.

Every function scores one example (or one query), so claims stay paired example by example:
- SQuAD exact match and F1 with the official answer normalization (lower case, no punctuation, no articles, single
  spaces), the best over the reference answers (the official ``evaluate-v1.1.py`` logic);
- ROUGE-1/2/L F-measures from ``rouge-score`` (Porter stemming), the best over the references;
- nDCG@10 and MRR@10 of a ranking per query from ``ir-measures``, under one tie rule (below);
- pass@1 of greedy programs from the sandbox's per-problem statuses.

Ties in a ranking (documents of one query with the same score) keep the order the documents were given in: for a
reranked task that is the first stage's (BM25) order, so a scorer that cannot tell two documents apart leaves them
as the first stage ranked them, and a constant scorer scores exactly the first stage's ranking. Every ranking metric
sees the ranking through this one rule (:func:`ranking_scores` hands ir-measures scores without ties). The
libraries differ: trec_eval (``pytrec_eval``, which ir-measures uses for nDCG and BEIR for all its metrics) breaks
ties by document id, descending; ir-measures' own MRR@k (its ``msmarco`` provider) by document id, ascending, so one
query whose candidates all score 0 got nDCG@10 0.5 and MRR@10 1.0 with its relevant document first by id. Ties by
document id make a score depend on how documents are named, and the optimistic and pessimistic rules make a
constant scorer look perfect or useless; the first stage's order is information the task already has.
A NaN score ranks below every number.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence

import pandas as pd

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)
ROUGE_TYPES: tuple[str, ...] = ("rouge1", "rouge2", "rougeL")


def normalize_answer(text: str) -> str:
    """The official SQuAD normalization: lower case, punctuation removed, articles removed, whitespace collapsed."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _f1(prediction: str, reference: str) -> float:
    pred, ref = normalize_answer(prediction).split(), normalize_answer(reference).split()
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def squad_scores(prediction: str, references: Sequence[str]) -> dict[str, float]:
    """``exact_match`` and ``f1`` of one prediction, each the best over the reference answers (0 or 1 / [0, 1])."""
    return {
        "exact_match": float(max(normalize_answer(prediction) == normalize_answer(r) for r in references)),
        "f1": max(_f1(prediction, r) for r in references),
    }


def rouge_scores(prediction: str, references: Sequence[str]) -> dict[str, float]:
    """ROUGE-1/2/L F-measures of one summary (``rouge-score``, stemmed), each the best over the references."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    best = dict.fromkeys(ROUGE_TYPES, 0.0)
    for reference in references:
        for name, score in scorer.score(reference, prediction).items():
            best[name] = max(best[name], score.fmeasure)
    return best


def ranking_scores(
    run: Mapping[str, Mapping[str, float]], qrels: Mapping[str, Mapping[str, int]], cutoff: int = 10
) -> pd.DataFrame:
    """nDCG@cutoff and MRR@cutoff per query, from ``ir-measures``.

    ``run`` maps query -> document -> model score, ``qrels`` query -> document -> relevance; queries without a
    relevant document are left out. Documents with the same score rank in ``run``'s order (the module's tie rule).
    """
    import ir_measures
    from ir_measures import RR, nDCG

    measures = [nDCG @ cutoff, RR @ cutoff]
    judged = [ir_measures.Qrel(q, d, int(rel)) for q, docs in qrels.items() for d, rel in docs.items()]
    scored = [ir_measures.ScoredDoc(q, d, s) for q, docs in run.items() for d, s in _untied(docs).items()]
    rows: dict[str, dict[str, float]] = {}
    for metric in ir_measures.iter_calc(measures, judged, scored):
        name = f"ndcg@{cutoff}" if metric.measure == measures[0] else f"mrr@{cutoff}"
        rows.setdefault(metric.query_id, {})[name] = float(metric.value)
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("query").reset_index()


def _untied(scores: Mapping[str, float]) -> dict[str, float]:
    """The ranking of ``scores`` as scores without ties: n for the first document ... 1 for the last.

    Documents with the same score keep the mapping's order; a NaN score ranks last.
    """
    ranked = sorted(scores, key=lambda doc: math.inf if math.isnan(score := float(scores[doc])) else -score)
    return {doc: float(len(ranked) - place) for place, doc in enumerate(ranked)}


def pass_at_1(statuses: Sequence[str]) -> float:
    """The share of problems whose greedy program ran all its tests to the end (``pass`` among sandbox statuses)."""
    return sum(status == "pass" for status in statuses) / len(statuses) if statuses else float("nan")
