"""Where the package keeps its caches (kept free of heavy imports: drift workers import it).

``$TOPOTUNER_CACHE`` moves every cache (drift diagrams and rows, exported models); ``$TOPOTUNER_MODEL_CACHE``
moves the exported models alone (the tests isolate the drift cache per test but share one model export).
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where exported models and drift caches live: ``$TOPOTUNER_CACHE`` or ``~/.cache/topotuner_lab``."""
    return Path(os.environ.get("TOPOTUNER_CACHE", Path.home() / ".cache" / "topotuner_lab"))


def model_cache_dir() -> Path:
    """Where exported models live: ``$TOPOTUNER_MODEL_CACHE``, else ``cache_dir() / "models"``."""
    return Path(os.environ.get("TOPOTUNER_MODEL_CACHE", cache_dir() / "models"))
