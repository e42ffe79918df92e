"""Snapshots: the attention matrices of one model, saved as float32 safetensors with metadata.

Notebooks and the CLI reuse a snapshot without reloading the model. The metadata records the
model name, its base model (the pretrained model a fine-tune came from), revision, architecture,
a content hash of the matrices and each projection's shape.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from typing import TYPE_CHECKING

import numpy as np

from .atomic import atomic_path
from .errors import InputFileError, SnapshotMismatchError
from .projections import enumerate_projections, model_type, parse_pid

if TYPE_CHECKING:  # torch and transformers stay out of drift worker processes
    import torch

    from .models import LoadedModel

FORMAT = "topotuner-snapshot/1"


def matrix_hash(matrix: np.ndarray) -> str:
    """Content hash of a float32 matrix (shape included)."""
    arr = np.ascontiguousarray(matrix, dtype=np.float32)
    digest = hashlib.blake2b(str(arr.shape).encode(), digest_size=16)
    digest.update(arr.data)
    return digest.hexdigest()


def weights_hash(matrices: dict[str, np.ndarray]) -> str:
    """Hash of all matrices of a snapshot, in id order: the model's weight fingerprint."""
    digest = hashlib.blake2b(digest_size=16)
    for pid in sorted(matrices):
        digest.update(pid.encode())
        digest.update(matrix_hash(matrices[pid]).encode())
    return digest.hexdigest()


@dataclass
class Snapshot:
    """Attention matrices by projection id, plus where they came from."""

    matrices: dict[str, np.ndarray]
    model: str
    base_model: str
    revision: str
    architecture: str
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    note: str = ""

    @property
    def weights_hash(self) -> str:
        return weights_hash(self.matrices)

    @property
    def shapes(self) -> dict[str, tuple[int, int]]:
        return {pid: tuple(m.shape) for pid, m in self.matrices.items()}

    def inventory(self):
        """One row per projection: id, layer, kind, rows, cols, parameters (a DataFrame)."""
        import pandas as pd

        rows = []
        for pid, m in self.matrices.items():
            layer, kind = parse_pid(pid)
            rows.append({"pid": pid, "layer": layer, "kind": kind, "rows": m.shape[0], "cols": m.shape[1], "params": m.size})
        return pd.DataFrame(rows)

    def metadata(self) -> dict[str, str]:
        return {
            "format": FORMAT,
            "model": self.model,
            "base_model": self.base_model,
            "revision": self.revision,
            "architecture": self.architecture,
            "created": self.created,
            "note": self.note,
            "weights_hash": self.weights_hash,
            "shapes": json.dumps({pid: list(s) for pid, s in self.shapes.items()}),
        }


def _ordered(matrices: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    order = {"q": 0, "k": 1, "v": 2, "o": 3}
    return dict(sorted(matrices.items(), key=lambda kv: (parse_pid(kv[0])[0], order[parse_pid(kv[0])[1]])))


def extract_snapshot(loaded: LoadedModel | torch.nn.Module, *, name: str | None = None, base_model: str | None = None, note: str = "") -> Snapshot:
    """Copy every attention projection of a model into a float32 snapshot."""
    import torch

    from .models import LoadedModel

    if isinstance(loaded, LoadedModel):
        model, model_name, revision = loaded.model, loaded.name, loaded.revision
    else:
        model, model_name, revision = loaded, type(loaded).__name__, "in-memory"
    model_name = name or model_name
    with torch.no_grad():
        matrices = {p.pid: p.matrix(model).detach().to(torch.float32).cpu().numpy().copy() for p in enumerate_projections(model)}
    base = base_model or getattr(getattr(model, "config", None), "topotuner_base_model", None) or model_name
    return Snapshot(matrices, model_name, base, revision, model_type(model), note=note)


def save_snapshot(snapshot: Snapshot, path: str | os.PathLike[str]) -> Path:
    """Write a snapshot atomically as safetensors."""
    from safetensors.numpy import save_file

    path = Path(path)
    with atomic_path(path) as tmp:
        save_file({pid: np.ascontiguousarray(m, dtype=np.float32) for pid, m in snapshot.matrices.items()}, str(tmp), metadata=snapshot.metadata())
    return path


def load_snapshot(path: str | os.PathLike[str]) -> Snapshot:
    """Read a snapshot, with clear errors for a missing, corrupt or foreign file."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise InputFileError(f"snapshot {path} does not exist", "create it with `topotuner-lab extract MODEL -o FILE` (or check the path)")
    try:
        with safe_open(str(path), framework="numpy") as handle:
            meta = handle.metadata() or {}
            matrices = {key: handle.get_tensor(key) for key in handle.keys()}
    except Exception as exc:  # safetensors raises several types for damaged files
        raise InputFileError(
            f"snapshot {path} is not a readable safetensors file ({exc.__class__.__name__}: {exc})",
            "the file is corrupt or truncated: extract it again with `topotuner-lab extract`",
        ) from exc
    if meta.get("format") != FORMAT:
        raise InputFileError(
            f"{path} is a safetensors file but not a TopoTuner snapshot (format={meta.get('format')!r})",
            "extract a snapshot from the model with `topotuner-lab extract MODEL -o FILE`",
        )
    snap = Snapshot(_ordered(matrices), meta["model"], meta["base_model"], meta["revision"], meta["architecture"], meta["created"], meta.get("note", ""))
    stored = meta.get("weights_hash")
    if stored and stored != snap.weights_hash:
        raise InputFileError(f"snapshot {path} does not match its own weight hash (damaged file)", "extract it again with `topotuner-lab extract`")
    return snap


def check_comparable(before: Snapshot, after: Snapshot, *, allow_other_base: bool = False) -> None:
    """Raise unless two snapshots are the same model (same ids and shapes, same base model)."""
    if before.architecture != after.architecture or before.shapes != after.shapes:
        missing = sorted(set(before.shapes) ^ set(after.shapes))
        differing = sorted(p for p in set(before.shapes) & set(after.shapes) if before.shapes[p] != after.shapes[p])
        detail = f"ids only in one: {missing[:6]}" if missing else f"shapes differ at {differing[:6]}"
        raise SnapshotMismatchError(
            f"snapshots are of different models: {before.model!r} ({before.architecture}, {len(before.shapes)} matrices) vs "
            f"{after.model!r} ({after.architecture}, {len(after.shapes)} matrices); {detail}",
            "compare a pretrained snapshot with a snapshot of the same model after fine-tuning",
        )
    if before.base_model != after.base_model and not allow_other_base:
        raise SnapshotMismatchError(
            f"snapshots have the same shapes but different base models: {before.base_model!r} vs {after.base_model!r}",
            "extract the fine-tuned snapshot with `--base-model` naming the pretrained model, or pass --allow-other-base if this is intended",
        )


def perturb_snapshot(snapshot: Snapshot, scale: float = 1e-3, seed: int = 0) -> Snapshot:
    """A copy with Gaussian noise of std ``scale`` x each matrix's std: the drift noise floor."""
    rng = np.random.default_rng(seed)
    noisy = {pid: (m + rng.standard_normal(m.shape, dtype=np.float32) * np.float32(scale * float(m.std()))).astype(np.float32) for pid, m in snapshot.matrices.items()}
    return Snapshot(noisy, f"{snapshot.model}+noise({scale:g},seed={seed})", snapshot.base_model, snapshot.revision, snapshot.architecture, note=f"perturbed: scale={scale:g} seed={seed}")
