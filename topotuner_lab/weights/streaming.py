"""Streaming extraction: a snapshot straight from safetensors checkpoints, one tensor at a time.

No model is instantiated: the checkpoint's index (``model.safetensors.index.json``) or single file says
where each attention tensor lives; each one is read on its own (bf16, fp16 or fp32), converted to float32,
written into the snapshot file and dropped. Peak memory is about one matrix plus the reader, whatever the
model size (an 8B model's float32 attention matrices alone are ~5 GB). The snapshot file is written with a
reserved header that is filled in at the end (weight and metadata hashes), then renamed into place.

The fine-tuned side can be a full checkpoint folder, a profile run's checkpoint (only the trainable tensors,
the rest read from the base), or a LoRA adapter folder, merged on the fly (W + scale * B A).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from topotuner_lab._io.atomic import atomic_path
from topotuner_lab._io.errors import InputFileError, ModelLoadError
from topotuner_lab.weights.projections import Projection, projections_in
from topotuner_lab.weights.snapshot import FORMAT, combine_hashes, matrix_hash, metadata_hash

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_HASH_PLACEHOLDER = "0" * 32  # blake2b-128 hex digests have this length


@dataclass
class Checkpoint:
    """Where each tensor of a safetensors checkpoint lives, and its shape (read from the headers only)."""

    folder: Path
    files: dict[str, Path]  # tensor name -> shard
    shapes: dict[str, tuple[int, ...]]
    config: dict[str, Any]

    @classmethod
    def open(cls, source: str | os.PathLike[str]) -> Checkpoint:
        """A checkpoint folder (``config.json`` + safetensors, sharded or not), indexed from its headers."""
        folder = Path(source)
        if not folder.is_dir() or not (folder / "config.json").is_file():
            raise ModelLoadError(
                f"{folder} is not a checkpoint folder with config.json", "point at a folder written by save_pretrained"
            )
        if (folder / INDEX).is_file():
            weight_map = json.loads((folder / INDEX).read_text())["weight_map"]
            shards = sorted(set(weight_map.values()))
        elif (folder / SINGLE).is_file():
            shards = [SINGLE]
        else:
            raise ModelLoadError(
                f"{folder} holds no {SINGLE} and no {INDEX}",
                "save the model with safetensors (save_pretrained's default)",
            )
        files, shapes = _scan([folder / shard for shard in shards])
        return cls(folder, files, shapes, json.loads((folder / "config.json").read_text()))

    @property
    def model_type(self) -> str:
        """The config's ``model_type`` (``"unknown"`` when absent)."""
        return str(self.config.get("model_type", "unknown"))

    @property
    def total_params(self) -> int:
        """Parameters of all the checkpoint's tensors."""
        return int(sum(np.prod(s) for s in self.shapes.values()))

    def read(self, name: str) -> np.ndarray:
        """One tensor as float32 (bf16/fp16 converted); the shard is opened for this read only (pages released)."""
        from safetensors import safe_open

        with safe_open(str(self.files[name]), framework="pt") as handle:
            return handle.get_tensor(name).float().numpy()


def _attention(checkpoint: Checkpoint) -> list[Projection]:
    return projections_in(checkpoint.shapes.items(), checkpoint.model_type)


def _lora_delta(adapter: Path, proj: Projection, cache: dict[str, Any]) -> np.ndarray | None:
    """The LoRA delta scale * B @ A for this projection's parameter, or None if the adapter does not touch it."""
    from safetensors import safe_open

    if "config" not in cache:
        cache["config"] = json.loads((adapter / ADAPTER_CONFIG).read_text())
        with safe_open(str(adapter / ADAPTER_WEIGHTS), framework="pt") as handle:
            cache["names"] = list(handle.keys())
    cfg = cache["config"]
    stem = proj.param_name.removesuffix(".weight")
    a_name = next((n for n in cache["names"] if n.endswith(f"{stem}.lora_A.weight")), None)
    b_name = next((n for n in cache["names"] if n.endswith(f"{stem}.lora_B.weight")), None)
    if a_name is None or b_name is None:
        return None
    with safe_open(str(adapter / ADAPTER_WEIGHTS), framework="pt") as handle:
        lora_a, lora_b = handle.get_tensor(a_name).float().numpy(), handle.get_tensor(b_name).float().numpy()
    rank = lora_a.shape[0]
    scale = cfg.get("lora_alpha", rank) / (np.sqrt(rank) if cfg.get("use_rslora") else rank)
    delta = (lora_b @ lora_a) * np.float32(scale)
    return delta.T if cfg.get("fan_in_fan_out") else delta


def _matrices(
    base: Checkpoint, overlay: Checkpoint | None, adapter: Path | None
) -> Iterator[tuple[Projection, np.ndarray]]:
    cache: dict[str, Any] = {}
    for proj in _attention(base):
        source = overlay if overlay is not None and proj.param_name in overlay.files else base
        weight = source.read(proj.param_name)
        if adapter is not None:
            delta = _lora_delta(adapter, proj, cache)
            if delta is not None:
                weight = weight + delta
        yield proj, np.ascontiguousarray(proj.from_weight(weight), dtype=np.float32)


