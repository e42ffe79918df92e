"""Validation like the test set: SST-2's validation rows are whole sentences from its own split, apart from train
and test; tasks without such a split carve validation from the training draw as before."""

from __future__ import annotations

import statistics

from topotuner_lab.tasks.loading import has_validation_split, load_task
from topotuner_lab.training.config import FinetuneConfig
from topotuner_lab.training.data import load_run_data


def _words(ds) -> float:
    return statistics.median(len(p.split("\n")[0].split()) - 1 for p in ds["prompt"])


def test_sst2_validation_rows_are_whole_sentences_from_their_own_split():
    data = load_run_data(FinetuneConfig(task="sst2", n_train=64, n_val=500, n_test=872))
    assert len(data.val) == 500 and "validation split (whole-sentences)" in data.val_source
    texts = [p.split("\n")[0].removeprefix("Review: ") for p in data.val["prompt"]]
    assert all(t.rstrip()[-1] in ".!?" and len(t.split()) >= 5 for t in texts)
    # like the test set (whole sentences, median ~19 words), unlike the training phrases (median ~7)
    assert _words(data.val) >= 14 and _words(data.train) <= _words(data.val) - 4 and _words(data.test) >= 17
    assert not set(data.val["prompt"]) & set(data.test["prompt"])
    assert len(data.train) == 64  # no longer carved out of the training draw


def test_validation_rows_do_not_depend_on_the_seed_but_training_rows_do():
    a = load_run_data(FinetuneConfig(task="sst2", n_train=32, n_val=50, n_test=8, seed=0, data_seed=0))
    b = load_run_data(FinetuneConfig(task="sst2", n_train=32, n_val=50, n_test=8, seed=1, data_seed=1))
    assert a.val["prompt"] == b.val["prompt"] and a.train["prompt"] != b.train["prompt"]


def test_a_task_without_a_validation_split_carves_it_from_training():
    assert not has_validation_split("agnews") and not has_validation_split("sst2", "hub")
    data = load_run_data(FinetuneConfig(task="agnews", n_train=32, n_val=8, n_test=8))
    assert data.val_source == "carved from the training draw" and len(data.val) == 8 and len(data.train) == 32
    assert not set(data.val["prompt"]) & set(data.train["prompt"])


def test_the_filter_applies_to_the_validation_split_only():
    train = load_task("sst2", "train", 400, 0)
    assert sum(p.split("\n")[0].rstrip()[-1:] not in ".!?" for p in train["prompt"]) > 100


def test_a_spec_files_own_validation_split_is_filtered_like_sst2s(tmp_path):
    (tmp_path / "train.csv").write_text("text,label\n" + "".join(f"phrase {i},{i % 2}\n" for i in range(20)))
    (tmp_path / "val.csv").write_text(
        "text,label\nA whole sentence of six words.,1\ntoo short.,0\nAnother complete sentence is here!,0\n"
        "no end mark in this one,1\n"
    )
    (tmp_path / "task.yaml").write_text(
        'task: mine\noutput_type: multiple_choice\ndoc_to_text: "Text: {{ text }}\\nLabel:"\ndoc_to_target: label\n'
        "doc_to_choice: [a, b]\nvalidation_rows: whole-sentences\n"
        "data_files: {train: train.csv, validation: val.csv, test: train.csv}\n"
    )
    spec = str(tmp_path / "task.yaml")
    assert has_validation_split(spec) and not has_validation_split(spec, "hub")
    data = load_run_data(FinetuneConfig(task=spec, n_train=8, n_val=5, n_test=4, n_ood=4, n_ppl=2))
    assert data.val_source == "the task's validation split (whole-sentences)" and data.ood_task == "sst2"
    assert data.val["prompt"] == [
        "Text: A whole sentence of six words.\nLabel:",
        "Text: Another complete sentence is here!\nLabel:",
    ]
    assert len(data.train) == 8 and all(p.startswith("Text: phrase ") for p in data.train["prompt"])


def test_boolq_carves_validation_from_training():
    data = load_run_data(FinetuneConfig(task="boolq", n_train=16, n_val=4, n_test=4, n_ood=4, n_ppl=2))
    assert data.val_source == "carved from the training draw" and len(data.val) == 4 and len(data.train) == 16
    assert data.ood_task == "sst2" and set(data.val["target"]) <= {" no", " yes"}
