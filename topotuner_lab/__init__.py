"""TopoTuner Lab: topology-guided fine-tuning of language models, as a Jupyter workbench.

Attention projection matrices are point clouds of their rows; their Vietoris–Rips persistence
diagrams and the Wasserstein drift between them rank matrices for freezing profiles and drive
topology-based early stopping.

The main entry points are importable from the package itself::

    from topotuner_lab.weights.models import load_model
    from topotuner_lab.drift.compute import drift_table
    from topotuner_lab.drift.settings import DriftSettings
    from topotuner_lab.profiles.card import build_profile, ProfileCard

They load lazily, so ``import topotuner_lab`` stays light (drift worker processes never import torch).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

#: public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "diagrams": "topology.persistence",
    "PersistenceSettings": "topology.persistence",
    "wasserstein": "topology.distances",
    "bottleneck": "topology.distances",
    "drift_table": "drift.compute",
    "DriftSettings": "drift.compute",
    "DriftCache": "drift.compute",
    "Snapshot": "weights.snapshot",
    "extract_snapshot": "weights.snapshot",
    "load_snapshot": "weights.snapshot",
    "save_snapshot": "weights.snapshot",
    "stream_snapshot": "weights.streaming",
    "ProfileCard": "profiles.card",
    "ModelIdentity": "profiles.card",
    "build_profile": "profiles.card",
    "apply_profile": "profiles.card",
    "TopologicalEarlyStopping": "training.early_stopping",
    "load_model": "weights.models",
    "FinetuneConfig": "training.finetune",
    "run_finetune": "training.finetune",
    "TopoTunerError": "_io.errors",
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
    from topotuner_lab._io.errors import TopoTunerError
    from topotuner_lab.drift.cache import DriftCache
    from topotuner_lab.drift.compute import drift_table
    from topotuner_lab.drift.settings import DriftSettings
    from topotuner_lab.profiles.card import ModelIdentity, ProfileCard, apply_profile, build_profile
    from topotuner_lab.topology.distances import bottleneck, wasserstein
    from topotuner_lab.topology.persistence import PersistenceSettings, diagrams
    from topotuner_lab.training.early_stopping import TopologicalEarlyStopping
    from topotuner_lab.training.finetune import FinetuneConfig, run_finetune
    from topotuner_lab.weights.models import load_model
    from topotuner_lab.weights.snapshot import Snapshot, extract_snapshot, load_snapshot, save_snapshot
    from topotuner_lab.weights.streaming import stream_snapshot
