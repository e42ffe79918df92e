"""Per-kind budgets: ranking within each projection kind, and the stratified random control (a random card with the
same kinds and count as a topology card, a fresh one per seed)."""

from __future__ import annotations

import pytest

from topotuner_lab._io.errors import ProfileError
from topotuner_lab.cli import main
from topotuner_lab.drift.cache import DriftCache
from topotuner_lab.drift.compute import drift_table
from topotuner_lab.drift.settings import DriftSettings
from topotuner_lab.drift.tables import save_table
from topotuner_lab.profiles.card import ModelIdentity, ProfileCard
from topotuner_lab.profiles.select import CardSettings, build_profile, kind_composition
from topotuner_lab.weights.snapshot import perturb_snapshot, save_snapshot


@pytest.fixture
def table_and_identity(tiny_snapshot):
    table = drift_table(
        tiny_snapshot, perturb_snapshot(tiny_snapshot, 0.05), DriftSettings(maxdim=0), n_jobs=1, cache=DriftCache(None)
    )
    return table, ModelIdentity.from_snapshot(tiny_snapshot)


def test_per_kind_budgets_rank_within_each_kind(table_and_identity):
    table, identity = table_and_identity
    card = build_profile(table, identity, CardSettings(prior_task="sst2", per_kind={"k": 1, "v": 2}))
    assert kind_composition(card) == {"k": 1, "v": 2} and card.budget == {"per_kind": {"k": 1, "v": 2}}
    scores = {r["pid"]: r["score"] for r in card.ranking}
    best_k = max((p for p in scores if p.endswith(".k")), key=scores.get)
    assert best_k in card.trainable  # the highest-drift k, whatever its rank among all matrices
    assert ProfileCard.from_dict(card.to_dict()).budget == card.budget  # the budget survives the file


def test_the_stratified_control_matches_the_cards_kinds_and_count_and_varies_by_seed(table_and_identity):
    table, identity = table_and_identity
    topology = build_profile(table, identity, CardSettings(prior_task="sst2", count=3))
    composition = kind_composition(topology)
    controls = [
        build_profile(
            table, identity, CardSettings(prior_task="sst2", strategy="random", per_kind=composition, seed=seed)
        )
        for seed in range(6)
    ]
    for control in controls:
        assert kind_composition(control) == composition and len(control.trainable) == len(topology.trainable)
        assert control.trainable_params == topology.trainable_params  # same kinds: same shapes, same budget
    assert len({tuple(c.trainable) for c in controls}) > 1  # a fresh pick per seed


@pytest.mark.parametrize(
    "per_kind, message",
    [
        pytest.param({"q": 3}, r"more matrices than the model has of kind\(s\) \{'q': 2\}", id="too-many"),
        pytest.param({"x": 1}, "per_kind=\\{'x': 1\\} is not a mapping of projection kind", id="unknown-kind"),
        pytest.param({}, "is not a mapping of projection kind", id="empty"),
    ],
)
def test_bad_per_kind_budgets_are_clear_errors(table_and_identity, per_kind, message):
    table, identity = table_and_identity
    with pytest.raises(ProfileError, match=message):
        build_profile(table, identity, CardSettings(prior_task="sst2", per_kind=per_kind))


def test_per_kind_on_the_command_line(tmp_path, tiny_snapshot, table_and_identity, capsys):
    table, _ = table_and_identity
    save_table(table, tmp_path / "t.parquet")
    save_snapshot(tiny_snapshot, tmp_path / "pre.safetensors")
    argv = ["profile", str(tmp_path / "t.parquet"), "--pretrained", str(tmp_path / "pre.safetensors")]
    argv += ["--prior-task", "sst2", "--strategy", "random", "--per-kind", "k=1,o=1", "-o", str(tmp_path / "c.json")]
    assert main(argv) == 0
    assert kind_composition(ProfileCard.load(tmp_path / "c.json")) == {"k": 1, "o": 1}
    assert main([*argv[:-4], "--per-kind", "k=one", "-o", str(tmp_path / "d.json")]) == 2
    assert "per_kind='k=one' is not a mapping" in capsys.readouterr().err
