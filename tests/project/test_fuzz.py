"""Fuzzing the files users and crashes can damage: "a clean error or the correct result, never a
traceback, never a wrong number" for card JSON, drift-cache entries and snapshot bytes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from topotuner_lab._io.errors import TopoTunerError
from topotuner_lab.drift.cache import DriftCache
from topotuner_lab.drift.compute import drift_table
from topotuner_lab.profiles.card import ModelIdentity, ProfileCard
from topotuner_lab.profiles.select import CardSettings, build_profile
from topotuner_lab.weights.extract import extract_snapshot
from topotuner_lab.weights.models import build_tiny_model
from topotuner_lab.weights.snapshot import load_snapshot, perturb_snapshot, save_snapshot

FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    pre = extract_snapshot(build_tiny_model("tiny-llama"))
    post = perturb_snapshot(pre, 0.05)
    table = drift_table(pre, post, n_jobs=1, cache=DriftCache(None))
    card = build_profile(table, ModelIdentity.from_snapshot(pre), CardSettings(prior_task="sst2", count=2))
    return {
        "tmp": tmp,
        "pre": pre,
        "post": post,
        "table": table,
        "card": card.to_dict(),
        "snapshot": save_snapshot(pre, tmp / "pre.safetensors").read_bytes(),
    }


@FUZZ
@given(field=st.sampled_from(sorted(ProfileCard.__dataclass_fields__)), value=JSON, drop=st.booleans())
def test_fuzzed_cards_load_correctly_or_fail_cleanly(world, field, value, drop):
    data = {k: v for k, v in world["card"].items() if not (drop and k == field)}
    if not drop:
        data[field] = value
    try:
        card = ProfileCard.from_dict(json.loads(json.dumps(data)))
    except TopoTunerError:
        return
    # accepted: then it is a usable card whose fields have the declared types
    assert set(card.trainable) | set(card.frozen) == set(card.model.shapes) and card.trainable
    assert all(isinstance(r["score"], (int, float)) for r in card.ranking)
    card.to_markdown()


@FUZZ
@given(data=st.binary(max_size=300), which=st.integers(0, 1000), kind=st.sampled_from(["rows", "diagrams"]))
def test_fuzzed_cache_entries_never_give_a_wrong_number(world, tmp_path_factory, data, which, kind):
    root = tmp_path_factory.mktemp("cache")
    cache = DriftCache(root)
    drift_table(world["pre"], world["post"], n_jobs=1, cache=cache)
    entries = sorted((root / kind).rglob("*.*"))
    entries[which % len(entries)].write_bytes(data)
    if kind == "diagrams":
        for row in (root / "rows").rglob("*.json"):
            row.unlink()
    pd.testing.assert_frame_equal(drift_table(world["pre"], world["post"], n_jobs=1, cache=cache), world["table"])


@FUZZ
@given(position=st.integers(0, 10**9), byte=st.integers(0, 255), cut=st.booleans())
def test_fuzzed_snapshot_bytes_load_identically_or_fail_cleanly(world, position, byte, cut):
    data = bytearray(world["snapshot"])
    where = position % len(data)
    if cut:
        data = data[:where]
    else:
        data[where] = byte
    path: Path = world["tmp"] / "damaged.safetensors"
    path.write_bytes(bytes(data))
    try:
        snap = load_snapshot(path)
    except TopoTunerError:
        return
    # accepted: the same matrices and the same identity, bit for bit
    assert (
        snap.weights_hash == world["pre"].weights_hash
        and snap.model == world["pre"].model
        and snap.total_params == world["pre"].total_params
    )
    assert all(np.array_equal(snap.matrices[p], world["pre"].matrices[p]) for p in world["pre"].matrices)
