"""A task's rows from the Hugging Face hub: asked for (``source="hub"``), or standing in for an absent offline copy.

The hub is read with ``datasets.load_dataset(dataset_path, dataset_name, split=...)``, the spec's fields in
lm-evaluation-harness's vocabulary. Rows keep the hub's order, so a draw (``load_task``'s shuffle with its seed) picks
the same rows as from an offline copy holding the same data in the same order. Where the hub stands in for a missing
offline copy, a one-line warning says so; where it cannot be read either, one :class:`TaskError` names the task, the
folder looked in, the hub dataset tried and both fixes.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from topotuner_lab._io.errors import TaskError
from topotuner_lab.tasks.schema import SPLITS

if TYPE_CHECKING:
    from topotuner_lab.tasks.schema import TaskSpec

__all__ = ["hub_name", "hub_where", "read_hub"]

#: how to make an offline copy visible, for messages
DATA_FIX = (
    "put the task's files in a data folder and set TOPOTUNER_DATA (or give --data-source FOLDER) to it (a spec "
    "without data_files: add them)"
)
#: how to let the hub be read, for messages
NETWORK_FIX = "run with network access to huggingface.co (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE unset)"


def hub_name(spec: TaskSpec) -> str:
    """The spec's hub dataset as messages and results name it: ``nyu-mll/glue (sst2)``, ``stanfordnlp/imdb``."""
    return f"{spec.dataset_path}" + (f" ({spec.dataset_name})" if spec.dataset_name else "")


def hub_where(spec: TaskSpec, split: str) -> str:
    """Where the hub rows of our ``split`` come from, as messages and results name it: ``hub ID (NAME), split S``."""
    return f"hub {hub_name(spec)}, split {spec.hub_split(split)}"


def _reason(exc: BaseException) -> str:
    """The first line of an exception (and its class), short enough for one message line."""
    return f"{exc.__class__.__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"


def read_hub(spec: TaskSpec, split: str, offline: str = "") -> tuple[Any, str]:
    """The rows of our ``split`` (train, validation, test) from the spec's hub dataset, and where they came from.

    Parameters
    ----------
    spec : the task's spec; its ``dataset_path`` / ``dataset_name`` and ``*_split`` fields name the hub copy.
    split : our split name; :meth:`TaskSpec.hub_split` gives the hub's.
    offline : where the absent offline copy was looked for, when the hub stands in for it (a warning says so, and
        a failure names both sources); empty when the hub was asked for.
    """
    import datasets

    if spec.dataset_path is None:
        raise TaskError(
            f"task {spec.task!r} has no hub copy (its spec gives no dataset_path)",
            "add dataset_path (a hub id) to the spec, or read its local files (no source='hub')",
        )
    hub_split = spec.hub_split(split)
    if hub_split is None:
        raise TaskError(
            f"task {spec.task!r} has no split {split!r}", f"use one of {[s for s in SPLITS if spec.hub_split(s)]}"
        )
    where = hub_where(spec, split)
    if offline:
        warnings.warn(f"task {spec.task!r}: no offline copy ({offline}), reading the {where}", stacklevel=4)
    args = (spec.dataset_path,) if spec.dataset_name is None else (spec.dataset_path, spec.dataset_name)
    try:
        return datasets.load_dataset(*args, split=hub_split), where
    except Exception as exc:  # noqa: BLE001 - no network, an unknown id or split: one clear line, not a traceback
        if offline:
            raise TaskError(
                f"task {spec.task!r} has no offline copy ({offline}), and its hub dataset {hub_name(spec)} cannot be "
                f"read ({_reason(exc)})",
                f"{DATA_FIX}, or {NETWORK_FIX}",
            ) from exc
        raise TaskError(
            f"the hub dataset {hub_name(spec)} of task {spec.task!r} cannot be read ({_reason(exc)})",
            f"{NETWORK_FIX}, or read the offline copies (no --data-source hub)",
        ) from exc
