"""What a finished fine-tune reports (:class:`RunResults`, written as ``results.json``) and how it is read back.

The file carries a checksum of its content; reading it back verifies it, so a hand-edited or damaged results file
is never reused as if a run had produced it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypedDict, cast

import numpy as np
from transformers import Trainer

from topotuner_lab._io import atomic
from topotuner_lab._io.errors import InputFileError
from topotuner_lab._io.json_files import json_digest, read_json
from topotuner_lab.training.callbacks import EpochEvaluation, at_epoch, evaluation_entry, per_epoch
from topotuner_lab.training.config import FinetuneConfig
from topotuner_lab.training.data import RunData
from topotuner_lab.training.early_stopping import TopologicalEarlyStopping
from topotuner_lab.training.evaluation import accuracy, perplexity_probe
from topotuner_lab.training.scoring import ExampleScores, per_example, primary_values
from topotuner_lab.training.spectrum import SpectrumRecord
from topotuner_lab.training.updates import update_measures
from topotuner_lab.weights.models import LoadedModel
from topotuner_lab.weights.projections import count_parameters


class RunResults(TypedDict, total=False):
    """The fields of ``results.json``: accuracies (per example too), forgetting, cost, early stopping, provenance.

    Fields added later are absent from older files, which still load: read them with ``.get``.

    - ``val_logloss``: mean over validation rows of -log p(true label | prompt) in nats, p normalized over the
      task's label words (the scores accuracy takes the argmax of); None without validation rows or for GSM8K.
    - ``epoch_val_accuracy``, ``epoch_val_logloss``: after each epoch, like ``epoch_test_accuracy`` (filled when
      the run evaluates each epoch: ``eval_each_epoch``, or a stopping threshold in observe mode; else empty).
    - ``epoch_eval_seconds``: that per-epoch evaluation's own seconds (not in ``epoch_seconds``).
    - ``metric``: the task's primary metric (``acc`` for a classification task; ``f1``, ``rougeL``, ``pass@1``...);
      ``test_accuracy`` and ``test_correct`` hold its mean and per-example values (0/1 for a 0/1 metric), whatever
      its name. ``test_metrics``: the mean of every metric the task is scored by; ``test_example_metrics``: their
      per-example values (``test_correct``'s order).
    - ``test_accuracy_before``, ``test_correct_before``: the pretrained (zero-shot) model's score on the same test
      rows, mean and per example: where fine-tuning starts, the scale a non-inferiority margin is read against;
      ``test_example_metrics_before``: every metric per example, as ``test_example_metrics``.
    - ``ood_battery``: the forgetting battery (``ood_tasks``; the first is ``ood_task``), per task its ``metric``,
      mean score ``before`` and ``after`` fine-tuning and per-example ``correct_before`` / ``correct_after``.
    - ``stop_epoch_test_correct``: per test row (``test_correct``'s order), 1 if it was right after the epoch the
      stopping rule fired (its mean is ``epoch_test_accuracy[stop_epoch - 1]``); None when the rule never fired or
      that epoch was not evaluated.
    - ``ppl_nll_before``, ``ppl_nll_after``: per perplexity text (same order), its mean token NLL in nats, before and
      after fine-tuning (NaN for a text with no token to predict); ``ppl_text_tokens``: the tokens each text's mean
      is over. ``perplexity_before`` equals exp(sum(ppl_nll_before * ppl_text_tokens) / sum(ppl_text_tokens)), NaN
      texts left out, up to float32 rounding (likewise after): weight per-text values by their tokens.
    - ``trainable_fraction`` is the paper's Train.% (parameters with ``requires_grad`` over the pretrained model's);
      ``updated_params``, ``updated_fraction`` (Upd.%: entries that moved by more than 1e-6, LoRA's merged
      ``(alpha / r) * B @ A`` counted in its matrices) and ``update_rel_change`` (mean ``|dw| / (|w| + 1e-6)`` over
      those entries) compare the final weights with the pretrained ones (:mod:`topotuner_lab.training.updates`).
    - The forgetting fields (``ood_*``, ``forgetting_ood``) are None when the run had no battery (``n_ood`` 0), the
      perplexity fields (``perplexity_*``, ``ppl_*``) when it had no perplexity probe (``n_ppl`` 0).
    - ``spectrum``: the ``spectrum-top5`` method's percent and the ``unfrozen_parameters`` patterns it trained.
    - ``data_sources``: where each split was read, ``task/split`` -> ``offline PATH`` or ``hub ID, split S`` (the hub
      stands in for an absent offline copy).
    - ``num_fewshot``: the few-shot examples before each test and validation prompt (``config.num_fewshot`` where
      given, else the task spec's; :mod:`topotuner_lab.tasks.fewshot`).
    """

    config: dict[str, Any]
    model: dict[str, Any]
    method: str
    task: str
    learning_rate: float
    trainable_params: int
    trainable_fraction: float
    epochs_run: int
    stop_epoch: int | None
    drift_history: list[dict[str, float | None]]
    log_history: list[dict[str, Any]]
    epoch_seconds: list[float]
    train_seconds: float
    seconds_per_epoch: float
    train_accuracy: float
    val_accuracy: float | None
    val_logloss: float | None
    val_source: str
    data_sources: dict[str, str]
    metric: str
    test_accuracy: float
    test_correct: list[int] | list[float]
    test_metrics: dict[str, float]
    test_example_metrics: dict[str, list[float]]
    epoch_test_accuracy: list[float]
    epoch_val_accuracy: list[float]
    epoch_val_logloss: list[float]
    epoch_eval_seconds: list[float]
    stop_epoch_test_correct: list[int] | None
    ood_task: str
    ood_accuracy_before: float | None
    ood_accuracy_after: float | None
    ood_correct_after: list[int] | list[float] | None
    ood_battery: dict[str, dict[str, Any]] | None
    test_accuracy_before: float
    test_correct_before: list[int] | list[float]
    test_example_metrics_before: dict[str, list[float]]
    perplexity_before: float | None
    perplexity_after: float | None
    ppl_nll_before: list[float] | None
    ppl_nll_after: list[float] | None
    ppl_text_tokens: list[int] | None
    seeds: dict[str, int]
    train_test_gap: float
    forgetting_ood: float | None
    perplexity_change: float | None
    updated_params: int
    updated_fraction: float
    update_rel_change: float | None
    trainable_param_names: list[str]
    profile: dict[str, Any]
    spectrum: SpectrumRecord
    lora_rank: int
    requested_counts: dict[str, int]
    num_fewshot: int
    resumed_from: str | None
    stop_threshold: float | None
    peak_rss_mib: float
    rss_increase_mib: float
    cuda_peak_allocated_mib: float | None
    transferred_to: dict[str, str] | None
    world_size: int
    machine: str
    snapshot: str
    epoch_snapshots: list[str]
    wall_seconds: float


def example_lists(scores: ExampleScores) -> dict[str, list[float]]:
    """Every metric's per-example values as plain float lists (what ``results.json`` stores)."""
    return {name: np.asarray(values, dtype=float).tolist() for name, values in scores.items()}


def collect_results(
    trainer: Trainer,
    cfg: FinetuneConfig,
    loaded: LoadedModel,
    data: RunData,
    score: Any,
    ood_correct: np.ndarray | None,
    before: dict[str, Any],
    score_val: Any = None,
    test_metrics: dict[str, np.ndarray] | None = None,
) -> RunResults:
    """Accuracy (train, validation, test), forgetting, time, what trained and moved, and early stopping of a run.

    ``ood_correct`` is the out-of-domain task's per-example score after training (the forgetting battery's first
    task, scored once by the caller; None without a battery: ``n_ood`` 0). ``score_val(model, rows)`` -> (per-row
    correctness, mean log-loss or None) scores the validation rows and a
    sample of the training rows (the training task's metric: a ``train_task`` spec's own rows are only tested);
    without it they get ``score`` and no log-loss. ``test_metrics``: the test rows' per-example metrics where the
    caller scored them already (:meth:`TaskScorer.score_and_predict`, for the predictions); else scored here.
    """
    model, tokenizer = trainer.model, loaded.tokenizer
    assert model is not None  # a Trainer is built with its model
    model.eval()
    history = trainer.state.log_history
    epoch_seconds = per_epoch(history, "epoch_seconds")
    test_metrics = test_metrics if test_metrics is not None else score.score_all(model, data.test)
    test_correct = primary_values(test_metrics[score.metric])
    stopper = next((c for c in trainer.callback_handler.callbacks if isinstance(c, TopologicalEarlyStopping)), None)
    stop_epoch = stopper.stop_epoch if stopper else None
    train_rows = data.train.select(range(min(len(data.train), cfg.n_test)))
    train_scored = score_val(model, train_rows)[0] if score_val else score(model, train_rows)
    val_correct, val_logloss = None, None
    if data.val is not None:
        val_correct, val_logloss = score_val(model, data.val) if score_val else (score(model, data.val), None)
    evaluation = next((c for c in trainer.callback_handler.callbacks if isinstance(c, EpochEvaluation)), None)
    last = int(round(trainer.state.epoch or 0))
    if evaluation is not None and evaluation.defer_final and last and at_epoch(history, "test_accuracy", last) is None:
        history = [*history, evaluation_entry(last, test_correct, val_correct, val_logloss)]  # the last epoch's
    stop_correct = at_epoch(history, "test_correct", stop_epoch)
    probe = perplexity_probe(model, tokenizer, data.general_text, max_length=cfg.max_length) if cfg.n_ppl else None
    total = count_parameters(loaded.model)
    trainable = count_parameters(model, trainable_only=True)
    updates = update_measures(loaded.model, model)
    results: RunResults = {
        "config": cfg.to_dict(),
        "model": {"name": loaded.name, "revision": loaded.revision, "total_params": total},
        "method": cfg.method,
        "task": cfg.task,
        "learning_rate": trainer.args.learning_rate,
        "trainable_params": trainable,
        "trainable_fraction": trainable / total,
        "updated_params": updates["updated_params"],
        "updated_fraction": updates["updated_fraction"],
        "update_rel_change": updates["update_rel_change"],
        "epochs_run": len(epoch_seconds),
        "stop_epoch": stop_epoch,
        "drift_history": stopper.history if stopper else [],
        "log_history": [h for h in history if "loss" in h],
        "epoch_seconds": epoch_seconds,
        "train_seconds": sum(epoch_seconds),
        "seconds_per_epoch": sum(epoch_seconds) / max(1, len(epoch_seconds)),
        "train_accuracy": accuracy(train_scored),
        "val_accuracy": accuracy(val_correct) if val_correct is not None else None,
        "val_logloss": val_logloss,
        "val_source": data.val_source,
        "data_sources": data.sources,
        "metric": score.metric,
        "test_accuracy": accuracy(test_correct),
        "test_correct": per_example(test_correct),  # per test example, for paired bootstrap intervals
        "test_metrics": {name: accuracy(values) for name, values in test_metrics.items() if name != "logloss"},
        "test_example_metrics": example_lists(test_metrics),
        "epoch_test_accuracy": per_epoch(history, "test_accuracy"),
        "epoch_val_accuracy": per_epoch(history, "val_accuracy"),
        "epoch_val_logloss": per_epoch(history, "val_logloss"),
        "epoch_eval_seconds": per_epoch(history, "eval_seconds"),
        "stop_epoch_test_correct": list(stop_correct) if stop_correct is not None else None,
        "ood_task": data.ood_task,
        "ood_accuracy_before": before["ood_accuracy"],
        "ood_accuracy_after": accuracy(ood_correct) if ood_correct is not None else None,
        "ood_correct_after": per_example(ood_correct) if ood_correct is not None else None,
        "perplexity_before": before["perplexity"],
        "perplexity_after": probe.perplexity if probe else None,
        "ppl_nll_before": list(before["ppl_nll"]) if probe else None,
        "ppl_nll_after": probe.text_nll if probe else None,
        "ppl_text_tokens": probe.text_tokens if probe else None,
        "seeds": {"train": cfg.seed, "data": cfg.data_seed},
    }
    results["train_test_gap"] = results["train_accuracy"] - results["test_accuracy"]
    ood_before, ood_after = results["ood_accuracy_before"], results["ood_accuracy_after"]
    results["forgetting_ood"] = ood_before - ood_after if ood_before is not None and ood_after is not None else None
    ppl_before, ppl_after = results["perplexity_before"], results["perplexity_after"]
    results["perplexity_change"] = ppl_after - ppl_before if ppl_before is not None and ppl_after is not None else None
    return results


#: the key of ``results.json`` that holds the checksum of everything else in it
CHECKSUM = "checksum"


def results_checksum(results: Mapping[str, Any]) -> str:
    """A digest of the results as JSON (every key but the checksum), as :func:`write_results` stores it."""
    return json_digest({k: v for k, v in results.items() if k != CHECKSUM})


def write_results(path: str | os.PathLike[str], results: Mapping[str, Any]) -> Path:
    """Write ``results`` atomically as JSON with their checksum, which :func:`load_results` verifies."""
    plain = json.loads(json.dumps(dict(results), default=str))  # what the file will hold, so the digest matches it
    plain.pop(CHECKSUM, None)
    return atomic.write_json(path, {**plain, CHECKSUM: results_checksum(plain)})


def load_results(path: str | os.PathLike[str]) -> RunResults:
    """A run's ``results.json`` (less its checksum).

    A missing or damaged file, and one whose checksum is missing or does not verify (edited by hand, written by an
    older version), is a clear error: rerun the step (``reproduce`` does so by itself).
    """
    path = Path(path)
    fix = f"delete {path.parent} and run the fine-tune again (reproduce reruns it by itself)"
    results = read_json(path, "results file", fix)
    if "test_accuracy" not in results:
        raise InputFileError(f"results file {path} is not a fine-tune's results", fix)
    recorded = results.pop(CHECKSUM, None)
    if recorded is None:
        raise InputFileError(f"results file {path} carries no checksum (written by an older version?)", fix)
    if recorded != results_checksum(results):
        raise InputFileError(f"results file {path} does not match its checksum (edited by hand, or damaged)", fix)
    return cast(RunResults, results)
