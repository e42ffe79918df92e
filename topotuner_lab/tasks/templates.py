"""Prompt templates of task specs: Jinja2 over a row's fields, as lm-evaluation-harness's ``doc_to_*`` keys are.

A template is either a bare field name (``label``: the field's value as it is, not turned into text) or a Jinja2
template over the row's fields (``"Review: {{ sentence | trim }}"``). Templates render in Jinja's
immutable sandbox (a spec file is data: rendering it cannot reach Python internals or change the row), with strict
undefined names (a missing field is an error, never an empty string) and trailing newlines kept.

A spec file is data, so a template cannot hang the machine or fill its memory either. One render (one template over
one row) may produce at most :data:`MAX_CHARS` characters and list items in all (its output, and every value an
operator, ``~``, filter or method computes on the way; counted before the value is built where its size can be told
in advance: ``sentence * 50000000``, ``x | center(10**9)``, ``'%999999999d' % 1``), integers of at most
:data:`MAX_INT_BITS` bits (``9 ** (9 ** 9)`` is refused before it is computed), and compute for at most
:data:`TIME_LIMIT_S` CPU seconds of its thread (checked at every loop step, call, operator and output; CPU time, not
wall time, so a loaded or paused machine never fails a render that would pass on an idle one). Checking a template
computes nothing: Jinja folds constant operators and filters while it compiles a template, so these are never
constant here (every operator goes through the sandbox, every filter needs the render's context). A template past a
limit fails with a :class:`jinja2.sandbox.SecurityError` naming the limit. ``lipsum`` is not available.
"""

from __future__ import annotations

import functools
import math
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

from jinja2 import Environment, StrictUndefined, Template, TemplateSyntaxError, meta, nodes, pass_context
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError
from jinja2.visitor import NodeTransformer

from topotuner_lab._io.config import is_int

__all__ = [
    "MAX_CHARS",
    "MAX_INT_BITS",
    "TIME_LIMIT_S",
    "evaluate",
    "expression_error",
    "fields_of",
    "is_field",
    "optional_fields",
    "render",
    "syntax_error",
]

#: the characters and list items one render may produce in all (output and intermediate values)
MAX_CHARS = 10_000_000
#: the largest integer a template may compute, in bits (about 19,700 decimal digits)
MAX_INT_BITS = 65_536
#: the most CPU time one render may take, in seconds of its thread (a prompt renders in well under a millisecond)
TIME_LIMIT_S = 1.0

