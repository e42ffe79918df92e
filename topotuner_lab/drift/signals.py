"""The field's weight-statistic selectors as ranking columns beside topological drift.

Computed on the pretrained matrices (they need no fine-tune): Spectrum's SNR (``spectrum_snr``), WeightWatcher's
power-law alpha (``ww_alpha``) and PEFT KappaTune's condition number (``kappa``); :mod:`topotuner_lab.topology.spectral`
defines each. A card can rank by any of them at the same budget as a topology card (strategies ``snr``, ``alpha``,
``kappa``), so a comparison sets topology against the selectors the field already uses.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

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


def with_signals(table: pd.DataFrame, pretrained: Snapshot) -> pd.DataFrame:
    """``table`` with the signal columns of the pretrained matrices joined by projection id (its attrs kept)."""
    missing = [name for name in SIGNALS if name not in table.columns]
    if not missing:
        return table
    joined = table.merge(signal_table(pretrained)[["pid", *missing]], on="pid", how="left")
    joined.attrs.update(table.attrs)
    return joined
