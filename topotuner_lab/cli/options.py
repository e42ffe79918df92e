"""Command-line options generated from the settings classes, and a parser with one-line usage errors.

The settings classes are the one source of defaults, choices and help; a usage error is one line with the fix, like
every other error of the command.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from topotuner_lab._io.config import REQUIRED, Config, field_choices

C = TypeVar("C", bound=Config)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that reports a usage error as one line and the fix, exit code 2."""

    def error(self, message: str) -> NoReturn:
        """Print ``error: MESSAGE`` and how to see the options, then exit 2 (argparse prints the whole usage)."""
        print(f"error: {message}\n  How to fix: see `{self.prog} --help` for the options", file=sys.stderr)
        raise SystemExit(2)


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
        flags = meta.get("flags") or ("--" + f.name.replace("_", "-"),)
        help_text = meta.get("help", "")
        default = REQUIRED if f.default is dataclasses.MISSING else f.default
        unset = argparse.SUPPRESS if only_given else default
        if isinstance(default, bool):
            action = "store_true" if default is False else argparse.BooleanOptionalAction
            parser.add_argument(*flags, dest=f.name, action=action, default=unset, help=help_text)
            continue
        kwargs: dict[str, Any] = {
            "dest": f.name,
            "type": meta.get("parse") or _value_type(hints[f.name]),
            "choices": field_choices(config, f),
        }
        if default is REQUIRED:
            kwargs["required"] = True
            kwargs["help"] = help_text
        else:
            kwargs["default"] = unset
            kwargs["help"] = f"{help_text} (default: {default})"
        if isinstance(default, tuple):
            kwargs["nargs"] = "+"
            kwargs["default"] = unset if only_given else list(default)
            shown = " ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in default) or "none"
            kwargs["help"] = f"{help_text} (default: {shown})"
        parser.add_argument(*flags, **kwargs)


def config_from_args(config: type[C], args: argparse.Namespace, base: C | None = None) -> C:
    """The settings the parsed options describe, each field checked as the class checks it.

    Fields the options do not set come from ``base`` (e.g. a recipe), else the class defaults.
    """
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(config) if hasattr(args, f.name)}
    return config.from_dict({**(base.to_dict() if base is not None else {}), **given})
