"""The fine-tune as a recipe of five typed steps, which :func:`~topotuner_lab.training.finetune.run_finetune` runs.

The steps, in order: :func:`prepare`, :func:`train`, :func:`evaluate`, :func:`assemble` and :func:`persist`.

``prepare`` reads the card and rows, builds the scorers, scores the pretrained model (forgetting's reference and
zero-shot, :mod:`topotuner_lab.training.baseline`) and sets up a trainer of a trainable copy; ``train`` trains it;
``evaluate`` scores the trained model on every row set; ``assemble`` builds one frozen
:class:`~topotuner_lab.training.results.FinetuneResult` without running a model; ``persist`` writes the weights
asked for, ``predictions.jsonl`` and ``results.json`` (its :meth:`~FinetuneResult.to_dict`).
"""

from __future__ import annotations

import functools
import shutil
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from transformers import Trainer, TrainerCallback

from topotuner_lab._io.errors import ProfileError
from topotuner_lab.profiles.card import ProfileCard
from topotuner_lab.tasks.fewshot import fewshot_count
from topotuner_lab.tasks.registry import training_spec
from topotuner_lab.tasks.sandbox import SandboxLimits
from topotuner_lab.training.baseline import PretrainedScores, battery_scores, pretrained_scores, zero_shot_scores
from topotuner_lab.training.callbacks import (
    EpochClock,
    EpochEvaluation,
    EpochSnapshots,
    RunClock,
    at_epoch,
    epoch_snapshot_path,
    evaluation_entry,
    per_epoch,
)
from topotuner_lab.training.config import FinetuneConfig
from topotuner_lab.training.data import RunData, capped_counts, chat_framed_data, load_run_data, used_counts
from topotuner_lab.training.early_stopping import TopologicalEarlyStopping
from topotuner_lab.training.evaluate import PREDICTIONS, write_predictions
from topotuner_lab.training.evaluation import PerplexityProbe, accuracy, perplexity_probe
from topotuner_lab.training.machine import machine
from topotuner_lab.training.memory import MemoryFields, PeakMemory
from topotuner_lab.training.results import FinetuneResult, battery_results, example_lists, write_results
from topotuner_lab.training.scoring import ExampleScores, TaskScorer, per_example, primary_values
from topotuner_lab.training.trainer import (
    MethodSetup,
    build_trainer,
    last_checkpoint,
    prepare_model,
    resolve_lora_rank,
)
from topotuner_lab.training.updates import UpdateMeasures, update_measures
from topotuner_lab.weights.extract import extract_snapshot
from topotuner_lab.weights.models import LoadedModel
from topotuner_lab.weights.projections import count_parameters, model_type
from topotuner_lab.weights.snapshot import save_snapshot

if TYPE_CHECKING:
    from peft import PeftModel


def evaluates_each_epoch(cfg: FinetuneConfig, threshold: float | None) -> bool:
    """Whether the run scores test (and validation) rows after every epoch.

    When asked (``eval_each_epoch``), and whenever early stopping observes without stopping (a threshold and
    ``observe_only``): the accuracy at the epoch the rule fired is then read from the epoch's own scores.
    """
    return cfg.eval_each_epoch or (threshold is not None and cfg.observe_only)


def stop_threshold_for(cfg: FinetuneConfig, card: ProfileCard | None) -> float | None:
    """The early-stopping threshold to use: the config's number, or the card's when it says "card"."""
    if not isinstance(cfg.stop_threshold, str):  # a number or None; "card" is the only text the config accepts
        return cfg.stop_threshold
    if card is None or card.stop_threshold is None:
        raise ProfileError(
            f"profile card {cfg.profile} records no stopping threshold",
            "rebuild it with `topotuner-lab profile ... --stop-threshold 0.5`, or pass a number instead of 'card'",
        )
    return card.stop_threshold