def _header(shapes: dict[str, tuple[int, ...]], meta: dict[str, str], reserve: int = 0) -> bytes:
    entries: dict[str, Any] = {"__metadata__": meta}
    offset = 0
    for pid, (rows, cols) in shapes.items():
        size = rows * cols * 4
        entries[pid] = {"dtype": "F32", "shape": [rows, cols], "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(entries, separators=(",", ":")).encode()
    width = max(len(raw), reserve)
    width += -width % 8  # keep the data 8-byte aligned, as safetensors does
    return raw + b" " * (width - len(raw))


def stream_snapshot(
    source: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    base: str | os.PathLike[str] | None = None,
    name: str | None = None,
    base_model: str | None = None,
    note: str = "",
) -> Path:
    """Write the attention matrices of a checkpoint as a snapshot, one tensor in memory at a time.

    Parameters
    ----------
    source : a checkpoint folder (``config.json`` + safetensors, sharded or not), or, with ``base``, a folder holding
        only some tensors (a profile run's checkpoint: ``trainable.safetensors``) or a LoRA adapter
        (``adapter_config.json``).
    output : the snapshot file to write (``.safetensors``), atomically.
    base : the pretrained checkpoint folder the tensors missing from ``source`` (or the adapter's base) come from.
    name, base_model : the names recorded in the snapshot (default: the folder names).
    """
    source = Path(source)
    adapter = source if (source / ADAPTER_CONFIG).is_file() else None
    if base is not None:
        base_ckpt = Checkpoint.open(base)
        overlay = None if adapter is not None else _overlay(source)
    else:
        if adapter is not None:
            raise ModelLoadError(
                f"{source} is a LoRA adapter: its base model is needed",
                "pass base=<pretrained checkpoint folder> (--base on the CLI)",
            )
        base_ckpt, overlay = Checkpoint.open(source), None
    projections = _attention(base_ckpt)
    shapes = {
        p.pid: tuple(int(x) for x in p.from_weight(np.empty(base_ckpt.shapes[p.param_name], dtype=np.bool_)).shape)
        for p in projections
    }
    model_name = name or (source.name if base is None else f"{Path(base).name}+{source.name}")
    meta = {
        "format": FORMAT,
        "model": model_name,
        "base_model": base_model or (Path(base).name if base is not None else model_name),
        "revision": "local",
        "architecture": base_ckpt.model_type,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "note": note or "streamed from safetensors",
        "total_params": str(base_ckpt.total_params),
        "weights_hash": _HASH_PLACEHOLDER,
        "shapes": json.dumps({pid: list(s) for pid, s in shapes.items()}),
    }
    reserve = len(_header(shapes, {**meta, "meta_hash": _HASH_PLACEHOLDER}))
    hashes: dict[str, str] = {}
    with atomic_path(output) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(struct.pack("<Q", reserve) + b" " * reserve)
            for proj, matrix in _matrices(base_ckpt, overlay, adapter):
                hashes[proj.pid] = matrix_hash(matrix)
                fh.write(matrix.tobytes())
            meta["weights_hash"] = combine_hashes(hashes)
            header = _header(shapes, {**meta, "meta_hash": metadata_hash(meta)}, reserve)
            if len(header) != reserve:  # cannot happen: same fields, hashes of fixed length
                raise RuntimeError("snapshot header outgrew its reserved space")
            fh.seek(8)
            fh.write(header)
    return Path(output)


def _scan(paths: list[Path]) -> tuple[dict[str, Path], dict[str, tuple[int, ...]]]:
    """Which file holds each tensor, and its shape, from the safetensors headers alone."""
    from safetensors import safe_open

    files, shapes = {}, {}
    for path in paths:
        try:
            with safe_open(str(path), framework="pt") as handle:
                for name in handle.keys():
                    files[name], shapes[name] = path, tuple(handle.get_slice(name).get_shape())
        except Exception as exc:  # noqa: BLE001 - safetensors raises several types for damaged files
            raise InputFileError(
                f"safetensors file {path} cannot be read ({exc})", "re-download or re-save the checkpoint"
            ) from exc
    return files, shapes


def _overlay(folder: Path) -> Checkpoint:
    """A folder of some tensors (a profile checkpoint's ``trainable.safetensors``, or any safetensors files)."""
    files, shapes = _scan(sorted(folder.glob("*.safetensors")))
    if not files:
        raise ModelLoadError(
            f"{folder} holds no safetensors files",
            "point at a checkpoint, a profile run's checkpoint or a LoRA adapter folder",
        )
    return Checkpoint(folder, files, shapes, {})


def is_streamable(source: str | os.PathLike[str]) -> bool:
    """True for a local checkpoint folder with safetensors weights (extraction then needs no model)."""
    folder = Path(source)
    return (
        folder.is_dir()
        and (folder / "config.json").is_file()
        and ((folder / INDEX).is_file() or (folder / SINGLE).is_file())
    )
