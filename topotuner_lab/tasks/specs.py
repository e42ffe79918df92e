"""Tasks as prompt + target text for a causal LM, read with ``datasets`` from a local file or the hub.

Classification (SST-2, AG News) is framed as a prompt followed by a label word and scored by the
label's likelihood; GSM8K as question -> worked answer, scored by exact match of the final number.
Local copies are looked up in ``$TOPOTUNER_DATA`` or the ``shared/data`` folder beside the project.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topotuner_lab._io.errors import TaskError


@dataclass(frozen=True)
class TaskSpec:
    """How one task is read and framed."""

    name: str
    kind: str  # "classification" or "generation"
    template: str  # prompt with a {text} slot
    labels: tuple[str, ...] = ()  # label words (classification), index = label id
    files: tuple[tuple[str, str], ...] = ()  # (split, file relative to the data dir)
    text_column: str = "text"
    label_column: str = "label"
    hub: tuple[str, ...] = ()  # datasets.load_dataset(*hub)
    hub_splits: tuple[tuple[str, str], ...] = ()
    #: which rows of the local validation split are kept, so validation looks like the test set ("" keeps all;
    #: "whole-sentences": SST-2's carved-out GLUE train rows are mostly phrases, its test rows whole sentences)
    validation_rows: str = ""


#: a validation row filter's test of a row's text
VALIDATION_FILTERS = {"whole-sentences": lambda text: text.rstrip()[-1:] in ".!?" and len(text.split()) >= 5}


def has_validation_split(name: str, source: str | os.PathLike[str] | None = None) -> bool:
    """Whether ``name`` has a validation split of its own, apart from train and test, in local data.

    On the hub SST-2's "validation" is the test set here, so it does not count.
    """
    return source != "hub" and "validation" in dict(get_task(name).files)


TASKS: dict[str, TaskSpec] = {
    "sst2": TaskSpec(
        "sst2",
        "classification",
        "Review: {text}\nSentiment:",
        (" negative", " positive"),
        (("train", "sst2/train.tsv"), ("validation", "sst2/dev.tsv"), ("test", "sst2/test.tsv")),
        "sentence",
        "label",
        ("nyu-mll/glue", "sst2"),
        (("train", "train"), ("validation", "validation"), ("test", "validation")),
        validation_rows="whole-sentences",
    ),
    "agnews": TaskSpec(
        "agnews",
        "classification",
        "News: {text}\nTopic:",
        (" World", " Sports", " Business", " Science"),
        (("train", "agnews/dev.tsv"), ("test", "agnews/test.tsv")),
        "text",
        "label",
        ("fancyzhx/ag_news",),
        (("train", "train"), ("test", "test")),
    ),
    "gsm8k": TaskSpec(
        "gsm8k",
        "generation",
        "Question: {text}\nAnswer:",
        (),
        (("train", "gsm8k/train.jsonl"), ("test", "gsm8k/test.jsonl")),
        "question",
        "answer",
        ("openai/gsm8k", "main"),
        (("train", "train"), ("test", "test")),
    ),
}
_AGNEWS_NAMES = {"World": 0, "Sports": 1, "Business": 2, "Sci/Tech": 3}


def data_dir() -> Path:
    """The offline data folder: ``$TOPOTUNER_DATA``, else the first ``shared/data`` above the package or cwd."""
    if os.environ.get("TOPOTUNER_DATA"):
        return Path(os.environ["TOPOTUNER_DATA"])
    for start in (Path(__file__).resolve().parent, Path.cwd().resolve()):
        for folder in (start, *start.parents):
            candidate = folder / "shared" / "data"
            if candidate.is_dir():
                return candidate
    raise TaskError(
        "no offline data folder found (looked for shared/data above the project and the current folder)",
        "set TOPOTUNER_DATA to the folder holding sst2/, agnews/, gsm8k/",
    )


def get_task(name: str) -> TaskSpec:
    """The spec of a task by name; an unknown name is a :class:`TaskError` listing the known ones."""
    if name not in TASKS:
        raise TaskError(f"unknown task {name!r}", f"use one of {', '.join(TASKS)}")
    return TASKS[name]


def _text_of(path: Path) -> str:
    """The file's text; a file that is not UTF-8 is a :class:`TaskError` naming the first bad byte and its line."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise TaskError(
            f"data file {path} is not UTF-8 text (byte 0x{data[exc.start]:02x} on line {line})",
            "save it as UTF-8 (e.g. iconv -f latin1 -t utf-8), or point --data-source at the right folder",
        ) from exc


