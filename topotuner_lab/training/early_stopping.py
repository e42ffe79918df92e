"""Topology-based early stopping as a Hugging Face ``TrainerCallback``.

After each epoch the callback computes the epoch-to-epoch drift of the monitored projections
(sum over them of one drift-table column, H0 Wasserstein-1 by default). It normalizes that
drift by the first epoch's drift (epoch 0 -> 1), so the first epoch is 1.0 by definition, and
stops training once the normalized drift falls below ``threshold`` (from epoch ``min_epochs`` on).
Each epoch also records the mean drift of the monitored projections from the weights training started from
(``from_pretrained``), the quantity of the authors' other rule (stop at the first epoch t >= 2 whose distance from
the pretrained weights is <= eta), so both rules can be replayed from a run's history without retraining.
With ``observe_only=True`` it records the epoch at which it would have stopped and lets training
run its full budget, so both accuracies can be compared.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from topotuner_lab._io.config import POSITIVE_INT
from topotuner_lab._io.errors import ParameterError
from topotuner_lab.drift.cache import DriftCache
from topotuner_lab.drift.columns import DEFAULT_METRIC
from topotuner_lab.drift.compute import drift_between
from topotuner_lab.drift.settings import DriftSettings
from topotuner_lab.weights.projections import enumerate_projections

#: the earliest epoch the rule can fire: epoch 1 is the reference its later epochs are normalized by
EARLIEST_STOP = 2
#: the stopping threshold on normalized drift used wherever none is given (cards, presets, notebooks, the CLI)
DEFAULT_STOP_THRESHOLD = 0.5


def projection_matrices(model: torch.nn.Module, pids: list[str] | None = None) -> dict[str, np.ndarray]:
    """Current float32 copies of the model's attention projections (merged under LoRA)."""
    with torch.no_grad():
        return {
            p.pid: p.matrix(model).detach().float().cpu().numpy().copy()
            for p in enumerate_projections(model)
            if pids is None or p.pid in pids
        }


