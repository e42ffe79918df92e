"""Shared fixtures: an isolated cache folder and tiny in-memory models."""

from __future__ import annotations

import numpy as np
import pytest

from topotuner_lab.models import build_tiny_model
from topotuner_lab.snapshot import extract_snapshot


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    """Every test writes caches under its own tmp folder, never the user's (the embedded export excepted)."""
    monkeypatch.setenv("TOPOTUNER_TEST_TMP", str(tmp_path))
    return tmp_path


@pytest.fixture
def tiny_llama():
    return build_tiny_model("tiny-llama", seed=0)


@pytest.fixture
def tiny_snapshot(tiny_llama):
    return extract_snapshot(tiny_llama)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
