"""One entry point for full fine-tuning, LoRA (peft) and TopoTuner profile fine-tuning, on HF ``Trainer``.

Every run writes ``results.json`` (atomically, with a checksum) with accuracy, the train-test gap, forgetting
(out-of-domain accuracy and held-out perplexity before/after; None where ``n_ood`` / ``n_ppl`` is 0), trainable
parameters, time per epoch, memory and the seeds, and ``predictions.jsonl``: each test row's prediction and metrics.
Checkpoints are saved each epoch, so a stopped run resumes.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import time
import warnings
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from transformers import TrainerCallback

from topotuner_lab._io.errors import ProfileError, TopoTunerError
from topotuner_lab.profiles.card import ProfileCard
from topotuner_lab.tasks.fewshot import fewshot_count
from topotuner_lab.tasks.registry import training_spec
from topotuner_lab.tasks.sandbox import SandboxLimits
from topotuner_lab.training.callbacks import EpochClock, EpochEvaluation, EpochSnapshots, epoch_snapshot_path
from topotuner_lab.training.config import FinetuneConfig
from topotuner_lab.training.data import RunData, capped_counts, chat_framed_data, load_run_data, used_counts
from topotuner_lab.training.early_stopping import TopologicalEarlyStopping
from topotuner_lab.training.evaluate import PREDICTIONS, write_predictions
from topotuner_lab.training.evaluation import accuracy, perplexity_probe
from topotuner_lab.training.machine import machine
from topotuner_lab.training.memory import PeakMemory
from topotuner_lab.training.results import RunResults, collect_results, example_lists, write_results
from topotuner_lab.training.scoring import ExampleScores, TaskScorer, per_example, primary_values
from topotuner_lab.training.trainer import build_trainer, last_checkpoint, prepare_model, resolve_lora_rank
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


def _callbacks(
    cfg: FinetuneConfig, card: ProfileCard | None, score: Any, data: RunData, score_val: Any = None
) -> tuple[list[TrainerCallback], float | None]:
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
                lambda m: score(m, data.test),
                (lambda m: score_val(m, val)) if val is not None and score_val is not None else None,
                defer_final=True,  # the last epoch's weights are the run's final ones, scored once after training
            )
        )
    return callbacks, threshold


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
            stacklevel=3,
        )
    return [str(path) for path in paths if path.is_file()]


class PeerProcessError(TopoTunerError):
    """Another process of a distributed (``accelerate launch``) run died or stopped answering."""


#: how gloo and NCCL report a peer that went away (killed, crashed, out of memory)
_PEER_LOST = re.compile(r"connection (?:reset|closed) by peer|broken pipe|socket timeout|gloo|nccl", re.IGNORECASE)


def _world() -> tuple[int, int] | None:
    """``(rank, world size)`` of this process when it is one of several in a process group, else None."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.get_rank(), dist.get_world_size()
    return None


@contextlib.contextmanager
def peer_loss_reported() -> Iterator[None]:
    """Turn a collective's failure after a peer process died into a :class:`PeerProcessError` (one line)."""
    try:
        yield
    except RuntimeError as exc:
        world = _world()
        if world is None or not _PEER_LOST.search(str(exc)):
            raise
        detail = re.sub(r"^\[[^\]]*\]\s*", "", str(exc).strip()).splitlines()[0].split(". ")[0][:160]
        raise PeerProcessError(
            f"rank {world[0]} of {world[1]}: a peer process of this distributed run died or stopped answering "
            f"({detail})",
            "see the other ranks' output for why it stopped (killed, out of memory), then run the same accelerate "
            "launch command again: it resumes from the last epoch checkpoint",
        ) from exc


def _tidy_checkpoints(out: Path) -> None:
    for checkpoint in out.glob("checkpoint-*"):
        shutil.rmtree(checkpoint, ignore_errors=True)


#: the pretrained model's forgetting-battery scores, perplexity and per-text NLL, per model object and evaluation rows
_PRETRAINED_SCORES: weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple[Any, ...], dict[str, Any]]] = (
    weakref.WeakKeyDictionary()
)


def _battery_scores(model: torch.nn.Module, cfg: FinetuneConfig, data: RunData, scorers: dict[str, TaskScorer]):
    """Per battery task, every metric per example (each task on its own metrics)."""
    return {task: scorers[task].score_all(model, rows) for task, rows in data.battery.items()}


