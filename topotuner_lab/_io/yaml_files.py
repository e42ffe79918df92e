"""Settings as commented YAML files (presets, drift recipes, task specs): read safely, each problem one error line.

A folder of such files is a :class:`YamlFolder`: a mapping of name (the file's stem) to what each file holds, read
on first use, so listing the names costs no parsing.

A file is data that checking and error messages walk, so it may hold at most :data:`MAX_VALUES` values, a YAML alias
(``*name``) counted at each use: a "billion laughs" file is refused before it is built.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import yaml

from topotuner_lab._io.errors import ParameterError, TopoTunerError

T = TypeVar("T")
SUFFIXES = (".yaml", ".yml")
#: the most values a settings file may hold, an alias counted at each use (the largest shipped file holds under 200)
MAX_VALUES = 10_000


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, reading ``1e-4`` as a number (as YAML 1.2 does) instead of YAML 1.1's text."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789")
)


def _bounded_data(text: str, path: Path, what: str, error: type[TopoTunerError]) -> Any:
    """The data of the YAML ``text``, refused (an ``error``) when its aliases make it over :data:`MAX_VALUES` values.

    PyYAML builds an alias (``*name``) as the object it names, shared: nine nested aliases of nine items each stand
    for 387 million values (the "billion laughs" file), which checking a field or showing it in an error would walk.
    The nodes are counted before any object is built.
    """
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
        stack, values = ([] if root is None else [root]), 0
        while stack:
            node = stack.pop()
            values += 1
            if values > MAX_VALUES:
                raise error(
                    f"{what} file {path} holds over {MAX_VALUES:,} values, its aliases (*name) counted at each use",
                    "write the values out, without aliases of aliases",
                )
            if isinstance(node, yaml.SequenceNode):
                stack.extend(node.value)
            elif isinstance(node, yaml.MappingNode):
                stack.extend(item for pair in node.value for item in pair)
        return None if root is None else loader.construct_document(root)
    finally:
        loader.dispose()


def read_yaml(
    path: str | os.PathLike[str], what: str, missing_fix: str, error: type[TopoTunerError] = ParameterError
) -> Any:
    """The data in the YAML file ``path`` (``what`` names it in errors; ``missing_fix`` says what to do if absent).

    A missing file, another suffix, text that is not UTF-8, invalid YAML and a file over :data:`MAX_VALUES` values
    are each one ``error`` naming the file.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise error(f"{what} file {path} does not exist", missing_fix)
    if path.suffix.lower() not in SUFFIXES:
        raise error(f"{what} file {path} is not a .yaml file", f"give the {what} as a .yaml file")
    try:
        return _bounded_data(path.read_text(encoding="utf-8"), path, what, error)  # a SafeLoader: plain data only
    except UnicodeDecodeError as exc:
        raise error(f"{what} file {path} is not UTF-8 text", "save it as UTF-8") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        reason = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise error(
            f"{what} file {path} is not valid YAML: {reason}{where}", "fix the YAML (quote text holding ': ')"
        ) from exc


def read_mapping(path: str | os.PathLike[str], what: str, missing_fix: str) -> dict[str, Any]:
    """The ``key: value`` mapping in the YAML file ``path`` (a file of comments alone is an empty one)."""
    data = read_yaml(path, what, missing_fix)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ParameterError(
            f"{what} file {path} is not a mapping of key: value", "write one key: value per line (seeds: [0, 1] ...)"
        )
    return data


@contextmanager
def in_file(path: str | os.PathLike[str]) -> Iterator[None]:
    """Prefix the problem of any error raised inside with the file it came from (``path: preset has no field...``)."""
    try:
        yield
    except TopoTunerError as exc:
        raise type(exc)(f"{os.fspath(path)}: {exc.problem}", exc.fix) from None


def summary(path: Path) -> str:
    """The first comment line of a file: the one-line description the command help lists."""
    with path.open(encoding="utf-8") as lines:
        return next((line.lstrip("#").strip() for line in lines if line.startswith("#")), "")


class YamlFolder(Mapping[str, T]):
    """The ``*.yaml`` files of ``folder`` by name (the file's stem), each turned into a value by ``load`` on first use.

    ``what`` names a file in errors (``"preset"``). A folder without files is a broken install, said as such.
    """

    def __init__(self, folder: Path, load: Callable[[Path], T], what: str) -> None:
        self.folder = folder
        self.what = what
        self._load = load
        self._values: dict[str, T] = {}

    def names(self) -> list[str]:
        """The names, sorted; a folder without files is a :class:`ParameterError` (the package data is missing)."""
        names = sorted(path.stem for path in self.folder.glob("*.yaml"))
        if not names:
            raise ParameterError(f"no {self.what} files in {self.folder}", "reinstall topotuner-lab (its data files)")
        return names

    def path(self, name: str) -> Path:
        """The file of ``name``."""
        return self.folder / f"{name}.yaml"

    def __getitem__(self, name: str) -> T:
        if name not in self._values:
            if name not in self:
                raise KeyError(name)
            self._values[name] = self._load(self.path(name))
        return self._values[name]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.names()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())
