"""Atomic file writes: write to a temporary file beside the target, then rename.

A crash or Ctrl-C mid-write leaves either the old file or the new one, never a torn file.
Files get the permissions a plain ``open()`` would give them (``0o666`` less the umask), not the
``0o600`` of the temporary file.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str], *, is_dir: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to ``target``; on success rename it onto ``target``."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{target.name}."
    if is_dir:
        tmp = Path(tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=target.parent))
    else:
        fd, name = tempfile.mkstemp(prefix=prefix, suffix=".tmp" + target.suffix, dir=target.parent)
        os.close(fd)
        tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, (0o777 if is_dir else 0o666) & ~_umask())
        if is_dir and target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise


def write_bytes(target: str | os.PathLike[str], data: bytes) -> Path:
    """Atomically write ``data`` to ``target``."""
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)
    return Path(target)


def write_text(target: str | os.PathLike[str], text: str) -> Path:
    """Atomically write UTF-8 ``text`` to ``target``."""
    return write_bytes(target, text.encode("utf-8"))


def write_json(target: str | os.PathLike[str], obj: Any) -> Path:
    """Atomically write ``obj`` as indented JSON."""
    return write_text(target, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