@dataclass(frozen=True)
class Scorers:
    """A run's scorers: the test task's, the training task's (train and validation rows), each battery task's.

    Train and validation rows are the training task's (the last of a ``train_task`` chain: e.g. IFEval trains on
    Alpaca), scored on its metric.
    """

    test: TaskScorer
    trained: TaskScorer
    battery: dict[str, TaskScorer]

    @classmethod
    def of(cls, cfg: FinetuneConfig, tokenizer: Any, battery: list[str]) -> Scorers:
        """The scorers of ``cfg``'s tasks, each with a progress bar over its batches."""
        sandbox = SandboxLimits(confirm_run_unsafe_code=cfg.confirm_run_unsafe_code)
        scorer = functools.partial(
            TaskScorer, tokenizer=tokenizer, max_length=cfg.max_length, progress=True, limits=sandbox
        )
        return cls(scorer(cfg.task), scorer(training_spec(cfg.task)), {task: scorer(task) for task in battery})


@dataclass(frozen=True)
class PreparedRun:
    """The ``prepare`` step's work: the rows, scorers, reference scores and a trainer of a trainable copy."""

    #: the config as it runs: every example count the rows really drawn (the results record it)
    cfg: FinetuneConfig
    #: the counts asked for that the data could not give in full: name -> the count asked for
    requested_counts: dict[str, int]
    card: ProfileCard | None
    data: RunData
    scorers: Scorers
    pretrained: PretrainedScores
    zero_shot: ExampleScores
    model: torch.nn.Module
    setup: MethodSetup
    trainer: Trainer
    threshold: float | None
    resume: str | None
    #: the run's wall time over its sittings (for ``wall_seconds``)
    clock: RunClock


@dataclass(frozen=True)
class Evaluation:
    """The ``evaluate`` step's scores of the trained model: per example, on every row set the results report."""

    battery: dict[str, ExampleScores]
    test: ExampleScores
    #: per test row, what the model answered (``predictions.jsonl``)
    predictions: list[str | None]
    #: a sample of ``n_test`` training rows, on the training task's primary metric
    train: np.ndarray
    val: np.ndarray | None
    val_logloss: float | None
    probe: PerplexityProbe | None
    updates: UpdateMeasures


def _callbacks(
    loaded: LoadedModel,
    cfg: FinetuneConfig,
    card: ProfileCard | None,
    scorers: Scorers,
    data: RunData,
    clock: RunClock,
) -> tuple[list[TrainerCallback], float | None]:
    """The trainer's callbacks and the stopping threshold.

    The epoch clock, early stopping, per-epoch evaluation and snapshots, then the run's clock, last so that it counts
    the others.
    """
    callbacks: list[TrainerCallback] = [EpochClock()]
    threshold = stop_threshold_for(cfg, card)
    if threshold is not None:
        pids = None
        if cfg.method == "profile":
            assert card is not None, "FinetuneConfig.check: method 'profile' needs a card"
            pids = card.trainable
        callbacks.append(TopologicalEarlyStopping(threshold, pids=pids, observe_only=cfg.observe_only))
    if evaluates_each_epoch(cfg, threshold):
        val = data.val if data.val is not None and len(data.val) else None
        callbacks.append(
            EpochEvaluation(
                lambda m: scorers.test(m, data.test),
                (lambda m: scorers.trained.with_logloss(m, val)) if val is not None else None,
                defer_final=True,  # the last epoch's weights are the run's final ones, scored once after training
            )
        )
    if cfg.save_epoch_snapshots:  # after the early-stopping callback, whose copy of the matrices it reuses
        callbacks.append(_epoch_snapshots(loaded, cfg, callbacks))
    return [*callbacks, clock], threshold


def _snapshot_name(loaded: LoadedModel, cfg: FinetuneConfig) -> str:
    """The model name a run's snapshots record: the pretrained model, then the task and method."""
    return f"{loaded.name}@{cfg.task}-{cfg.method}"


