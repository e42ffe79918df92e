"""Nothing is lost and results are reproducible."""

import json

import pandas as pd
import pytest

from topotuner_lab._io import atomic
from topotuner_lab.drift.cache import DriftCache
from topotuner_lab.drift.compute import drift_table
from topotuner_lab.drift.settings import DriftSettings
from topotuner_lab.profiles.apply import identity_of
from topotuner_lab.profiles.select import CardSettings, build_profile
from topotuner_lab.weights.snapshot import load_snapshot, perturb_snapshot, save_snapshot


def test_crash_mid_write_keeps_the_old_file(tmp_path):
    target = tmp_path / "card.json"
    atomic.write_json(target, {"v": 1})
    with pytest.raises(RuntimeError):
        with atomic.atomic_path(target) as tmp:
            tmp.write_text('{"v": 2, "trunc')
            raise RuntimeError("killed")
    assert json.loads(target.read_text()) == {"v": 1}
    assert list(tmp_path.iterdir()) == [target]  # no temp files left behind


def test_snapshot_write_is_atomic(tmp_path, tiny_snapshot, monkeypatch):
    path = save_snapshot(tiny_snapshot, tmp_path / "s.safetensors")
    import safetensors.numpy

    def exploding(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(safetensors.numpy, "save_file", exploding)
    with pytest.raises(KeyboardInterrupt):
        save_snapshot(perturb_snapshot(tiny_snapshot, 0.1), path)
    assert load_snapshot(path).weights_hash == tiny_snapshot.weights_hash


def test_damaged_cache_entry_is_recomputed(tmp_path, tiny_snapshot):
    cache = DriftCache(tmp_path / "c")
    noisy = perturb_snapshot(tiny_snapshot, 0.05)
    first = drift_table(tiny_snapshot, noisy, n_jobs=1, cache=cache)
    for path in (tmp_path / "c" / "rows").rglob("*.json"):
        path.write_text("{broken")
    again = drift_table(tiny_snapshot, noisy, n_jobs=1, cache=cache)
    pd.testing.assert_frame_equal(first, again)


def test_same_inputs_same_table_bit_for_bit(tmp_path, tiny_snapshot):
    noisy = perturb_snapshot(tiny_snapshot, 0.05, seed=3)
    settings = DriftSettings(n_perm=20, seed=4)
    a = drift_table(tiny_snapshot, noisy, settings, n_jobs=1, cache=DriftCache(None))
    b = drift_table(
        tiny_snapshot,
        perturb_snapshot(tiny_snapshot, 0.05, seed=3),
        settings,
        n_jobs=2,
        cache=DriftCache(tmp_path / "c"),
    )
    pd.testing.assert_frame_equal(a, b, check_exact=True)


def test_other_seeds_other_table(tiny_snapshot):
    noisy = perturb_snapshot(tiny_snapshot, 0.05, seed=3)
    settings = DriftSettings(n_perm=20, seed=4)
    a = drift_table(tiny_snapshot, noisy, settings, n_jobs=1, cache=DriftCache(None))
    other_start = drift_table(tiny_snapshot, noisy, DriftSettings(n_perm=20, seed=5), n_jobs=1, cache=DriftCache(None))
    # H0 is exact on all rows whatever the seed; the seed moves the H1 subsample's start point
    pd.testing.assert_series_equal(a["h0_w1"], other_start["h0_w1"])
    assert not a["h1_w1"].equals(other_start["h1_w1"])
    other_noise = drift_table(
        tiny_snapshot, perturb_snapshot(tiny_snapshot, 0.05, seed=6), settings, n_jobs=1, cache=DriftCache(None)
    )
    assert not a["h0_w1"].equals(other_noise["h0_w1"]) and not a["rel_frobenius"].equals(other_noise["rel_frobenius"])


def test_same_seed_same_profile(tiny_llama, tiny_snapshot):
    table = drift_table(tiny_snapshot, perturb_snapshot(tiny_snapshot, 0.05), n_jobs=1, cache=DriftCache(None))
    identity = identity_of(tiny_llama.model, "tiny-llama")
    cards = [
        build_profile(table, identity, CardSettings(prior_task="sst2", strategy="random", fraction=0.05, seed=9))
        for _ in range(2)
    ]
    assert cards[0].trainable == cards[1].trainable and cards[0].seed == 9
    assert cards[0].ranking == cards[1].ranking


def test_other_seed_other_random_profile(tiny_llama, tiny_snapshot):
    table = drift_table(tiny_snapshot, perturb_snapshot(tiny_snapshot, 0.05), n_jobs=1, cache=DriftCache(None))
    identity = identity_of(tiny_llama.model, "tiny-llama")
    a, b = (
        build_profile(table, identity, CardSettings(prior_task="sst2", strategy="random", fraction=0.05, seed=s))
        for s in (9, 10)
    )
    assert a.seed == 9 and b.seed == 10
    assert [r["pid"] for r in a.ranking] != [r["pid"] for r in b.ranking]


def test_tests_write_caches_under_their_own_folder(isolated_cache, tiny_snapshot):
    from topotuner_lab._io.paths import cache_dir

    assert cache_dir() == isolated_cache and DriftCache().root == isolated_cache / "drift"
    drift_table(tiny_snapshot, perturb_snapshot(tiny_snapshot, 0.05), n_jobs=1)  # the default cache
    assert list((isolated_cache / "drift" / "rows").rglob("*.json"))
