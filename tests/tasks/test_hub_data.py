"""Task data outside this setup: the offline copy when present, else the hub through ``datasets.load_dataset``.

The hub is stood in by parquet files in its layout (``<dataset id>/<config>/<split>-00000-of-00001.parquet``, the
hub's column types) that the real ``datasets.load_dataset`` reads with its parquet builder: everything between
``load_task`` and that call is the package's own code.
"""

from __future__ import annotations

import datasets
import pytest

from topotuner_lab.cli import main
from topotuner_lab.tasks.loading import data_source_of, has_validation_split, load_task
from topotuner_lab.training.results import load_results

SENTIMENT = datasets.ClassLabel(names=["negative", "positive"])


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """The hub stood in by parquet folders under ``tmp_path/hub``; returns (root, the hub calls made).

    ``datasets.load_dataset(ID, CONFIG, split=S)`` reads ``root/ID/CONFIG/S-*.parquet`` (the only config folder
    without CONFIG) through the real ``datasets.load_dataset("parquet", ...)``; a dataset not there fails as an
    unreachable hub does. Local builders (csv, json: the offline copies) pass through untouched.
    """
    real = datasets.load_dataset
    root, calls = tmp_path / "hub", []

    def load_dataset(path=None, name=None, *, split=None, **kwargs):
        if "/" not in str(path):  # a builder name: an offline file read by read_data_file
            return real(path, name, split=split, **kwargs)
        calls.append((path, name, split))
        folders = [root / path / name] if name else sorted((root / path).glob("*"))
        files = sorted(str(f) for folder in folders[:1] for f in folder.glob(f"{split}-*.parquet"))
        if not files:
            raise ConnectionError(f"Couldn't reach {path!r} on the Hub (stand-in: no {split} files)")
        return real("parquet", data_files={split: files}, split=split, cache_dir=str(tmp_path / "hf-cache"))

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return root, calls


def _publish(root, dataset_id, config, split, columns, features):
    """One split of a hub dataset, as the hub stores it."""
    folder = root / dataset_id / config
    folder.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_dict(columns, features=datasets.Features(features)).to_parquet(
        folder / f"{split}-00000-of-00001.parquet"
    )


def _sentences(n, offset=0):
    return [f"review {offset + i}: {'a fine' if i % 3 else 'a dull'} film, {i * 7 % 11} stars" for i in range(n)]


def _sst2_both_ways(tmp_path, root):
    """The same SST-2 rows as an offline copy (GLUE's TSV files) and as the hub's nyu-mll/glue sst2 parquet."""
    train, test = _sentences(40), _sentences(12, offset=100)
    labels = {"train": [i % 3 != 0 for i in range(40)], "test": [i % 2 == 0 for i in range(12)]}
    offline = tmp_path / "data" / "sst2"
    offline.mkdir(parents=True)
    for name, texts, lab in (("train", train, labels["train"]), ("test", test, labels["test"])):
        lines = ["sentence\tlabel", *(f"{t}\t{int(x)}" for t, x in zip(texts, lab))]
        (offline / f"{name}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (offline / "dev.tsv").write_text("sentence\tlabel\na whole sentence of a review .\t1\n", encoding="utf-8")
    features = {"sentence": datasets.Value("string"), "label": SENTIMENT, "idx": datasets.Value("int32")}
    for split, texts, lab in (("train", train, labels["train"]), ("validation", test, labels["test"])):
        columns = {"sentence": texts, "label": [int(x) for x in lab], "idx": list(range(len(texts)))}
        _publish(root, "nyu-mll/glue", "sst2", split, columns, features)
    return tmp_path / "data"


def test_without_the_offline_copy_a_task_loads_from_the_hub_with_the_same_rows(tmp_path, monkeypatch, hub):
    root, calls = hub
    data = _sst2_both_ways(tmp_path, root)
    monkeypatch.setenv("TOPOTUNER_DATA", str(data))
    offline = {split: load_task("sst2", split, 9, seed=3).to_list() for split in ("train", "test")}
    assert calls == []  # the offline copy is read first: the hub is not asked
    assert data_source_of("sst2", "train") == f"offline {data / 'sst2' / 'train.tsv'}" and has_validation_split("sst2")

    monkeypatch.setenv("TOPOTUNER_DATA", str(tmp_path / "no-data"))  # no offline folder
    for split, hub_split in (("train", "train"), ("test", "validation")):
        note = (
            rf"task 'sst2': no offline copy \(.*no-data/sst2/{split}.tsv is missing\), reading the hub "
            rf"nyu-mll/glue \(sst2\), split {hub_split}$"
        )
        with pytest.warns(UserWarning, match=note):
            rows = load_task("sst2", split, 9, seed=3).to_list()
        assert rows == offline[split]  # the same rows drawn, in the same order
        assert data_source_of("sst2", split) == f"hub nyu-mll/glue (sst2), split {hub_split}"
    assert calls == [("nyu-mll/glue", "sst2", "train"), ("nyu-mll/glue", "sst2", "validation")]
    assert not has_validation_split("sst2")  # the hub's validation split is the test set here


@pytest.mark.slow  # a fine-tune
def test_a_hub_only_task_trains_and_the_run_records_its_source(tmp_path, hub, capsys):
    root, calls = hub
    features = {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["neg", "pos"])}
    for split, n in (("train", 16), ("test", 8)):
        columns = {"text": _sentences(n, offset=len(split)), "label": [i % 2 for i in range(n)]}
        _publish(root, "stanfordnlp/imdb", "plain_text", split, columns, features)
    out = tmp_path / "run"
    sizes = ["--n-train", "8", "--n-test", "4", "--n-ood", "0", "--n-ppl", "0", "--max-length", "32"]
    argv = ["finetune", "--model", "tiny-llama", "--task", "imdb", "--epochs", "1", *sizes, "-o", str(out)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for split in ("train", "test"):
        assert (
            f"warning: task 'imdb': no offline copy (its spec names no local {split} file), reading the hub "
            f"stanfordnlp/imdb, split {split}\n" in err
        )
    assert {c[0] for c in calls} == {"stanfordnlp/imdb"}
    results = load_results(out / "results.json")
    assert results["data_sources"] == {
        "imdb/train": "hub stanfordnlp/imdb, split train",
        "imdb/test": "hub stanfordnlp/imdb, split test",
    }
    assert len(results["test_correct"]) == 4


def test_neither_an_offline_copy_nor_the_hub_is_one_named_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TOPOTUNER_DATA", str(tmp_path / "no-data"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)  # the real hub path, failing fast
    monkeypatch.setattr("datasets.config.HF_HUB_OFFLINE", True)
    argv = ["finetune", "--model", "tiny-llama", "--task", "sst2", "--n-ood", "0", "--n-ppl", "0"]
    assert main([*argv, "-o", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    error = err[err.index("error: ") :].splitlines()
    assert error[0].startswith(
        f"error: task 'sst2' has no offline copy ({tmp_path / 'no-data' / 'sst2' / 'train.tsv'} is missing), and its "
        "hub dataset nyu-mll/glue (sst2) cannot be read (ConnectionError: "
    )
    assert len(error) == 2 and error[1].startswith("  How to fix: put the task's files in a data folder")
    assert "TOPOTUNER_DATA" in error[1] and "--data-source FOLDER" in error[1] and "network access" in error[1]
