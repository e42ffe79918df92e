"""A card's prior task spec, recorded where it was found and found again from any folder.

A card keeps its ``prior_task`` as it was typed (``sst2``, ``my_task.yaml``); a relative spec path means nothing from
another folder. So a card also records ``prior_spec`` (:func:`prior_record`): the spec file's content hash and, for a
spec file, the absolute path it was read from (for a built-in task, its name). :func:`resolve_prior` finds the spec
again when it is re-read (the transfer check takes the prior's gradients): a built-in task by its name; a spec file at
its recorded path while it holds the same content; else the spec with the same hash in the working folder, the card's
folder or the built-in specs (a moved or renamed copy); else the recorded path with a warning that it changed since;
else a :class:`ProfileError` naming the spec, its hash and the fix. A card without ``prior_spec`` (older, or a prior
that is no spec: the authors' orderings) is read as before: ``prior_task`` as typed.

Built-in specs are read here as package data (``tasks/builtin``), not through ``tasks.registry``, which lies on a floor
above this one.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from topotuner_lab._io.errors import ProfileError

if TYPE_CHECKING:
    from topotuner_lab.profiles.card import ProfileCard

__all__ = ["BUILTIN_SPECS", "prior_record", "resolve_prior", "spec_hash"]

#: the built-in task specs (package data; ``tasks.registry.BUILTIN_DIR``)
BUILTIN_SPECS = Path(__file__).resolve().parent.parent / "tasks" / "builtin"
#: the spec files a search by hash looks at in each folder
_SPEC_GLOBS = ("*.yaml", "*.yml")


def spec_hash(path: str | os.PathLike[str]) -> str:
    """``sha256:`` and the SHA-256 of a spec file's bytes: what a card knows its prior spec by."""
    return "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _builtin(task: str) -> Path | None:
    """The built-in spec file of ``task`` where it is a built-in name (as ``tasks.registry.get_task`` reads it)."""
    path = BUILTIN_SPECS / f"{task}.yaml"
    return path if "/" not in task and os.sep not in task and path.is_file() else None


def prior_record(task: str) -> dict[str, Any] | None:
    """What a card records of its prior ``task`` (as typed), found from the current folder.

    ``{"builtin": NAME, "hash": ...}`` for a built-in task, ``{"path": ABSOLUTE, "hash": ...}`` for a spec file,
    None for a name of no spec (the authors' orderings' ``imdb+sst2+mmlu``).
    """
    builtin = _builtin(task)
    if builtin is not None:
        return {"builtin": task, "hash": spec_hash(builtin)}
    path = Path(task).expanduser()
    return {"path": str(path.resolve()), "hash": spec_hash(path)} if path.is_file() else None


def _found_by_hash(digest: str, folders: list[Path]) -> Path | None:
    """The first spec file in ``folders`` (not their subfolders) whose content has ``digest``."""
    for folder in folders:
        for pattern in _SPEC_GLOBS:
            for path in sorted(folder.glob(pattern)):
                if path.is_file() and spec_hash(path) == digest:
                    return path
    return None


def resolve_prior(card: ProfileCard, card_path: str | os.PathLike[str] | None = None) -> str:
    """The prior task of ``card`` as ``get_task`` reads it from the current folder: a built-in name or a spec path.

    ``card_path``: where the card was read from (its folder is searched for a moved spec).
    """
    record = card.prior_spec
    if record is None:  # an older card, or a prior that is no spec: as typed
        return card.prior_task
    if "builtin" in record:
        return str(record["builtin"])
    recorded, digest = Path(record["path"]), str(record["hash"])
    if recorded.is_file() and spec_hash(recorded) == digest:
        return str(recorded)
    folders = list(dict.fromkeys([Path.cwd(), *([Path(card_path).resolve().parent] if card_path else [])]))
    found = _found_by_hash(digest, [*folders, BUILTIN_SPECS])
    if found is not None:
        return found.stem if found.parent == BUILTIN_SPECS else str(found)
    card_name = f"card {card_path}" if card_path else "the card"
    if recorded.is_file():
        warnings.warn(
            f"the prior task spec of {card_name} ({card.prior_task!r}) changed since the card was built: {recorded} "
            f"is no longer {digest[:19]}..., and no copy of the original was found; it is read as it is now",
            stacklevel=2,
        )
        return str(recorded)
    searched = ", ".join(str(f) for f in folders)
    raise ProfileError(
        f"the prior task spec of {card_name} is missing: {card.prior_task!r} was {recorded} ({digest}) when the card "
        f"was built, and no spec with that content is in {searched} or the built-in tasks",
        f"put the spec back at {recorded}, or a copy of it (any name) in the working folder or beside the card",
    )