def _epoch_snapshots(loaded: LoadedModel, cfg: FinetuneConfig, callbacks: list[TrainerCallback]) -> EpochSnapshots:
    """The callback writing ``epoch-N.safetensors``; it reuses the early-stopping callback's copy of the matrices."""
    stopper = next((c for c in callbacks if isinstance(c, TopologicalEarlyStopping)), None)
    return EpochSnapshots(
        cfg.output_dir,
        model_name=_snapshot_name(loaded, cfg),
        base_model=loaded.name,
        architecture=model_type(loaded.model),
        total_params=count_parameters(loaded.model),
        shared=stopper,
    )


def _run_data(cfg: FinetuneConfig, tokenizer: Any) -> tuple[FinetuneConfig, dict[str, int], RunData]:
    """The run's rows, chat-framed; the config with the counts used, and the counts the data could not give."""
    data = chat_framed_data(load_run_data(cfg), cfg.task, tokenizer)
    used = used_counts(cfg, data)  # the config recorded is what ran: never more rows than were used
    capped = capped_counts(cfg, used)
    if capped:
        shortfall = ", ".join(f"{name} {count} -> {getattr(used, name)}" for name, count in capped.items())
        warnings.warn(
            f"the data holds fewer examples than asked ({shortfall}): every row there is used, and the results "
            "record the counts used (asked: requested_counts)",
            stacklevel=4,  # run_finetune's caller
        )
    return used, capped, data


def prepare(loaded: LoadedModel, cfg: FinetuneConfig) -> PreparedRun:
    """Step 1: read the card and rows, build the scorers, score the pretrained model, set up a trainer of a copy.

    An impossible LoRA rank is refused before any data is read or scored.
    """
    started = time.perf_counter()
    Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
    tokenizer = loaded.tokenizer
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    card = ProfileCard.load(cfg.profile) if cfg.profile else None
    if cfg.method == "lora":
        resolve_lora_rank(loaded.model, cfg, card)
    cfg, capped, data = _run_data(cfg, tokenizer)
    scorers = Scorers.of(cfg, tokenizer, list(data.battery))
    pretrained = pretrained_scores(loaded, cfg, data, scorers.battery)
    zero_shot = zero_shot_scores(loaded, cfg, data, scorers.test)
    model, setup = prepare_model(loaded, cfg, card)
    resume = last_checkpoint(Path(cfg.output_dir)) if cfg.save_checkpoints else None
    clock = RunClock(started, resumed=resume is not None)
    callbacks, threshold = _callbacks(loaded, cfg, card, scorers, data, clock)
    return PreparedRun(
        cfg=cfg,
        requested_counts=capped,
        card=card,
        data=data,
        scorers=scorers,
        pretrained=pretrained,
        zero_shot=zero_shot,
        model=model,
        setup=setup,
        trainer=build_trainer(model, tokenizer, cfg, data, callbacks),
        threshold=threshold,
        resume=resume,
        clock=clock,
    )


def train(run: PreparedRun) -> MemoryFields:
    """Step 2: train (from the last checkpoint where one is kept); returns the memory training took."""
    with PeakMemory() as memory:
        run.trainer.train(resume_from_checkpoint=run.resume)
    return memory.fields()


def evaluate(loaded: LoadedModel, run: PreparedRun) -> Evaluation:
    """Step 3: score the trained model on the battery, test, train and validation rows and the perplexity texts.

    Also measures what moved (:func:`~topotuner_lab.training.updates.update_measures`) against ``loaded``.
    """
    model, data, scorers, cfg = run.model, run.data, run.scorers, run.cfg
    battery = battery_scores(model, data, scorers.battery) if cfg.n_ood else {}
    model.eval()
    test, predictions = scorers.test.score_and_predict(model, data.test)  # the metrics and predictions.jsonl
    train_rows = data.train.select(range(min(len(data.train), cfg.n_test)))
    train_scores = scorers.trained.with_logloss(model, train_rows)[0]
    val, val_logloss = scorers.trained.with_logloss(model, data.val) if data.val is not None else (None, None)
    return Evaluation(
        battery=battery,
        test=test,
        predictions=predictions,
        train=train_scores,
        val=val,
        val_logloss=val_logloss,
        probe=perplexity_probe(model, loaded.tokenizer, data.general_text, max_length=cfg.max_length)
        if cfg.n_ppl
        else None,
        updates=update_measures(loaded.model, model),
    )


