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

Every metric a task spec may name is an entry of one registry (:data:`REGISTRY`, filled at the end of this module):
its name, the output type it scores, whether higher is better, and for ``generate_until`` the function that scores
the answers. Specs are checked against it and scorers dispatch through it, so a metric is added in one place
(:func:`register_metric`).
"""

from __future__ import annotations

import json
import math
import re
import string
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np

from topotuner_lab._io.errors import ParameterError
from topotuner_lab.tasks.ifeval import IFEVAL_METRICS, ifeval_scores
from topotuner_lab.tasks.sandbox import SandboxLimits, Status, run_program
from topotuner_lab.tasks.templates import render

if TYPE_CHECKING:
    import pandas as pd

    from topotuner_lab.tasks.schema import TaskSpec

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
    import pandas as pd
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


def final_number(answer: str) -> str | None:
    """The number after GSM8K's ``####`` (or the last number in a generated answer)."""
    tail = answer.split("####")[-1]
    numbers = re.findall(r"-?\d[\d,]*\.?\d*", tail)
    return numbers[-1].replace(",", "").rstrip(".") if numbers else None


# ------------------------------------------------------------------------------------------------ the registry

#: how a task is scored: the likelihood of each label word, greedy generation, or reranking a candidate list
OutputType = Literal["multiple_choice", "generate_until", "ranking"]
OUTPUT_TYPES: tuple[str, ...] = get_args(OutputType)
#: per example, each metric's value (a metric name -> an array in the rows' order)
ExampleScores = dict[str, np.ndarray]
#: how generation metrics are scored: (answers, rows, spec, sandbox limits) -> per example, each metric it computes
GenerationScore = Callable[[Sequence[str], Any, "TaskSpec", SandboxLimits], ExampleScores]


@dataclass(frozen=True)
class Metric:
    """One metric a task spec may name (``metric_list``), as specs check it and scorers compute it.

    ``score`` computes the metric from a ``generate_until`` task's answers, with every other metric the same function
    scores (one call for all of them: ``rouge1`` / ``rouge2`` / ``rougeL`` share their ROUGE runs). The other output
    types' metrics come from their own model step in :mod:`topotuner_lab.training.scoring` (the options' likelihoods
    give ``acc``, ``acc_norm``, ``acc_bytes``; the reranked candidates ``ndcg@10``, ``mrr@10``): their ``score`` is
    None. ``requires`` names a spec field the metric needs (``pass@1`` runs ``doc_to_program``). Every metric is
    aggregated by its mean over the examples, which paired claims compare example by example.
    """

    name: str
    output_type: OutputType
    higher_is_better: bool = True
    score: GenerationScore | None = None
    requires: str = ""


#: every metric by name, in the order registered: an output type's first metric is its tasks' default
REGISTRY: dict[str, Metric] = {}


def register_metric(
    *names: str,
    output_type: OutputType = "generate_until",
    score: GenerationScore | None = None,
    higher_is_better: bool = True,
    requires: str = "",
) -> None:
    """Add the metrics ``names``, computed together by ``score``, to :data:`REGISTRY`: specs may name them from now on.

    A ``generate_until`` metric needs its ``score``; a name already registered is a :class:`ParameterError`.
    """
    taken = [name for name in names if name in REGISTRY]
    if taken:
        raise ParameterError(f"metric(s) {taken} are already registered", "register the metric under another name")
    if output_type not in OUTPUT_TYPES:
        raise ParameterError(f"output type {output_type!r} is not one of {OUTPUT_TYPES}", "register it for one of them")
    if (score is None) == (output_type == "generate_until"):
        raise ParameterError(
            f"metric(s) {list(names)} of output type {output_type} "
            + ("need a score function" if score is None else "are computed by their model step, not by a function"),
            "give score for generate_until metrics only",
        )
    for name in names:
        REGISTRY[name] = Metric(name, output_type, higher_is_better, score, requires)


def metric_names(output_type: str) -> tuple[str, ...]:
    """The metrics registered for ``output_type``, in the order registered (the first is the default)."""
    return tuple(name for name, metric in REGISTRY.items() if metric.output_type == output_type)