class TopologicalEarlyStopping(TrainerCallback, ExportableState):
    """Stop when normalized epoch-to-epoch topological drift falls below ``threshold``.

    A Hugging Face ``TrainerCallback``: pass it in ``Trainer(callbacks=[...])`` (``run_finetune`` does so when its
    config sets ``stop_threshold``). Its state is saved with each checkpoint, so a resumed run keeps its history.

    Parameters
    ----------
    threshold : float, default 0.5
        In (0, 1); the first epoch's drift is 1.0 by definition.
    pids : list of str, optional
        Projection ids to monitor (a card's trainable ids), or None for all.
    metric : str, default "h0_w1"
        Drift column summed over the monitored matrices.
    settings : DriftSettings or dict, optional
        Drift settings, or their ``key()`` (default H0 only, W1, no bottleneck, no magnitude: cheap enough for every
        epoch).
    min_epochs : int, default 2
        Never stop before this epoch (a whole number >= 1).
    observe_only : bool, default False
        Record ``stop_epoch`` but let training run its whole budget.

    Attributes
    ----------
    history : list of dict
        Per epoch: ``epoch``, ``drift`` (since the previous epoch), ``normalized`` (by the first epoch's drift),
        ``from_pretrained`` (mean drift from the weights training started from) and ``seconds``.
    stop_epoch : int or None
        The epoch the rule fired at (also under ``observe_only``), or None.

    Raises
    ------
    ParameterError
        A threshold outside (0, 1), ``min_epochs`` not a whole number >= 1, ``pids`` not a non-empty list of ids, a
        ``metric`` the settings do not compute; at the start of training, monitored ids the model does not have.

    Examples
    --------
    Two simulated epochs on a tiny model, the second moving the weights a tenth as far as the first:

    >>> import torch
    >>> from transformers import TrainerControl, TrainerState
    >>> from topotuner_lab import TopologicalEarlyStopping, load_model
    >>> model = load_model("tiny-llama").model
    >>> stopper = TopologicalEarlyStopping(threshold=0.5)
    >>> state, control = TrainerState(), TrainerControl()
    >>> stopper.on_train_begin(None, state, control, model=model)
    >>> _ = torch.manual_seed(0)
    >>> for epoch, step in ((1, 0.1), (2, 0.01)):
    ...     with torch.no_grad():
    ...         for param in model.parameters():
    ...             _ = param.add_(step * torch.randn_like(param))
    ...     state.epoch = epoch
    ...     control = stopper.on_epoch_end(None, state, control, model=model)
    >>> stopper.stop_epoch, control.should_training_stop
    (2, True)
    >>> stopper.history[0]["normalized"], stopper.history[1]["normalized"] < 0.5
    (1.0, True)
    """

    def __init__(
        self,
        threshold: float = DEFAULT_STOP_THRESHOLD,
        *,
        pids: list[str] | None = None,
        metric: str = DEFAULT_METRIC,
        settings: DriftSettings | dict[str, Any] | None = None,
        min_epochs: int = EARLIEST_STOP,
        observe_only: bool = False,
    ) -> None:
        if not (isinstance(threshold, (int, float)) and 0 < threshold < 1):
            raise ParameterError(
                f"stopping threshold {threshold!r} is not in (0, 1)",
                f"normalized drift starts at 1.0; use e.g. {DEFAULT_STOP_THRESHOLD}",
            )
        self.threshold = float(threshold)
        if not POSITIVE_INT(min_epochs):
            raise ParameterError(
                f"min_epochs={min_epochs!r} is not a whole number >= 1",
                f"give the first epoch the rule may stop at, e.g. {EARLIEST_STOP} (epoch 1 is the reference)",
            )
        if pids is not None and (isinstance(pids, str) or not pids or not all(isinstance(pid, str) for pid in pids)):
            raise ParameterError(
                f"pids={pids!r} is not a non-empty list of projection ids", "give ids like ['L0.q', 'L1.v'], or None"
            )
        self.pids = None if pids is None else list(pids)
        self.metric = metric
        if isinstance(settings, dict):
            settings = DriftSettings.from_key(settings)
        self.settings = settings or DriftSettings(maxdim=0, orders=(1.0,), bottleneck=False, magnitude=False)
        if metric not in self.settings.columns():
            raise ParameterError(
                f"metric {metric!r} is not computed by these drift settings", f"use one of {self.settings.columns()}"
            )
        self.min_epochs = min_epochs
        self.observe_only = observe_only
        self.history: list[dict[str, float | None]] = []
        self.reference: float | None = None
        self.stop_epoch: int | None = None
        self._previous: dict[str, np.ndarray] | None = None
        self._start: dict[str, np.ndarray] | None = None

    # transformers saves this with checkpoints (ExportableState), so a resumed run keeps its history
    def state(self) -> dict[str, Any]:
        """The callback's arguments and record, as HF saves them with each checkpoint."""
        return {
            "args": {
                "threshold": self.threshold,
                "pids": self.pids,
                "metric": self.metric,
                "min_epochs": self.min_epochs,
                "observe_only": self.observe_only,
                "settings": self.settings.key(),
            },
            "attributes": {"history": self.history, "reference": self.reference, "stop_epoch": self.stop_epoch},
        }

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        """Copy the monitored matrices, which the first epoch's drift is measured from; refuse ids the model lacks."""
        self._previous = projection_matrices(model, self.pids)
        # a resumed run starts from a checkpoint, not the pretrained weights: it records no distance from them
        self._start = self._previous if not state.epoch else None
        missing = sorted(set(self.pids or ()) - set(self._previous))
        if missing:
            raise ParameterError(
                f"early stopping monitors projection id(s) {missing[:5]} this model does not have",
                f"monitor ids of this model (e.g. {sorted(self._previous)[:4]}), or use a card made for it",
            )

    def on_epoch_end(self, args, state, control, model=None, **kwargs):
        """Record the drift since the previous epoch, raw and normalized by the first epoch's.

        The first time it falls below the threshold (from ``min_epochs`` on), record the stop epoch and, unless
        ``observe_only``, stop training.
        """
        start = time.perf_counter()
        current = projection_matrices(model, self.pids)
        table = drift_between(self._previous, current, self.settings, n_jobs=1, cache=DriftCache(None))
        drift = float(table[self.metric].sum())
        if self.reference is None:
            self.reference = drift if drift > 0 else float("nan")
        normalized = drift / self.reference if self.reference else float("nan")
        from_start = None
        if self._start is not None:
            since_start = drift_between(self._start, current, self.settings, n_jobs=1, cache=DriftCache(None))
            from_start = float(since_start[self.metric].mean())
        epoch = int(round(state.epoch or len(self.history) + 1))
        self.history.append(
            {
                "epoch": epoch,
                "drift": drift,
                "normalized": normalized,
                "from_pretrained": from_start,
                "seconds": time.perf_counter() - start,
            }
        )
        state.log_history.append({"epoch": epoch, "topo_drift": drift, "topo_drift_normalized": normalized})
        if self.stop_epoch is None and epoch >= self.min_epochs and normalized < self.threshold:
            self.stop_epoch = epoch
            if not self.observe_only:
                control.should_training_stop = True
        self._previous = current
        return control
