"""A task's rows as a fine-tune reads them: found, carved, filtered and framed as prompt + target (:func:`load_task`).

Rows come from the offline copy, a data folder laid out like it, one data file (:mod:`.datafiles`), a BEIR folder
(ranking tasks, :mod:`.retrieval`) or the hub (:mod:`.hub`). Local copies are looked up in ``$TOPOTUNER_DATA`` or the
``shared/data`` folder beside the project (:func:`data_dir`); where a task's copy is absent there and its spec names a
hub dataset, the hub is read instead, with a warning. A split's rows are then carved out of a shared file
(:mod:`.carve`), filtered, checked for the fields the spec names and rendered through its templates
(:mod:`.templates`); any failure is one :class:`TaskError` line naming the task, the file and the fix. The spec itself
is :mod:`.schema`'s, found by :mod:`.registry`.
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path
from typing import Any

from topotuner_lab._io.errors import TaskError
from topotuner_lab.tasks.carve import carve
from topotuner_lab.tasks.datafiles import read_data_file
from topotuner_lab.tasks.hub import hub_where, read_hub
from topotuner_lab.tasks.registry import get_task, training_spec
from topotuner_lab.tasks.schema import SPLITS, VALIDATION_FILTERS, TaskSpec
from topotuner_lab.tasks.templates import evaluate, fields_of, is_field, render

__all__ = ["data_dir", "data_source_of", "has_validation_split", "load_task"]


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


def has_validation_split(name: str | os.PathLike[str] | TaskSpec, source: str | os.PathLike[str] | None = None) -> bool:
    """Whether ``name`` has a validation split of its own, apart from train and test, in local data.

    On the hub SST-2's "validation" is the test set here, so it does not count (nor where the hub stands in for an
    absent offline copy).
    """
    spec = training_spec(name)
    return (
        source != "hub"
        and "validation" in spec.data_files
        and not (source is None and _hub_stands_in(spec, "validation"))
    )


def _validation_column(spec: TaskSpec) -> str:
    return spec.validation_column or fields_of(spec.doc_to_text)[0]


def _offline_file(spec: TaskSpec, split: str) -> tuple[Path | None, str]:
    """The offline copy of ``split`` where it is present (else None), and where it was looked for (for messages)."""
    rel = spec.data_files.get(split)
    if rel is None:
        return None, f"its spec names no local {split} file"
    path = Path(rel).expanduser()
    if not path.is_absolute():
        try:
            path = data_dir() / path
        except TaskError:
            return None, "TOPOTUNER_DATA is unset and no shared/data lies above the project or the current folder"
    return (path if path.is_file() else None), f"{path} is missing"


def _hub_stands_in(spec: TaskSpec, split: str) -> str:
    """Why the offline copy of ``split`` is absent, where the spec's hub copy stands in for it; else ``""``."""
    if spec.output_type == "ranking" or spec.dataset_path is None or spec.hub_split(split) is None:
        return ""
    path, looked = _offline_file(spec, split)
    return looked if path is None else ""


def data_source_of(
    name: str | os.PathLike[str] | TaskSpec, split: str, source: str | os.PathLike[str] | None = None
) -> str:
    """Where :func:`load_task` reads ``split``'s rows from, as results record it.

    ``offline PATH``; ``hub ID (NAME), split S`` (asked for, or standing in for an absent offline copy); or
    ``folder PATH`` / ``file PATH`` (a ``source`` given).
    """
    spec = get_task(name) if split == "test" else training_spec(name)
    if source == "hub" or (source is None and _hub_stands_in(spec, split)):
        return hub_where(spec, split)
    if source is None:
        return f"offline {_offline_file(spec, split)[0]}"
    return f"{'folder' if Path(source).is_dir() else 'file'} {source}"


def _rows(spec: TaskSpec, split: str, source: str | os.PathLike[str] | None) -> tuple[Any, str]:
    """The raw rows of ``split`` and where they came from (for messages).

    Without a ``source``, the hub stands in for an absent offline copy where the spec names one (with a warning).
    """
    if spec.output_type == "ranking" and source == "hub":
        raise TaskError(f"ranking task {spec.task!r} reads a local BEIR folder", "drop source='hub'")
    offline = _hub_stands_in(spec, split) if source is None else ""
    if source == "hub" or offline:
        return read_hub(spec, split, offline)
    rel = spec.data_files.get(split)
    if source is None or Path(source).is_dir():  # a data folder: the offline copy or one laid out like it
        if rel is None:
            raise TaskError(f"task {spec.task!r} has no local split {split!r}", f"use one of {list(spec.data_files)}")
        path = Path(rel).expanduser()
        if not path.is_absolute():
            path = (data_dir() if source is None else Path(source)) / path
    else:
        path = Path(source)
    if spec.output_type == "ranking":
        return _ranking_rows(spec, path), str(path)
    return read_data_file(path, spec.task, spec.column_names, f"data_files.{split}" if rel else ""), str(path)


