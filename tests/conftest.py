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


@pytest.fixture
def card_path(tiny_llama, tiny_snapshot, tmp_path):
    """A two-matrix card of tiny-llama ranked by drift against a perturbed copy, saved as card.json."""
    from topotuner_lab.drift.cache import DriftCache
    from topotuner_lab.drift.compute import drift_table
    from topotuner_lab.profiles.apply import identity_of
    from topotuner_lab.profiles.select import CardSettings, build_profile
    from topotuner_lab.weights.snapshot import perturb_snapshot

    table = drift_table(tiny_snapshot, perturb_snapshot(tiny_snapshot, 0.05), n_jobs=1, cache=DriftCache(None))
    card = build_profile(table, identity_of(tiny_llama.model, "tiny-llama"), CardSettings(prior_task="sst2", count=2))
    return card.save(tmp_path / "card.json")
