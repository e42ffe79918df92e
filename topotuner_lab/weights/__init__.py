"""Attention projections of a model and snapshots of their weights.

Projections, snapshots (numpy; no torch), extraction from a model (torch) or streamed from checkpoint files, and
model loading.
"""

from topotuner_lab._io.lazy import lazy_exports

_EXPORTS = {
    "Snapshot": ".snapshot",
    "load_snapshot": ".snapshot",
    "save_snapshot": ".snapshot",
    "perturb_snapshot": ".snapshot",
    "extract_snapshot": ".extract",
    "stream_snapshot": ".streaming",
    "load_model": ".models",
    "LoadedModel": ".models",
    "enumerate_projections": ".projections",
    "parse_pid": ".projections",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
