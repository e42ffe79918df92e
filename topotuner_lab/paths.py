"""Where the package keeps its caches (kept free of heavy imports: drift workers import it)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where exported models and drift caches live: ``$TOPOTUNER_CACHE`` or ``~/.cache/topotuner_lab``."""
    return Path(os.environ.get("TOPOTUNER_CACHE", Path.home() / ".cache" / "topotuner_lab"))