def _gsm8k(answers: Sequence[str], ds: Any, spec: TaskSpec, limits: SandboxLimits) -> ExampleScores:
    """GSM8K's ``exact_match``: the answer's final number is the target's."""
    hits = [final_number(a) is not None and final_number(a) == final_number(t) for a, t in zip(answers, ds["target"])]
    return {"exact_match": np.asarray(hits, dtype=float)}


def _squad(answers: Sequence[str], ds: Any, spec: TaskSpec, limits: SandboxLimits) -> ExampleScores:
    """SQuAD's ``exact`` and ``f1`` over each row's references."""
    rows = [squad_scores(a, refs) for a, refs in zip(answers, ds["references"])]
    return {"exact": np.asarray([r["exact_match"] for r in rows]), "f1": np.asarray([r["f1"] for r in rows])}


def _rouge(answers: Sequence[str], ds: Any, spec: TaskSpec, limits: SandboxLimits) -> ExampleScores:
    """ROUGE-1/2/L over each row's references."""
    rows = [rouge_scores(a, refs) for a, refs in zip(answers, ds["references"])]
    return {name: np.asarray([r[name] for r in rows]) for name in ROUGE_TYPES}


def _ifeval(answers: Sequence[str], ds: Any, spec: TaskSpec, limits: SandboxLimits) -> ExampleScores:
    """IFEval's four verifier scores of each row's instructions."""
    rows = [ifeval_scores(a, json.loads(doc)) for a, doc in zip(answers, ds["doc"])]
    return {name: np.asarray([r[name] for r in rows]) for name in IFEVAL_METRICS}


def _program(spec: TaskSpec, answer: str, doc: str) -> str | Exception:
    """The program of one answer, or why the template could not render it."""
    try:
        return str(render(spec.doc_to_program, {**json.loads(doc), "completion": answer}))
    except Exception as exc:  # noqa: BLE001 - the answer's failure, not the spec's (checked on every row at load)
        return exc


def _programs(answers: Sequence[str], ds: Any, spec: TaskSpec, limits: SandboxLimits) -> ExampleScores:
    """pass@1: each answer put into the spec's ``doc_to_program`` and run in the sandbox, one program at a time.

    A program passes only if it runs to its end and exits with 0, so one that leaves early (``exit()``,
    ``sys.exit(0)``, ``os._exit(0)``) fails, as in openai/human-eval. One at a time, so each program has the CPU its
    wall-clock limit assumes. An answer that makes the template fail (a template limit hit: a template repeating the
    completion, given a long one) is a program that fails (status ``error``), with a warning naming the task.
    """
    sources = [_program(spec, answer, doc) for answer, doc in zip(answers, ds["doc"])]
    failed = [source for source in sources if isinstance(source, Exception)]
    if failed:
        reason = (str(failed[0]).strip().splitlines() or [""])[0][:200]
        warnings.warn(
            f"doc_to_program of task {spec.task!r} could not render {len(failed)} of {len(sources)} answers "
            f"({type(failed[0]).__name__}: {reason}): each is scored as a failed program (pass@1 0)",
            stacklevel=2,
        )
    statuses: list[Status] = [
        "error" if isinstance(source, Exception) else run_program(source, limits).status for source in sources
    ]
    return {"pass@1": np.asarray([s == "pass" for s in statuses], dtype=float)}


# lm-evaluation-harness's names. acc / acc_norm / acc_bytes: the likeliest option is the true one, by its summed
# log-probability, per character of its text, per UTF-8 byte (lm-eval 0.4.13's three); exact_match: the final number
# of the answer (GSM8K); exact / f1: SQuAD's, over the references; rouge*: ROUGE F-measures over the references;
# pass@1: the greedy program passes its tests (doc_to_program); the *_acc four: IFEval's verifiers; ndcg@10 /
# mrr@10: a reranked candidate list.
register_metric("acc", "acc_norm", "acc_bytes", output_type="multiple_choice")
register_metric("exact_match", score=_gsm8k)
register_metric("exact", "f1", score=_squad)
register_metric(*ROUGE_TYPES, score=_rouge)
register_metric("pass@1", score=_programs, requires="doc_to_program")
register_metric(*IFEVAL_METRICS, score=_ifeval)
register_metric("ndcg@10", "mrr@10", output_type="ranking")
