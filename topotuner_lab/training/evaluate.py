"""Evaluate without training: a model zero-shot, or a finished fine-tune's weights, on a task's test rows.

The test rows are the draw every fine-tune of the task is tested on (``EVAL_SEED``), so an evaluation is paired with
the runs. Each metric gets a 95% percentile bootstrap interval over the test examples, and every row's prediction is
kept (``predictions.jsonl``: prompt, gold target, the model's answer, each metric). The bootstrap is a small one here
rather than ``study.stats``'s: the training floor may not import the study floor (importlinter's layers).

A run folder's weights are found the way a stopped run resumes: its last ``checkpoint-N`` (``--keep-checkpoints``),
loaded by the run's own trainer class onto the base model; else, for a profile or LoRA run (which change only the
attention projections), its snapshot (``after.safetensors``, ``--save-snapshot``) written into the base's projections.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from topotuner_lab._io import atomic
from topotuner_lab._io.errors import InputFileError, SnapshotMismatchError
from topotuner_lab.tasks.fewshot import FEWSHOT_SEED, fewshot_count, fewshot_split, with_fewshot
from topotuner_lab.tasks.loading import load_task
from topotuner_lab.tasks.registry import get_task
from topotuner_lab.tasks.sandbox import SandboxLimits
from topotuner_lab.training.config import FinetuneConfig
from topotuner_lab.training.data import EVAL_SEED, chat_framed
from topotuner_lab.training.results import RunResults, example_lists, load_results, write_results
from topotuner_lab.training.scoring import ExampleScores, TaskScorer
from topotuner_lab.training.trainer import TrainableOnlyTrainer, last_checkpoint, prepare_model
from topotuner_lab.weights.models import LoadedModel, load_model
from topotuner_lab.weights.projections import enumerate_projections
from topotuner_lab.weights.snapshot import load_snapshot
from topotuner_lab.weights.streaming import RUN_SNAPSHOT

PREDICTIONS = "predictions.jsonl"
EVALUATION = "evaluation.json"
N_BOOT = 10_000
LEVEL = 0.95
#: bootstrap draws per chunk (bounds memory at chunk x examples values)
_CHUNK = 500
#: the methods whose every trained weight is an attention projection, so the run's snapshot restores the model
SNAPSHOT_METHODS = ("profile", "lora")
_RERUN = "run the fine-tune again with --keep-checkpoints (or --save-snapshot, for a profile or LoRA run)"


def mean_interval(values: Any, *, n_boot: int = N_BOOT, level: float = LEVEL, seed: int = 0) -> dict[str, float]:
    """The mean of per-example ``values`` with a percentile bootstrap interval over the examples."""
    x = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    means = np.concatenate(
        [
            x[rng.integers(0, x.size, size=(min(_CHUNK, n_boot - done), x.size))].mean(axis=1)
            for done in range(0, n_boot, _CHUNK)
        ]
    )
    tail = (1 - level) / 2
    return {
        "mean": float(x.mean()),
        "low": float(np.quantile(means, tail)),
        "high": float(np.quantile(means, 1 - tail)),
    }


def prediction_lines(
    rows: Any, scores: ExampleScores, predictions: list[str | None], delimiter: str = ""
) -> list[dict[str, Any]]:
    """Per row: its prompt, gold ``target``, the model's ``prediction`` and each metric (``predictions.jsonl``).

    The target loses the spec's ``delimiter`` (a multiple-choice prediction is the option's text without it).
    """
    return [
        {
            "prompt": row["prompt"],
            "target": row["target"].removeprefix(delimiter) if isinstance(row["target"], str) else row["target"],
            "prediction": prediction,
            **{name: float(values[i]) for name, values in scores.items()},
        }
        for i, (row, prediction) in enumerate(zip(rows, predictions))
    ]


def write_predictions(
    path: str | os.PathLike[str], rows: Any, scores: ExampleScores, predictions: list[str | None], delimiter: str = ""
) -> Path:
    """Write :func:`prediction_lines` as JSON lines, atomically."""
    lines = prediction_lines(rows, scores, predictions, delimiter)
    return atomic.write_text(path, "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))


def _from_checkpoint(loaded: LoadedModel, results: RunResults, checkpoint: str) -> torch.nn.Module:
    """The base with the checkpoint's weights, loaded as a resumed run loads them (LoRA merged afterwards)."""
    from transformers import TrainingArguments

    lora = results["method"] == "lora"
    if lora:
        cfg = FinetuneConfig(method="lora", lora_rank=int(results.get("lora_rank", 8)), seed=results["seeds"]["train"])
        model = prepare_model(loaded, cfg, None)[0]
    else:
        model = copy.deepcopy(loaded.model)
    args = TrainingArguments(
        output_dir=str(Path(checkpoint).parent), report_to=[], use_cpu=not torch.cuda.is_available()
    )
    TrainableOnlyTrainer(model=model, args=args)._load_from_checkpoint(checkpoint)
    return cast(Any, model).merge_and_unload() if lora else model


