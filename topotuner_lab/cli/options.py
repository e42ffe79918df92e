"""Command-line options generated from the settings classes, and a parser with one-line usage errors.

The settings classes are the one source of defaults, choices and help; a usage error is one line with the fix, like
every other error of the command. Where a field's stored name means something else on the command line,
:data:`SPELLINGS` names its option (the one table of such names) and keeps the earlier spelling working for one
release, with a deprecation line on stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

from topotuner_lab._io.config import REQUIRED, Config, field_choices
from topotuner_lab._io.errors import ParameterError

C = TypeVar("C", bound=Config)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that reports a usage error as one line and the fix, exit code 2."""

    def error(self, message: str) -> NoReturn:
        """Print ``error: MESSAGE`` and how to see the options, then exit 2 (argparse prints the whole usage)."""
        print(f"error: {message}\n  How to fix: see `{self.prog} --help` for the options", file=sys.stderr)
        raise SystemExit(2)


def require_at_least(*checks: tuple[str, int | None, int]) -> None:
    """Refuse the first ``(flag, value, least)`` whose given value is below ``least`` (None: not given)."""
    for flag, value, least in checks:
        if value is not None and value < least:
            raise ParameterError(f"{flag} {value} is below {least}", f"give {flag} {least} or more")


def percent_as_fraction(text: str) -> float | str:
    """A budget in percent, as the earlier ``--budget`` took it, as the fraction the card records (``1`` -> 0.01).

    Text that is no number is passed on for the field's check to refuse.
    """
    try:
        return float(text) / 100
    except ValueError:
        return text


@dataclass(frozen=True)
class Spelling:
    """The command-line name of a settings field whose stored name means something else there.

    ``old`` is the earlier option, accepted until the next release with a deprecation line; ``old_parse`` reads its
    value where its unit differs from the new option's (``--budget`` took a percent, ``--budget-fraction`` a
    fraction).
    """

    flag: str
    metavar: str | None  # None: the choices name the values
    old: str
    old_parse: Callable[[str], Any] | None = None


#: every settings field whose option is not its field name, by (settings class, field): the stored name stays (cards,
#: results, cache keys and recipes keep it); the command line says what the value is. ``metric`` means only a task's
#: score there: a drift table's distance between rows is ``--distance``, the column a card ranks by ``--rank-by``; a
#: card's path is ``--card``; a budget is a fraction of the model's parameters everywhere (``--budget-fraction
#: 0.01``), as the API, presets and cards record it
SPELLINGS: dict[tuple[str, str], Spelling] = {
    ("DriftSettings", "metric"): Spelling("--distance", None, "--metric"),
    ("CardSettings", "metric"): Spelling("--rank-by", "COLUMN", "--metric"),
    ("CardSettings", "fraction"): Spelling("--budget-fraction", "FRACTION", "--budget", percent_as_fraction),
    ("FinetuneConfig", "profile"): Spelling("--card", "CARD", "--profile"),
}


class _Deprecated(argparse.Action):
    """An earlier option's spelling: sets its field as the new option would and says, on stderr, what to type now."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, new: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option_string: Any = None
    ) -> None:
        """Store the value and print one deprecation line naming the new spelling (with the value in its unit)."""
        shown = f" {values:g}" if isinstance(values, float) else f" {values}" if isinstance(values, str) else ""
        print(
            f"warning: {option_string} is deprecated and will be removed in the next release: use {self.new}{shown}",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, values)


def add_deprecated(parser: argparse.ArgumentParser, old: str, new: str, dest: str, **kwargs: Any) -> argparse.Action:
    """Accept ``old`` as the earlier spelling of option ``new`` (storing into ``dest``), hidden from the help.

    Add it before ``new``: a listing of the parser's options by ``dest`` then finds the new option.
    """
    return parser.add_argument(
        old, dest=dest, action=_Deprecated, new=new, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs
    )


def _help(help_text: str, default: Any, spelling: Spelling | None) -> str:
    """``help_text`` with its default (none where it is None or the text names it) and any earlier spelling."""
    notes = []
    if default is not REQUIRED and default is not None and "default" not in help_text:
        if isinstance(default, tuple):
            default = " ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in default) or "none"
        notes.append(f"default: {default}")
    if spelling:
        notes.append(f"formerly {spelling.old}" + (", in percent" if spelling.old_parse else ""))
    text = help_text.replace("%", "%%")  # argparse formats help with %
    return f"{text} ({'; '.join(notes)})" if notes else text


def _value_type(hint: Any) -> Callable[[str], Any]:
    """How to read a value of type ``hint`` from the command line (``int | None`` -> int, a Literal -> str)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        return _value_type(options[0]) if len(options) == 1 else str
    if typing.get_origin(hint) is tuple:
        return _value_type(typing.get_args(hint)[0])
    return hint if hint in (int, float, str) else str


def add_config_options(
    parser: argparse.ArgumentParser, config: type[Config], *, skip: tuple[str, ...] = (), only_given: bool = False
) -> None:
    """Add one option per field of ``config`` (those with ``cli=True``, less ``skip``).

    Flags, type, default, choices and help come from the field itself (:func:`topotuner_lab._io.config.opt`; the
    choices from its ``Literal`` type where ``opt`` names none: :func:`topotuner_lab._io.config.field_choices`). With
    ``only_given`` an option left off the command line sets nothing, so :func:`config_from_args` takes that field
    from its ``base`` (a recipe) instead of the class default.
    """
    hints = typing.get_type_hints(config)
    for f in dataclasses.fields(config):
        meta = f.metadata
        if f.name in skip or not meta.get("cli", True):
            continue
        spelling = SPELLINGS.get((config.__name__, f.name))
        flags = (spelling.flag,) if spelling else meta.get("flags") or ("--" + f.name.replace("_", "-"),)
        default = REQUIRED if f.default is dataclasses.MISSING else f.default
        unset = argparse.SUPPRESS if only_given else default
        help_text = _help(meta.get("help", ""), None if isinstance(default, bool) else default, spelling)
        if isinstance(default, bool):
            action = "store_true" if default is False else argparse.BooleanOptionalAction
            parser.add_argument(*flags, dest=f.name, action=action, default=unset, help=help_text)
            continue
        kwargs: dict[str, Any] = {
            "dest": f.name,
            "type": meta.get("parse") or _value_type(hints[f.name]),
            "choices": field_choices(config, f),
            "help": help_text,
        }
        if spelling:
            old_type = spelling.old_parse or kwargs["type"]
            add_deprecated(parser, spelling.old, spelling.flag, f.name, type=old_type, choices=kwargs["choices"])
            kwargs["metavar"] = spelling.metavar
        if default is REQUIRED:
            kwargs["required"] = True
        else:
            kwargs["default"] = unset
        if isinstance(default, tuple):
            kwargs["nargs"] = "+"
            kwargs["default"] = unset if only_given else list(default)
        parser.add_argument(*flags, **kwargs)


def config_from_args(config: type[C], args: argparse.Namespace, base: C | None = None) -> C:
    """The settings the parsed options describe, each field checked as the class checks it.

    Fields the options do not set come from ``base`` (e.g. a recipe), else the class defaults.
    """
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(config) if hasattr(args, f.name)}
    return config.from_dict({**(base.to_dict() if base is not None else {}), **given})
