"""The field's weight-statistic selectors as ranking columns beside topological drift.

Computed on the pretrained matrices (they need no fine-tune): Spectrum's SNR (``spectrum_snr``), WeightWatcher's
power-law alpha (``ww_alpha``) and PEFT KappaTune's condition number (``kappa``); :mod:`topotuner_lab.topology.spectral`
defines each. A card can rank by any of them at the same budget as a topology card (strategies ``snr``, ``alpha``,
``kappa``), so a comparison sets topology against the selectors the field already uses. Signals computed elsewhere
(the target task's gradient magnitude, ``training.transfer.with_gradient_signal``) join a table through
:func:`join_signal`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from topotuner_lab._io.errors import ProfileError
from topotuner_lab.topology.spectral import condition_number, powerlaw_alpha, spectrum_snr
from topotuner_lab.weights.snapshot import Snapshot

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