def _from_snapshot(loaded: LoadedModel, path: Path) -> torch.nn.Module:
    """The base with a run's snapshot written into its attention projections."""
    snap = load_snapshot(path)
    model = copy.deepcopy(loaded.model)
    projections = {p.pid: p for p in enumerate_projections(model)}
    shapes = {pid: tuple(proj.matrix(model).shape) for pid, proj in projections.items()}
    if {pid: tuple(m.shape) for pid, m in snap.matrices.items()} != shapes:
        raise SnapshotMismatchError(
            f"the run's snapshot {path} ({snap.model}) does not fit the base model {loaded.name}",
            "pass the base model the run was trained from (--base)",
        )
    with torch.no_grad():
        for pid, proj in projections.items():
            proj.from_weight(model.get_parameter(proj.param_name)).copy_(torch.from_numpy(np.array(snap.matrices[pid])))
    return model


def run_model(folder: str | os.PathLike[str], base: str | None = None) -> tuple[LoadedModel, RunResults, str]:
    """A finished run's fine-tuned model (on ``base``, default the model its results name), its results, the weights."""
    folder = Path(folder)
    if not (folder / "results.json").is_file():
        raise InputFileError(
            f"{folder} is not a finished fine-tune's folder (it holds no results.json)",
            "point at the -o folder of a finished `topotuner-lab finetune` run, or evaluate a model with --model",
        )
    results = load_results(folder / "results.json")
    loaded = load_model(base or results["model"]["name"])
    checkpoint = last_checkpoint(folder)
    snapshot = folder / RUN_SNAPSHOT
    if checkpoint is not None:
        model, weights = _from_checkpoint(loaded, results, checkpoint), checkpoint
    elif snapshot.is_file() and results["method"] in SNAPSHOT_METHODS:
        model, weights = _from_snapshot(loaded, snapshot), str(snapshot)
    else:
        kept = (
            f" (its {RUN_SNAPSHOT} holds only the attention projections, and it trained more)"
            if snapshot.is_file()
            else ""
        )
        raise InputFileError(f"{folder} is a finished {results['method']} run that kept no weights{kept}", _RERUN)
    return replace(loaded, model=model.eval()), results, weights


def evaluate(
    task: str | None = None,
    *,
    model: str | LoadedModel | None = None,
    run: str | os.PathLike[str] | None = None,
    base: str | None = None,
    n_test: int | None = None,
    max_length: int | None = None,
    data_source: str | None = None,
    num_fewshot: int | None = None,
    output_dir: str | os.PathLike[str] | None = None,
    confirm_run_unsafe_code: bool = False,
) -> dict[str, Any]:
    """Score ``model`` (zero-shot; default the embedded one) or the fine-tuned weights of ``run`` on ``task``.

    ``task``, ``n_test``, ``max_length`` and ``data_source`` default to the run's own (a run is then scored on the rows
    it was tested on), else to ``sst2``, 128, 64 and the offline copies. ``num_fewshot``: solved examples before each
    prompt (:func:`~topotuner_lab.tasks.fewshot.with_fewshot`; default the run's, else the task spec's). With
    ``output_dir``: ``evaluation.json`` (with a checksum, as ``results.json``) and ``predictions.jsonl`` are written
    there.

    Returns
    -------
    ``task``, ``metric`` (the primary), ``metrics`` (each metric's ``mean``, ``low``, ``high``: a bootstrap
    interval at ``level`` over the test rows), ``model``, ``source`` (``zero-shot`` or the run folder), ``weights``,
    ``n_test``, ``max_length``, ``num_fewshot`` (with ``fewshot_split`` and ``fewshot_seed``), ``example_metrics``
    (per row), ``predictions``.
    """
    config: dict[str, Any] = {}
    if run is not None:
        loaded, results, weights = run_model(run, base)
        config, source = results["config"], str(run)
    else:
        loaded = model if isinstance(model, LoadedModel) else load_model(model)
        weights, source = "pretrained", "zero-shot"
    task = task or config.get("task") or "sst2"
    get_task(task)
    n_test = n_test or config.get("n_test") or 128
    max_length = max_length or config.get("max_length") or 64
    data_source = data_source or config.get("data_source")
    num_fewshot = fewshot_count(task, config.get("num_fewshot") if num_fewshot is None else num_fewshot)
    tokenizer = loaded.tokenizer
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    rows = load_task(task, "test", n_test, EVAL_SEED, data_source)
    rows = chat_framed(with_fewshot(rows, task, num_fewshot, data_source), task, tokenizer)
    limits = SandboxLimits(confirm_run_unsafe_code=confirm_run_unsafe_code)
    scorer = TaskScorer(task, tokenizer, max_length, progress=True, limits=limits)
    scores, predictions = scorer.score_and_predict(loaded.model.eval(), rows)
    evaluation: dict[str, Any] = {
        "task": scorer.spec.name,
        "metric": scorer.metric,
        "metrics": {name: mean_interval(values) for name, values in scores.items() if name != "logloss"},
        "level": LEVEL,
        "n_boot": N_BOOT,
        "model": {"name": loaded.name, "revision": loaded.revision},
        "source": source,
        "weights": weights,
        "n_test": len(rows),
        "max_length": max_length,
        "data_source": data_source,
        "num_fewshot": num_fewshot,
        "fewshot_split": fewshot_split(task),
        "fewshot_seed": FEWSHOT_SEED,
    }
    if output_dir is not None:
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_predictions(out / PREDICTIONS, rows, scores, predictions, scorer.spec.target_delimiter)
        write_results(out / EVALUATION, evaluation)
    return {**evaluation, "example_metrics": example_lists(scores), "predictions": predictions}
