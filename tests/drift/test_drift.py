import numpy as np
import pandas as pd
import pytest

import topotuner_lab.drift.cache as cache_mod
import topotuner_lab.drift.executors as executors_mod
import topotuner_lab.drift.pairs as pairs_mod
from topotuner_lab._io.errors import InvalidMatrixError, ParameterError, SnapshotMismatchError
from topotuner_lab.drift.cache import DriftCache
from topotuner_lab.drift.columns import MAGNITUDE_COLUMNS
from topotuner_lab.drift.compute import drift_between, drift_table
from topotuner_lab.drift.settings import DriftSettings
from topotuner_lab.drift.tables import load_table, save_table
from topotuner_lab.weights.extract import extract_snapshot
from topotuner_lab.weights.models import build_tiny_model
from topotuner_lab.weights.snapshot import perturb_snapshot


@pytest.fixture
def cache(tmp_path):
    return DriftCache(tmp_path / "cache")


def _count_diagram_calls(monkeypatch):
    calls = []
    real = cache_mod.diagrams

    def counting(matrix, settings):
        calls.append(matrix.shape)
        return real(matrix, settings)

    monkeypatch.setattr(cache_mod, "diagrams", counting)
    return calls


def test_identical_snapshots_give_zero_drift(tiny_snapshot, cache):
    table = drift_table(tiny_snapshot, tiny_snapshot, n_jobs=1, cache=cache)
    assert len(table) == 8
    drift_cols = DriftSettings().columns() + ["rel_frobenius", "rel_spectral"]
    assert (table[drift_cols] == 0).all().all()
    assert table["row_cosine_change"].abs().max() < 1e-12


def test_table_columns_and_positive_drift(tiny_snapshot, cache):
    noisy = perturb_snapshot(tiny_snapshot, 0.05)
    table = drift_table(tiny_snapshot, noisy, n_jobs=1, cache=cache)
    expected = [
        "pid",
        "layer",
        "kind",
        "rows",
        "cols",
        "h0_w1",
        "h0_w2",
        "h0_bottleneck",
        "n_h0_before",
        "n_h0_after",
        "h0_persistence_before",
        "h1_w1",
        "h1_w2",
        "h1_bottleneck",
        "n_h1_before",
        "n_h1_after",
        "h1_persistence_before",
        "rel_frobenius",
        "rel_spectral",
        "row_cosine_change",
    ]
    assert list(table.columns) == expected
    assert list(table.pid) == list(tiny_snapshot.matrices)
    assert (table["h0_w1"] > 0).all() and (table["rel_frobenius"] > 0).all()
    assert table.loc[table.pid == "L0.k", "rows"].item() == 32


def test_topology_only_table_skips_the_magnitude_baselines(tiny_snapshot, cache, monkeypatch):
    monkeypatch.setattr(pairs_mod, "magnitude_metrics", lambda *a: pytest.fail("magnitude metrics computed"))
    noisy = perturb_snapshot(tiny_snapshot, 0.05)
    settings = DriftSettings(magnitude=False)
    table = drift_table(tiny_snapshot, noisy, settings, n_jobs=1, cache=cache)
    assert not set(MAGNITUDE_COLUMNS) & set(table.columns)
    monkeypatch.undo()
    full = drift_table(tiny_snapshot, noisy, n_jobs=1, cache=cache)  # its own cache entries, with the baselines
    assert set(MAGNITUDE_COLUMNS) <= set(full.columns)
    pd.testing.assert_frame_equal(table, full[table.columns])


def test_more_noise_more_drift(tiny_snapshot, cache):
    small = drift_table(tiny_snapshot, perturb_snapshot(tiny_snapshot, 0.01), n_jobs=1, cache=cache)
    large = drift_table(tiny_snapshot, perturb_snapshot(tiny_snapshot, 0.2), n_jobs=1, cache=cache)
    assert (large["h0_w1"] > small["h0_w1"]).all()


def test_rerun_hits_the_cache(tiny_snapshot, cache, monkeypatch):
    noisy = perturb_snapshot(tiny_snapshot, 0.05)
    calls = _count_diagram_calls(monkeypatch)
    first = drift_table(tiny_snapshot, noisy, n_jobs=1, cache=cache)
    assert len(calls) == 16  # 8 pretrained + 8 perturbed matrices
    second = drift_table(tiny_snapshot, noisy, n_jobs=1, cache=cache)
    assert len(calls) == 16
    pd.testing.assert_frame_equal(first, second)
    # A new fine-tuned copy reuses the pretrained diagrams: only 8 new ones.
    drift_table(tiny_snapshot, perturb_snapshot(tiny_snapshot, 0.05, seed=7), n_jobs=1, cache=cache)
    assert len(calls) == 24


