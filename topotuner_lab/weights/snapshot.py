"""Snapshots: the attention matrices of one model, saved as float32 safetensors with metadata.

Notebooks and the CLI reuse a snapshot without reloading the model. The metadata records the
model name, its base model (the pretrained model a fine-tune came from), revision, architecture,
a content hash of the matrices and each projection's shape.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from topotuner_lab._io.atomic import atomic_path
from topotuner_lab._io.config import POSITIVE, Check, Config, opt
from topotuner_lab._io.errors import InputFileError, SnapshotMismatchError
from topotuner_lab._io.json_files import json_digest
from topotuner_lab.weights.projections import (
    PID_PATTERN,
    parse_pid,
)

FORMAT = "topotuner-snapshot/2"
LEGACY_FORMATS: tuple[str, ...] = ("topotuner-snapshot/1",)  # no metadata hash: read, with a warning
#: the default noise std, as a fraction of each matrix's std
NOISE_SCALE = 1e-3
REQUIRED_METADATA: tuple[str, ...] = ("model", "base_model", "revision", "architecture", "created", "weights_hash")
_REEXTRACT = "extract it again with `topotuner-lab extract MODEL -o FILE`"


def matrix_hash(matrix: np.ndarray) -> str:
    """Content hash of a float32 matrix (shape included)."""
    arr = np.ascontiguousarray(matrix, dtype=np.float32)
    digest = hashlib.blake2b(str(arr.shape).encode(), digest_size=16)
    digest.update(arr.data)
    return digest.hexdigest()


def weights_hash(matrices: dict[str, np.ndarray]) -> str:
    """Hash of all matrices of a snapshot, in id order: the model's weight fingerprint."""
    return combine_hashes({pid: matrix_hash(m) for pid, m in matrices.items()})


def combine_hashes(hashes: dict[str, str]) -> str:
    """The weight fingerprint from each matrix's :func:`matrix_hash` (so a streamed snapshot needs no matrix kept)."""
    digest = hashlib.blake2b(digest_size=16)
    for pid in sorted(hashes):
        digest.update(pid.encode())
        digest.update(hashes[pid].encode())
    return digest.hexdigest()


