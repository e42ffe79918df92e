"""The field's weight-statistic selectors as ranking columns beside topological drift.

Computed on the pretrained matrices (they need no fine-tune): Spectrum's SNR (``spectrum_snr``), WeightWatcher's
power-law alpha (``ww_alpha``) and PEFT KappaTune's condition number (``kappa``); :mod:`topotuner_lab.topology.spectral`
defines each. A card can rank by any of them at the same budget as a topology card (strategies ``snr``, ``alpha``,
``kappa``), so a comparison sets topology against the selectors the field already uses. Signals computed elsewhere
(the target task's gradient magnitude, ``training.transfer.with_gradient_signal``) join a table through
:func:`join_signal`. The authors' element-wise relative change (``eltwise_rel``, strategy ``relchange``) compares
the pretrained matrices with the prior fine-tune's, like the magnitude control: :func:`with_relchange` joins it.

References
----------
FDataLab/TopoTuner (commit c8ab0bd43919b65c6b595282b7c6836b76b0a090),
``codes/eltwise/eltwise_rel_llama_full_layer_epoch_curves.py`` lines 187-192, ``mean_abs_eltwise_relative``:
``mean(|W_t - W_0| / max(|W_0|, eps))`` over the flattened tensor, ``eps = 1e-12``, one value per weight tensor (a
layer's v or o projection); ``codes/eltwise/eltwise_rel_vo_orderings_full_finetune.py`` orders the V and O layers by
it, for the last checkpoint (``final``) or averaged over the epoch checkpoints (``avg``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from topotuner_lab._io.errors import ProfileError
from topotuner_lab.topology.spectral import condition_number, powerlaw_alpha, spectrum_snr
from topotuner_lab.weights.snapshot import Snapshot, check_comparable

#: the floor on |W_0| of the element-wise relative change (the reference script's ``eps``)
ELTWISE_EPS = 1e-12
#: the drift-table column of the element-wise relative change
ELTWISE_COLUMN = "eltwise_rel"
#: column -> the statistic of one pretrained matrix
SIGNALS: dict[str, Callable[[np.ndarray], float]] = {
    "spectrum_snr": spectrum_snr,
    "ww_alpha": powerlaw_alpha,
    "kappa": condition_number,
}


def signal_table(snapshot: Snapshot) -> pd.DataFrame:
    """One row per projection id of ``snapshot``: ``pid`` and every :data:`SIGNALS` column."""
    return pd.DataFrame(
        [{"pid": pid, **{name: f(matrix) for name, f in SIGNALS.items()}} for pid, matrix in snapshot.matrices.items()]
    )


def join_signal(table: pd.DataFrame, values: pd.DataFrame) -> pd.DataFrame:
    """``table`` with the columns of ``values`` (``pid`` and signal columns) joined by projection id, attrs kept.

    Columns of ``values`` that ``table`` already has are replaced; ``values`` must cover every id of ``table``.
    """
    new = [c for c in values.columns if c != "pid"]
    lacking = sorted(set(table["pid"]) - set(values["pid"]))
    if lacking:
        raise ProfileError(
            f"the signal columns {new} lack projection ids {lacking[:5]} of the drift table",
            "compute the signals on the pretrained model the drift table was computed from",
        )
    joined = table.drop(columns=new, errors="ignore").merge(values, on="pid", how="left")
    joined.attrs.update(table.attrs)
    return joined


def with_signals(table: pd.DataFrame, pretrained: Snapshot) -> pd.DataFrame:
    """``table`` with the signal columns of the pretrained matrices joined by projection id (its attrs kept)."""
    missing = [name for name in SIGNALS if name not in table.columns]
    if not missing:
        return table
    return join_signal(table, signal_table(pretrained)[["pid", *missing]])


def eltwise_relative_change(before: np.ndarray, after: np.ndarray, eps: float = ELTWISE_EPS) -> float:
    """The authors' element-wise relative change: ``mean(|after - before| / max(|before|, eps))`` over all entries.

    Computed in float64 (the reference script divides and averages in float32: the two agree to ~1e-6 relative).
    """
    a, b = np.asarray(before, np.float64), np.asarray(after, np.float64)
    return float(np.mean(np.abs(b - a) / np.maximum(np.abs(a), eps)))


def relchange_table(pretrained: Snapshot, *after: Snapshot) -> pd.DataFrame:
    """``pid`` and ``eltwise_rel`` per projection: :func:`eltwise_relative_change` from ``pretrained`` to ``after``.

    One fine-tuned snapshot is the reference script's ``final`` mode; several (one per epoch) its ``avg`` mode, the
    mean over them.
    """
    if not after:
        raise ProfileError(
            "the element-wise relative change needs the prior fine-tune's snapshot",
            "pass the snapshot the prior run saved (after.safetensors), or one per epoch",
        )
    for snap in after:
        check_comparable(pretrained, snap)
    return pd.DataFrame(
        [
            {
                "pid": pid,
                ELTWISE_COLUMN: float(np.mean([eltwise_relative_change(before, s.matrices[pid]) for s in after])),
            }
            for pid, before in pretrained.matrices.items()
        ]
    )


def with_relchange(table: pd.DataFrame, pretrained: Snapshot, *after: Snapshot) -> pd.DataFrame:
    """``table`` with the ``eltwise_rel`` column of :func:`relchange_table` joined by projection id (attrs kept).

    A table that records its fine-tuned weights (``attrs["after_hash"]``) must be of the one snapshot given, so the
    column ranks the same prior fine-tune as the drift.
    """
    recorded = table.attrs.get("after_hash")
    if len(after) == 1 and recorded is not None and recorded != after[0].weights_hash:
        raise ProfileError(
            f"the drift table was computed from fine-tuned weights {str(recorded)[:12]}, the snapshot given has "
            f"{after[0].weights_hash[:12]}",
            "pass the snapshot of the prior fine-tune the table was computed from",
        )
    return join_signal(table, relchange_table(pretrained, *after))
