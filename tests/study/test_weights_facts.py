"""The facts of a comparison's weights: measured, recorded beside the ledger, read back without the weights."""

from __future__ import annotations

import json

import numpy as np
import pytest

from topotuner_lab._io.errors import InputFileError
from topotuner_lab.study.weights_facts import grid_share, read_facts, record_weights_facts, weights_facts
from topotuner_lab.study.workspace import WorkDir
from topotuner_lab.weights.snapshot import Snapshot, perturb_snapshot, save_snapshot


def _snapshot(matrix: np.ndarray) -> Snapshot:
    return Snapshot({"L0.q": matrix.astype(np.float32)}, "m", "m", "r", "llama", total_params=10_000)


def _grid_and_random(random_rows: int, seed: int = 0) -> np.ndarray:
    """4 rows of 32 weights (one block each): ``random_rows`` rows of 32 distinct values, the rest on a 4-value grid."""
    rng = np.random.default_rng(seed)
    matrix = rng.choice([-0.5, -0.1, 0.1, 0.5], size=(4, 32))
    matrix[:random_rows] = rng.standard_normal((random_rows, 32))
    return matrix


@pytest.mark.parametrize("random_rows, share", [(0, 1.0), (1, 0.75), (2, 0.5), (4, 0.0)])
def test_grid_share_counts_blocks_of_at_most_16_values(random_rows, share):
    assert grid_share(_snapshot(_grid_and_random(random_rows))) == share


def test_grid_share_boundary_is_16_distinct_values():
    block16 = np.tile(np.arange(16.0), 2)  # 16 distinct values in a block of 32
    block17 = np.concatenate([np.arange(17.0), np.zeros(15)])
    assert grid_share(_snapshot(np.stack([block16, block17]))) == 0.5


@pytest.fixture
def work(tmp_path):
    """A folder with a pretrained snapshot on the grid and an sst2 prior fine-tune off it (one block of four)."""
    work = WorkDir(tmp_path / "study")
    save_snapshot(_snapshot(_grid_and_random(0)), work.pretrained)
    save_snapshot(_snapshot(_grid_and_random(1)), work.finetuned("sst2"))
    return work


def test_recorded_facts_stand_in_for_the_weights_once_they_are_gone(work):
    recorded = record_weights_facts(work, ["sst2"])
    assert (recorded.grid_share, recorded.finetuned["sst2"].grid_share) == (1.0, 0.75)
    assert recorded.identity.shapes == {"L0.q": [4, 32]} and recorded.identity.total_params == 10_000
    stored = json.loads(work.weights_facts.read_text())
    assert stored["finetuned"]["sst2"]["file"] == "prior-sst2/after.safetensors"
    assert stored["pretrained"]["identity"]["weights_hash"] == recorded.identity.weights_hash
    assert weights_facts(work, ["sst2"]) == recorded  # weights present: measured, and they agree with the record
    work.pretrained.unlink()
    work.finetuned("sst2").unlink()
    assert weights_facts(work, ["sst2"]) == recorded  # weights gone: the record
    work.weights_facts.unlink()
    assert weights_facts(work, ["sst2"]) is None  # neither: the report says what to run


def test_a_prior_whose_weights_are_gone_keeps_its_recorded_facts(work):
    first = record_weights_facts(work, ["sst2"])
    work.finetuned("sst2").unlink()
    again = record_weights_facts(work, ["sst2"])  # a later sitting without that prior's weights
    assert again.finetuned == first.finetuned and read_facts(work) == first


def test_facts_that_disagree_with_the_weights_present_are_refused(work):
    record_weights_facts(work, ["sst2"])
    retrained = perturb_snapshot(_snapshot(_grid_and_random(1)), 0.01, seed=3)  # the prior trained again elsewhere
    save_snapshot(retrained, work.finetuned("sst2"))
    with pytest.raises(InputFileError, match=r"weights-facts.json record the sst2 prior fine-tune") as caught:
        weights_facts(work, ["sst2"])
    assert "reproduce" in caught.value.fix
    save_snapshot(_snapshot(_grid_and_random(2, seed=5)), work.pretrained)  # other pretrained weights
    with pytest.raises(InputFileError, match="record the pretrained model m"):
        weights_facts(work, ["sst2"])


def test_a_damaged_facts_file_names_itself_and_its_fix(work):
    record_weights_facts(work, ["sst2"])
    record = json.loads(work.weights_facts.read_text())
    del record["pretrained"]["identity"]["shapes"]
    work.weights_facts.write_text(json.dumps(record))
    work.pretrained.unlink()
    with pytest.raises(InputFileError, match="are not a facts record") as caught:
        weights_facts(work, ["sst2"])
    assert "git checkout" in caught.value.fix
    work.weights_facts.write_text("[1, 2]")
    with pytest.raises(InputFileError, match="weights facts"):
        weights_facts(work, ["sst2"])