def _pretrained_scores(
    loaded: LoadedModel, cfg: FinetuneConfig, data: RunData, scorers: dict[str, TaskScorer]
) -> dict[str, Any]:
    """Forgetting's reference point: the pretrained model's battery scores, perplexity and per-text NLL.

    The evaluation rows are fixed (``EVAL_SEED``) and ``loaded`` is never changed, so every run of a comparison
    shares it: computed once per process, not once per fine-tune.
    """
    key = (tuple(data.battery), cfg.n_ood, cfg.n_ppl, cfg.max_length, cfg.data_source, cfg.num_fewshot)
    per_model = _PRETRAINED_SCORES.setdefault(loaded.model, {})
    if key not in per_model:
        probe = perplexity_probe(loaded.model, loaded.tokenizer, data.general_text, max_length=cfg.max_length)
        battery = _battery_scores(loaded.model, cfg, data, scorers) if cfg.n_ood else {}
        per_model[key] = {
            "ood_accuracy": (
                accuracy(primary_values(battery[data.ood_task][scorers[data.ood_task].metric])) if battery else None
            ),
            "battery": battery,
            "perplexity": probe.perplexity if cfg.n_ppl else None,
            "ppl_nll": probe.text_nll if cfg.n_ppl else None,
            "ppl_text_tokens": probe.text_tokens if cfg.n_ppl else None,
        }
    return {name: list(value) if isinstance(value, list) else value for name, value in per_model[key].items()}


def _zero_shot(loaded: LoadedModel, cfg: FinetuneConfig, data: RunData, score: TaskScorer) -> ExampleScores:
    """The pretrained model's per-example test scores, every metric: where fine-tuning starts.

    Computed once per process and test draw. The continuous metrics (the gold label's log-loss) give a claim
    measured by log-probability its zero-shot -> full FT gain.
    """
    key = ("zero-shot", cfg.task, cfg.n_test, cfg.max_length, cfg.data_source, cfg.num_fewshot)
    per_model = _PRETRAINED_SCORES.setdefault(loaded.model, {})
    if key not in per_model:
        per_model[key] = {"test": score.score_all(loaded.model, data.test)}
    return per_model[key]["test"]


def battery_results(
    before: dict[str, dict[str, np.ndarray]], after: dict[str, dict[str, np.ndarray]], metrics: dict[str, str]
) -> dict[str, dict[str, Any]]:
    """``results.json``'s ``ood_battery``: per task its metric, mean score before and after, and per-example values."""
    out = {}
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