def _log_history(run: PreparedRun, test_correct: np.ndarray, scores: Evaluation) -> list[dict[str, Any]]:
    """The trainer's log, with the last epoch's evaluation where the per-epoch evaluation left it to the run's end."""
    trainer = run.trainer
    history = trainer.state.log_history
    evaluation = next((c for c in trainer.callback_handler.callbacks if isinstance(c, EpochEvaluation)), None)
    last = int(round(trainer.state.epoch or 0))
    if evaluation is not None and evaluation.defer_final and last and at_epoch(history, "test_accuracy", last) is None:
        return [*history, evaluation_entry(last, test_correct, scores.val, scores.val_logloss)]
    return history


def _minus(left: float | None, right: float | None) -> float | None:
    """``left - right``, or None when either is None (a measure the run did not take)."""
    return left - right if left is not None and right is not None else None


def assemble(loaded: LoadedModel, run: PreparedRun, memory: MemoryFields, scores: Evaluation) -> FinetuneResult:
    """Step 4: the run's :class:`FinetuneResult` from what the steps before measured (no model is run here)."""
    cfg, data, trainer, card = run.cfg, run.data, run.trainer, run.card
    metric = run.scorers.test.metric
    test_correct = primary_values(scores.test[metric])
    history = _log_history(run, test_correct, scores)
    epoch_seconds = per_epoch(history, "epoch_seconds")
    stopper = next((c for c in trainer.callback_handler.callbacks if isinstance(c, TopologicalEarlyStopping)), None)
    stop_epoch = stopper.stop_epoch if stopper else None
    stop_correct = at_epoch(history, "test_correct", stop_epoch)
    ood = scores.battery[data.ood_task][run.scorers.battery[data.ood_task].metric] if scores.battery else None
    ood_correct = primary_values(ood) if ood is not None else None
    ood_after = accuracy(ood_correct) if ood_correct is not None else None
    before, probe = run.pretrained, scores.probe
    ppl_before = before.probe.perplexity if before.probe else None
    ppl_after = probe.perplexity if probe else None
    zero_shot = primary_values(run.zero_shot[metric])
    total, trainable = count_parameters(loaded.model), count_parameters(run.model, trainable_only=True)
    train_accuracy, test_accuracy = accuracy(scores.train), accuracy(test_correct)
    return FinetuneResult(
        config=cfg.to_dict(),
        model={"name": loaded.name, "revision": loaded.revision, "total_params": total},
        method=cfg.method,
        task=cfg.task,
        learning_rate=trainer.args.learning_rate,
        trainable_params=trainable,
        trainable_fraction=trainable / total,
        **scores.updates,
        epochs_run=len(epoch_seconds),
        stop_epoch=stop_epoch,
        drift_history=stopper.history if stopper else [],
        log_history=[h for h in history if "loss" in h],
        epoch_seconds=epoch_seconds,
        train_seconds=sum(epoch_seconds),
        seconds_per_epoch=sum(epoch_seconds) / max(1, len(epoch_seconds)),
        train_accuracy=train_accuracy,
        val_accuracy=accuracy(scores.val) if scores.val is not None else None,
        val_logloss=scores.val_logloss,
        val_source=data.val_source,
        data_sources=data.sources,
        metric=metric,
        test_accuracy=test_accuracy,
        test_correct=per_example(test_correct),  # per test example, for paired bootstrap intervals
        test_metrics={name: accuracy(values) for name, values in scores.test.items() if name != "logloss"},
        test_example_metrics=example_lists(scores.test),
        epoch_test_accuracy=per_epoch(history, "test_accuracy"),
        epoch_val_accuracy=per_epoch(history, "val_accuracy"),
        epoch_val_logloss=per_epoch(history, "val_logloss"),
        epoch_eval_seconds=per_epoch(history, "eval_seconds"),
        stop_epoch_test_correct=list(stop_correct) if stop_correct is not None else None,
        ood_task=data.ood_task,
        ood_accuracy_before=before.ood_accuracy,
        ood_accuracy_after=ood_after,
        ood_correct_after=per_example(ood_correct) if ood_correct is not None else None,
        perplexity_before=ppl_before,
        perplexity_after=ppl_after,
        ppl_nll_before=list(before.probe.text_nll) if before.probe else None,
        ppl_nll_after=probe.text_nll if probe else None,
        ppl_text_tokens=probe.text_tokens if probe else None,
        seeds={"train": cfg.seed, "data": cfg.data_seed},
        train_test_gap=train_accuracy - test_accuracy,
        forgetting_ood=_minus(before.ood_accuracy, ood_after),
        perplexity_change=_minus(ppl_after, ppl_before),
        ood_battery=(
            battery_results(before.battery, scores.battery, {t: s.metric for t, s in run.scorers.battery.items()})
            if scores.battery
            else None
        ),
        test_accuracy_before=accuracy(zero_shot),
        test_correct_before=per_example(zero_shot),
        test_example_metrics_before=example_lists(run.zero_shot),
        **run.setup,
        requested_counts=run.requested_counts,
        num_fewshot=fewshot_count(cfg.task, cfg.num_fewshot),  # the examples each test prompt had
        resumed_from=run.resume,
        stop_threshold=run.threshold,
        transferred_to=(
            {"card": str(cfg.profile), "prior_task": card.prior_task, "task": cfg.task} if card is not None else None
        ),
        **memory,
        world_size=trainer.args.world_size,
        machine=machine(),
    )


