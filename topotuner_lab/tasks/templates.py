"""Prompt templates of task specs: Jinja2 over a row's fields, as lm-evaluation-harness's ``doc_to_*`` keys are.

A template is either a bare field name (``label``: the field's value as it is, not turned into text) or a Jinja2
template over the row's fields (``"Review: {{ sentence | trim }}"``). Templates render in Jinja's
immutable sandbox (a spec file is data: rendering it cannot reach Python internals or change the row), with strict
undefined names (a missing field is an error, never an empty string) and trailing newlines kept.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

from jinja2 import StrictUndefined, Template, TemplateSyntaxError, meta, nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["fields_of", "is_field", "render", "syntax_error"]

_ENV = ImmutableSandboxedEnvironment(undefined=StrictUndefined, keep_trailing_newline=True, autoescape=False)
_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_field(source: str) -> bool:
    """Whether ``source`` is a bare field name (its value is taken as is) rather than a template."""
    return _FIELD.fullmatch(source) is not None


@functools.lru_cache(maxsize=256)
def _compiled(source: str) -> Template:
    return _ENV.from_string(source)


def syntax_error(source: str) -> str | None:
    """Why ``source`` is not a valid Jinja2 template (one line), or None when it is one."""
    try:
        _ENV.parse(source)
    except TemplateSyntaxError as exc:
        return f"{exc.message} (line {exc.lineno})"
    return None


@functools.lru_cache(maxsize=256)
def fields_of(source: str) -> tuple[str, ...]:
    """The row fields ``source`` reads, in the order they first appear (loop variables and Jinja globals excluded)."""
    if is_field(source):
        return (source,)
    tree = _ENV.parse(source)
    free = meta.find_undeclared_variables(tree)
    return tuple(dict.fromkeys(n.name for n in tree.find_all(nodes.Name) if n.ctx == "load" and n.name in free))


def render(source: str, row: Mapping[str, Any]) -> Any:
    """``source`` over ``row``: the field's own value for a bare field name, else the rendered text."""
    if is_field(source):
        return row[source]
    return _compiled(source).render(row)