T = TypeVar("T")
_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: the widths and precisions of %-format (``%-10.3f``, ``%(name)5s``) and str.format (``{0:>10.2}``) fields
_WIDTHS = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\d*)(?:\.(\d*))?|\{[^{}:]*:[^{}\d]*(\d*)(?:\.(\d*))?")
#: a width taken from the arguments: ``%*d``, ``{:{width}}``
_WIDTH_ARGUMENT = re.compile(r"%(?:\([^)]*\))?[-#0 +]*\*|%(?:\([^)]*\))?[-#0 +]*\d*\.\*|\{[^{}]*:[^{}]*\{")


@dataclass
class _Budget:
    """What the current render may still produce, and when it must end."""

    left: int
    deadline: float


_BUDGET: ContextVar[_Budget | None] = ContextVar("template_budget", default=None)


def _limited(run: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``run(*args, **kwargs)``: one render (or expression), under a fresh budget of characters and time."""
    token = _BUDGET.set(_Budget(MAX_CHARS, time.thread_time() + TIME_LIMIT_S))
    try:
        return run(*args, **kwargs)
    finally:
        _BUDGET.reset(token)


def _budget() -> _Budget:
    """The current render's budget (a fresh one when Jinja is driven from outside :func:`render`)."""
    return _BUDGET.get() or _Budget(MAX_CHARS, time.thread_time() + TIME_LIMIT_S)


def _tick() -> _Budget:
    """The render's budget, after refusing to go on past its deadline."""
    budget = _budget()
    if time.thread_time() > budget.deadline:
        raise SecurityError(f"the template ran longer than {TIME_LIMIT_S:g} s of CPU time")
    return budget


def _size(value: Any, limit: int) -> int:
    """The characters and items ``value`` holds, a part shared by several places counted at each (up to ``limit``)."""
    total, stack = 0, [value]
    while stack and total <= limit:
        item = stack.pop()
        if isinstance(item, (str, bytes)):
            total += len(item)
        elif isinstance(item, Mapping):
            total += len(item)
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            total += len(item)
            stack.extend(item)
        else:
            total += 1
    return total


def _refuse_over(estimate: int, what: str) -> None:
    """Refuse to build a value of ``estimate`` characters and items when the render's budget has less left."""
    if estimate > _tick().left:
        raise SecurityError(f"{what} would make over the {MAX_CHARS:,} characters a template may produce")


def _spend(value: Any) -> Any:
    """``value``, counted against the render's budget (and its time checked)."""
    budget = _tick()
    if isinstance(value, str):
        budget.left -= len(value)
    else:
        if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
            raise SecurityError(f"the template computes an integer of over {MAX_INT_BITS:,} bits")
        budget.left -= _size(value, budget.left)
    if budget.left < 0:
        raise SecurityError(f"the template produces over {MAX_CHARS:,} characters")
    return value


def _whole(value: Any) -> int:
    """``value`` as a count when it is a whole number (``bool`` is not one), else 0: what sizes a width or a repeat."""
    return max(value, 0) if is_int(value) else 0


def _listed(value: Any) -> Any:
    """An iterator as a list, so its size can be counted before it is used (lists, strings and the rest as they are)."""
    if isinstance(value, (str, list, tuple, dict, int, float)):  # the common cases, without an ABC check
        return value
    return list(value) if isinstance(value, Iterator) else value


def _formatted_size(template: str, values: Iterable[Any]) -> int:
    """An upper bound on the length of ``template`` %-formatted or str.format-ted with ``values``."""
    values = list(values)
    widths = sum(int(d) for match in _WIDTHS.finditer(template) for d in match.groups() if d)
    taken = sum(_whole(v) for v in values) if _WIDTH_ARGUMENT.search(template) else 0
    return len(template) + widths + taken + sum(_size(v, MAX_CHARS) for v in values)


def _replaced_size(text: Any, old: Any, new: Any, count: Any) -> int:
    """An upper bound on the length of ``text.replace(old, new, count)``."""
    if not (isinstance(text, str) and isinstance(old, str) and isinstance(new, str)):
        return 0
    places = text.count(old) if old else len(text) + 1
    if isinstance(count, int) and count >= 0:
        places = min(places, count)
    return len(text) + places * len(new)


def _joined_size(items: Any, separator: Any) -> int:
    """An upper bound on the length of ``separator.join(items)``."""
    if not isinstance(items, (list, tuple, str)):
        return 0
    return _size(items, MAX_CHARS) + len(str(separator)) * len(items)


def _indented_size(text: str, width: Any) -> int:
    """An upper bound on the length of ``text`` indented by ``width`` (spaces, or a string) at each line."""
    return len(text) + (text.count("\n") + 1) * (len(width) if isinstance(width, str) else _whole(width))


def _translated_size(text: str, table: Any) -> int:
    """An upper bound on the length of ``text.translate(table)``: each character may become the longest value."""
    values = table.values() if isinstance(table, Mapping) else table if isinstance(table, (list, tuple)) else ()
    return len(text) * max((_size(v, MAX_CHARS) for v in values), default=1)


def _arg(args: tuple[Any, ...], kwargs: Mapping[str, Any], index: int, name: str, default: Any) -> Any:
    return args[index] if len(args) > index else kwargs.get(name, default)


Sizer = Callable[[Any, tuple[Any, ...], Mapping[str, Any]], int]

#: upper bounds on the size of the filters whose output can outgrow their input many times over
_FILTER_SIZES: dict[str, Sizer] = {
    "batch": lambda v, a, k: _size(v, MAX_CHARS) + _whole(_arg(a, k, 0, "linecount", 0)),
    "center": lambda v, a, k: len(str(v)) + _whole(_arg(a, k, 0, "width", 80)),
    "format": lambda v, a, k: _formatted_size(str(v), (*a, *k.values())),
    "indent": lambda v, a, k: _indented_size(str(v), _arg(a, k, 0, "width", 4)),
    "join": lambda v, a, k: _joined_size(v, _arg(a, k, 0, "d", "")),
    "replace": lambda v, a, k: _replaced_size(
        str(v), _arg(a, k, 0, "old", ""), _arg(a, k, 1, "new", ""), _arg(a, k, 2, "count", None)
    ),
    "slice": lambda v, a, k: _size(v, MAX_CHARS) + _whole(_arg(a, k, 0, "slices", 0)),
    "wordwrap": lambda v, a, k: len(str(v)) * (1 + len(str(_arg(a, k, 2, "wrapstring", None) or "\n"))),
}
#: the same for the methods of a string (``text.center(80)``)
_METHOD_SIZES: dict[str, Sizer] = {
    "center": lambda s, a, k: len(s) + _whole(_arg(a, k, 0, "width", 0)),
    "ljust": lambda s, a, k: len(s) + _whole(_arg(a, k, 0, "width", 0)),
    "rjust": lambda s, a, k: len(s) + _whole(_arg(a, k, 0, "width", 0)),
    "zfill": lambda s, a, k: len(s) + _whole(_arg(a, k, 0, "width", 0)),
    "expandtabs": lambda s, a, k: len(s) + s.count("\t") * _whole(_arg(a, k, 0, "tabsize", 8)),
    "join": lambda s, a, k: _joined_size(_arg(a, k, 0, "iterable", ()), s),
    "replace": lambda s, a, k: _replaced_size(
        s, _arg(a, k, 0, "old", ""), _arg(a, k, 1, "new", ""), _arg(a, k, 2, "count", -1)
    ),
    "translate": lambda s, a, k: _translated_size(s, _arg(a, k, 0, "table", {})),
}

#: a plain environment, to call Jinja's own filters from the bounded ones
_PLAIN = Environment()


def _bounded_filter(name: str) -> Callable[..., Any]:
    """Jinja's filter ``name``, its size bounded before it runs where it can grow, its result counted.

    Every filter takes the render's context, so Jinja never calls one while it compiles a template.
    """
    sizer = _FILTER_SIZES.get(name)

    @pass_context
    def bounded(context: Context, value: Any, *args: Any, **kwargs: Any) -> Any:
        value, args = _listed(value), tuple(map(_listed, args))
        if sizer is not None:
            _refuse_over(sizer(value, args, kwargs), f"the {name} filter")
        return _spend(_PLAIN.call_filter(name, value, args, kwargs, context=context))

    return bounded


@pass_context
def _output(context: Context, value: Any) -> str:
    """One piece of a template's output (text or ``{{ ... }}``), counted (also inside macros and blocks)."""
    return str(_spend(str(value)))


@pass_context
def _concat(context: Context, values: list[Any]) -> str:
    """``a ~ b``: the values as text, joined after their length is counted."""
    parts = [str(v) for v in values]
    _refuse_over(sum(map(len, parts)), "~")
    return str(_spend("".join(parts)))


@pass_context
def _ticked(context: Context, iterable: Iterable[Any]) -> Iterator[Any]:
    """The items of a ``{% for %}`` loop, the render's time checked at each step."""
    for item in iterable:
        _tick()
        yield item


class _Bounded(NodeTransformer):
    """Routes a template's output, ``~`` and loops through the budget.

    Every ``{{ ... }}`` is counted, and the literal text in a loop (text outside loops is the template's own, once
    per render or per macro call, and a macro's result is counted where it is called).
    """

    def __init__(self) -> None:
        self.loops = 0

    @staticmethod
    def _through(node: nodes.Node, name: str) -> nodes.Filter:
        return nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)

    def visit_Output(self, node: nodes.Output) -> nodes.Node:
        """Each piece of output through ``_output``."""
        self.generic_visit(node)
        node.nodes = [
            child if isinstance(child, nodes.TemplateData) and not self.loops else self._through(child, "_output")
            for child in node.nodes
        ]
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        """``a ~ b`` through ``_concat``."""
        self.generic_visit(node)
        return self._through(nodes.List(node.nodes, lineno=node.lineno), "_concat")

    def visit_For(self, node: nodes.For) -> nodes.Node:
        """A loop's items through ``_ticked``."""
        self.loops += 1
        self.generic_visit(node)
        self.loops -= 1
        node.iter = self._through(node.iter, "_ticked")
        return node


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox under the module's size and time limits, with nothing computed while compiling."""

    #: every operator goes through :meth:`call_binop` (and so is never folded into a constant while compiling)
    intercepted_binops = frozenset(ImmutableSandboxedEnvironment.default_binop_table)

    def __init__(self) -> None:
        super().__init__(undefined=StrictUndefined, keep_trailing_newline=True, autoescape=False)
        self.filters = {name: _bounded_filter(name) for name in self.filters}
        self.filters |= {"_output": _output, "_concat": _concat, "_ticked": _ticked}
        del self.globals["lipsum"]  # lorem ipsum of any length: no use in a prompt

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        """``left operator right``, refused before it runs when its result would be too big."""
        if is_int(left) and is_int(right):
            bits = math.log2(abs(left) or 1) * right if operator == "**" else left.bit_length() + right.bit_length()
            if operator in ("*", "**") and bits > MAX_INT_BITS:
                raise SecurityError(f"{operator} would make an integer of over {MAX_INT_BITS:,} bits")
        elif operator == "*" and isinstance(left, (str, list, tuple)) != isinstance(right, (str, list, tuple)):
            repeated, times = (left, right) if isinstance(left, (str, list, tuple)) else (right, left)
            _refuse_over(_size(repeated, MAX_CHARS) * _whole(times), "*")
        elif operator == "+" and isinstance(left, (str, list, tuple)):
            _refuse_over(_size(left, MAX_CHARS) + _size(right, MAX_CHARS), "+")
        elif operator == "%" and isinstance(left, str):
            values = right.values() if isinstance(right, Mapping) else right if isinstance(right, tuple) else (right,)
            _refuse_over(_formatted_size(left, values), "%")
        return _spend(super().call_binop(context, operator, left, right))

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        """``obj(*args, **kwargs)`` in the sandbox; a string method that can grow is sized first."""
        args = tuple(map(_listed, args))
        owner, sizer = getattr(obj, "__self__", None), _METHOD_SIZES.get(getattr(obj, "__name__", ""))
        if isinstance(owner, str) and sizer is not None:
            _refuse_over(sizer(owner, args, kwargs), f"str.{obj.__name__}")
        return _spend(super().call(context, obj, *args, **kwargs))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """``text.format`` / ``text.format_map`` in the sandbox, sized first (``'{:>999999999}'.format(1)``)."""
        sandboxed = super().wrap_str_format(value)
        if sandboxed is None:
            return None
        template: str = value.__self__

        def bounded(*args: Any, **kwargs: Any) -> str:
            values = [*args, *kwargs.values()]
            if value.__name__ == "format_map" and args and isinstance(args[0], Mapping):
                values = list(args[0].values())
            _refuse_over(_formatted_size(template, values), f"str.{value.__name__}")
            return sandboxed(*args, **kwargs)

        return bounded


_ENV = _BoundedSandbox()


def is_field(source: str) -> bool:
    """Whether ``source`` is a bare field name (its value is taken as is) rather than a template."""
    return _FIELD.fullmatch(source) is not None


@functools.lru_cache(maxsize=256)
def _compiled(source: str) -> Template:
    tree = _Bounded().visit(_ENV.parse(source))
    tree.set_environment(_ENV)
    return _ENV.from_string(tree)


@functools.lru_cache(maxsize=256)
def _compiled_expression(expression: str) -> Callable[..., Any]:
    return _ENV.compile_expression(expression, undefined_to_none=False)


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
    compiled = _compiled_expression(expression)
    return _limited(compiled, **row)


def expression_error(expression: str) -> str | None:
    """Why ``expression`` is not a valid Jinja2 expression (one line), or None when it is one."""
    try:
        _ENV.compile_expression(expression)
    except TemplateSyntaxError as exc:
        return exc.message or "invalid expression"
    return None


def render(source: str, row: Mapping[str, Any]) -> Any:
    """``source`` over ``row``: the field's own value for a bare field name, else the rendered text (bounded)."""
    if is_field(source):
        return row[source]
    template = _compiled(source)
    return _limited(template.render, row)
