"""A card carries its prior task resolved: the spec's content hash and where it was found, usable from any folder.

A small spec over a JSONL file is written into the test's ``made`` folder; a tiny-llama card is built there with the
spec given by its relative path, then used from another folder: found at its recorded path, by its content when
moved, or named in the error when gone. Older cards (no ``prior_spec``) load and read their prior as typed.
"""

from __future__ import annotations

import json
import shutil

import pytest

from topotuner_lab._io.errors import ProfileError
from topotuner_lab.cli import main
from topotuner_lab.profiles.card import ProfileCard
from topotuner_lab.profiles.prior import BUILTIN_SPECS, prior_record, resolve_prior, spec_hash
from topotuner_lab.tasks.registry import BUILTIN_DIR
from topotuner_lab.training.transfer import TransferCheckSettings, transfer_check

SPEC = """task: my-reviews
output_type: multiple_choice
doc_to_text: "Review: {{ text }}\\nVerdict:"
doc_to_choice: [bad, good]
doc_to_target: label
data_files: {train: DATA, test: DATA}
"""
SMALL = TransferCheckSettings(n_rows=4, max_length=32, batch_size=4)


@pytest.fixture
def made(tmp_path, monkeypatch, tiny_llama, tiny_snapshot):
    """A card built in ``made/`` from ``my_task.yaml`` typed relative; the data file lives apart (absolute path)."""
    from topotuner_lab.drift.cache import DriftCache
    from topotuner_lab.drift.compute import drift_table
    from topotuner_lab.profiles.apply import identity_of
    from topotuner_lab.profiles.select import CardSettings, build_profile
    from topotuner_lab.weights.snapshot import perturb_snapshot

    data = tmp_path / "data" / "reviews.jsonl"
    data.parent.mkdir()
    data.write_text("".join(json.dumps({"text": f"review {i}", "label": i % 2}) + "\n" for i in range(8)))
    folder = tmp_path / "made"
    folder.mkdir()
    (folder / "my_task.yaml").write_text(SPEC.replace("DATA", str(data)))
    monkeypatch.chdir(folder)
    table = drift_table(tiny_snapshot, perturb_snapshot(tiny_snapshot, 0.05), n_jobs=1, cache=DriftCache(None))
    settings = CardSettings(prior_task="my_task.yaml", count=2)
    card = build_profile(table, identity_of(tiny_llama.model, "tiny-llama"), settings)
    path = card.save(folder / "card.json")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return path


def test_the_card_records_the_spec_found_and_its_hash(made):
    card = ProfileCard.load(made)
    assert card.prior_task == "my_task.yaml"  # as typed
    spec = made.parent / "my_task.yaml"
    assert card.prior_spec == {"path": str(spec.resolve()), "hash": spec_hash(spec)}
    assert card.prior_spec["hash"].startswith("sha256:") and len(card.prior_spec["hash"]) == 7 + 64
    assert prior_record("sst2") == {"builtin": "sst2", "hash": spec_hash(BUILTIN_DIR / "sst2.yaml")}
    assert BUILTIN_SPECS == BUILTIN_DIR and prior_record("imdb+sst2+mmlu") is None  # a name of no spec: none recorded


def test_a_relative_spec_works_from_another_folder(made, tiny_llama):
    """From another folder the typed ``my_task.yaml`` names nothing; the card finds its prior at the recorded path."""
    card = ProfileCard.load(made)
    assert resolve_prior(card, made) == str((made.parent / "my_task.yaml").resolve())
    check = transfer_check(tiny_llama, card, "sst2", SMALL, card_path=made)
    assert check.table["cosine"].notna().all() and len(check.table) == len(card.trainable + card.frozen)


def test_a_moved_spec_is_found_by_its_content(made, tiny_llama, tmp_path):
    """Renamed beside the card, or copied into the working folder, the spec is found by its hash."""
    card = ProfileCard.load(made)
    moved = made.parent / "renamed.yml"
    (made.parent / "my_task.yaml").rename(moved)
    (made.parent / "other.yaml").write_text(SPEC.replace("DATA", "x.jsonl"))  # another spec: not taken
    assert resolve_prior(card, made) == str(moved)
    assert transfer_check(tiny_llama, card, "sst2", SMALL, card_path=made).table["cosine"].notna().all()
    shutil.copy(moved, tmp_path / "elsewhere" / "copy.yaml")
    moved.unlink()
    assert resolve_prior(card) == str(tmp_path / "elsewhere" / "copy.yaml")  # the working folder, no card path


def test_a_missing_spec_is_one_error_naming_it_its_hash_and_the_fix(made, capsys):
    card = ProfileCard.load(made)
    spec = (made.parent / "my_task.yaml").resolve()
    spec.unlink()
    with pytest.raises(ProfileError) as info:
        resolve_prior(card, made)
    assert "'my_task.yaml'" in info.value.problem and str(spec) in info.value.problem
    assert card.prior_spec["hash"] in info.value.problem
    assert f"put the spec back at {spec}" in info.value.fix and "beside the card" in info.value.fix
    assert main(["transfer-check", str(made), "--task", "sst2", "--model", "tiny-llama", "--n-rows", "4"]) == 2
    err = capsys.readouterr().err
    assert "prior task spec of card" in err and "Traceback" not in err


def test_a_changed_spec_is_read_with_a_warning(made):
    spec = made.parent / "my_task.yaml"
    spec.write_text(spec.read_text() + "metadata: {note: edited}\n")
    with pytest.warns(UserWarning, match="changed since the card was built"):
        assert resolve_prior(ProfileCard.load(made), made) == str(spec.resolve())


def test_an_older_card_without_the_record_loads_and_reads_its_prior_as_typed(made, card_path):
    """Cards written before ``prior_spec`` existed load (the field defaults to None) and behave as before."""
    data = json.loads(made.read_text())
    del data["prior_spec"]
    made.write_text(json.dumps(data))
    card = ProfileCard.load(made)
    assert card.prior_spec is None and resolve_prior(card, made) == "my_task.yaml"
    builtin = ProfileCard.load(card_path)  # conftest's card: a built-in prior, recorded by name and hash
    assert resolve_prior(builtin, card_path) == "sst2" and builtin.prior_spec["builtin"] == "sst2"


@pytest.mark.parametrize(
    "record",
    [{"path": "/x.yaml"}, {"hash": "sha256:0"}, {"path": "/x.yaml", "builtin": "sst2", "hash": "h"}, "sst2"],
)
def test_a_bad_record_is_refused_with_the_rebuild_fix(made, record):
    data = json.loads(made.read_text()) | {"prior_spec": record}
    made.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="prior_spec="):
        ProfileCard.load(made)
