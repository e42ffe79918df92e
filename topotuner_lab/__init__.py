"""TopoTuner Lab: topology-guided fine-tuning of language models, as a Jupyter workbench.

Attention projection matrices are point clouds of their rows; their Vietoris–Rips persistence
diagrams and the Wasserstein drift between them rank matrices for freezing profiles and drive
topology-based early stopping.

The main entry points are importable from the package itself::

    from topotuner_lab.weights.models import load_model
    from topotuner_lab.drift.compute import drift_table
    from topotuner_lab.drift.settings import DriftSettings
    from topotuner_lab.profiles.select import CardSettings, build_profile
    from topotuner_lab.profiles.card import ProfileCard

They load lazily, so ``import topotuner_lab`` stays light (drift worker processes never import torch).
The package is built in floors, each importing only from the ones below it (checked by ``make lint``)::

    cli        the ``topotuner-lab`` command
    lab        figures, widgets, the Markdown report, the notebooks' facade and runner
    study      presets, the planned runs, the resumable protocol, claims and statistics
    training   config, trainer, callbacks (early stopping), evaluation, results
    tasks      task specs and data loading
    profiles   card schema and JSON (no torch), selection, apply (torch), compare
    drift      settings, columns, cache, pairs, executors, tables, noise floor
    weights    projections, snapshots, extraction, streaming, model loading
    topology   persistence diagrams, diagram distances, magnitude baselines (numpy/scipy only)
    _io        errors, config idiom, atomic writes, paths, output checks
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

from topotuner_lab._io.lazy import lazy_exports

try:
    __version__ = version("topotuner-lab")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

#: public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "Diagrams": ".topology.persistence",
    "PersistenceSettings": ".topology.persistence",
    "diagrams": ".topology.persistence",
    "wasserstein": ".topology.distances",
    "bottleneck": ".topology.distances",
    "Snapshot": ".weights.snapshot",
    "load_snapshot": ".weights.snapshot",
    "save_snapshot": ".weights.snapshot",
    "perturb_snapshot": ".weights.snapshot",
    "extract_snapshot": ".weights.extract",
    "stream_snapshot": ".weights.streaming",
    "load_model": ".weights.models",
    "DriftSettings": ".drift.settings",
    "DriftCache": ".drift.cache",
    "drift_table": ".drift.compute",
    "load_table": ".drift.tables",
    "save_table": ".drift.tables",
    "noise_check": ".drift.noise",
    "ProfileCard": ".profiles.card",
    "ModelIdentity": ".profiles.card",
    "build_profile": ".profiles.select",
    "CardSettings": ".profiles.select",
    "apply_profile": ".profiles.apply",
    "compare_cards": ".profiles.compare",
    "export_card": ".profiles.export",
    "upstream_card": ".profiles.upstream",
    "TopologicalEarlyStopping": ".training.early_stopping",
    "FinetuneConfig": ".training.config",
    "run_finetune": ".training.finetune",
    "transfer_check": ".training.transfer",
    "TopoTunerError": "._io.errors",
    "InputFileError": "._io.errors",
    "ModelLoadError": "._io.errors",
    "UnsupportedArchitectureError": "._io.errors",
    "SnapshotMismatchError": "._io.errors",
    "InvalidMatrixError": "._io.errors",
    "ProfileError": "._io.errors",
    "TaskError": "._io.errors",
    "ParameterError": "._io.errors",
}
__all__ = [
    "CardSettings",
    "Diagrams",
    "DriftCache",
    "DriftSettings",
    "FinetuneConfig",
    "InputFileError",
    "InvalidMatrixError",
    "ModelIdentity",
    "ModelLoadError",
    "ParameterError",
    "PersistenceSettings",
    "ProfileCard",
    "ProfileError",
    "Snapshot",
    "SnapshotMismatchError",
    "TaskError",
    "TopoTunerError",
    "TopologicalEarlyStopping",
    "UnsupportedArchitectureError",
    "apply_profile",
    "bottleneck",
    "build_profile",
    "compare_cards",
    "diagrams",
    "drift_table",
    "export_card",
    "extract_snapshot",
    "load_model",
    "load_snapshot",
    "load_table",
    "noise_check",
    "perturb_snapshot",
    "run_finetune",
    "save_snapshot",
    "save_table",
    "stream_snapshot",
    "transfer_check",
    "upstream_card",
    "wasserstein",
]
__getattr__, _dir = lazy_exports(__name__, _EXPORTS)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


if TYPE_CHECKING:  # for type checkers and IDEs; at run time the names above load on first use
    from topotuner_lab._io.errors import (
        InputFileError,
        InvalidMatrixError,
        ModelLoadError,
        ParameterError,
        ProfileError,
        SnapshotMismatchError,
        TaskError,
        TopoTunerError,
        UnsupportedArchitectureError,
    )
    from topotuner_lab.drift.cache import DriftCache
    from topotuner_lab.drift.compute import drift_table
    from topotuner_lab.drift.noise import noise_check
    from topotuner_lab.drift.settings import DriftSettings
    from topotuner_lab.drift.tables import load_table, save_table
    from topotuner_lab.profiles.apply import apply_profile
    from topotuner_lab.profiles.card import ModelIdentity, ProfileCard
    from topotuner_lab.profiles.compare import compare_cards
    from topotuner_lab.profiles.export import export_card
    from topotuner_lab.profiles.select import CardSettings, build_profile
    from topotuner_lab.profiles.upstream import upstream_card
    from topotuner_lab.topology.distances import bottleneck, wasserstein
    from topotuner_lab.topology.persistence import Diagrams, PersistenceSettings, diagrams
    from topotuner_lab.training.config import FinetuneConfig
    from topotuner_lab.training.early_stopping import TopologicalEarlyStopping
    from topotuner_lab.training.finetune import run_finetune
    from topotuner_lab.training.transfer import transfer_check
    from topotuner_lab.weights.extract import extract_snapshot
    from topotuner_lab.weights.models import load_model
    from topotuner_lab.weights.snapshot import Snapshot, load_snapshot, perturb_snapshot, save_snapshot
    from topotuner_lab.weights.streaming import stream_snapshot