def _lines(path: Path) -> list[tuple[int, str]]:
    """The non-blank lines of a UTF-8 file with their numbers (from 1); an empty file is a :class:`TaskError`."""
    lines = [(n, line.rstrip("\r")) for n, line in enumerate(_text_of(path).split("\n"), start=1)]
    lines = [(n, line) for n, line in lines if line]
    if not lines:
        raise TaskError(f"data file {path} is empty", "give a file with one example per line")
    return lines


def _check_tsv(spec: TaskSpec, path: Path, header: bool) -> None:
    """Refuse a TSV the reader would fail on: not UTF-8, empty, a header without rows, a row of another width."""
    lines = _lines(path)
    width = len(lines[0][1].split("\t")) if header else 2
    layout = "a header line, then" if header else "no header;"
    fix = f"give {path.name} as UTF-8 text with {layout} one example per line: {width} tab-separated fields"
    if header and len(lines) == 1:
        raise TaskError(f"data file {path} holds a header but no rows", fix)
    for number, line in lines[1:] if header else lines:
        fields = line.count("\t") + 1
        if fields != width:
            raise TaskError(
                f"line {number} of data file {path} has {fields} tab-separated field(s), not {width}"
                + (" as its header" if header else ""),
                fix + " (a tab inside the text splits it)",
            )


def _check_jsonl(path: Path) -> None:
    """Refuse a JSON-lines file the reader would fail on: not UTF-8, empty, a line that is not a JSON object."""
    for number, line in _lines(path):
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict):
            raise TaskError(
                f"line {number} of data file {path} is not a JSON object", "give one JSON object per line (JSONL)"
            )


def _read_local(spec: TaskSpec, path: Path) -> Any:
    """A local data file as a ``datasets.Dataset``, checked first so that a malformed file is a clear TaskError."""
    import datasets

    if not path.is_file():
        raise TaskError(
            f"data file {path} for task {spec.name!r} does not exist",
            "check TOPOTUNER_DATA / the shared data folder, or pass source='hub'",
        )
    headerless = spec.name == "agnews"  # TSV without header: text, label name
    if path.suffix == ".jsonl":
        _check_jsonl(path)
        kwargs: dict[str, Any] = {"path": "json"}
    else:
        _check_tsv(spec, path, header=not headerless)
        kwargs = {"path": "csv", "delimiter": "\t", "quoting": 3}
        if headerless:
            kwargs["column_names"] = ["text", "label"]
    try:
        return datasets.load_dataset(data_files=str(path), split="train", **kwargs)
    except Exception as exc:  # noqa: BLE001 - the reader's own errors (pyarrow, pandas) become one clear line
        cause = exc.__cause__ or exc
        reason = (str(cause).strip().splitlines() or [""])[0][:200]
        raise TaskError(
            f"data file {path} cannot be read as {kwargs['path'].upper()} ({cause.__class__.__name__}: {reason})",
            "check the file: UTF-8 text, one example per line"
            + (", tab-separated" if kwargs["path"] == "csv" else ", each a JSON object"),
        ) from exc


def _check_columns(spec: TaskSpec, ds: Any, where: str) -> None:
    missing = [c for c in (spec.text_column, spec.label_column) if c not in ds.column_names]
    if missing:
        raise TaskError(
            f"{where} has no column(s) {missing} needed by task {spec.name!r} (it has {ds.column_names})",
            f"give a file with columns {spec.text_column!r} and {spec.label_column!r}",
        )


