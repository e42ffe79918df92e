"""What a finished fine-tune reports (:class:`FinetuneResult`, written as ``results.json``) and how it is read back.

A run returns a :class:`FinetuneResult`; ``results.json`` holds its :meth:`~FinetuneResult.to_dict`, read back as
:class:`RunResults` (files of older versions lack fields added since). The file carries a checksum of its content;
reading it back verifies it, so a hand-edited or damaged results file is never reused as if a run had produced it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

import numpy as np

from topotuner_lab._io import atomic
from topotuner_lab._io.errors import InputFileError
from topotuner_lab._io.json_files import json_digest, read_json
from topotuner_lab.training.evaluation import accuracy
from topotuner_lab.training.scoring import ExampleScores, per_example
from topotuner_lab.training.spectrum import SpectrumRecord

if TYPE_CHECKING:
    from topotuner_lab.training.trainer import ProfileRecord


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
    - ``wall_seconds``: the run's wall time over every sitting that worked on it, up to the checkpoint each left
      (:class:`~topotuner_lab.training.callbacks.RunClock`); ``wall_from_last_sitting`` True where a run resumed
      from a checkpoint that recorded no earlier time, so ``wall_seconds`` counts its last sitting alone (a file
      without the field: every run with ``resumed_from``; :func:`timed_last_sitting_only` reads both).
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
    wall_from_last_sitting: bool


class ModelRecord(TypedDict):
    """``results.json``'s ``model``: the pretrained model fine-tuned, and its parameter count."""

    name: str
    revision: str
    total_params: int


class BatteryRecord(TypedDict):
    """A task of ``results.json``'s ``ood_battery``: its metric, mean score and per-example values, before and after."""

    metric: str
    before: float
    after: float
    correct_before: list[int] | list[float]
    correct_after: list[int] | list[float]


def battery_results(
    before: Mapping[str, ExampleScores], after: Mapping[str, ExampleScores], metrics: Mapping[str, str]
) -> dict[str, BatteryRecord]:
    """``results.json``'s ``ood_battery``: per task its metric, mean score before and after, and per-example values."""
    out: dict[str, BatteryRecord] = {}
    for task, scores in after.items():
        metric = metrics[task]
        out[task] = {
            "metric": metric,
            "before": accuracy(before[task][metric]),
            "after": accuracy(scores[metric]),
            "correct_before": per_example(before[task][metric]),
            "correct_after": per_example(scores[metric]),
        }
    return out


def example_lists(scores: ExampleScores) -> dict[str, list[float]]:
    """Every metric's per-example values as plain float lists (what ``results.json`` stores)."""
    return {name: np.asarray(values, dtype=float).tolist() for name, values in scores.items()}


def timed_last_sitting_only(results: Mapping[str, Any]) -> bool:
    """Whether a run's ``wall_seconds`` count its last sitting alone (resumed from a checkpoint with no earlier time).

    Files written before ``wall_from_last_sitting`` existed timed every resumed run that way.
    """
    return bool(results.get("wall_from_last_sitting", results.get("resumed_from") is not None))


#: the fields a run has only by its method (the first four) or by what it saved (the last four: ``snapshot`` and
#: ``epoch_snapshots`` where asked, ``wall_seconds`` and ``wall_from_last_sitting`` on the process that writes): None,
#: and absent from the file, where it has none
ABSENT_WHEN_NONE = frozenset(
    {
        "trainable_param_names",
        "profile",
        "spectrum",
        "lora_rank",
        "snapshot",
        "epoch_snapshots",
        "wall_seconds",
        "wall_from_last_sitting",
    }
)


@dataclass(frozen=True, kw_only=True)
class FinetuneResult:
    """One fine-tune's results, typed: what :func:`~topotuner_lab.training.finetune.run_finetune` returns.

    Its fields are ``results.json``'s keys, in the file's order (:meth:`to_dict` gives the file's content);
    :class:`RunResults` says what each holds. The fields of :data:`ABSENT_WHEN_NONE` are None where the run has
    none of them, and then left out of the file.
    """

    config: dict[str, Any]
    model: ModelRecord
    method: str
    task: str
    learning_rate: float
    trainable_params: int
    trainable_fraction: float
    updated_params: int
    updated_fraction: float
    update_rel_change: float | None
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
    stop_epoch_test_correct: list[int] | list[float] | None
    ood_task: str
    ood_accuracy_before: float | None
    ood_accuracy_after: float | None
    ood_correct_after: list[int] | list[float] | None
    perplexity_before: float | None
    perplexity_after: float | None
    ppl_nll_before: list[float] | None
    ppl_nll_after: list[float] | None
    ppl_text_tokens: list[int] | None
    seeds: dict[str, int]
    train_test_gap: float
    forgetting_ood: float | None
    perplexity_change: float | None
    ood_battery: dict[str, BatteryRecord] | None
    test_accuracy_before: float
    test_correct_before: list[int] | list[float]
    test_example_metrics_before: dict[str, list[float]]
    trainable_param_names: list[str] | None = None
    profile: ProfileRecord | None = None
    spectrum: SpectrumRecord | None = None
    lora_rank: int | None = None
    requested_counts: dict[str, int]
    num_fewshot: int
    resumed_from: str | None
    stop_threshold: float | None
    transferred_to: dict[str, str] | None
    peak_rss_mib: float
    rss_increase_mib: float
    cuda_peak_allocated_mib: float | None
    world_size: int
    machine: str
    snapshot: str | None = None
    epoch_snapshots: list[str] | None = None
    wall_seconds: float | None = None
    wall_from_last_sitting: bool | None = None

    def to_dict(self) -> RunResults:
        """``results.json``'s content (less its checksum), a copy: every field in order, less those the run lacks."""
        fields = asdict(self)
        return cast(RunResults, {k: v for k, v in fields.items() if v is not None or k not in ABSENT_WHEN_NONE})


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
