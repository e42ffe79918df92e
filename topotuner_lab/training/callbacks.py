"""Per-epoch bookkeeping callbacks for the HF ``Trainer``: seconds per epoch and test accuracy per epoch.

Both log into ``state.log_history``, which checkpoints carry, so a resumed run keeps its earlier epochs.
"""

from __future__ import annotations

import time
from typing import Any

from transformers import TrainerCallback

from topotuner_lab.training.evaluation import accuracy


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


class EpochEvaluation(TrainerCallback):
    """Test accuracy after every epoch (to see what a longer or shorter budget gives), logged like EpochClock."""

    def __init__(self, score) -> None:
        self.score = score

    def on_epoch_end(self, args, state, control, model=None, **kwargs):
        """Log the epoch's test accuracy, then put the model back in training mode."""
        state.log_history.append({"epoch": _epoch(state), "test_accuracy": accuracy(self.score(model))})
        model.train()


def per_epoch(log_history: list[dict[str, Any]], key: str) -> list[float]:
    """The values of ``key`` logged once per epoch, in epoch order."""
    return [h[key] for h in sorted((h for h in log_history if key in h), key=lambda h: h["epoch"])]
