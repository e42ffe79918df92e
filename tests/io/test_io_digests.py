"""One JSON digest and one JSON reader for every floor: cache keys, snapshot metadata and results checksums agree."""

from __future__ import annotations

import hashlib
import json

import pytest

from topotuner_lab._io.errors import InputFileError, ProfileError
from topotuner_lab._io.json_files import json_digest, read_json
from topotuner_lab.drift import cache
from topotuner_lab.drift.cache import DriftCache
from topotuner_lab.drift.settings import DriftSettings
from topotuner_lab.weights import snapshot

PAYLOAD = {"b": [1, 2.5, None], "a": {"z": "text", "y": True}}


def test_the_digest_is_blake2b_128_over_sorted_json():
    expected = hashlib.blake2b(json.dumps(PAYLOAD, sort_keys=True).encode(), digest_size=16).hexdigest()
    assert json_digest(PAYLOAD) == expected == json_digest(dict(reversed(PAYLOAD.items())))
    assert json_digest({**PAYLOAD, "c": 1}) != expected


def test_cache_snapshot_and_results_use_the_one_digest(tmp_path):
    from topotuner_lab.training import results

    assert cache.json_digest is snapshot.json_digest is results.json_digest is json_digest
    a, b, settings = "0" * 32, "1" * 32, DriftSettings()
    assert DriftCache(None).row_key(a, b, settings) == json_digest([a, b, settings.key()])
    meta = {"model": "m", "created": "now", "meta_hash": "ignored"}
    assert snapshot.metadata_hash(meta) == json_digest({"model": "m", "created": "now"})
    assert results.results_checksum({**PAYLOAD, results.CHECKSUM: "ignored"}) == json_digest(PAYLOAD)
    DriftCache(tmp_path).put_row("ab" * 16, {"x": 1.5})
    (row,) = tmp_path.glob("rows/*/*.json")
    assert json.loads(row.read_text())["checksum"] == json_digest({"x": 1.5})


def test_read_json_returns_the_value_of_the_kind_asked(tmp_path):
    path = tmp_path / "a.json"
    path.write_text('{"x": [1, 2]}')
    assert read_json(path, "record", "write it again") == {"x": [1, 2]}
    path.write_text("[1, 2]")
    assert read_json(path, "record", "write it again", kind=list) == [1, 2]
    assert read_json(path, "record", "write it again", kind=object) == [1, 2]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "does not exist"),
        (b"{truncated", "is not valid JSON (JSONDecodeError"),
        (b"\xff\xfe{", "is not valid JSON (UnicodeDecodeError"),
        (b"[" * 100_000 + b"]" * 100_000, "is not valid JSON (RecursionError"),
        (b"[1, 2]", "holds a JSON list, not a JSON object"),
    ],
    ids=["missing", "truncated", "not-utf8", "deep-nesting", "wrong-kind"],
)
def test_a_missing_or_damaged_file_is_one_clear_error(tmp_path, content, problem):
    path = tmp_path / "record.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(InputFileError) as caught:
        read_json(path, "chosen rate record", "run the comparison again")
    assert caught.value.problem.startswith(f"chosen rate record {path} {problem}")
    assert caught.value.fix == "run the comparison again"


def test_read_json_raises_the_error_class_its_caller_names(tmp_path):
    path = tmp_path / "card.json"
    path.write_text("{not json")
    with pytest.raises(ProfileError, match="profile card .* is not valid JSON"):
        read_json(path, "profile card", "rebuild it", kind=object, error=ProfileError)


def test_a_damaged_cache_row_is_recomputed_not_an_error(tmp_path):
    store = DriftCache(tmp_path)
    key = "cd" * 16
    store.put_row(key, {"x": 1.0})
    assert store.get_row(key) == {"x": 1.0}
    (row,) = tmp_path.glob("rows/*/*.json")
    row.write_bytes(b"{damaged")
    assert store.get_row(key) is None
