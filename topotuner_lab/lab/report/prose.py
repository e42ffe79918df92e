"""The report's prose: Jinja2 templates shipped in ``templates/``, filled with the values the sections compute.

A section computes numbers, verdicts and table rows; its template (``templates/SECTION.md.j2``) lays them out.
``StrictUndefined`` makes a value a template names but a section did not pass an error rather than a blank;
``trim_blocks``, ``lstrip_blocks`` and ``keep_trailing_newline`` make the Markdown exactly what the template shows
(a line holding only a ``{% ... %}`` tag leaves nothing behind). Tables are data: ``tabulate`` lays them out
(the ``markdown`` and ``results_table`` filters), the template picks their number format.
"""

from __future__ import annotations

import functools
from typing import Any

import jinja2
import pandas as pd

from topotuner_lab.study.markdown import markdown_table


def _fmt(value: Any, spec: str) -> str:
    """``value`` under a Python format spec (``{{ x | fmt(".3g") }}``): the f-string's own rounding."""
    return format(value, spec)


def _markdown(table: pd.DataFrame | pd.Series, floatfmt: str, index: bool = True) -> str:
    """A table as Markdown, its numbers in ``floatfmt`` (``{{ table | markdown(".3g", index=False) }}``)."""
    return str(table.to_markdown(index=index, floatfmt=floatfmt))


@functools.cache
def environment() -> jinja2.Environment:
    """The templates' environment: loaded from the package, strict about missing values, whitespace exact."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("topotuner_lab.lab.report", "templates"),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,  # Markdown, not HTML: a `<` in a task name is text
    )
    env.filters.update(fmt=_fmt, markdown=_markdown, results_table=markdown_table)
    return env


def render(template: str, **values: Any) -> str:
    """The Markdown of ``templates/<template>.md.j2`` filled with ``values``."""
    return environment().get_template(f"{template}.md.j2").render(**values)


def sentence(library: str, macro: str, **values: Any) -> str:
    """One sentence from a macro of ``templates/<library>.md.j2`` (a file of macros only), for a list of lines."""
    return str(getattr(environment().get_template(f"{library}.md.j2").module, macro)(**values))