def test_interrupted_run_resumes_with_same_table(tiny_snapshot, cache, monkeypatch):
    noisy = perturb_snapshot(tiny_snapshot, 0.05)
    reference = drift_table(tiny_snapshot, noisy, n_jobs=1, cache=DriftCache(None))
    real_values = executors_mod.pair_values
    done = []

    def dying(*args, **kwargs):
        if len(done) == 3:
            raise KeyboardInterrupt
        done.append(1)
        return real_values(*args, **kwargs)

    monkeypatch.setattr(executors_mod, "pair_values", dying)
    with pytest.raises(KeyboardInterrupt):
        drift_table(tiny_snapshot, noisy, n_jobs=1, cache=cache)
    monkeypatch.setattr(executors_mod, "pair_values", real_values)
    calls = _count_diagram_calls(monkeypatch)
    resumed = drift_table(tiny_snapshot, noisy, n_jobs=1, cache=cache)
    assert len(calls) == 2 * (8 - 3)
    pd.testing.assert_frame_equal(resumed, reference)


def test_parallel_equals_serial(tiny_snapshot, cache):
    noisy = perturb_snapshot(tiny_snapshot, 0.05)
    serial = drift_table(tiny_snapshot, noisy, n_jobs=1, cache=DriftCache(None))
    parallel = drift_table(tiny_snapshot, noisy, n_jobs=2, cache=cache)
    pd.testing.assert_frame_equal(serial, parallel)


def test_snapshot_of_a_different_model(tiny_snapshot, cache):
    other = extract_snapshot(build_tiny_model("tiny-qwen2"))
    with pytest.raises(SnapshotMismatchError, match="snapshots are of different models"):
        drift_table(tiny_snapshot, other, cache=cache)


def test_unknown_pids_and_bad_settings(tiny_snapshot, cache):
    with pytest.raises(ParameterError, match="unknown projection id"):
        drift_between(tiny_snapshot.matrices, tiny_snapshot.matrices, pids=["L9.q"], cache=cache)
    with pytest.raises(ParameterError, match="orders"):
        DriftSettings(orders=(0.5,))
    with pytest.raises(ParameterError, match="solver"):
        DriftSettings(solver="magic")


def test_nan_weights_are_refused(tiny_snapshot, cache):
    broken = {pid: m.copy() for pid, m in tiny_snapshot.matrices.items()}
    broken["L1.v"][3, 3] = np.nan
    with pytest.raises(InvalidMatrixError, match=r"contains 1 NaN/Inf value"):
        drift_between(tiny_snapshot.matrices, broken, n_jobs=1, cache=cache)


def test_table_files_round_trip(tmp_path, tiny_snapshot, cache):
    table = drift_table(tiny_snapshot, perturb_snapshot(tiny_snapshot, 0.05), n_jobs=1, cache=cache)
    for name in ("t.parquet", "t.csv"):
        back = load_table(save_table(table, tmp_path / name))
        pd.testing.assert_frame_equal(back, table, check_dtype=False)
    with pytest.raises(ParameterError, match=r"\.parquet or \.csv"):
        save_table(table, tmp_path / "t.xlsx")


def test_spectral_norm_matches_full_svd(rng):
    from topotuner_lab.topology.magnitude import spectral_norm

    for shape in [(2, 5), (64, 64), (32, 64), (200, 90), (600, 400)]:
        m = rng.standard_normal(shape)
        exact = np.linalg.norm(m, 2)
        assert spectral_norm(m) == pytest.approx(exact, rel=1e-6)  # float64 input, the stated tolerance
        assert spectral_norm(m.astype(np.float32)) == pytest.approx(exact, rel=1e-5)  # float32 products
    assert spectral_norm(np.zeros((10, 10))) == 0.0


def test_dask_local_cluster_gives_the_same_table_bit_for_bit(tiny_snapshot, tmp_path):
    noisy = perturb_snapshot(tiny_snapshot, 0.05)
    local = drift_table(tiny_snapshot, noisy, n_jobs=1, cache=DriftCache(None))
    shared = DriftCache(tmp_path / "shared-cache")
    distributed = drift_table(tiny_snapshot, noisy, n_jobs=2, cache=shared, scheduler="local")
    pd.testing.assert_frame_equal(distributed, local, check_exact=True)
    assert len(list((tmp_path / "shared-cache" / "rows").rglob("*.json"))) == 8  # the workers wrote the shared cache
