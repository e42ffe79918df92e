"""One idiom for every settings object: frozen dataclasses whose fields carry their help, choices and check.

A field is declared once with :func:`opt`; :class:`Config` validates every field on creation (a bad value is a
:class:`ParameterError` naming the field and the fix), converts to and from plain dicts (JSON, preset files, cache
keys), and the CLI generates its options from the same metadata (``cli.options``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import reprlib
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from topotuner_lab._io.errors import ParameterError, TopoTunerError

C = TypeVar("C", bound="Config")

#: how a checked value is shown in an error: cut short, so a huge value (or one built of shared parts, as YAML aliases
#: build it) is a short line, not a walk through all of it
_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 80
_SHOWN.maxlist = _SHOWN.maxtuple = _SHOWN.maxdict = _SHOWN.maxset = _SHOWN.maxfrozenset = 8
_SHOWN.maxlevel = 2


def shown(value: Any) -> str:
    """``repr(value)`` cut short for an error message: long texts, long lists and deep nesting elided with ``...``."""
    return _SHOWN.repr(value)


@dataclass(frozen=True)
class Check:
    """A test of one value and what a passing value is (``"a whole number >= 1"``), for the error message."""

    test: Callable[[Any], object]  # a truth value; ``__call__`` takes its ``bool``
    wanted: str

    def __call__(self, value: Any) -> bool:
        """Whether ``value`` passes; a test that raises (a wrong type) counts as a failure."""
        try:
            return bool(self.test(value))
        except (TypeError, ValueError):
            return False


def is_int(value: Any) -> bool:
    """A true integer (``bool`` is not one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """A finite real number (``bool`` is not one)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


POSITIVE_INT = Check(lambda v: is_int(v) and v >= 1, "a whole number >= 1")
NON_NEGATIVE_INT = Check(lambda v: is_int(v) and v >= 0, "a whole number >= 0")
OPEN_UNIT = Check(lambda v: is_real(v) and 0 < v < 1, "a number in (0, 1)")
POSITIVE = Check(lambda v: is_real(v) and v > 0, "a positive finite number")


def optional(check: Check) -> Check:
    """``check``, or None."""
    return Check(lambda v: v is None or check(v), f"{check.wanted}, or None")


#: the default of a field that has none: it must be given
REQUIRED: Any = dataclasses.MISSING


@functools.cache
def _literal_choices(config: type) -> dict[str, tuple[Any, ...]]:
    """The values each ``Literal``-annotated field of ``config`` allows (``Literal[...] | None`` adds None).

    Types that do not resolve at run time (a name known only to a function's scope) give no choices.
    """
    try:
        hints = typing.get_type_hints(config)
    except NameError:
        return {}
    choices: dict[str, tuple[Any, ...]] = {}
    for name, hint in hints.items():
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        parts = typing.get_args(hint) if union else (hint,)
        literals = [part for part in parts if typing.get_origin(part) is typing.Literal]
        if len(literals) == 1 and all(part is type(None) or part is literals[0] for part in parts):
            choices[name] = typing.get_args(literals[0]) + ((None,) if type(None) in parts else ())
    return choices


def field_choices(config: type, f: dataclasses.Field[Any]) -> tuple[Any, ...] | None:
    """The values field ``f`` of ``config`` may take: ``opt(choices=...)``, else its ``Literal`` type's; None: any.

    A field typed ``Method = Literal["full", "lora"]`` so declares its choices once, for validation and for the CLI.

    Examples
    --------
    >>> @dataclass(frozen=True)
    ... class Example(Config):
    ...     size: typing.Literal["small", "large"] = opt("small", "how big")
    >>> field_choices(Example, dataclasses.fields(Example)[0])
    ('small', 'large')
    """
    given = f.metadata.get("choices")
    return tuple(given) if given is not None else _literal_choices(config).get(f.name)


def opt(
    default: Any,
    help: str,
    *,
    factory: Callable[[], Any] | None = None,
    choices: tuple[Any, ...] | None = None,
    check: Check | None = None,
    flags: tuple[str, ...] | None = None,
    parse: Callable[[str], Any] | None = None,
    cli: bool = True,
    compare: bool = True,
) -> Any:
    """A config field: its default, the help the CLI shows, the allowed ``choices`` and a ``check`` of its value.

    ``flags`` and ``parse`` override the generated CLI option (``--field-name``, parsed as the default's type); a
    stored field name that would mean something else on the command line is renamed there in one table,
    ``cli.options.SPELLINGS``; ``cli=False`` keeps a field off the command line. ``REQUIRED`` makes a field without
    default; ``factory`` computes the default per instance (mutable defaults such as dicts are copied per instance
    anyway). ``compare=False`` leaves a field out of equality: words that explain a choice, not the choice.
    """
    metadata = {"help": help, "choices": choices, "check": check, "flags": flags, "parse": parse, "cli": cli}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata, compare=compare)
    if default is REQUIRED:
        return field(metadata=metadata, compare=compare)
    if isinstance(default, (dict, list, set)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata, compare=compare)
    if isinstance(default, Config):
        return field(default_factory=lambda: dataclasses.replace(default), metadata=metadata, compare=compare)
    return field(default=default, metadata=metadata, compare=compare)


class Config:
    """Base of the settings dataclasses (declare them ``@dataclass(frozen=True)`` with :func:`opt` fields).

    Every field is checked on creation against its ``choices`` and ``check``; :meth:`check` adds the rules that
    relate several fields. ``to_dict`` / ``from_dict`` round-trip through plain JSON values.
    """

    #: set by ``@dataclass`` on each subclass; declared so type checkers see every Config as a dataclass
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]
    #: what the object is called in error messages (``"drift settings"``)
    label: ClassVar[str] = "settings"
    #: the error a bad value raises, and the fix it suggests (default: how to give the field a good value)
    error: ClassVar[type[TopoTunerError]] = ParameterError
    remedy: ClassVar[str | None] = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(f.default, tuple) and isinstance(value, list):  # JSON and callers give lists
                value = tuple(value)
                object.__setattr__(self, f.name, value)
            choices, check = field_choices(type(self), f), f.metadata.get("check")
            if choices is not None and value not in choices:
                self.fail(
                    f"{f.name}={shown(value)} is not one of {', '.join(map(str, choices))}",
                    f"use one of {', '.join(map(str, choices))}",
                )
            if check is not None and not check(value):
                self.fail(f"{f.name}={shown(value)} is not {check.wanted}", f"give {f.name} as {check.wanted}")
        self.check()

    def check(self) -> None:
        """Rules across fields; call :meth:`fail` when one is broken (none by default)."""

    def fail(self, problem: str, fix: str) -> typing.NoReturn:
        """Raise this class's error for ``problem`` (prefixed by its label), with ``fix`` or the class's remedy."""
        raise self.error(f"{self.label}: {problem}", self.remedy or fix)

    def to_dict(self) -> dict[str, Any]:
        """The settings as plain JSON values (tuples as lists, nested settings as dicts)."""
        return _plain(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls: type[C], data: Mapping[str, Any]) -> C:
        """Settings from :meth:`to_dict`'s output (lists back to tuples, nested settings rebuilt).

        Unknown keys are refused, and so is a missing field without a default.
        """
        if not isinstance(data, Mapping):
            raise cls.error(
                f"{cls.label} must be a mapping of field to value, not {type(data).__name__}", "pass a dict"
            )
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        missing = [n for n, f in fields.items() if n not in data and f.default is f.default_factory is REQUIRED]
        if unknown or missing:
            parts = [unknown and f"has no field(s) {unknown}", missing and f"lacks field(s) {missing}"]
            raise cls.error(
                f"{cls.label} " + "; ".join(p for p in parts if p), cls.remedy or f"fields: {sorted(fields)}"
            )
        hints = typing.get_type_hints(cls)
        return cls(**{name: _typed(hints[name], value) for name, value in data.items()})


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _typed(hint: Any, value: Any) -> Any:
    """``value`` from JSON shaped as ``hint`` wants it: a nested Config, a tuple, a dict of tuples."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None or len(options) != 1:
            return value
        return _typed(options[0], value)
    if isinstance(hint, type) and issubclass(hint, Config) and isinstance(value, Mapping):
        return hint.from_dict(value)
    if origin is tuple and isinstance(value, list):
        return tuple(value)
    if origin is dict and isinstance(value, Mapping):
        args = typing.get_args(hint)
        return {k: _typed(args[1], v) for k, v in value.items()} if len(args) == 2 else dict(value)
    return value
