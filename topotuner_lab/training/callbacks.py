"""Per-epoch callbacks for the HF ``Trainer``: seconds and test/validation accuracy per epoch, the matrices after each.

The first two log into ``state.log_history``, which checkpoints carry, so a resumed run keeps its earlier epochs;
:class:`EpochSnapshots` writes a snapshot file per epoch into the run folder.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from transformers import TrainerCallback

from topotuner_lab.training.early_stopping import TopologicalEarlyStopping, projection_matrices
from topotuner_lab.training.evaluation import accuracy
from topotuner_lab.training.scoring import per_example
from topotuner_lab.weights.snapshot import Snapshot, save_snapshot

#: ``score_val(model)`` -> (per validation row correctness, mean label log-loss or None for a generation task)
ValScorer = Callable[[Any], tuple[np.ndarray, float | None]]


def _epoch(state: Any) -> int:
    return int(round(state.epoch or 0))


class EpochClock(TrainerCallback):
    """Seconds per epoch (checkpoint saving, which happens after the epoch ends, excluded).

    Logged into ``state.log_history``, which checkpoints carry, so a resumed run keeps earlier epochs.
    """

    def on_epoch_begin(self, args, state, control, **kwargs):
        """Start the epoch's clock."""
        self._start = time.perf_counter()

    def on_epoch_end(self, args, state, control, **kwargs):
        """Log the epoch's seconds."""
        state.log_history.append({"epoch": _epoch(state), "epoch_seconds": time.perf_counter() - self._start})


class RunClock(TrainerCallback):
    """The run's wall seconds over all its sittings, logged as ``run_seconds`` at each epoch's end.

    Added after the other callbacks, so an epoch's entry counts its evaluation and snapshot too, and the checkpoint
    saved after it carries the entry: a run resumed from that checkpoint adds the seconds its earlier sittings spent
    up to it. A checkpoint that logged none (written before this record) leaves the earlier time unknown: such a run
    logs no ``run_seconds`` and :meth:`seconds` counts its last sitting alone.

    Parameters
    ----------
    started : ``time.perf_counter()`` when this sitting's work on the run began.
    resumed : whether the run resumes from a checkpoint (its history then comes back with it).
    """

    def __init__(self, started: float, *, resumed: bool) -> None:
        self.started = started
        self._before: float | None = None if resumed else 0.0
        self._read = not resumed  # a fresh run has no earlier sitting; a resumed one reads its checkpoint's history

    def _earlier(self, log_history: list[dict[str, Any]]) -> float | None:
        """The seconds of the sittings before this one: the last ``run_seconds`` the checkpoint's history holds."""
        if not self._read:  # first called before this sitting logs any entry of its own
            logged = [h["run_seconds"] for h in log_history if "run_seconds" in h]
            self._before, self._read = (logged[-1] if logged else None), True
        return self._before

    def seconds(self, log_history: list[dict[str, Any]]) -> tuple[float, bool]:
        """The run's wall seconds so far, and whether they cover every sitting (False: this sitting alone)."""
        this_sitting = time.perf_counter() - self.started
        earlier = self._earlier(log_history)
        return (this_sitting, False) if earlier is None else (earlier + this_sitting, True)

    def on_epoch_end(self, args, state, control, **kwargs):
        """Log the run's seconds so far (where its earlier sittings' are known)."""
        seconds, whole = self.seconds(state.log_history)
        if whole:
            state.log_history.append({"epoch": _epoch(state), "run_seconds": seconds})


class EpochEvaluation(TrainerCallback):
    """Test (and validation) accuracy after every epoch, logged like EpochClock (its seconds excluded from the epoch's).

    Each epoch logs one entry: ``test_accuracy``, ``test_correct`` (per test row, 0/1: accuracy at an early-stopping
    epoch gets paired intervals against the full budget), ``val_accuracy`` and ``val_logloss`` when a validation
    scorer is given (the log-loss only for label-likelihood tasks), and ``eval_seconds``, the evaluation's own cost.

    With ``defer_final`` the epoch whose weights are the run's last (the budget spent, or the rule stopping it) is
    not scored here: the finished run's own scoring, of the same weights, gives its entry (:func:`evaluation_entry`),
    which saves one scoring pass per run.

    Parameters
    ----------
    score : ``score(model)`` -> per test row, whether it is right (a boolean array).
    score_val : ``score_val(model)`` -> (per validation row correctness, mean log-loss or None); None: no validation.
    defer_final : leave the last epoch to the finished run's scoring.
    """

    def __init__(
        self, score: Callable[[Any], np.ndarray], score_val: ValScorer | None = None, *, defer_final: bool = False
    ) -> None:
        self.score = score
        self.score_val = score_val
        self.defer_final = defer_final

    def on_epoch_end(self, args, state, control, model=None, **kwargs):
        """Log the epoch's test (and validation) accuracy, then put the model back in training mode."""
        if self.defer_final and (control.should_training_stop or state.global_step >= state.max_steps):
            return  # training ends with these weights: the run's final scores are this epoch's
        start = time.perf_counter()
        correct = self.score(model)
        val_correct, val_logloss = self.score_val(model) if self.score_val is not None else (None, None)
        seconds = time.perf_counter() - start
        state.log_history.append(evaluation_entry(_epoch(state), correct, val_correct, val_logloss, seconds))
        model.train()