def _tidy_checkpoints(out: Path) -> None:
    for checkpoint in out.glob("checkpoint-*"):
        shutil.rmtree(checkpoint, ignore_errors=True)


def _listed_epoch_snapshots(out: Path, epochs_run: int) -> list[str]:
    """The per-epoch snapshot files of epochs 1 to ``epochs_run``, in order; a missing one is left out with a warning.

    A run resumed from the checkpoint of a run that did not save them lacks its earlier epochs' files.
    """
    paths = [epoch_snapshot_path(out, epoch) for epoch in range(1, epochs_run + 1)]
    missing = [epoch for epoch, path in enumerate(paths, start=1) if not path.is_file()]
    if missing:
        warnings.warn(
            f"the snapshots of epoch(s) {missing} are missing from {out} (resumed from a run that did not save "
            "them?): results list only the others; delete the folder and run again for every epoch",
            stacklevel=4,  # run_finetune's caller
        )
    return [str(path) for path in paths if path.is_file()]


def persist(loaded: LoadedModel, run: PreparedRun, scores: Evaluation, result: FinetuneResult) -> FinetuneResult:
    """Step 5: save the weights asked for, ``predictions.jsonl`` and ``results.json``; remove the checkpoints.

    Returns ``result`` with where the weights went and the wall time. Under ``accelerate launch`` only the first
    process writes: the others get ``result`` as it is.
    """
    cfg = run.cfg
    if not run.trainer.is_world_process_zero():
        return result
    out = Path(cfg.output_dir)
    snapshot = None
    if cfg.save_snapshot:
        merged = cast("PeftModel", run.model).merge_and_unload() if cfg.method == "lora" else run.model
        weights = extract_snapshot(merged, name=_snapshot_name(loaded, cfg), base_model=loaded.name)
        snapshot = str(save_snapshot(weights, out / "after.safetensors"))
    seconds, every_sitting = run.clock.seconds(run.trainer.state.log_history)
    result = replace(
        result,
        snapshot=snapshot,
        epoch_snapshots=_listed_epoch_snapshots(out, result.epochs_run) if cfg.save_epoch_snapshots else None,
        wall_seconds=seconds,
        wall_from_last_sitting=not every_sitting,
    )
    delimiter = run.scorers.test.spec.target_delimiter
    write_predictions(out / PREDICTIONS, run.data.test, scores.test, scores.predictions, delimiter)
    write_results(out / "results.json", result.to_dict())
    if not cfg.keep_checkpoints:
        _tidy_checkpoints(out)
    return result
