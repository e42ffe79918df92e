"""Scoring a model on a task's rows with the task's own metrics, per example, so every claim stays paired.

One :class:`TaskScorer` per task: option likelihood for ``multiple_choice``, fixed label words or each row's own
options, as lm-evaluation-harness scores them (``acc``, ``acc_norm``, ``acc_bytes``, and the label log-loss a
validation criterion reads); for ``generate_until`` one batched greedy generation
(:func:`~topotuner_lab.training.generation.generate`, the spec's stop strings and ``max_gen_toks``) and then every
metric of the spec's ``metric_list`` on the same answers, by the function the metric registry
(:data:`topotuner_lab.tasks.metrics.REGISTRY`) holds for it: GSM8K's final-number ``exact_match``, SQuAD's
``exact`` / ``f1`` and ROUGE over the references, IFEval's verifiers, ``pass@1`` by running ``doc_to_program`` in
the sandbox. ``ranking`` tasks rerank their candidates by query likelihood
(:mod:`topotuner_lab.training.ranking`) for ``ndcg@10`` / ``mrr@10``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from topotuner_lab.tasks import metrics
from topotuner_lab.tasks.metrics import ExampleScores, GenerationScore
from topotuner_lab.tasks.registry import get_task
from topotuner_lab.tasks.sandbox import SandboxLimits
from topotuner_lab.tasks.schema import TaskSpec
from topotuner_lab.tasks.templates import render
from topotuner_lab.training.evaluation import choice_metrics, classification_scores, label_logloss
from topotuner_lab.training.generation import generate
from topotuner_lab.training.ranking import ranking_example_scores, rerank_scores


def _generation_metrics(spec: TaskSpec) -> list[GenerationScore]:
    """The functions that score ``spec``'s answers (:data:`~topotuner_lab.tasks.metrics.REGISTRY`), each once."""
    scores = (metrics.REGISTRY[name].score for name in spec.metrics)
    return [score for score in dict.fromkeys(scores) if score is not None]


@dataclass
class TaskScorer:
    """``scorer(model, rows)`` -> per example, the task's primary metric; :meth:`score_all` gives every metric.

    ``max_length`` is the tokens a prompt keeps (from the left); a generated answer gets ``max_gen_toks`` more.
    """

    task: str | TaskSpec
    tokenizer: Any
    max_length: int = 128
    batch_size: int = 16
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    progress: bool = False

    def __post_init__(self) -> None:
        self.spec = get_task(self.task)

    @property
    def metric(self) -> str:
        """The primary metric's name (the spec's first)."""
        return self.spec.metric

    def answers(self, model: torch.nn.Module, ds: Any) -> list[str]:
        """The greedy answers to the rows' prompts, cut at the spec's stop strings.

        Within the model's context: a model of fewer positions than the prompt and ``max_gen_toks`` need gets fewer
        new tokens (at least one), the prompt keeping its ``max_length``.
        """
        new = self.spec.max_gen_toks
        context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        if isinstance(context, int):
            new = max(1, min(new, context - self.max_length))
        return generate(
            model,
            self.tokenizer,
            list(ds["prompt"]),
            max_new_tokens=new,
            stop=self.spec.until,
            batch_size=self.batch_size,
            max_length=self.max_length + new,
            progress=self.progress,
        )

    def score_all(self, model: torch.nn.Module, ds: Any) -> ExampleScores:
        """Every metric of the task, per example; a classification task's also holds ``logloss`` (label log-loss)."""
        return self.score_and_predict(model, ds)[0]

    def score_and_predict(self, model: torch.nn.Module, ds: Any) -> tuple[ExampleScores, list[str | None]]:
        """:meth:`score_all`'s metrics, and per row what the model answered, from the same forward passes.

        The answer: the option scored highest (``acc``'s choice, without the target delimiter) for multiple choice,
        the generated text for generation; None for ranking (its answer is an order of candidates).
        """
        if len(ds) == 0:
            return {name: np.zeros(0) for name in self.spec.metrics}, []
        if self.spec.kind == "classification":
            return self._choices(model, ds)
        if self.spec.kind == "ranking":
            return self._ranking(model, ds), [None] * len(ds)
        answers = self.answers(model, ds)
        out: ExampleScores = {}
        for score in _generation_metrics(self.spec):
            out |= score(answers, ds, self.spec, self.limits)
        return {name: out[name] for name in self.spec.metrics}, list(answers)

    def _choices(self, model: torch.nn.Module, ds: Any) -> tuple[ExampleScores, list[str | None]]:
        """Each row's options (fixed words or its own) scored by log p(delimiter + option | prompt), lm-eval's way.

        The spec's metrics (``acc``, ``acc_norm``, ``acc_bytes``) and ``logloss``, the true option's log-loss with
        the probabilities normalized over the row's options; and each row's option scored highest.
        """
        spec = self.spec
        options = list(ds["choices"]) if spec.per_row_choices else [spec.doc_to_choice] * len(ds)
        scores = classification_scores(
            model,
            self.tokenizer,
            ds,
            [[spec.target_delimiter + text for text in row] for row in options],
            max_length=self.max_length,
            batch_size=self.batch_size,
            progress=self.progress,
        )
        out = choice_metrics(scores, options, ds["label"])
        chosen: list[str | None] = [row[int(np.argmax(row_scores))] for row, row_scores in zip(options, scores)]
        return {name: out[name] for name in spec.metrics} | {"logloss": label_logloss(scores, ds["label"])}, chosen

    def _ranking(self, model: torch.nn.Module, ds: Any) -> ExampleScores:
        """Each row's candidates reranked by log p(target(query) | prompt(candidate)); nDCG@10 and MRR@10 per row."""
        rows = [{**json.loads(row), **json.loads(json.loads(row)["ranking"])} for row in ds["doc"]]
        spec = self.spec
        run = rerank_scores(
            model,
            self.tokenizer,
            rows,
            lambda document: str(render(spec.doc_to_text, document)),
            lambda query: spec.target_delimiter + str(render(spec.doc_to_target, {"query": query})),
            max_length=self.max_length,
            batch_size=self.batch_size,
            progress=self.progress,
        )
        return ranking_example_scores(rows, run)

    def __call__(self, model: torch.nn.Module, ds: Any) -> np.ndarray:
        """Per example, the primary metric (booleans for accuracy and other 0/1 metrics)."""
        return primary_values(self.score_all(model, ds)[self.metric])

    def with_logloss(self, model: torch.nn.Module, ds: Any) -> tuple[np.ndarray, float | None]:
        """Per example the primary metric, and the mean label log-loss (None for a generation task or no rows)."""
        scores = self.score_all(model, ds)
        logloss = scores.get("logloss")
        mean = float(logloss.mean()) if logloss is not None and logloss.size else None
        return primary_values(scores[self.metric]), mean


def primary_values(values: np.ndarray) -> np.ndarray:
    """A metric's per-example values: booleans when every value is 0 or 1 (accuracy, exact match), else floats."""
    return values.astype(bool) if np.isin(values, (0, 1)).all() else np.asarray(values, dtype=float)


def per_example(values: np.ndarray) -> list[int] | list[float]:
    """Per-example values as ``results.json`` keeps them: 0/1 integers for a 0/1 metric, else floats (ROUGE...)."""
    values = primary_values(np.asarray(values))
    return values.astype(int).tolist() if values.dtype == bool else values.tolist()