@dataclass
class Snapshot:
    """Attention matrices by projection id, plus where they came from.

    Parameters
    ----------
    matrices : dict of str to numpy.ndarray
        Projection id (``"L0.q"``: layer, then ``q``, ``k``, ``v`` or ``o``) -> its (rows, cols) float32 matrix in
        ``nn.Linear`` layout (rows are output units), in model order.
    model : str
        The model's name (a fine-tuned model's own name).
    base_model : str
        The pretrained model a fine-tune came from (the model itself for a pretrained snapshot); two snapshots are
        compared only when it matches.
    revision : str
        Where the weights came from: a hub revision, ``"local"``, ``"in-memory"``, a tiny model's seed.
    architecture : str
        The model's ``model_type`` (``"llama"``...).
    created : str
        When the snapshot was made (UTC, ISO 8601; default: now).
    note : str
        Free text (``perturb_snapshot`` records its noise here).
    total_params : int or None
        Parameters of the whole model (budgets in percent need it); None if unknown.

    Attributes
    ----------
    weights_hash : str
        The weight fingerprint: a hash of every matrix, in id order (cards and drift tables record it).
    shapes : dict of str to tuple of int
        Each matrix's (rows, cols), by projection id.

    Raises
    ------
    ParameterError
        ``inventory()`` of a snapshot holding an id not shaped like ``"L0.q"``.

    See Also
    --------
    extract_snapshot, stream_snapshot : snapshots of a model or a checkpoint.
    save_snapshot, load_snapshot : the snapshot file.

    Examples
    --------
    >>> import numpy as np
    >>> from topotuner_lab import Snapshot
    >>> rng = np.random.default_rng(0)
    >>> matrices = {pid: rng.standard_normal((6, 4), dtype=np.float32) for pid in ("L0.q", "L0.k", "L0.v", "L0.o")}
    >>> snap = Snapshot(matrices, model="toy", base_model="toy", revision="r0", architecture="llama")
    >>> snap.shapes["L0.q"], len(snap.weights_hash)
    ((6, 4), 32)
    >>> snap.inventory()[["pid", "layer", "kind", "params"]]
        pid  layer kind  params
    0  L0.q      0    q      24
    1  L0.k      0    k      24
    2  L0.v      0    v      24
    3  L0.o      0    o      24
    """

    matrices: dict[str, np.ndarray]
    model: str
    base_model: str
    revision: str
    architecture: str
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    note: str = ""
    total_params: int | None = None  # parameters of the whole model (for budgets in percent); None if unknown

    @property
    def weights_hash(self) -> str:
        """The weight fingerprint: the hash of all matrices, in id order."""
        return weights_hash(self.matrices)

    @property
    def shapes(self) -> dict[str, tuple[int, int]]:
        """The (rows, cols) shape of each matrix, by projection id."""
        return {pid: tuple(m.shape) for pid, m in self.matrices.items()}

    def inventory(self):
        """One row per projection: id, layer, kind, rows, cols, parameters (a DataFrame)."""
        import pandas as pd

        rows = []
        for pid, m in self.matrices.items():
            layer, kind = parse_pid(pid)
            rows.append(
                {"pid": pid, "layer": layer, "kind": kind, "rows": m.shape[0], "cols": m.shape[1], "params": m.size}
            )
        return pd.DataFrame(rows)

    def metadata(self) -> dict[str, str]:
        """The safetensors metadata; ``meta_hash`` covers every other field, so an edited header is caught."""
        meta = {
            "format": FORMAT,
            "model": self.model,
            "base_model": self.base_model,
            "revision": self.revision,
            "architecture": self.architecture,
            "created": self.created,
            "note": self.note,
            "total_params": "" if self.total_params is None else str(self.total_params),
            "weights_hash": self.weights_hash,
            "shapes": json.dumps({pid: list(s) for pid, s in self.shapes.items()}),
        }
        return {**meta, "meta_hash": metadata_hash(meta)}


def metadata_hash(meta: dict[str, str]) -> str:
    """Hash of a snapshot's metadata fields (``meta_hash`` itself excluded)."""
    return json_digest({k: v for k, v in meta.items() if k != "meta_hash"})