def evaluation_entry(
    epoch: int,
    test_correct: np.ndarray,
    val_correct: np.ndarray | None = None,
    val_logloss: float | None = None,
    seconds: float = 0.0,
) -> dict[str, Any]:
    """One epoch's log entry of :class:`EpochEvaluation`; the finished run makes the last epoch's (``defer_final``).

    A deferred last epoch's ``eval_seconds`` is 0: the run scores its final weights anyway.
    """
    entry: dict[str, Any] = {
        "epoch": epoch,
        "test_accuracy": accuracy(test_correct),
        "test_correct": per_example(test_correct),  # 0/1 or a graded score (ROUGE...), never truncated
    }
    if val_correct is not None:
        entry["val_accuracy"] = accuracy(val_correct)
        if val_logloss is not None:
            entry["val_logloss"] = val_logloss
    entry["eval_seconds"] = seconds
    return entry


def per_epoch(log_history: list[dict[str, Any]], key: str) -> list[Any]:
    """The values of ``key`` logged once per epoch, in epoch order."""
    return [h[key] for h in sorted((h for h in log_history if key in h), key=lambda h: h["epoch"])]


def at_epoch(log_history: list[dict[str, Any]], key: str, epoch: int | None) -> Any:
    """The value of ``key`` logged for ``epoch`` (the last one logged for it); None when none was, or no epoch."""
    if epoch is None:
        return None
    return next((h[key] for h in reversed(log_history) if key in h and h.get("epoch") == epoch), None)


def epoch_snapshot_path(folder: str | os.PathLike[str], epoch: int) -> Path:
    """Where a run writes the snapshot after ``epoch`` (1-based): ``FOLDER/epoch-N.safetensors``."""
    return Path(folder) / f"epoch-{epoch}.safetensors"


class EpochSnapshots(TrainerCallback):
    """Write the attention matrices after every epoch as a snapshot, ``epoch-N.safetensors`` in ``folder``.

    Each file is written atomically (a crash leaves the previous file or none, never a torn one) by the first process
    only, in float32 like every snapshot: exact, at 106 MB an epoch for SmolLM2-135M. Float16 would halve that but
    is not exact: a fine-tune moves weights by only a few times float16's rounding. Measured on SmolLM2-135M
    (full fine-tune on SST-2, 64 examples, lr 1e-4, 2 epochs: median relative weight change 0.15-0.17%, float16
    rounding 0.02%), drift against the float16-rounded epoch snapshots was off by, per epoch: summed ``h0_w1``
    1.9% / 1.4% (default settings, H0), 0.7% / 0.4% (reference recipe); per matrix a median 1.8% / 1.4% and up to
    9.2% (default); and one of the 6 highest-drift matrices changed after epoch 1. Smaller steps drift less and
    would be hit harder.

    When an early-stopping callback that monitors every projection runs before this one, its copy of this epoch's
    matrices is written instead of extracting them a second time.

    Parameters
    ----------
    folder : the run folder.
    model_name : the snapshots' model name; ``-epochN`` is appended.
    base_model : the pretrained model the run started from (recorded, and checked by drift).
    architecture, total_params : the model's ``model_type`` and parameter count, as the final snapshot records them.
    shared : the run's early-stopping callback, whose matrices are reused when it monitors every projection.
    """

    def __init__(
        self,
        folder: str | os.PathLike[str],
        *,
        model_name: str,
        base_model: str,
        architecture: str,
        total_params: int | None = None,
        shared: TopologicalEarlyStopping | None = None,
    ) -> None:
        self.folder = Path(folder)
        self.model_name, self.base_model = model_name, base_model
        self.architecture, self.total_params = architecture, total_params
        self.shared = shared
        self.written: dict[int, Path] = {}

    def _matrices(self, model: Any, epoch: int) -> dict[str, np.ndarray]:
        """The epoch's matrices: the early-stopping callback's copy when it holds every projection, else extracted."""
        stopper = self.shared
        if stopper is not None and stopper.pids is None and stopper.history and stopper.history[-1]["epoch"] == epoch:
            latest = stopper._previous  # the callback keeps this epoch's copy to measure the next epoch's drift from
            if latest is not None:
                return latest
        return projection_matrices(model)

    def on_epoch_end(self, args, state, control, model=None, **kwargs):
        """Write the snapshot of the epoch just finished (the first process only)."""
        if not state.is_world_process_zero:
            return
        epoch = _epoch(state)
        snap = Snapshot(
            self._matrices(model, epoch),
            f"{self.model_name}-epoch{epoch}",
            self.base_model,
            "in-memory",
            self.architecture,
            note=f"after epoch {epoch}",
            total_params=self.total_params,
        )
        self.written[epoch] = save_snapshot(snap, epoch_snapshot_path(self.folder, epoch))
