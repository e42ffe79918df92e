"""JSON files and JSON digests: one reader with clear errors, one content digest for keys and checksums.

Every JSON file the package reads back (checkpoint configs, cards, results, ledgers, cache rows) goes through
:func:`read_json`, so a missing, unreadable or damaged file is one error naming the file and its fix. Every digest of
JSON-able data (cache keys and checksums, snapshot metadata hashes, results checksums) is :func:`json_digest`, so two
floors that hash the same payload agree.
"""

from __future__ import annotations

import hashlib
import json
import os
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from topotuner_lab._io.errors import InputFileError, TopoTunerError

#: the kinds of JSON value a file may be asked to hold, as they are named in errors
_KIND_NAMES: dict[type, str] = {dict: "object", list: "list"}


def json_digest(value: Any) -> str:
    """The blake2b-128 hex digest of ``value`` as JSON with sorted keys (a value JSON cannot hold as its ``str``).

    Parameters
    ----------
    value
        Plain data: dicts, lists, strings, numbers, booleans, None (anything else is hashed as its ``str``).

    Returns
    -------
    str
        32 hex characters; equal payloads (dict key order aside) give equal digests.

    Examples
    --------
    >>> json_digest({"b": 1, "a": 2}) == json_digest({"a": 2, "b": 1})
    True
    >>> len(json_digest([1, 2]))
    32
    """
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def read_json(
    path: str | os.PathLike[str] | Traversable,
    what: str,
    fix: str,
    *,
    kind: type = dict,
    error: type[TopoTunerError] = InputFileError,
) -> Any:
    """The JSON value in the file ``path``, which must be a ``kind`` (``dict``, ``list``, or ``object`` for any).

    Parameters
    ----------
    path
        The file (or a package data file, as :func:`importlib.resources.files` gives it).
    what
        What the file is, as errors name it (``"model config"``, ``"preset"``).
    fix
        What the user should do when the file is missing or damaged.
    kind
        The type of JSON value the file must hold; ``object`` takes any.
    error
        The :class:`TopoTunerError` subclass raised.

    Returns
    -------
    Any
        The parsed value.

    Raises
    ------
    TopoTunerError
        An ``error`` when the file is missing or unreadable, is not UTF-8 JSON, or holds another kind of value.

    Examples
    --------
    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "a.json").write_text('{"x": 1}')
    >>> read_json(folder / "a.json", "example", "write it again")
    {'x': 1}
    """
    path = Path(path) if isinstance(path, (str, os.PathLike)) else path
    try:
        value = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError as exc:
        raise error(f"{what} {path} does not exist", fix) from exc
    except OSError as exc:
        raise error(f"{what} {path} cannot be read ({exc.__class__.__name__}: {exc.strerror})", fix) from exc
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise error(f"{what} {path} is not valid JSON ({exc.__class__.__name__}: {str(exc)[:100]})", fix) from exc
    if not isinstance(value, kind):
        wanted = _KIND_NAMES.get(kind, kind.__name__)
        raise error(f"{what} {path} holds a JSON {type(value).__name__}, not a JSON {wanted}", fix)
    return value
