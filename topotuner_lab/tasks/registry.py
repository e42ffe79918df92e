"""Where task specs come from: a spec file by its path (:func:`read_spec`), or a built-in task by name (:data:`TASKS`).

The built-in tasks are spec files shipped in ``tasks/builtin/``, each read on first use; any other task is a spec file
given by its path (:func:`get_task` takes either). :func:`training_spec` follows ``train_task`` to the spec whose rows
train a task. Reading a file adds the checks only a file needs (unknown or lm-evaluation-harness-only keys, missing
fields, paths relative to the spec) to the schema's own (:mod:`.schema`): the one place tasks are registered and read.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from pathlib import Path

from topotuner_lab._io.config import REQUIRED
from topotuner_lab._io.errors import TaskError
from topotuner_lab._io.yaml_files import YamlFolder, read_yaml
from topotuner_lab.tasks.schema import TaskSpec

__all__ = ["BUILTIN_DIR", "TASKS", "get_task", "read_spec", "training_spec"]

#: lm-evaluation-harness keys this reader does not implement (named in the error, so it is not a typo hunt)
_UNSUPPORTED = (
    "dataset_kwargs",
    "description",
    "doc_to_decontamination_query",
    "fewshot_config",
    "filter_list",
    "group",
    "process_docs",
    "process_results",
    "repeats",
    "should_decontaminate",
    "tag",
)
#: where the built-in task specs live (shipped as package data)
BUILTIN_DIR = Path(__file__).with_name("builtin")


def read_spec(path: str | os.PathLike[str], *, builtin: bool = False) -> TaskSpec:
    """The task spec in the YAML file ``path``; any problem is one :class:`TaskError` line naming the field.

    Relative ``data_files`` paths that exist beside the spec are made absolute; the others are looked up in the data
    folder when the task is loaded. ``builtin`` specs (shipped in the package) read theirs from the data folder only.
    """
    path = Path(path).expanduser()
    missing_fix = (
        "reinstall topotuner-lab (its data files)"
        if builtin
        else f"check the path, or use a built-in task: {', '.join(TASKS)}"
    )
    data = read_yaml(path, "task spec", missing_fix, TaskError)
    prefix = f"task spec {path}"
    if not isinstance(data, dict):
        raise TaskError(f"{prefix} is not a mapping of key: value", "write one key: value per line (task: my-task ...)")
    known = {f.name: f for f in dataclasses.fields(TaskSpec)}
    for key in data:
        if key in known:
            continue
        if key in _UNSUPPORTED:
            raise TaskError(f"{prefix}: lm-evaluation-harness's {key} is not supported here", f"remove {key}")
        close = difflib.get_close_matches(str(key), known, n=1)
        raise TaskError(
            f"{prefix}: unknown field {key!r}",
            f"did you mean {close[0]!r}?" if close else f"use the fields {', '.join(known)}",
        )
    missing = [n for n, f in known.items() if n not in data and f.default is f.default_factory is REQUIRED]
    if missing:
        raise TaskError(
            f"{prefix}: lacks field(s) {missing}", "; ".join(f"add {n}: {known[n].metadata['help']}" for n in missing)
        )
    if isinstance(data.get("doc_to_references"), str):  # one field (or template) is a list of one
        data["doc_to_references"] = [data["doc_to_references"]]
    files = data.get("data_files")
    if isinstance(files, dict) and not builtin:
        data["data_files"] = {
            split: str((path.parent / rel).resolve())
            if isinstance(rel, str) and not Path(rel).is_absolute() and (path.parent / rel).is_file()
            else rel
            for split, rel in files.items()
        }
    try:
        return TaskSpec.from_dict(data)
    except TaskError as exc:
        raise TaskError(exc.problem.replace("task spec", prefix, 1), exc.fix) from None


def _read_builtin(path: Path) -> TaskSpec:
    """The built-in spec in ``path``, which names the task after its file."""
    spec = read_spec(path, builtin=True)
    assert spec.task == path.stem, f"built-in spec {path.name} names task {spec.task!r}"
    return spec


#: the built-in tasks, by name: the spec files in ``tasks/builtin/``, each read on first use (listing names reads none)
TASKS: YamlFolder[TaskSpec] = YamlFolder(BUILTIN_DIR, _read_builtin, "task spec")


def get_task(name: str | os.PathLike[str] | TaskSpec) -> TaskSpec:
    """The spec of a built-in task by name, or of a ``.yaml`` spec file by its path.

    An unknown name is a :class:`TaskError` listing the built-in ones.
    """
    if isinstance(name, TaskSpec):
        return name
    key = os.fspath(name)
    if key in TASKS:
        return TASKS[key]
    if key.lower().endswith((".yaml", ".yml")) or "/" in key or os.sep in key:
        return read_spec(key)
    raise TaskError(
        f"unknown task {key!r}", f"use one of {', '.join(TASKS)}, or give the path of a task spec .yaml file"
    )


def training_spec(name: str | os.PathLike[str] | TaskSpec) -> TaskSpec:
    """The spec whose train and validation rows train ``name``: its own, or its ``train_task``'s (followed on).

    A chain of ``train_task`` that comes back to a task on it (a.yaml trains on b.yaml, which trains on a.yaml) is a
    :class:`TaskError` naming the chain.
    """
    spec = get_task(name)
    chain, seen = [spec.task], [spec]
    while spec.train_task is not None:
        chain.append(spec.train_task)
        spec = get_task(spec.train_task)
        if spec in seen:
            raise TaskError(
                f"train_task goes round in a circle: {' -> '.join(chain)} (task {spec.task!r} again)",
                "let one task on the circle train on its own rows: remove its train_task",
            )
        seen.append(spec)
    return spec
