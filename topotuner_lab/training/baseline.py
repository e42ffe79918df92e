"""The pretrained model's scores a fine-tune is measured against: forgetting's reference point and zero-shot.

The evaluation rows are fixed (``EVAL_SEED``) and the pretrained model is never changed, so every run of a
comparison shares these scores: computed once per process and model object, not once per fine-tune, and the
per-example scores once per machine (:mod:`topotuner_lab.training.score_cache`).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from topotuner_lab.training.config import FinetuneConfig
from topotuner_lab.training.data import RunData
from topotuner_lab.training.evaluation import PerplexityProbe, accuracy, perplexity_probe
from topotuner_lab.training.score_cache import cached_scores
from topotuner_lab.training.scoring import ExampleScores, TaskScorer, primary_values
from topotuner_lab.weights.models import LoadedModel


@dataclass(frozen=True)
class PretrainedScores:
    """Forgetting's reference point: the pretrained model's battery scores and perplexity probe.

    ``battery`` is empty and ``ood_accuracy`` None without a battery (``n_ood`` 0); ``probe`` is None without
    perplexity texts (``n_ppl`` 0).
    """

    battery: dict[str, ExampleScores]
    ood_accuracy: float | None
    probe: PerplexityProbe | None


#: per pretrained model object, its reference scores per evaluation rows (:func:`pretrained_scores`' key)
_PRETRAINED: weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple[object, ...], PretrainedScores]] = (
    weakref.WeakKeyDictionary()
)
#: per pretrained model object, its per-example test scores per test draw (:func:`zero_shot_scores`' key)
_ZERO_SHOT: weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple[object, ...], ExampleScores]] = (
    weakref.WeakKeyDictionary()
)


def battery_scores(
    model: torch.nn.Module, data: RunData, scorers: Mapping[str, TaskScorer], *, pretrained: bool = False
) -> dict[str, ExampleScores]:
    """Per battery task, every metric per example (each task on its own metrics).

    ``pretrained``: ``model`` is the pretrained one, whose scores go through the disk cache (:func:`cached_scores`).
    """
    return {
        task: cached_scores(model, scorers[task], rows) if pretrained else scorers[task].score_all(model, rows)
        for task, rows in data.battery.items()
    }


def pretrained_scores(
    loaded: LoadedModel, cfg: FinetuneConfig, data: RunData, scorers: Mapping[str, TaskScorer]
) -> PretrainedScores:
    """The pretrained model's battery scores and perplexity probe on the run's rows, computed once per process."""
    key = (tuple(data.battery), cfg.n_ood, cfg.n_ppl, cfg.max_length, cfg.data_source, cfg.num_fewshot)
    per_model = _PRETRAINED.setdefault(loaded.model, {})
    if key not in per_model:
        probe = (
            perplexity_probe(loaded.model, loaded.tokenizer, data.general_text, max_length=cfg.max_length)
            if cfg.n_ppl
            else None
        )
        battery = battery_scores(loaded.model, data, scorers, pretrained=True) if cfg.n_ood else {}
        ood = battery[data.ood_task][scorers[data.ood_task].metric] if battery else None
        per_model[key] = PretrainedScores(battery, accuracy(primary_values(ood)) if ood is not None else None, probe)
    return per_model[key]


def zero_shot_scores(loaded: LoadedModel, cfg: FinetuneConfig, data: RunData, score: TaskScorer) -> ExampleScores:
    """The pretrained model's per-example test scores, every metric: where fine-tuning starts.

    Computed once per process and test draw. The continuous metrics (the gold label's log-loss) give a claim
    measured by log-probability its zero-shot -> full FT gain.
    """
    key = (cfg.task, cfg.n_test, cfg.max_length, cfg.data_source, cfg.num_fewshot)
    per_model = _ZERO_SHOT.setdefault(loaded.model, {})
    if key not in per_model:
        per_model[key] = cached_scores(loaded.model, score, data.test)
    return per_model[key]
