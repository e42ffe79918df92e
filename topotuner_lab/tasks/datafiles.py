"""Local data files of a task, read as a ``datasets.Dataset`` after a check that makes a malformed file one clear error.

Formats, by suffix: ``.tsv`` (tab-separated, no quoting: a quote is text), ``.csv`` (comma-separated, ``"..."``
quoting), each with a header line unless the spec gives ``column_names``; ``.jsonl`` (one JSON object per line);
``.json`` (a JSON list of objects, or SQuAD's layout ``{"data": [{"title", "paragraphs": [{"context", "qas"}]}]}``,
read as one row per question: ``id``, ``title``, ``context``, ``question``, ``answers`` (their texts)). Any of them
may be gzipped (``.jsonl.gz``). A file of another suffix given directly (``source=path``) is read as TSV.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from pathlib import Path
from typing import Any

from topotuner_lab._io.errors import TaskError

__all__ = ["FORMATS", "file_format", "read_data_file"]

#: the data file suffixes a task spec may name, and what each holds
FORMATS: dict[str, str] = {
    ".tsv": "tab-separated text, a header line unless column_names is given",
    ".csv": "comma-separated text (quote a field holding a comma), a header line unless column_names is given",
    ".jsonl": "one JSON object per line",
    ".json": "a JSON list of objects, or SQuAD's layout (one row per question)",
}


def file_format(path: str | Path) -> str:
    """The format suffix of ``path`` (``.jsonl`` for ``x.jsonl.gz``): a key of :data:`FORMATS`, or another suffix."""
    suffixes = [s.lower() for s in Path(path).suffixes]
    if suffixes[-1:] == [".gz"]:
        suffixes = suffixes[:-1]
    return suffixes[-1] if suffixes else ""


def _text_of(path: Path) -> str:
    """The file's text; a file that is not UTF-8 is a :class:`TaskError` naming the first bad byte and its line."""
    data = path.read_bytes()
    if path.suffix.lower() == ".gz":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise TaskError(f"data file {path} is not a valid gzip file ({exc})", "gzip it again, or unzip it") from exc
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


def _check_width(path: Path, rows: list[tuple[int, list[str]]], header: bool, width: int, sep: str) -> None:
    """Refuse a header without rows and a row of another width than the header's (or ``column_names``')."""
    layout = "a header line, then" if header else "no header;"
    fix = f"give {path.name} as UTF-8 text with {layout} one example per line: {width} {sep}-separated fields"
    if header and len(rows) == 1:
        raise TaskError(f"data file {path} holds a header but no rows", fix)
    for number, fields in rows[1:] if header else rows:
        if len(fields) != width:
            raise TaskError(
                f"line {number} of data file {path} has {len(fields)} {sep}-separated field(s), not {width}"
                + (" as its header" if header else ""),
                fix + (" (a tab inside the text splits it)" if sep == "tab" else " (quote a field holding a comma)"),
            )


def _check_tsv(path: Path, column_names: tuple[str, ...]) -> None:
    """Refuse a TSV the reader would fail on: not UTF-8, empty, a header without rows, a row of another width."""
    rows = [(n, line.split("\t")) for n, line in _lines(path)]
    header = not column_names
    _check_width(path, rows, header, len(rows[0][1]) if header else len(column_names), "tab")


def _check_csv(path: Path, column_names: tuple[str, ...]) -> None:
    """Refuse a CSV the reader would fail on, as :func:`_check_tsv` (fields may be quoted, and span lines)."""
    _lines(path)  # UTF-8, not empty
    reader = csv.reader(io.StringIO(_text_of(path), newline=""))
    rows: list[tuple[int, list[str]]] = []
    try:
        for fields in reader:
            if fields:
                rows.append((reader.line_num, fields))
    except csv.Error as exc:
        raise TaskError(
            f"line {reader.line_num} of data file {path} is not valid CSV ({exc})",
            "close every quoted field, or write the file as TSV",
        ) from exc
    header = not column_names
    _check_width(path, rows, header, len(rows[0][1]) if header else len(column_names), "comma")


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


def _squad_rows(data: dict[str, Any]) -> list[dict[str, Any]] | None:
    """SQuAD's nested layout flattened to one row per question, or None when ``data`` is not laid out so."""
    articles = data.get("data")
    if not isinstance(articles, list):
        return None
    try:
        return [
            {
                "id": str(qa["id"]),
                "title": str(article.get("title", "")),
                "context": str(paragraph["context"]),
                "question": str(qa["question"]),
                "answers": [str(answer["text"]) for answer in qa["answers"]],
            }
            for article in articles
            for paragraph in article["paragraphs"]
            for qa in paragraph["qas"]
        ]
    except (KeyError, TypeError):
        return None


def _json_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSON file: a non-empty list of objects, or SQuAD's layout flattened."""
    _lines(path)  # UTF-8, not empty
    try:
        rows = json.loads(_text_of(path))
    except ValueError as exc:
        raise TaskError(f"data file {path} is not valid JSON ({exc})", "give a JSON list of objects") from exc
    if isinstance(rows, dict):
        rows = _squad_rows(rows)
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise TaskError(
            f"data file {path} is not a JSON list of objects (nor SQuAD's layout)",
            "give [{...}, {...}], or one object per line as .jsonl",
        )
    return rows


def read_data_file(path: Path, task: str, column_names: tuple[str, ...] = (), what: str = "") -> Any:
    """``path`` as a ``datasets.Dataset``, checked first so that a malformed file is one clear :class:`TaskError`.

    Parameters
    ----------
    path : the data file (its suffix says its format, see :data:`FORMATS`).
    task : the task's name, for messages.
    column_names : the columns of a headerless ``.tsv`` / ``.csv`` (empty: the first line is the header).
    what : where the path came from, for messages (``"data_files.train"``).
    """
    import datasets

    if not path.is_file():
        raise TaskError(
            f"data file {path}{f' ({what})' if what else ''} for task {task!r} does not exist",
            "check TOPOTUNER_DATA / the shared data folder (a relative path in a spec file is looked up beside the "
            "spec, then in the data folder), or pass source='hub'",
        )
    suffix = file_format(path)
    kwargs: dict[str, Any]
    if suffix == ".jsonl":
        _check_jsonl(path)
        kwargs = {"path": "json"}
    elif suffix == ".json":
        return datasets.Dataset.from_list(_json_rows(path))
    elif suffix == ".csv":
        _check_csv(path, column_names)
        kwargs = {"path": "csv"}
    else:
        _check_tsv(path, column_names)
        kwargs = {"path": "csv", "delimiter": "\t", "quoting": 3}
    if column_names and kwargs["path"] == "csv":
        kwargs["column_names"] = list(column_names)
    try:
        return datasets.load_dataset(data_files=str(path), split="train", **kwargs)
    except Exception as exc:  # noqa: BLE001 - the reader's own errors (pyarrow, pandas) become one clear line
        cause = exc.__cause__ or exc
        reason = (str(cause).strip().splitlines() or [""])[0][:200]
        raise TaskError(
            f"data file {path} cannot be read as {kwargs['path'].upper()} ({cause.__class__.__name__}: {reason})",
            "check the file: UTF-8 text, one example per line"
            + (", tab-separated" if "delimiter" in kwargs else ", comma-separated" if suffix == ".csv" else "")
            + (", each a JSON object" if kwargs["path"] == "json" else ""),
        ) from exc
