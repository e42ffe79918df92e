"""Lazy public names for a package: ``import topotuner_lab`` (or a floor) stays light, each name loads on first use.

Drift worker processes import the package without pulling in torch; a notebook gets every entry point from one place.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, whose public ``name`` lives in module ``exports[name]``.

    Module paths are relative to ``package`` (``".settings"``) or absolute (``"topotuner_lab.drift.settings"``).
    """

    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(importlib.import_module(exports[name], package), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(exports)

    return __getattr__, __dir__