def _ranking_rows(spec: TaskSpec, qrels: Path) -> Any:
    """One row per query of a BEIR split (``qrels`` is its ``qrels/<split>.tsv``) with a relevant document.

    The row holds ``query_id``, ``query``, the ``title`` and ``text`` of its most relevant judged document (what
    training learns the query from) and ``ranking``: its BM25 candidates and judgements as JSON (what is scored).
    """
    import datasets

    from topotuner_lab.tasks.retrieval import bm25_candidates, ranking_rows, read_beir

    beir = read_beir(qrels.parent.parent, qrels.stem)
    rows = []
    for row in ranking_rows(beir, bm25_candidates(beir.corpus, beir.queries, spec.candidates)):
        relevant = sorted((-rel, doc) for doc, rel in row["qrels"].items() if rel > 0)
        if relevant:  # a query without a relevant document has nothing to learn and no nDCG
            document = beir.corpus[relevant[0][1]]
            ranking = json.dumps({"candidates": row["candidates"], "qrels": row["qrels"]})
            rows.append({"query_id": row["query_id"], "query": row["query"], **document, "ranking": ranking})
    return datasets.Dataset.from_list(rows)


def _check_columns(spec: TaskSpec, ds: Any, where: str) -> None:
    missing = [c for c in spec.required_fields if c not in ds.column_names]
    if missing:
        named = [n for n, source in spec._templates() if set(fields_of(source)) & set(missing)] or ["validation_column"]
        named = list(dict.fromkeys(named))
        raise TaskError(
            f"{where} has no column(s) {missing} named by {', '.join(named)} of task {spec.task!r} "
            f"(it has {ds.column_names})",
            f"give a file with columns {list(spec.required_fields)}, or name its columns in the spec's "
            f"{' and '.join(named)}",
        )


def _filtered(spec: TaskSpec, ds: Any, split: str, where: str) -> Any:
    """The rows of ``split`` that ``split_filter`` keeps (all without one); a failing expression is a TaskError."""
    expression = spec.split_filter.get(split)
    if expression is None:
        return ds

    def keep(row: dict[str, Any], index: int) -> bool:
        try:
            return bool(evaluate(expression, {**row, "_index": index}))
        except Exception as exc:  # noqa: BLE001 - Jinja's errors become one clear line
            raise TaskError(
                f"split_filter.{split} of task {spec.task!r} fails on row {index} of {where} "
                f"({exc.__class__.__name__}: {str(exc)[:160]})",
                f"fix split_filter.{split}: it may read the row's fields {sorted(row)} and _index",
            ) from None

    return ds.filter(keep, with_indices=True)


def _render(spec: TaskSpec, name: str, row: dict[str, Any], where: str, source: str | None = None) -> Any:
    """``spec``'s template ``name`` (or its ``source``, one of several) over ``row``; a failure is a TaskError."""
    try:
        return render(getattr(spec, name) if source is None else source, row)
    except Exception as exc:  # noqa: BLE001 - Jinja's errors (a failed filter, the sandbox) become one clear line
        reason = (str(exc).strip().splitlines() or [""])[0][:200]
        raise TaskError(
            f"{name} of task {spec.task!r} fails on a row of {where} ({exc.__class__.__name__}: {reason})",
            f"fix {name} in the spec: it may read the row's fields {sorted(row)} and Jinja2 filters",
        ) from None


def _carved(spec: TaskSpec, ds: Any, split: str, where: str) -> Any:
    """The rows ``split_carve`` gives ``split`` of the spec's data file (all without one): see :mod:`.carve`."""
    carving = spec.split_carve
    if not carving:
        return ds
    fields = [carving["by"], *([carving["strata"]] if "strata" in carving else [])]
    missing = [f for f in fields if f not in ds.column_names]
    if missing:
        raise TaskError(
            f"{where} has no column(s) {missing} named by split_carve of task {spec.task!r} (it has {ds.column_names})",
            "name the file's columns in split_carve.by and split_carve.strata",
        )
    keys = [str(v) for v in ds[carving["by"]]]
    strata = [str(v) for v in ds[carving["strata"]]] if "strata" in carving else None
    shares = [(s, carving["shares"][s]) for s in SPLITS if s in carving["shares"]]
    splits = carve(keys, strata, shares, carving.get("seed", 0))
    return ds.select([i for i, s in enumerate(splits) if s == split])


