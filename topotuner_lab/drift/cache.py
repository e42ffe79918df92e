"""The drift cache: diagrams per matrix and finished rows per matrix pair, on disk, keyed by content.

Every entry stores its own key and a checksum of its content; an entry that does not verify is recomputed.
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from topotuner_lab._io import atomic
from topotuner_lab._io.config import is_int
from topotuner_lab._io.errors import InputFileError, ParameterError
from topotuner_lab._io.json_files import json_digest, read_json
from topotuner_lab._io.paths import cache_dir
from topotuner_lab.drift.settings import CACHE_VERSION, DriftSettings
from topotuner_lab.topology.persistence import Diagrams, PersistenceSettings, diagrams


def is_number(value: Any) -> bool:
    """An int or float, not a bool (what a cached row may hold)."""
    return is_int(value) or isinstance(value, float)


def _arrays_digest(arrays: list[np.ndarray]) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for arr in arrays:
        arr = np.ascontiguousarray(arr, dtype=np.float64)
        digest.update(str(arr.shape).encode())
        digest.update(arr.data)
    return digest.hexdigest()


@dataclass
class DriftCache:
    """On-disk cache of diagrams (``.npz``) and finished rows (``.json``); ``root=None`` disables it.

    Every entry stores its own key and a checksum of its content. An entry that cannot be read, was
    written for another key (swapped or renamed files), or fails its checksum (bit flips, truncation)
    is recomputed and rewritten, never trusted. Rows hold only what the matrix pair determines: the
    projection id is added when the table is assembled, so identical pairs under two ids share one entry.

    Parameters
    ----------
    root : pathlib.Path or None
        The cache folder (default: ``drift`` under ``$TOPOTUNER_CACHE``, else ``~/.cache/topotuner_lab``); None
        keeps nothing (every value is computed).

    Raises
    ------
    ParameterError
        :meth:`check_writable` when the folder cannot be created or written.

    See Also
    --------
    drift_table : takes the cache as ``cache=``.

    Examples
    --------
    A diagram is computed once, then read back (verified) from disk:

    >>> import tempfile
    >>> from pathlib import Path
    >>> import numpy as np
    >>> from topotuner_lab import DriftCache, PersistenceSettings
    >>> matrix = np.random.default_rng(0).standard_normal((6, 3))
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     cache = DriftCache(Path(folder))
    ...     first = cache.diagrams("hash-of-matrix", PersistenceSettings(maxdim=0), matrix)
    ...     again = cache.diagrams("hash-of-matrix", PersistenceSettings(maxdim=0), matrix)
    ...     print(len(list(Path(folder).rglob("*.npz"))), np.array_equal(first[0], again[0]))
    1 True
    >>> DriftCache(None).get_row("any key") is None
    True
    """

    root: Path | None = field(default_factory=lambda: cache_dir() / "drift")

    def _path(self, kind: str, key: str, suffix: str) -> Path | None:
        return None if self.root is None else Path(self.root) / kind / key[:2] / f"{key}{suffix}"

    def check_writable(self) -> None:
        """Raise a clear error now, before any work, when the cache folder cannot be created or written."""
        if self.root is None:
            return
        root = Path(self.root)
        try:
            root.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=root, prefix=".probe-"):
                pass
        except OSError as exc:
            raise ParameterError(
                f"cannot write the drift cache at {root} ({exc.strerror or exc})",
                "pass --cache with a writable folder, or --no-cache",
            ) from exc

    def _read_diagrams(self, path: Path, key: str, maxdim: int) -> Diagrams | None:
        try:
            with np.load(path, allow_pickle=False) as data:
                dgms = [np.asarray(data[f"h{k}"], dtype=np.float64) for k in range(maxdim + 1)]
                ok = str(data["key"]) == key and str(data["checksum"]) == _arrays_digest(dgms)
        except Exception:  # noqa: BLE001 - any unreadable entry (zip, zlib, EOF, missing member) is recomputed
            return None
        if not ok or any(d.ndim != 2 or d.shape[1] != 2 for d in dgms):
            return None
        return Diagrams(dgms)

    def diagrams(self, mhash: str, settings: PersistenceSettings, matrix: np.ndarray) -> Diagrams:
        """Diagrams of ``matrix`` (hash ``mhash``), from a verified cache entry or computed and stored."""
        key = json_digest([mhash, settings.key(), CACHE_VERSION])
        path = self._path("diagrams", key, ".npz")
        if path is not None and path.is_file():
            cached = self._read_diagrams(path, key, settings.maxdim)
            if cached is not None:
                return cached
        dgms = diagrams(matrix, settings)
        if path is not None:
            arrays = {f"h{k}": d for k, d in enumerate(dgms.dgms)}
            with atomic.atomic_path(path) as tmp:
                with open(tmp, "wb") as fh:
                    # numpy's stub lets **kwds fill the ``allow_pickle: bool`` keyword
                    np.savez(fh, key=np.array(key), checksum=np.array(_arrays_digest(dgms.dgms)), **arrays)  # type: ignore[arg-type]
        return dgms

    def row_key(self, hash_a: str, hash_b: str, settings: DriftSettings) -> str:
        """The cache key of a pair's values: both matrices' hashes and the settings."""
        return json_digest([hash_a, hash_b, settings.key()])

    def get_row(self, key: str, columns: list[str] | None = None) -> dict[str, Any] | None:
        """The values of a finished pair, or None when absent or not verified (then it is recomputed)."""
        path = self._path("rows", key, ".json")
        if path is None or not path.is_file():
            return None
        try:
            entry = read_json(path, "drift cache row", "it is recomputed")
        except InputFileError:
            return None
        if entry.get("key") != key or not isinstance(entry.get("values"), dict):
            return None
        values = entry["values"]
        if entry.get("checksum") != json_digest(values) or not all(is_number(v) for v in values.values()):
            return None
        if columns is not None and not set(columns) <= set(values):
            return None
        return values

    def put_row(self, key: str, values: dict[str, Any]) -> None:
        """Store a finished pair's values under ``key``, with their checksum (nothing without a cache folder)."""
        path = self._path("rows", key, ".json")
        if path is not None:
            atomic.write_json(path, {"key": key, "checksum": json_digest(values), "values": values})