def run_finetune(loaded: LoadedModel, cfg: FinetuneConfig) -> RunResults:
    """Fine-tune ``loaded`` as ``cfg`` says and write ``results.json`` into ``cfg.output_dir``; returns the results.

    The input card is read, never rewritten: the task it was transferred to is recorded in the results
    (``transferred_to``), so several runs can share one card. A stopped run resumes from its last epoch
    checkpoint; a finished one removes its checkpoints unless ``keep_checkpoints``. Under ``accelerate launch``
    every process trains and scores, the first writes.

    Parameters
    ----------
    loaded : the pretrained model (``load_model``); it is copied, never changed.
    cfg : what to train; see :class:`FinetuneConfig` (``epochs``, example counts, ``learning_rate``...).

    Returns
    -------
    The results dict written to ``results.json``: accuracies (train, validation, test and per-example
    ``test_correct``), validation log-loss, forgetting (out-of-domain accuracy and perplexity before/after, with
    each text's NLL), trainable parameters and fraction, seconds per epoch, memory (resident peak, its increase,
    CUDA peak), the early-stopping record (with per-epoch test and validation accuracy when the rule observes),
    the config and seeds; :class:`RunResults` lists every field.
    """
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = loaded.tokenizer
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    card = ProfileCard.load(cfg.profile) if cfg.profile else None
    if cfg.method == "lora":  # refuse an impossible rank before any data is read or scored
        resolve_lora_rank(loaded.model, cfg, card)
    wall_start = time.perf_counter()
    data = chat_framed_data(load_run_data(cfg), cfg.task, tokenizer)
    asked, cfg = cfg, used_counts(cfg, data)  # the config recorded is what ran: never more rows than were used
    capped = capped_counts(asked, cfg)
    if capped:
        shortfall = ", ".join(f"{name} {count} -> {getattr(cfg, name)}" for name, count in capped.items())
        warnings.warn(
            f"the data holds fewer examples than asked ({shortfall}): every row there is used, and the results "
            "record the counts used (asked: requested_counts)",
            stacklevel=2,
        )
    sandbox = SandboxLimits(confirm_run_unsafe_code=cfg.confirm_run_unsafe_code)
    # a progress bar over generation / ranking batches
    score = TaskScorer(cfg.task, tokenizer, cfg.max_length, progress=True, limits=sandbox)
    scorers = {t: TaskScorer(t, tokenizer, cfg.max_length, progress=True, limits=sandbox) for t in data.battery}
    # train and validation rows are the training task's (the last of a train_task chain: e.g. IFEval trains on
    # Alpaca), scored on its metric
    trained = training_spec(cfg.task)
    score_val = TaskScorer(trained, tokenizer, cfg.max_length, progress=True, limits=sandbox).with_logloss
    before = _pretrained_scores(loaded, cfg, data, scorers)
    zero_shot = _zero_shot(loaded, cfg, data, score)
    model, info = prepare_model(loaded, cfg, card)
    callbacks, threshold = _callbacks(cfg, card, score, data, score_val)
    if cfg.save_epoch_snapshots:  # after the early-stopping callback, whose copy of the matrices it reuses
        callbacks.append(_epoch_snapshots(loaded, cfg, callbacks))
    trainer = build_trainer(model, tokenizer, cfg, data, callbacks)
    resume = last_checkpoint(out) if cfg.save_checkpoints else None
    with peer_loss_reported():
        with PeakMemory() as memory:
            trainer.train(resume_from_checkpoint=resume)
        after = _battery_scores(model, cfg, data, scorers) if cfg.n_ood else {}  # the first: the legacy ood fields
        ood_after = primary_values(after[data.ood_task][scorers[data.ood_task].metric]) if after else None
        model.eval()
        test_scores, predictions = score.score_and_predict(model, data.test)  # the metrics and predictions.jsonl
        results = collect_results(
            trainer, cfg, loaded, data, score, ood_after, before, score_val=score_val, test_metrics=test_scores
        )
    metrics = {task: scorer.metric for task, scorer in scorers.items()}
    results["ood_battery"] = battery_results(before["battery"], after, metrics) if after else None
    zero_shot_primary = primary_values(zero_shot[score.metric])
    results["test_accuracy_before"] = accuracy(zero_shot_primary)
    results["test_correct_before"] = per_example(zero_shot_primary)
    results["test_example_metrics_before"] = example_lists(zero_shot)
    results.update(info)  # type: ignore[typeddict-item]
    results["requested_counts"] = capped
    results["num_fewshot"] = fewshot_count(cfg.task, cfg.num_fewshot)  # the examples each test prompt had
    results["resumed_from"] = resume
    results["stop_threshold"] = threshold
    results["transferred_to"] = (
        {"card": str(cfg.profile), "prior_task": card.prior_task, "task": cfg.task} if card is not None else None
    )
    results.update(memory.fields())
    results["world_size"] = trainer.args.world_size
    results["machine"] = machine()
    if not trainer.is_world_process_zero():  # under DDP (accelerate launch) every rank trains and scores; one writes
        return results
    if cfg.save_snapshot:
        merged = cast("PeftModel", model).merge_and_unload() if cfg.method == "lora" else model
        snap = extract_snapshot(merged, name=_snapshot_name(loaded, cfg), base_model=loaded.name)
        results["snapshot"] = str(save_snapshot(snap, out / "after.safetensors"))
    if cfg.save_epoch_snapshots:
        results["epoch_snapshots"] = _listed_epoch_snapshots(out, results["epochs_run"])
    results["wall_seconds"] = time.perf_counter() - wall_start
    write_predictions(out / PREDICTIONS, data.test, test_scores, predictions, score.spec.target_delimiter)
    write_results(out / "results.json", results)
    if not cfg.keep_checkpoints:
        _tidy_checkpoints(out)
    return results
