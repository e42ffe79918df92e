"""Checks on where a command writes, done before any work.

An output never replaces an input, two outputs never collide, and a path that cannot be written is refused with a
clear message.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from topotuner_lab._io.errors import ParameterError

_SYSTEM_ROOTS = (Path("/proc"), Path("/sys"), Path("/dev"))


def _resolved(path: str | os.PathLike[str]) -> Path:
    return Path(path).expanduser().resolve()


def check_writable(
    path: str | os.PathLike[str],
    what: str,
    *,
    suffixes: Iterable[str] = (),
    new_folders_under: Iterable[str | os.PathLike[str]] | None = None,
) -> Path:
    """Refuse an output path that cannot or should not be written; the resolved path otherwise.

    Refused: a folder, a path under a file or a system folder, one that cannot be created, a suffix other than
    ``suffixes`` (when given), or one whose folder is missing and lies outside every folder of ``new_folders_under``
    (when given: the only places where writing it may create folders).
    """
    target = _resolved(path)
    suffixes = tuple(suffixes)
    if suffixes and target.suffix not in suffixes:
        raise ParameterError(
            f"{what} {path} should end in {' or '.join(suffixes)}", f"give a file name ending in {suffixes[0]}"
        )
    if any(target == root or root in target.parents for root in _SYSTEM_ROOTS):
        raise ParameterError(f"{what} {path} lies in a system folder", "write it under your project or home folder")
    if target.is_dir():
        raise ParameterError(
            f"{what} {path} is a folder",
            f"give a file name inside it, e.g. {Path(path) / ('out' + (suffixes[0] if suffixes else ''))}",
        )
    parent = target.parent
    while not parent.exists():
        parent = parent.parent
    roots = None if new_folders_under is None else [_resolved(root) for root in new_folders_under]
    if roots is not None and parent != target.parent and not any(target.parent.is_relative_to(r) for r in roots):
        raise ParameterError(
            f"{what} {path} lies in a folder that does not exist ({target.parent}); missing folders are created only "
            f"below {' or '.join(map(str, roots))}",
            f"create {target.parent} first, or write the {what} below {' or '.join(map(str, roots))}",
        )
    if not parent.is_dir():
        raise ParameterError(
            f"{what} {path} lies under {parent}, which is a file, not a folder", "choose an output path inside a folder"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ParameterError(
            f"{what} {path} cannot be written: no write permission in {parent}", "choose a folder you can write to"
        )
    return target


def check_output_dir(path: str | os.PathLike[str], what: str) -> Path:
    """Refuse an output folder that is a file, lies under one or a system folder, or cannot be created."""
    target = _resolved(path)
    if target.exists() and not target.is_dir():
        raise ParameterError(f"{what} {path} is a file, not a folder", "give a folder path (it is created if missing)")
    check_writable(target / "x", what)
    return target


#: a path given to :func:`refuse_overwrite`: one path, several (a repeatable option such as ``--noise-table``) or none
Paths = str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None


def _each_resolved(paths: Mapping[str, Paths]) -> dict[str, Path]:
    """Every path by name, resolved; each path of a list is named with its own text after the list's name."""
    named: dict[str, Path] = {}
    for name, value in paths.items():
        if isinstance(value, (str, os.PathLike)):
            named[name] = _resolved(value)
        elif value is not None:
            named |= {f"{name} {os.fspath(p)}": _resolved(p) for p in value}
    return named


def refuse_overwrite(inputs: Mapping[str, Paths], outputs: Mapping[str, Paths]) -> None:
    """Raise unless every output differs from every input and from the other outputs (after resolving links)."""
    ins, outs = _each_resolved(inputs), _each_resolved(outputs)
    for out_name, out in outs.items():
        for in_name, inp in ins.items():
            if out == inp or (out.exists() and inp.exists() and os.path.samefile(out, inp)):
                raise ParameterError(
                    f"the {out_name} {out} is the {in_name}: writing it would destroy an input",
                    f"choose another path for the {out_name}",
                )
    seen: dict[Path, str] = {}
    for out_name, out in outs.items():
        if out in seen:
            raise ParameterError(
                f"the {out_name} and the {seen[out]} are the same file {out}", f"choose another path for the {out_name}"
            )
        seen[out] = out_name
