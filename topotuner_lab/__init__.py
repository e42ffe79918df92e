"""TopoTuner Lab: topology-guided fine-tuning of language models, as a Jupyter workbench.

Attention projection matrices are point clouds of their rows; their Vietoris–Rips persistence
diagrams and the Wasserstein drift between them rank matrices for freezing profiles and drive
topology-based early stopping.

The main entry points are importable from the package itself::

    from topotuner_lab import load_model, drift_table, DriftSettings, build_profile, ProfileCard

They load lazily, so ``import topotuner_lab`` stays light (drift worker processes never import torch).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

#: public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "diagrams": "persistence",
    "PersistenceSettings": "persistence",
    "wasserstein": "distances",
    "bottleneck": "distances",
    "drift_table": "drift",
    "DriftSettings": "drift",
    "DriftCache": "drift",
    "Snapshot": "snapshot",
    "extract_snapshot": "snapshot",
    "load_snapshot": "snapshot",
    "save_snapshot": "snapshot",
    "stream_snapshot": "streaming",
    "ProfileCard": "profiles",
    "ModelIdentity": "profiles",
    "build_profile": "profiles",
    "apply_profile": "profiles",
    "TopologicalEarlyStopping": "early_stopping",
    "load_model": "models",
    "FinetuneConfig": "finetune",
    "run_finetune": "finetune",
    "TopoTunerError": "errors",
}
__all__ = [
    "DriftCache",
    "DriftSettings",
    "FinetuneConfig",
    "ModelIdentity",
    "PersistenceSettings",
    "ProfileCard",
    "Snapshot",
    "TopoTunerError",
    "TopologicalEarlyStopping",
    "apply_profile",
    "bottleneck",
    "build_profile",
    "diagrams",
    "drift_table",
    "extract_snapshot",
    "load_model",
    "load_snapshot",
    "run_finetune",
    "save_snapshot",
    "stream_snapshot",
    "wasserstein",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'topotuner_lab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


if TYPE_CHECKING:  # for type checkers and IDEs; at run time the names above load on first use
    from .distances import bottleneck, wasserstein
    from .drift import DriftCache, DriftSettings, drift_table
    from .early_stopping import TopologicalEarlyStopping
    from .errors import TopoTunerError
    from .finetune import FinetuneConfig, run_finetune
    from .models import load_model
    from .persistence import PersistenceSettings, diagrams
    from .profiles import ModelIdentity, ProfileCard, apply_profile, build_profile
    from .snapshot import Snapshot, extract_snapshot, load_snapshot, save_snapshot
    from .streaming import stream_snapshot
