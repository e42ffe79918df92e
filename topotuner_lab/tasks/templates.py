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

__all__ = ["evaluate", "expression_error", "fields_of", "is_field", "optional_fields", "render", "syntax_error"]

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


@functools.lru_cache(maxsize=256)
def optional_fields(source: str) -> tuple[str, ...]:
    """The fields a row may lack: all of ``source``'s when it tests ``is defined`` or uses the ``default`` filter.

    Such a template handles missing fields itself: ``"{{ summary if summary is defined else summary1 }}"`` reads a
    training file's ``summary`` and a test file's ``summary1``. A field it still lacks fails when the row renders.
    """
    if is_field(source):
        return ()
    tree = _ENV.parse(source)
    guarded = any(t.name in ("defined", "undefined") for t in tree.find_all(nodes.Test)) or any(
        f.name == "default" for f in tree.find_all(nodes.Filter)
    )
    return fields_of(source) if guarded else ()


def evaluate(expression: str, row: Mapping[str, Any]) -> Any:
    """The Jinja2 expression ``expression`` (``"601 <= task_id <= 974"``) over ``row``, in the same sandbox."""
    return _ENV.compile_expression(expression, undefined_to_none=False)(**row)


def expression_error(expression: str) -> str | None:
    """Why ``expression`` is not a valid Jinja2 expression (one line), or None when it is one."""
    try:
        _ENV.compile_expression(expression)
    except TemplateSyntaxError as exc:
        return exc.message or "invalid expression"
    return None


def render(source: str, row: Mapping[str, Any]) -> Any:
    """``source`` over ``row``: the field's own value for a bare field name, else the rendered text."""
    if is_field(source):
        return row[source]
    return _compiled(source).render(row)
