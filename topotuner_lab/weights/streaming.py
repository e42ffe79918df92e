"""Streaming extraction: a snapshot straight from safetensors checkpoints, one tensor at a time.

No model is instantiated: the checkpoint's index (``model.safetensors.index.json``) or single file says
where each attention tensor lives (:mod:`topotuner_lab.weights.checkpoint` checks the index against the shards,
the dtypes and each projection's shape against ``config.json``); each one is read on its own (bf16, fp16, fp32, or
FP8 dequantized), converted to float32, written into the snapshot file and dropped. Peak memory is about one matrix
plus the reader, whatever the model size or layer count (an 8B model's float32 attention matrices alone are ~5 GB).
The snapshot file is written with a reserved header that is filled in at the end (weight and metadata hashes); every
matrix is checked against the header before it is written, and the finished file is verified (read back in chunks)
before it is renamed into place, so a bad input never replaces a good snapshot.

The fine-tuned side can be a full checkpoint folder, a profile run's checkpoint (only the trainable tensors, the rest
read from the base), a finished profile run (its ``after.safetensors``), or a LoRA adapter folder, merged on the fly
by peft's own layers (:mod:`topotuner_lab.weights.adapters`).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from topotuner_lab._io.atomic import atomic_path
from topotuner_lab._io.errors import InputFileError, ModelLoadError, ParameterError, SnapshotMismatchError
from topotuner_lab.weights.adapters import LoraAdapter, is_adapter, needs_base_error
from topotuner_lab.weights.checkpoint import INDEX, SINGLE, Checkpoint
from topotuner_lab.weights.projections import KINDS, Projection, expected_layers, expected_shape, projections_in
from topotuner_lab.weights.snapshot import (
    FORMAT,
    LEGACY_FORMATS,
    combine_hashes,
    load_snapshot,
    matrix_hash,
    metadata_hash,
    snapshot_metadata,
)

RUN_SNAPSHOT = "after.safetensors"  # what a finished profile run keeps (with --save-snapshot)
_HASH_PLACEHOLDER = "0" * 32  # blake2b-128 hex digests have this length
_RESAVE = "re-save the model with save_pretrained (or re-download the checkpoint)"
Matrices = Iterator[tuple[str, np.ndarray]]


def _plan(checkpoint: Checkpoint) -> tuple[list[Projection], dict[str, tuple[int, int]]]:
    """The checkpoint's attention projections and each one's (out x in) shape, checked against its config."""
    projections = projections_in(checkpoint.shapes.items(), checkpoint.model_type)
    shapes: dict[str, tuple[int, int]] = {}
    for proj in projections:
        stored = checkpoint.shapes[proj.param_name]
        if len(stored) != 2 or 0 in stored:
            raise InputFileError(
                f"{proj.param_name} in {checkpoint.folder} has shape {stored}: an attention projection is a non-empty "
                "matrix",
                _RESAVE,
            )
        checkpoint.check_weight(proj.param_name)
        rows, cols = proj.from_weight(np.empty(stored, dtype=np.bool_)).shape
        expected = expected_shape(checkpoint.config, checkpoint.model_type, proj.kind)
        if (expected is not None and (rows, cols) != expected) or rows == 0:
            raise InputFileError(
                f"{proj.param_name} in {checkpoint.folder} gives a {proj.kind} matrix of shape {(rows, cols)}, but its "
                f"config.json says {expected}: the weights do not belong to this config",
                _RESAVE,
            )
        shapes[proj.pid] = (int(rows), int(cols))
    layers = expected_layers(checkpoint.config) or 1 + max(p.layer for p in projections)
    missing = [f"L{i}.{k}" for i in range(layers) for k in KINDS if f"L{i}.{k}" not in shapes]
    extra = [pid for pid in shapes if int(pid[1:].split(".")[0]) >= layers]
    if missing or extra:
        raise InputFileError(
            f"{checkpoint.folder} does not hold the attention projections of its {layers} layers: "
            + (f"missing {missing[:4]}" if missing else f"extra {extra[:4]}"),
            _RESAVE,
        )
    return projections, shapes


def _matrices(projections: list[Projection], read: Callable[[str], np.ndarray]) -> Matrices:
    """Each projection as a float32 matrix; a fused weight (GPT-2's ``c_attn``) is read once for its q, k and v."""
    last: tuple[str, np.ndarray] | None = None
    for proj in projections:
        if last is None or last[0] != proj.param_name:
            last = None  # drop the previous weight before reading the next
            last = (proj.param_name, read(proj.param_name))
        yield proj.pid, np.ascontiguousarray(proj.from_weight(last[1]), dtype=np.float32)


def _header(shapes: dict[str, tuple[int, int]], meta: dict[str, str], reserve: int = 0) -> bytes:
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


def _write(output: Path, shapes: dict[str, tuple[int, int]], meta: dict[str, str], matrices: Matrices) -> Path:
    """Write the snapshot: each matrix checked against the header first, the file verified before it is renamed."""
    meta = {**meta, "weights_hash": _HASH_PLACEHOLDER, "shapes": json.dumps({p: list(s) for p, s in shapes.items()})}
    reserve = len(_header(shapes, {**meta, "meta_hash": _HASH_PLACEHOLDER}))
    hashes: dict[str, str] = {}
    expected = iter(shapes.items())
    with atomic_path(output) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(struct.pack("<Q", reserve) + b" " * reserve)
            for pid, matrix in matrices:
                want = next(expected, None)
                if want != (pid, matrix.shape) or matrix.dtype != np.float32 or pid in hashes:
                    raise InputFileError(
                        f"projection {pid} came out as {matrix.dtype} {matrix.shape}, where the snapshot's header "
                        f"expects {want}: the fine-tuned tensors do not fit the base",
                        "pass the --base the fine-tuned model was trained from",
                    )
                hashes[pid] = matrix_hash(matrix)
                fh.write(matrix.data)
            if len(hashes) != len(shapes):
                raise InputFileError(f"only {len(hashes)} of {len(shapes)} projections could be read", _RESAVE)
            meta["weights_hash"] = combine_hashes(hashes)
            header = _header(shapes, {**meta, "meta_hash": metadata_hash(meta)}, reserve)
            if len(header) != reserve:  # cannot happen: same fields, hashes of fixed length
                raise RuntimeError("snapshot header outgrew its reserved space")
            fh.seek(8)
            fh.write(header)
        load_snapshot(tmp)  # read back and verified before it replaces anything at ``output``
    return output


def _overlay(folder: Path, base: Checkpoint, projections: list[Projection]) -> Checkpoint:
    """A folder of some of the base's tensors (a profile checkpoint's ``trainable.safetensors``), checked against it."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        kept = sorted(folder.glob("checkpoint-*/*.safetensors"), key=lambda p: int(p.parent.name.split("-")[-1]))
        if kept:
            raise ModelLoadError(
                f"{folder} holds no weights of its own, only checkpoints",
                f"point at the checkpoint to extract, e.g. the last one: {kept[-1].parent}",
            )
        if (folder / "results.json").is_file():
            raise ModelLoadError(
                f"{folder} is a finished run that kept neither its snapshot ({RUN_SNAPSHOT}) nor its checkpoints",
                "run it again with --save-snapshot (or --keep-checkpoints)",
            )
        raise ModelLoadError(
            f"{folder} holds no safetensors files",
            "point at a checkpoint, a profile run's checkpoint or a LoRA adapter folder",
        )
    overlay = Checkpoint.of_files(folder, files, base.config)
    unknown = sorted(set(overlay.files) - set(base.files))
    if unknown:
        raise InputFileError(
            f"{folder} holds tensors the base {base.folder} does not have: {unknown[:3]}",
            "pass the --base this checkpoint was trained from (a snapshot file is used as it is, not extracted)",
        )
    for name in overlay.files:
        if overlay.shapes[name] != base.shapes[name]:
            raise InputFileError(
                f"{name} in {overlay.files[name]} has shape {overlay.shapes[name]}, the base's {base.shapes[name]}",
                "pass the --base this checkpoint was trained from",
            )
    touched = [p.param_name for p in projections if p.param_name in overlay.files]
    if not touched:
        raise InputFileError(
            f"{folder} changes no attention projection of the base (it holds {sorted(overlay.files)[:3]}): its "
            "snapshot would be the base's",
            "point at a checkpoint of a run that trained attention projections",
        )
    for name in touched:
        overlay.check_weight(name)
    return overlay


def _run_snapshot(folder: Path) -> Path | None:
    """A finished profile run's own snapshot (``after.safetensors``), if the folder holds one."""
    path = folder / RUN_SNAPSHOT
    try:
        fmt = snapshot_metadata(path).get("format") if path.is_file() else None
    except Exception:  # noqa: BLE001 - not a readable safetensors file: then it is not a snapshot
        return None
    return path if fmt == FORMAT or fmt in LEGACY_FORMATS else None


def _from_run(path: Path, base: Checkpoint, shapes: dict[str, tuple[int, int]]) -> tuple[dict[str, str], Matrices]:
    """A finished run's verified snapshot, checked to be of the base's model: its identity and its matrices."""
    snap = load_snapshot(path)
    if snap.shapes != shapes or snap.architecture != base.model_type:
        raise SnapshotMismatchError(
            f"the run's snapshot {path} is of another model ({snap.model}: {snap.architecture}, {len(snap.shapes)} "
            f"matrices) than the base {base.folder} ({base.model_type}, {len(shapes)})",
            "pass the --base the run was trained from",
        )
    identity = {"model": snap.model, "base_model": snap.base_model, "note": snap.note}
    identity["total_params"] = str(snap.total_params or base.total_params)

    def matrices() -> Matrices:
        for pid in list(snap.matrices):
            yield pid, np.array(snap.matrices.pop(pid))  # each memory map is released once copied

    return identity, matrices()


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
    source : str or os.PathLike
        A checkpoint folder (``config.json`` + safetensors, sharded or not), or, with ``base``, a folder holding
        only some tensors (a profile run's checkpoint: ``trainable.safetensors``), a finished profile run (its
        ``after.safetensors`` is used) or a LoRA adapter (``adapter_config.json``).
    output : str or os.PathLike
        The snapshot file to write (``.safetensors``), atomically, verified before it replaces anything.
    base : str or os.PathLike, optional
        The pretrained checkpoint folder the tensors missing from ``source`` (or the adapter's base) come from.
    name, base_model : str, optional
        The names recorded in the snapshot (default: the folder names).
    note : str
        Free text recorded in the snapshot (default: ``"streamed from safetensors"``).

    Returns
    -------
    pathlib.Path
        The snapshot file, readable with :func:`load_snapshot`.

    Raises
    ------
    ModelLoadError
        ``source`` (or ``base``) is not a checkpoint folder, or an adapter comes without ``base``.
    InputFileError
        The checkpoint's index, shards, dtypes or shapes do not agree with each other or with ``config.json``.
    SnapshotMismatchError
        A run's snapshot is of another model than ``base``.
    ParameterError
        ``output`` is the run's own snapshot.
    UnsupportedArchitectureError
        The checkpoint's architecture has no known attention projections.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from topotuner_lab import extract_snapshot, load_model, load_snapshot, stream_snapshot
    >>> loaded = load_model("tiny-llama")
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     loaded.model.save_pretrained(Path(folder) / "ckpt")
    ...     path = stream_snapshot(Path(folder) / "ckpt", Path(folder) / "ckpt.safetensors", name="tiny-llama")
    ...     streamed = load_snapshot(path)
    ...     print(streamed.model, streamed.weights_hash == extract_snapshot(loaded).weights_hash)
    tiny-llama True
    """
    source, output = Path(source), Path(output)
    if not source.is_dir():
        raise ModelLoadError(
            f"{source} is not a folder", "point at a checkpoint, a profile run (or its checkpoint) or an adapter folder"
        )
    if base is None and is_adapter(source):
        raise needs_base_error(source)
    checkpoint = Checkpoint.open(source if base is None else base)
    projections, shapes = _plan(checkpoint)
    model_name = name or (source.name if base is None else f"{Path(base).name}+{source.name}")
    identity = {
        "model": model_name,
        "base_model": base_model or (Path(base).name if base is not None else model_name),
        "note": note or "streamed from safetensors",
        "total_params": str(checkpoint.total_params),
    }
    run = _run_snapshot(source) if base is not None and not is_adapter(source) else None
    if run is not None:
        if output.resolve() == run.resolve():
            raise ParameterError(f"the output {output} is the run's own snapshot", "choose another output path")
        recorded, matrices = _from_run(run, checkpoint, shapes)
        identity = {**recorded, **{k: v for k, v in (("model", name), ("base_model", base_model)) if v}}
        identity["note"] = note or recorded["note"]
    else:
        read: Callable[[str], np.ndarray] = checkpoint.read
        if base is not None and is_adapter(source):
            adapter = LoraAdapter(source, checkpoint)
            read = lambda param: adapter.merge(param, checkpoint.read(param))
        elif base is not None:
            overlay = _overlay(source, checkpoint, projections)
            read = lambda param: (overlay if param in overlay.files else checkpoint).read(param)
        matrices = _matrices(projections, read)
    meta = {
        "format": FORMAT,
        "model": identity["model"],
        "base_model": identity["base_model"],
        "revision": "local",
        "architecture": checkpoint.model_type,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "note": identity["note"],
        "total_params": identity["total_params"],
    }
    return _write(output, shapes, meta, matrices)


def is_streamable(source: str | os.PathLike[str]) -> bool:
    """True for a local checkpoint folder with safetensors weights (extraction then needs no model)."""
    folder = Path(source)
    return (
        folder.is_dir()
        and (folder / "config.json").is_file()
        and ((folder / INDEX).is_file() or (folder / SINGLE).is_file())
    )
