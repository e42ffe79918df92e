"""Every public export has a numpydoc reference docstring whose examples run, and docs/REFERENCE.md is its rendering.

The sections each kind of export needs: a function Parameters / Returns / Raises / Examples, a class Parameters /
Raises / Examples (a dataclass names every field under Parameters), an error class Examples; the topology exports
also References. The examples run here as doctests, each in a fresh namespace (they import what they use).
"""

from __future__ import annotations

import dataclasses
import doctest
import importlib.util
import inspect
import re
import time
from pathlib import Path

import pytest

import topotuner_lab
from topotuner_lab._io.errors import TopoTunerError

ROOT = Path(__file__).resolve().parents[2]
#: the exports that follow published methods and say which (References)
TOPOLOGY = {"diagrams", "wasserstein", "bottleneck", "PersistenceSettings", "drift_table", "noise_check"}
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _export(name: str) -> object:
    return getattr(topotuner_lab, name)


def required_sections(name: str) -> set[str]:
    """The numpydoc sections the export ``name`` must have."""
    obj = _export(name)
    if isinstance(obj, type) and issubclass(obj, TopoTunerError):
        needed = {"Examples"}
    elif isinstance(obj, type):
        needed = {"Parameters", "Raises", "Examples"}
    else:
        needed = {"Parameters", "Returns", "Raises", "Examples"}
    return needed | ({"References"} if name in TOPOLOGY else set())


def sections(doc: str) -> dict[str, str]:
    """A numpydoc docstring's sections by title (a title line underlined with dashes), each with its body."""
    parts = re.split(r"^(\w[\w ]*)\n-{3,}$", inspect.cleandoc(doc), flags=re.MULTILINE)
    return {title: body for title, body in zip(parts[1::2], parts[2::2])}


def documented_names(parameters: str) -> set[str]:
    """The names a Parameters section documents (``name : type``, or ``a, b : type`` for several)."""
    names: set[str] = set()
    for line in parameters.splitlines():
        if line and not line[0].isspace() and " : " in line:
            names.update(n.strip() for n in line.split(" : ")[0].split(","))
    return names


def test_every_export_is_covered():
    assert sorted(topotuner_lab.__all__) == sorted(topotuner_lab._EXPORTS)
    assert TOPOLOGY <= set(topotuner_lab.__all__)


@pytest.mark.parametrize("name", topotuner_lab.__all__)
def test_export_docstring_has_its_sections_and_examples(name):
    obj = _export(name)
    doc = obj.__doc__ or ""  # the object's own docstring, not one inherited
    found = sections(doc)
    missing = sorted(required_sections(name) - set(found))
    assert not missing, f"{name}'s docstring lacks the section(s) {missing}"
    assert ">>>" in found["Examples"], f"{name}'s Examples section has no doctest (>>>)"
    if dataclasses.is_dataclass(obj) and not issubclass(obj, TopoTunerError):  # type: ignore[arg-type]
        fields = {f.name for f in dataclasses.fields(obj)}  # type: ignore[arg-type]
        undocumented = sorted(fields - documented_names(found["Parameters"]))
        assert not undocumented, f"{name}'s Parameters section does not name the field(s) {undocumented}"


@pytest.mark.parametrize("name", topotuner_lab.__all__)
def test_export_examples_pass_as_doctests(name):
    obj = _export(name)
    tests = doctest.DocTestFinder(recurse=False).find(obj, name, globs={})
    assert tests and tests[0].examples, f"{name} has no doctest"
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    report: list[str] = []
    start = time.perf_counter()
    for test in tests:
        runner.run(test, out=report.append)
    seconds = time.perf_counter() - start
    assert runner.failures == 0, f"{name}'s examples failed:\n" + "".join(report)
    print(f"{name}: {runner.tries} examples in {seconds:.2f} s")


def _generator():
    spec = importlib.util.spec_from_file_location("reference_docs", ROOT / "scripts" / "reference_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reference_page_is_the_rendering_of_the_docstrings():
    page = (ROOT / "docs" / "REFERENCE.md").read_text(encoding="utf-8")
    assert page == _generator().render(), "docs/REFERENCE.md is stale: run `python scripts/reference_docs.py`"


def test_reference_page_has_every_export_with_its_signature_and_examples():
    page = _generator().render()
    parts = {part.split("`", 1)[0]: part for part in page.split("\n## `")[1:]}
    assert sorted(parts) == sorted(topotuner_lab.__all__)
    for name, part in parts.items():
        assert f"```python\n{name}" in part, f"{name} has no signature on the page"
        assert "```pycon\n>>> " in part, f"{name} has no example on the page"
    assert "\n- `matrix` (array_like, shape (rows, cols)): A weight matrix" in parts["diagrams"]
    assert '\n1. U. Bauer, "Ripser: ' in parts["diagrams"]


def test_sections_reader_finds_titles_and_field_names():
    doc = """Summary.

    Parameters
    ----------
    a, b : int
        Two numbers.
    c : str
        Text with a colon : inside.

    Examples
    --------
    >>> 1
    1
    """
    found = sections(doc)
    assert set(found) == {"Parameters", "Examples"}
    assert documented_names(found["Parameters"]) == {"a", "b", "c"}