def _label_id(spec: TaskSpec, value: Any) -> int:
    """The label's index; a label name (AG News) or a number, checked against the task's labels."""
    if spec.name == "agnews" and isinstance(value, str) and value in _AGNEWS_NAMES:
        return _AGNEWS_NAMES[value]
    try:
        label = int(value)
    except (TypeError, ValueError):
        label = -1
    if not 0 <= label < len(spec.labels):
        raise TaskError(
            f"label {value!r} is not one of task {spec.name!r}'s {len(spec.labels)} labels",
            f"give labels 0..{len(spec.labels) - 1}"
            + (f" or names {list(_AGNEWS_NAMES)}" if spec.name == "agnews" else ""),
        )
    return label


def final_number(answer: str) -> str | None:
    """The number after GSM8K's ``####`` (or the last number in a generated answer)."""
    tail = answer.split("####")[-1]
    numbers = re.findall(r"-?\d[\d,]*\.?\d*", tail)
    return numbers[-1].replace(",", "").rstrip(".") if numbers else None


def load_task(
    name: str, split: str = "train", n: int | None = None, seed: int = 0, source: str | os.PathLike[str] | None = None
) -> Any:
    """Rows with ``prompt``, ``target`` (text to learn), ``label`` (int, -1 for generation) as a ``datasets.Dataset``.

    ``source``: None reads the offline copy; ``"hub"`` loads from the Hugging Face hub; a folder is read like the
    offline copy (``sst2/train.tsv``...); a file path reads that file for the requested split.
    ``n`` rows are drawn at random with ``seed`` (the data-order seed recorded in results).
    """
    spec = get_task(name)
    if source == "hub":
        import datasets

        hub_split = dict(spec.hub_splits).get(split)
        if hub_split is None:
            raise TaskError(f"task {name!r} has no split {split!r}", f"use one of {[s for s, _ in spec.hub_splits]}")
        ds, where = datasets.load_dataset(*spec.hub, split=hub_split), f"hub {spec.hub}"
    else:
        rel = dict(spec.files).get(split)
        if source is None or Path(source).is_dir():  # a data folder: the offline copy or one laid out like it
            folder = data_dir() if source is None else Path(source)
            if rel is None:
                raise TaskError(
                    f"task {name!r} has no local split {split!r}", f"use one of {[s for s, _ in spec.files]}"
                )
            path = folder / rel
        else:
            path = Path(source)
        ds, where = _read_local(spec, path), str(path)
    _check_columns(spec, ds, where)
    ds = ds.filter(lambda row: row[spec.text_column] is not None and row[spec.label_column] is not None)
    if split == "validation" and spec.validation_rows:
        keep = VALIDATION_FILTERS[spec.validation_rows]
        ds = ds.filter(lambda row: keep(str(row[spec.text_column])))
    if len(ds) == 0:
        raise TaskError(
            f"{where} holds no example with both {spec.text_column!r} and {spec.label_column!r}",
            "give a file with at least one complete example",
        )
    if n is not None and n < len(ds):
        ds = ds.shuffle(seed=seed).select(range(n))

    def frame(row: dict[str, Any]) -> dict[str, Any]:
        text = str(row[spec.text_column]).strip()
        if spec.kind == "classification":
            label = _label_id(spec, row[spec.label_column])
            return {"prompt": spec.template.format(text=text), "target": spec.labels[label], "label": label}
        return {
            "prompt": spec.template.format(text=text),
            "target": " " + str(row[spec.label_column]).strip(),
            "label": -1,
        }

    import datasets

    features = datasets.Features(
        {"prompt": datasets.Value("string"), "target": datasets.Value("string"), "label": datasets.Value("int64")}
    )
    return ds.map(frame, remove_columns=ds.column_names, features=features)
