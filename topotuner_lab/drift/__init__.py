"""Drift tables and everything they are made from.

Settings, column names, the verified on-disk cache, computation on local or Dask workers, table files, and the
noise floor.
"""

from topotuner_lab._io.lazy import lazy_exports

_EXPORTS = {
    "DriftSettings": ".settings",
    "DriftCache": ".cache",
    "drift_table": ".compute",
    "drift_between": ".compute",
    "pair_values": ".pairs",
    "save_table": ".tables",
    "load_table": ".tables",
    "aggregate_epochs": ".tables",
    "NoiseCheck": ".noise",
    "noise_check": ".noise",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
