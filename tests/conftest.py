"""Shared fixtures: an isolated cache folder and tiny in-memory models."""

from __future__ import annotations

import numpy as np
import pytest

from topotuner_lab._io.paths import model_cache_dir
from topotuner_lab.weights.extract import extract_snapshot
from topotuner_lab.weights.models import build_tiny_model


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    """Every test writes caches under its own tmp folder, never the user's; only the embedded model's float32
    export is shared (it takes ~20 s and ~0.5 GB to make), in the user's model cache."""
    monkeypatch.setenv("TOPOTUNER_MODEL_CACHE", str(model_cache_dir()))
    monkeypatch.setenv("TOPOTUNER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def tiny_llama():
    return build_tiny_model("tiny-llama", seed=0)


@pytest.fixture
def tiny_snapshot(tiny_llama):
    return extract_snapshot(tiny_llama)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