def _choices(spec: TaskSpec, row: dict[str, Any], where: str) -> list[str]:
    """A row's options: the fixed ``doc_to_choice`` words, or the row's own (a field's list, a template's list).

    A template's text is read as a Python list literal, as lm-evaluation-harness reads it.
    """
    if not spec.per_row_choices:
        return list(spec.doc_to_choice)
    value = _render(spec, "doc_to_choice", row, where)
    if isinstance(value, str) and not is_field(str(spec.doc_to_choice)):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            pass
    if not (isinstance(value, (list, tuple)) and len(value) >= 2 and all(isinstance(v, str) and v for v in value)):
        raise TaskError(
            f"doc_to_choice of task {spec.task!r} gives {str(value)[:120]!r} for a row of {where}, not a list of 2 or "
            "more non-empty texts",
            'make doc_to_choice a field holding a list of texts, or a template rendering one, e.g. "{{[a, b, c]}}"',
        )
    return list(value)


def _complete(needed: tuple[str, ...]) -> str:
    if len(needed) == 2:
        return f"both {needed[0]!r} and {needed[1]!r}"
    return f"{needed[0]!r}" if len(needed) == 1 else f"all of {list(needed)}"


def load_task(
    name: str | os.PathLike[str] | TaskSpec,
    split: str = "train",
    n: int | None = None,
    seed: int = 0,
    source: str | os.PathLike[str] | None = None,
) -> Any:
    """Rows with ``prompt``, ``target`` (text to learn), ``label`` (int, -1 for generation) as a ``datasets.Dataset``.

    ``name``: a built-in task, the path of a ``.yaml`` task spec, or a :class:`TaskSpec`.
    ``source``: None reads the offline copy; ``"hub"`` loads from the Hugging Face hub; a folder is read like the
    offline copy (``sst2/train.tsv``...); a file path reads that file for the requested split.
    ``n`` rows are drawn at random with ``seed`` (the data-order seed recorded in results).
    """
    spec = get_task(name) if split == "test" else training_spec(name)
    ds, where = _rows(spec, split, source)
    # split_carve cuts the spec's files (or a folder laid out like them), no other
    spec_files = not _hub_stands_in(spec, split) if source is None else source != "hub" and Path(source).is_dir()
    ds = _filtered(spec, _carved(spec, ds, split, where) if spec_files else ds, split, where)
    _check_columns(spec, ds, where)
    needed = spec.required_fields
    ds = ds.filter(lambda row: all(row[c] is not None for c in needed))
    if split == "validation" and spec.validation_rows:
        keep, column = VALIDATION_FILTERS[spec.validation_rows], _validation_column(spec)
        ds = ds.filter(lambda row: keep(str(row[column])))
    if len(ds) == 0:
        raise TaskError(
            f"{where} holds no example with {_complete(needed)}", "give a file with at least one complete example"
        )
    if n is not None and n < len(ds):
        ds = ds.shuffle(seed=seed).select(range(n))

    def frame(row: dict[str, Any]) -> dict[str, Any]:
        prompt = str(_render(spec, "doc_to_text", row, where))
        target = _render(spec, "doc_to_target", row, where)
        if spec.output_type == "multiple_choice":
            choices = _choices(spec, row, where)
            if isinstance(target, str) and target.isdigit() and not is_field(spec.doc_to_target):
                target = int(target)  # as lm-eval reads a template's whole number: an index
            label = spec.label_index(target, choices)
            framed = {"prompt": prompt, "target": spec.target_delimiter + choices[label], "label": label}
            return framed | ({"choices": choices} if spec.per_row_choices else {})
        if spec.doc_to_program:  # rendered when scoring: checked now, with the target standing in for the answer
            _render(spec, "doc_to_program", {**row, "completion": str(target)}, where)
        return {
            "prompt": prompt,
            "target": spec.target_delimiter + str(target),
            "label": -1,
            "references": _references(spec, row, where, str(target)),
            "doc": json.dumps(dict(row), default=str),
        }

    import datasets

    columns = {"prompt": datasets.Value("string"), "target": datasets.Value("string"), "label": datasets.Value("int64")}
    if spec.per_row_choices:  # each row's own options
        columns["choices"] = datasets.Sequence(datasets.Value("string"))
    if spec.output_type != "multiple_choice":  # what answers are scored against; the row (programs, rankings...)
        columns |= {"references": datasets.Sequence(datasets.Value("string")), "doc": datasets.Value("string")}
    return ds.map(frame, remove_columns=ds.column_names, features=datasets.Features(columns))


def _references(spec: TaskSpec, row: dict[str, Any], where: str, target: str) -> list[str]:
    """The texts a generated answer is scored against: ``doc_to_references``' (empty ones dropped), else the target."""
    if not spec.doc_to_references:
        return [target]
    if len(spec.doc_to_references) == 1 and is_field(spec.doc_to_references[0]):
        value = row[spec.doc_to_references[0]]
        texts = [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]
    else:
        texts = [str(_render(spec, "doc_to_references", row, where, source)) for source in spec.doc_to_references]
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise TaskError(
            f"doc_to_references of task {spec.task!r} gives no reference text for a row of {where}",
            "make doc_to_references name a field holding the reference texts",
        )
    return texts