def _ordered(matrices: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    order = {"q": 0, "k": 1, "v": 2, "o": 3}
    return dict(sorted(matrices.items(), key=lambda kv: (parse_pid(kv[0])[0], order[parse_pid(kv[0])[1]])))


def save_snapshot(snapshot: Snapshot, path: str | os.PathLike[str]) -> Path:
    """Write a snapshot atomically as safetensors.

    The matrices are stored as float32 tensors named by projection id; the metadata records the snapshot's fields,
    each matrix's shape, the weight hash and a hash of the metadata itself, so :func:`load_snapshot` catches any
    damage. The file appears only once it is complete (written beside it, then renamed).

    Parameters
    ----------
    snapshot : Snapshot
        The snapshot to write.
    path : str or os.PathLike
        The file to write (``.safetensors``); its folder is created.

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    OSError
        The folder cannot be created or written.

    Examples
    --------
    >>> import numpy as np
    >>> from topotuner_lab import Snapshot
    >>> rng = np.random.default_rng(0)
    >>> matrices = {pid: rng.standard_normal((6, 4), dtype=np.float32) for pid in ("L0.q", "L0.k", "L0.v", "L0.o")}
    >>> snap = Snapshot(matrices, model="toy", base_model="toy", revision="r0", architecture="llama")
    >>> import tempfile
    >>> from pathlib import Path
    >>> from topotuner_lab import load_snapshot, save_snapshot
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = save_snapshot(snap, Path(folder) / "toy.safetensors")
    ...     print(path.name, load_snapshot(path).weights_hash == snap.weights_hash)
    toy.safetensors True
    """
    from safetensors.numpy import save_file

    path = Path(path)
    with atomic_path(path) as tmp:
        save_file(
            {pid: np.ascontiguousarray(m, dtype=np.float32) for pid, m in snapshot.matrices.items()},
            str(tmp),
            metadata=snapshot.metadata(),
        )
    return path


def _tensor_header(fh: BinaryIO) -> tuple[int, dict[str, Any]]:
    """The header size and the tensor entries of a safetensors file open at its start (metadata left out)."""
    import struct

    (size,) = struct.unpack("<Q", fh.read(8))
    header = json.loads(fh.read(size))
    header.pop("__metadata__", None)
    return size, header


def _memory_mapped(path: Path) -> dict[str, np.ndarray]:
    """The float32 tensors of a safetensors file as read-only memory maps (pages load on use, never all at once)."""
    with open(path, "rb") as fh:
        size, header = _tensor_header(fh)
    out = {}
    for key, entry in header.items():
        start, stop = entry["data_offsets"]
        shape = tuple(entry["shape"])
        if entry["dtype"] != "F32" or stop - start != 4 * int(np.prod(shape)):
            raise ValueError(f"tensor {key!r} is {entry['dtype']} {shape}, not float32 of that shape")
        out[key] = (
            np.memmap(path, dtype=np.float32, mode="r", offset=8 + size + start, shape=shape)
            if stop > start
            else np.zeros(shape, np.float32)
        )
    return out


def _file_hashes(path: Path, chunk: int = 1 << 24) -> dict[str, str]:
    """Each tensor's :func:`matrix_hash`, read from the file in chunks.

    No tensor is held whole and no page stays mapped, so verifying an 8B model's ~5 GB snapshot costs ``chunk`` bytes
    of memory, not the file's size.
    """
    hashes = {}
    buffer = memoryview(bytearray(chunk))
    with open(path, "rb") as fh:
        size, header = _tensor_header(fh)
        for key, entry in header.items():
            start, stop = entry["data_offsets"]
            digest = hashlib.blake2b(str(tuple(entry["shape"])).encode(), digest_size=16)
            fh.seek(8 + size + start)
            left = stop - start
            while left:
                got = fh.readinto(buffer[: min(left, chunk)])
                if not got:
                    raise InputFileError(f"snapshot {path} is truncated", f"the file is damaged: {_REEXTRACT}")
                digest.update(buffer[:got])
                left -= got
            hashes[key] = digest.hexdigest()
    return hashes


def snapshot_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
    """The metadata of a snapshot file, from its header alone (no check: :func:`load_snapshot` verifies)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as handle:
        return dict(handle.metadata() or {})


def load_snapshot(path: str | os.PathLike[str]) -> Snapshot:
    """Read a snapshot and verify it: format, required metadata, shapes, weight hash and metadata hash.

    Any damage (truncation, bit flips in weights or header, a foreign safetensors file) is a clear
    :class:`InputFileError`, never a wrong number. The matrices are read-only memory maps of the file, so
    an 8B model's snapshot does not need its ~5 GB in memory at once (worker processes share the pages); the weight
    hash is checked by reading the file in chunks, so loading touches none of those pages.

    Parameters
    ----------
    path : str or os.PathLike
        A snapshot file written by :func:`save_snapshot`, :func:`stream_snapshot` or ``topotuner-lab extract``.

    Returns
    -------
    Snapshot
        The verified snapshot, its matrices in model order (layer, then q, k, v, o).

    Raises
    ------
    InputFileError
        The file is missing, not a readable safetensors file, not a TopoTuner snapshot, lacks metadata, or does not
        match its own shapes, weight hash or metadata hash (a damaged or edited file).

    Warns
    -----
    UserWarning
        A snapshot of the older format ``topotuner-snapshot/1``, whose metadata no hash covers.

    Examples
    --------
    A flipped bit in the weights is caught:

    >>> import numpy as np
    >>> from topotuner_lab import Snapshot
    >>> rng = np.random.default_rng(0)
    >>> matrices = {pid: rng.standard_normal((6, 4), dtype=np.float32) for pid in ("L0.q", "L0.k", "L0.v", "L0.o")}
    >>> snap = Snapshot(matrices, model="toy", base_model="toy", revision="r0", architecture="llama")
    >>> import tempfile
    >>> from pathlib import Path
    >>> from topotuner_lab import InputFileError, load_snapshot, save_snapshot
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = save_snapshot(snap, Path(folder) / "toy.safetensors")
    ...     print(load_snapshot(path).shapes == snap.shapes)
    ...     data = bytearray(path.read_bytes())
    ...     data[-1] ^= 1
    ...     _ = path.write_bytes(bytes(data))
    ...     try:
    ...         load_snapshot(path)
    ...     except InputFileError as err:
    ...         print(err.problem)
    True
    snapshot .../toy.safetensors does not match its own weight hash (damaged file)
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise InputFileError(
            f"snapshot {path} does not exist",
            "create it with `topotuner-lab extract MODEL -o FILE` (or check the path)",
        )
    try:
        with safe_open(str(path), framework="numpy") as handle:  # validates the header against the file's size
            meta = handle.metadata() or {}
        matrices = _memory_mapped(path)
    except Exception as exc:  # noqa: BLE001 - safetensors raises several types for damaged files
        raise InputFileError(
            f"snapshot {path} is not a readable safetensors file ({exc.__class__.__name__}: {str(exc)[:160]})",
            f"the file is corrupt or truncated: {_REEXTRACT}",
        ) from exc
    fmt = meta.get("format")
    if fmt != FORMAT and fmt not in LEGACY_FORMATS:
        raise InputFileError(f"{path} is a safetensors file but not a TopoTuner snapshot (format={fmt!r})", _REEXTRACT)
    missing = [k for k in REQUIRED_METADATA if not meta.get(k)]
    if missing:
        raise InputFileError(
            f"snapshot {path} lacks metadata {missing}, so its integrity cannot be checked", _REEXTRACT
        )
    if fmt == FORMAT and meta.get("meta_hash") != metadata_hash(meta):
        raise InputFileError(
            f"snapshot {path}'s metadata does not match its own hash (edited or damaged header)", _REEXTRACT
        )
    if fmt in LEGACY_FORMATS:
        warnings.warn(
            f"snapshot {path} is of the older format {fmt}: its metadata is not covered by a hash; re-extract it "
            "to protect it",
            stacklevel=2,
        )
    bad = sorted(k for k, m in matrices.items() if not PID_PATTERN.fullmatch(k) or m.ndim != 2 or m.dtype != np.float32)
    if bad:
        raise InputFileError(
            f"snapshot {path} holds tensors {bad[:5]} that are not float32 projection matrices named like 'L0.q'",
            _REEXTRACT,
        )
    try:
        total = int(meta["total_params"]) if meta.get("total_params") else None
        recorded = {pid: tuple(shape) for pid, shape in json.loads(meta.get("shapes", "{}")).items()}
    except (ValueError, TypeError, AttributeError) as exc:
        raise InputFileError(f"snapshot {path} has malformed metadata ({exc})", _REEXTRACT) from exc
    snap = Snapshot(
        _ordered(matrices),
        meta["model"],
        meta["base_model"],
        meta["revision"],
        meta["architecture"],
        meta["created"],
        meta.get("note", ""),
        total,
    )
    if recorded != snap.shapes:
        raise InputFileError(f"snapshot {path}'s tensors do not match the shapes its metadata records", _REEXTRACT)
    if meta["weights_hash"] != combine_hashes(_file_hashes(path)):
        raise InputFileError(f"snapshot {path} does not match its own weight hash (damaged file)", _REEXTRACT)
    return snap


def check_comparable(before: Snapshot, after: Snapshot, *, allow_other_base: bool = False) -> None:
    """Raise unless two snapshots are the same model (same ids and shapes, same base model)."""
    if before.architecture != after.architecture or before.shapes != after.shapes:
        missing = sorted(set(before.shapes) ^ set(after.shapes))
        differing = sorted(p for p in set(before.shapes) & set(after.shapes) if before.shapes[p] != after.shapes[p])
        if missing:
            detail = f"ids only in one: {missing[:6]}"
        elif differing:
            detail = f"shapes differ at {differing[:6]} ({before.shapes[differing[0]]} vs {after.shapes[differing[0]]})"
        else:
            detail = f"architectures differ: {before.architecture!r} vs {after.architecture!r}"
        raise SnapshotMismatchError(
            f"snapshots are of different models: {before.model!r} ({before.architecture}, {len(before.shapes)} "
            "matrices) vs "
            f"{after.model!r} ({after.architecture}, {len(after.shapes)} matrices); {detail}",
            "compare a pretrained snapshot with a snapshot of the same model after fine-tuning",
        )
    if before.base_model != after.base_model and not allow_other_base:
        raise SnapshotMismatchError(
            f"snapshots have the same shapes but different base models: {before.base_model!r} vs {after.base_model!r}",
            "extract the fine-tuned snapshot with `--base-model` naming the pretrained model, or pass "
            "--allow-other-base if this is intended",
        )


SEED = Check(lambda v: isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 0, "a whole number >= 0")


@dataclass(frozen=True)
class PerturbSettings(Config):
    """Gaussian noise added to every matrix of a snapshot (the drift noise floor)."""

    label = "perturbation"

    scale: float = opt(NOISE_SCALE, "noise std as a fraction of each matrix's std", check=POSITIVE)
    seed: int = opt(0, "noise seed", check=SEED)


def perturb_snapshot(snapshot: Snapshot, scale: float = NOISE_SCALE, seed: int = 0) -> Snapshot:
    """A copy with Gaussian noise of std ``scale`` x each matrix's std: the drift noise floor.

    Drift tables of a snapshot against such copies (one per seed) are the noise floor that :func:`noise_check`
    compares a fine-tune's drift with.

    Parameters
    ----------
    snapshot : Snapshot
        The snapshot to perturb (not changed).
    scale : float, default ``NOISE_SCALE`` (1e-3)
        Noise standard deviation as a fraction of each matrix's own standard deviation; positive.
    seed : int, default 0
        Seed of the noise (>= 0).

    Returns
    -------
    Snapshot
        The float32 noisy copy: same ids, shapes, base model, revision and architecture; its ``model`` and ``note``
        name the noise.

    Raises
    ------
    ParameterError
        ``scale`` not a positive finite number, or ``seed`` not a whole number >= 0.

    Examples
    --------
    >>> import numpy as np
    >>> from topotuner_lab import Snapshot
    >>> rng = np.random.default_rng(0)
    >>> matrices = {pid: rng.standard_normal((6, 4), dtype=np.float32) for pid in ("L0.q", "L0.k", "L0.v", "L0.o")}
    >>> snap = Snapshot(matrices, model="toy", base_model="toy", revision="r0", architecture="llama")
    >>> from topotuner_lab import perturb_snapshot
    >>> noisy = perturb_snapshot(snap, scale=1e-3, seed=1)
    >>> noisy.model, noisy.base_model, noisy.shapes == snap.shapes
    ('toy+noise(0.001,seed=1)', 'toy', True)
    >>> ratio = float(np.std(noisy.matrices["L0.q"] - snap.matrices["L0.q"]) / np.std(snap.matrices["L0.q"]))
    >>> 0.0005 < ratio < 0.002
    True
    """
    PerturbSettings(scale, seed)
    rng = np.random.default_rng(seed)
    noisy = {
        pid: (m + rng.standard_normal(m.shape, dtype=np.float32) * np.float32(scale * float(m.std()))).astype(
            np.float32
        )
        for pid, m in snapshot.matrices.items()
    }
    return Snapshot(
        noisy,
        f"{snapshot.model}+noise({scale:g},seed={seed})",
        snapshot.base_model,
        snapshot.revision,
        snapshot.architecture,
        note=f"perturbed: scale={scale:g} seed={seed}",
        total_params=snapshot.total_params,
    )
