import numpy as np
import pytest
from safetensors.numpy import save_file

from topotuner_lab._io.errors import InputFileError, SnapshotMismatchError
from topotuner_lab.weights.extract import extract_snapshot
from topotuner_lab.weights.models import build_tiny_model
from topotuner_lab.weights.snapshot import check_comparable, load_snapshot, perturb_snapshot, save_snapshot


def test_round_trip_keeps_matrices_and_metadata(tmp_path, tiny_snapshot):
    path = save_snapshot(tiny_snapshot, tmp_path / "snap.safetensors")
    back = load_snapshot(path)
    assert list(back.matrices) == list(tiny_snapshot.matrices)
    for pid, m in tiny_snapshot.matrices.items():
        assert back.matrices[pid].dtype == np.float32
        np.testing.assert_array_equal(back.matrices[pid], m)
    assert (back.model, back.base_model, back.architecture) == ("tiny-llama", "tiny-llama", "llama")
    assert back.weights_hash == tiny_snapshot.weights_hash
    inv = back.inventory()
    assert list(inv.columns) == ["pid", "layer", "kind", "rows", "cols", "params"]
    assert inv.loc[inv.pid == "L0.k", "rows"].item() == 32


def test_missing_file(tmp_path):
    with pytest.raises(InputFileError, match="does not exist.*\n.*topotuner-lab extract"):
        load_snapshot(tmp_path / "nope.safetensors")


def test_corrupt_file(tmp_path, tiny_snapshot):
    path = save_snapshot(tiny_snapshot, tmp_path / "snap.safetensors")
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(InputFileError, match="not a readable safetensors file"):
        load_snapshot(path)


def test_foreign_safetensors(tmp_path):
    path = tmp_path / "other.safetensors"
    save_file({"w": np.zeros((2, 2), np.float32)}, str(path))
    with pytest.raises(InputFileError, match="not a TopoTuner snapshot"):
        load_snapshot(path)


def test_tampered_weights_detected(tmp_path, tiny_snapshot):
    path = save_snapshot(tiny_snapshot, tmp_path / "snap.safetensors")
    data = bytearray(path.read_bytes())
    data[-4:] = b"\x00\x00\x80\x7f"  # last float becomes +Inf
    path.write_bytes(bytes(data))
    with pytest.raises(InputFileError, match="weight hash"):
        load_snapshot(path)


def test_different_models_are_refused(tiny_snapshot):
    other = extract_snapshot(build_tiny_model("tiny-gpt2"))
    with pytest.raises(SnapshotMismatchError, match="different models.*tiny-llama.*tiny-gpt2"):
        check_comparable(tiny_snapshot, other)
    deeper = extract_snapshot(build_tiny_model("tiny-llama", num_hidden_layers=3))
    with pytest.raises(SnapshotMismatchError, match="ids only in one"):
        check_comparable(tiny_snapshot, deeper)


def test_same_shapes_other_base_model(tiny_snapshot):
    other = extract_snapshot(build_tiny_model("tiny-llama", seed=1), name="someone-else")
    with pytest.raises(SnapshotMismatchError, match="different base models") as info:
        check_comparable(tiny_snapshot, other)
    assert "--allow-other-base" in str(info.value)
    check_comparable(tiny_snapshot, other, allow_other_base=True)


def test_perturbation_is_small_and_seeded(tiny_snapshot):
    a = perturb_snapshot(tiny_snapshot, 1e-3, seed=0)
    b = perturb_snapshot(tiny_snapshot, 1e-3, seed=0)
    check_comparable(tiny_snapshot, a)
    for pid, m in tiny_snapshot.matrices.items():
        np.testing.assert_array_equal(a.matrices[pid], b.matrices[pid])
        rel = np.linalg.norm(a.matrices[pid] - m) / np.linalg.norm(m)
        assert 5e-4 < rel < 2e-3


def test_perturbation_depends_on_the_seed(tiny_snapshot):
    a = perturb_snapshot(tiny_snapshot, 1e-3, seed=0)
    c = perturb_snapshot(tiny_snapshot, 1e-3, seed=1)
    check_comparable(a, c)
    assert a.weights_hash != c.weights_hash and a.model != c.model
    for pid in tiny_snapshot.matrices:
        assert not np.array_equal(a.matrices[pid], c.matrices[pid]), pid
