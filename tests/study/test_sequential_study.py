"""A study with seed blocks: claims judged after each block at its own level, seeds added only while undecided."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from topotuner_lab.study import protocol, sequential
from topotuner_lab.study.claim_ids import ClaimId
from topotuner_lab.study.presets import PRESETS
from topotuner_lab.study.protocol import run_study
from topotuner_lab.study.sequential import look_level

BLOCKS = replace(
    PRESETS["tiny"], seeds=(0, 1, 2), seed_blocks=(2, 3), other_models=(), constant_lr=(), baselines=(),
    strategies=("high-drift", "random"), noise_seeds=(0,), lr_grid={"profile": (1e-3,)}, lr_extend=0,
)  # fmt: skip

pytestmark = pytest.mark.slow


def test_a_look_that_decides_stops_the_study_before_the_next_block(tmp_path, monkeypatch):
    monkeypatch.setattr(protocol, "open_claims", lambda claims: [])  # every sequential claim decided
    results = run_study(BLOCKS, tmp_path / "out", log=lambda _: None)
    assert set(results["seed"]) == {0, 1}  # the third seed never ran
    looks = json.loads((tmp_path / "out" / sequential.LOOKS_FILE).read_text())
    assert [(look["seeds"], look["adds_seeds"]) for look in looks] == [(2, False)]
    assert looks[0]["level"] == pytest.approx(look_level([2 / 3, 1.0], 0))


def test_an_undecided_look_adds_the_next_block_and_the_last_look_is_recorded(tmp_path, monkeypatch):
    judged = []

    def undecided(claims):
        judged.append({c.claim for c in claims})
        return [c for c in claims if c.claim in sequential.SEQUENTIAL_CLAIMS]  # each judged claim left open

    monkeypatch.setattr(protocol, "open_claims", undecided)
    results = run_study(BLOCKS, tmp_path / "out", log=lambda _: None)
    assert set(results["seed"]) == {0, 1, 2}
    assert ClaimId.BEATS_CONTROLS in judged[0]  # the look judged the card against the random control
    looks = json.loads((tmp_path / "out" / sequential.LOOKS_FILE).read_text())
    assert [(look["seeds"], look["adds_seeds"]) for look in looks] == [(2, True), (3, False)]
    assert looks[1]["level"] == pytest.approx(look_level([2 / 3, 1.0], 1))


def test_a_look_below_the_seed_floor_adds_seeds_though_it_decides(tmp_path, monkeypatch):
    monkeypatch.setattr(protocol, "open_claims", lambda claims: [])  # every sequential claim decided at each look
    logged = []
    results = run_study(replace(BLOCKS, seed_floor=3), tmp_path / "out", log=logged.append)
    assert set(results["seed"]) == {0, 1, 2}  # the floor, not the first look, ends the study
    looks = json.loads((tmp_path / "out" / sequential.LOOKS_FILE).read_text())
    assert [(look["seeds"], look["adds_seeds"], look["seed_floor"]) for look in looks] == [(2, True, 3), (3, False, 3)]
    assert any("decided; adding seeds up to the preset's floor of 3" in line for line in logged)
