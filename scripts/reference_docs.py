"""Write docs/REFERENCE.md, the API reference, from the docstrings of the package's public exports.

Run ``python scripts/reference_docs.py`` after changing a docstring of an export (a test compares the committed page
with :func:`render`). Each export gets its signature and its numpydoc sections in Markdown: parameter lists as bullet
lists, examples as ``pycon`` code blocks.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import topotuner_lab
from topotuner_lab._io.atomic import write_text

PAGE = Path(__file__).resolve().parents[1] / "docs" / "REFERENCE.md"
#: sections whose entries are ``name : type`` lines with indented descriptions
LISTS = ("Parameters", "Attributes", "Returns", "Raises", "Yields", "Warns", "See Also")
#: a signature longer than this is written one parameter a line
WIDE = 100
HEADER = """# API reference

The public names of `topotuner_lab` (`topotuner_lab.__all__`), grouped by the floor that defines them. Generated from
their docstrings by `python scripts/reference_docs.py`; do not edit by hand (a test checks the page is current). Every
example is a doctest that runs in the fast test suite (`tests/project/test_reference_docs.py`).
"""


def _inline(text: str) -> str:
    """Inline reStructuredText markup as Markdown: ``code`` and :role:`name` become `code`."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def _entries(body: str) -> list[str]:
    """A list section (``name : type`` then indented description lines) as Markdown bullets."""
    items: list[str] = []
    for line in body.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            head, _, kind = line.partition(" : ")
            items.append(f"- `{head}`" + (f" ({_inline(kind)})" if kind else "") + ":")
        elif items:
            items[-1] += " " + _inline(line.strip())
        else:
            items.append("- " + _inline(line.strip()))
    return [item.removesuffix(":") for item in items]


def _references(body: str) -> list[str]:
    """``.. [n] citation`` entries (continued on indented lines) as a numbered Markdown list."""
    items: list[str] = []
    for line in body.splitlines():
        cited = re.match(r"\.\. \[(\d+)\] (.*)", line)
        if cited:
            items.append(f"{cited.group(1)}. {_inline(cited.group(2))}")
        elif line.strip() and items:
            items[-1] += " " + _inline(line.strip())
    return items


def _section(title: str, body: str) -> list[str]:
    """One numpydoc section in Markdown."""
    body = body.strip("\n")
    if title == "Examples":  # prose paragraphs as text, each session of ``>>>`` lines as a code block
        blocks = [b for b in re.split(r"\n\s*\n", body) if b.strip()]
        shown = [f"```pycon\n{b}\n```" if b.lstrip().startswith(">>>") else _inline(b) for b in blocks]
        return [f"**{title}**", "", "\n\n".join(shown)]
    if title in LISTS:
        return [f"**{title}**", "", *_entries(body)]
    if title == "References":
        return [f"**{title}**", "", *_references(body)]
    return [f"**{title}**", "", _inline(body)]


class _Shown(str):
    """An annotation kept as text (``from __future__ import annotations``), shown without quotes."""

    def __repr__(self) -> str:
        return str(self)


def _signature(name: str, obj: Any) -> str:
    """``name(parameters)``, one parameter a line when long; the bare name where Python cannot tell them."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return name
    shown = [
        p.replace(annotation=_Shown(p.annotation)) if isinstance(p.annotation, str) else p
        for p in sig.parameters.values()
    ]
    returns = sig.return_annotation
    if isinstance(obj, type):  # a class's signature is its constructor's, which returns None
        returns = inspect.Signature.empty
    elif isinstance(returns, str):
        returns = _Shown(returns)
    text = f"{name}{sig.replace(parameters=shown, return_annotation=returns)}"
    if len(text) <= WIDE:
        return text
    params = str(sig.replace(parameters=shown, return_annotation=inspect.Signature.empty))[1:-1]
    lines = [f"    {part}," for part in _split_top(params)]
    tail = f") -> {returns}" if returns is not inspect.Signature.empty else ")"
    return "\n".join([f"{name}(", *lines, tail])


def _split_top(params: str) -> list[str]:
    """The comma-separated parts of a parameter list, not splitting inside brackets or quotes."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(params):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(params[start:i].strip())
            start = i + 1
    return [*parts, params[start:].strip()]


def document(name: str) -> str:
    """The Markdown section of one export: its heading, signature and docstring."""
    obj = getattr(topotuner_lab, name)
    kind = "class" if isinstance(obj, type) else "function"
    parts = re.split(r"^(\w[\w ]*)\n-{3,}$", inspect.cleandoc(obj.__doc__ or ""), flags=re.MULTILINE)
    lines = [f"## `{name}`", "", f"{kind} in `{obj.__module__}`", "", "```python", _signature(name, obj), "```", ""]
    lines += [_inline(parts[0].strip()), ""]
    for title, body in zip(parts[1::2], parts[2::2]):
        lines += [*_section(title, body), ""]
    return "\n".join(lines)


def render() -> str:
    """The whole page: a contents line per floor, then every export in :data:`topotuner_lab._EXPORTS` order."""
    names = list(topotuner_lab._EXPORTS)
    floors: dict[str, list[str]] = {}
    for name in names:
        floors.setdefault(topotuner_lab._EXPORTS[name].split(".")[1], []).append(name)
    anchors: dict[str, str] = {}
    for name in names:  # GitHub's heading anchors: the lower-cased text, "-1", "-2"... for repeats
        seen = sum(anchor.split("-")[0] == name.lower() for anchor in anchors.values())
        anchors[name] = name.lower() + (f"-{seen}" if seen else "")
    contents = [f"- {floor}: " + ", ".join(f"[`{n}`](#{anchors[n]})" for n in group) for floor, group in floors.items()]
    return "\n".join([HEADER, *contents, "", *(document(name) for name in names)]).rstrip("\n") + "\n"


if __name__ == "__main__":
    write_text(PAGE, render())
    print(f"wrote {PAGE}")
