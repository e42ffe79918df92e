"""The pretrained model's scores on disk: reused across processes only when every input and the entry verify."""

import copy
import json

import numpy as np
import pytest
import torch
from datasets import Dataset

import topotuner_lab.training.score_cache as score_cache
from topotuner_lab.training.score_cache import cache_folder, cached_scores
from topotuner_lab.training.scoring import TaskScorer

ROWS = {"prompt": ["Review: a fine film.\nSentiment:", "Review: dull\nSentiment:", "Review: ok\nSentiment:"]}


@pytest.fixture
def counted(tiny_llama, monkeypatch):
    """An SST-2 scorer of the tiny model whose ``score_all`` calls are counted."""
    scorer = TaskScorer("sst2", tiny_llama.tokenizer, 40)
    calls = []
    real = TaskScorer.score_all

    def score_all(self, model, rows):
        calls.append(len(rows))
        return real(self, model, rows)

    monkeypatch.setattr(TaskScorer, "score_all", score_all)
    return scorer, calls


def _rows():
    return Dataset.from_dict({**ROWS, "label": [1, 0, 1]})


def _entries():
    return sorted(cache_folder().rglob("*.json"))


def test_a_later_process_reads_the_stored_scores_instead_of_scoring(tiny_llama, counted):
    scorer, calls = counted
    first = cached_scores(tiny_llama.model, scorer, _rows())
    score_cache._MODEL_DIGESTS.clear()  # as a new process: the digest is computed again from the weights
    again = cached_scores(tiny_llama.model, scorer, _rows())
    assert calls == [3] and len(_entries()) == 1
    assert set(again) == set(first) and "logloss" in again
    for name in first:
        np.testing.assert_array_equal(again[name], first[name])
        assert again[name].dtype == np.asarray(first[name]).dtype


def test_other_weights_rows_or_prompt_length_are_scored_anew(tiny_llama, counted):
    scorer, calls = counted
    cached_scores(tiny_llama.model, scorer, _rows())
    changed = copy.deepcopy(tiny_llama.model)
    with torch.no_grad():
        next(changed.parameters()).view(-1)[0] += 1e-3
    cached_scores(changed, scorer, _rows())
    cached_scores(tiny_llama.model, scorer, Dataset.from_dict({**ROWS, "label": [1, 1, 1]}))
    cached_scores(tiny_llama.model, TaskScorer("sst2", tiny_llama.tokenizer, 32), _rows())
    assert calls == [3, 3, 3, 3] and len(_entries()) == 4


@pytest.mark.parametrize("damage", ["value", "truncate", "key", "rows"])
def test_an_entry_that_does_not_verify_is_scored_again_and_rewritten(tiny_llama, counted, damage):
    scorer, calls = counted
    first = cached_scores(tiny_llama.model, scorer, _rows())
    [path] = _entries()
    entry = json.loads(path.read_text())
    if damage == "value":
        entry["scores"]["logloss"][0] += 0.5
    elif damage == "key":
        entry["key"] = "0" * 32
    elif damage == "rows":
        entry["scores"] = {k: v[:2] for k, v in entry["scores"].items()}
    path.write_text(json.dumps(entry)[: 40 if damage == "truncate" else None])
    again = cached_scores(tiny_llama.model, scorer, _rows())
    assert calls == [3, 3]
    np.testing.assert_array_equal(again["logloss"], first["logloss"])
    cached_scores(tiny_llama.model, scorer, _rows())  # rewritten: read back now
    assert calls == [3, 3]


def test_off_keeps_nothing_and_an_unwritable_folder_only_warns(tiny_llama, counted, monkeypatch, tmp_path):
    scorer, calls = counted
    monkeypatch.setenv("TOPOTUNER_SCORE_CACHE", "off")
    cached_scores(tiny_llama.model, scorer, _rows())
    cached_scores(tiny_llama.model, scorer, _rows())
    assert calls == [3, 3] and cache_folder() is None
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("TOPOTUNER_SCORE_CACHE", str(blocker / "scores"))
    with pytest.warns(UserWarning, match="cannot be written"):
        scores = cached_scores(tiny_llama.model, scorer, _rows())
    assert len(scores["acc"]) == 3


def test_a_scalar_buffer_is_part_of_the_weights_digest():
    """Gemma-style models hold 0-dim buffers (an embedding scale); they digest and a changed scalar changes the key."""
    model = torch.nn.Linear(2, 2)
    model.register_buffer("scale", torch.tensor(2.0))
    before = score_cache.model_digest(model)
    changed = copy.deepcopy(model)
    changed.scale.fill_(3.0)
    assert score_cache.model_digest(changed) != before
