"""The notebook series: stored without outputs, parameterized, and executed headlessly on the tiny profile."""

import json
from pathlib import Path

import nbformat
import pytest

from topotuner_lab._io.errors import ParameterError
from topotuner_lab.lab.notebooks import (
    EXPECTED_FIGURES,
    NOTEBOOKS,
    NotebookError,
    _coerce,
    notebooks_dir,
    run_notebooks,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebooks_are_stripped_and_parameterized(name):
    book = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    nbformat.validate(book)
    assert book.metadata.kernelspec.name == "python3"
    code = [c for c in book.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "commit notebooks without outputs"
    assert "parameters" in code[0].metadata.get("tags", [])
    assert sum(len(c.source.splitlines()) for c in code) < 60, "keep notebooks thin: logic belongs in topotuner_lab"


@pytest.mark.slow
def test_all_notebooks_run_headlessly_on_the_tiny_profile(tmp_path):
    executed = run_notebooks("tiny", tmp_path)
    assert [p.name for p in executed] == list(NOTEBOOKS)
    for path in executed:
        book = nbformat.read(path, as_version=4)
        code = [c for c in book.cells if c.cell_type == "code"]
        assert all(c.metadata.papermill.status == "completed" for c in code), path.name
        assert sum(len(c.outputs) for c in code) > 0, f"{path.name} produced no output"
        _reads_well(path, code)
    for stems in EXPECTED_FIGURES.values():
        for stem in stems:
            html = (tmp_path / "figures" / f"{stem}.html").read_text()
            assert 'src="plotly.min.js"' in html and len(html) < 500_000, (
                stem
            )  # the page loads the one shared plotly.js
    assert (tmp_path / "figures" / "plotly.min.js").stat().st_size > 1_000_000  # offline: plotly.js itself, once
    assert len(list((tmp_path / "figures").glob("plotly*.js"))) == 1
    card = json.loads((tmp_path / "work" / "cards" / "profile.json").read_text())
    assert card["model"]["name"] == "tiny-llama" and card["trainable"]
    profile_book = nbformat.read(tmp_path / "executed" / "04_build_profile.ipynb", as_version=4)
    printed = "".join(o.get("text", "") for c in profile_book.cells if c.cell_type == "code" for o in c.outputs)
    assert "Across 3 prior runs the picks share a Jaccard index of " in printed  # the card against 2 more prior runs
    from topotuner_lab.lab.workbench import method_run, rate_sweeps

    results = method_run(tmp_path / "work", "agnews", "profile")  # the rate notebook 5 chose on validation
    assert results["trainable_params"] == card["trainable_params"]
    sweeps = rate_sweeps(tmp_path / "work", "agnews")
    assert set(sweeps["method"]) == {"full", "lora", "profile"} and len(sweeps) == 6  # two rates each
    assert (sweeps.groupby("method")["chosen"].sum() == 1).all()
    chosen = sweeps[(sweeps["method"] == "profile") & sweeps["chosen"]]
    assert chosen["lr"].item() == results["learning_rate"]


#: the workbench series (01..07): each opens with what it shows, reads, writes and what to look for
SERIES = tuple(name for name in NOTEBOOKS if name[:2] in {"01", "02", "03", "04", "05", "06", "07"})
PLOTLY_MIME = "application/vnd.plotly.v1+json"


def _reads_well(path: Path, code: list) -> None:
    """An executed notebook as it reads when opened: no progress debris, warnings or leaked reprs; figures shown."""
    outputs = [o for c in code for o in c.outputs]
    text = "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", "")) for o in outputs)
    for debris in ("Loading weights", "Writing model shards", "FutureWarning", "[PosixPath(", "VBox(children"):
        assert debris not in text, f"{path.name} shows {debris!r}"
    html = "".join(str(o.get("data", {}).get("text/html", "")) for o in outputs)
    assert "plotly.js v" not in html and path.stat().st_size < 1_500_000, f"{path.name} carries its own plotly.js"
    if path.name not in SERIES:
        return
    if path.name in EXPECTED_FIGURES:  # widgets' figures too: a static copy draws without a kernel
        assert any(PLOTLY_MIME in o.get("data", {}) for o in outputs), f"{path.name} displays no figure"
    opening = nbformat.read(path, as_version=4).cells[0]
    assert opening.cell_type == "markdown" and all(w in opening.source for w in ("**Reads**", "**Writes**")), path.name


def test_notebooks_open_as_documents_with_one_setup_call():
    for name in SERIES:
        book = nbformat.read(ROOT / "notebooks" / name, as_version=4)
        opening = book.cells[0]
        assert opening.cell_type == "markdown", name
        assert all(w in opening.source for w in ("**Shows**", "**Reads**", "**Writes**", "**Look for**")), name
        code = "".join(c.source for c in book.cells if c.cell_type == "code")
        assert code.count("notebooks.setup(figures_dir)") == 1, name  # the shared setup, not a copied cell
        for wiring in ("observe(", "FigureWidget", "use_offline_renderer", "mkdir("):
            assert wiring not in code, (name, wiring)  # widget wiring and setup live in topotuner_lab.lab


@pytest.mark.slow
def test_failing_cell_names_notebook_cell_and_error(tmp_path):
    with pytest.raises(NotebookError) as info:
        run_notebooks("tiny", tmp_path, {"prior_task": "mnli"}, names=("01_extract.ipynb",))
    message = str(info.value)
    assert (
        "01_extract.ipynb failed" in message
        and "cell" in message
        and "TaskError" in message
        and "unknown task 'mnli'" in message
    )


def test_parameter_types_are_checked(tmp_path):
    with pytest.raises(ParameterError, match="'prior_n_train' of 01_extract.ipynb expects int, got 'many'"):
        run_notebooks("tiny", tmp_path, {"prior_n_train": "many"}, names=("01_extract.ipynb",))
    with pytest.raises(ParameterError, match="no notebook has parameter"):
        run_notebooks("tiny", tmp_path, {"learning_rat": "1"}, names=("01_extract.ipynb",))
    with pytest.raises(ParameterError, match="unknown notebook preset"):
        run_notebooks("huge", tmp_path)
    with pytest.raises(ParameterError, match="distinct seeds >= 1"):
        run_notebooks("tiny", tmp_path, {"extra_prior_seeds": "[0, 1]"}, names=("01_extract.ipynb",))
    assert _coerce("n", "12", "int", "nb") == 12 and _coerce("x", "1", "float", "nb") == 1.0
    assert _coerce("s", "[1, 2]", "list", "nb") == [1, 2]
    with pytest.raises(ParameterError):
        _coerce("n", "True", "int", "nb")


def test_notebooks_dir_is_the_repository_folder():
    assert notebooks_dir() == ROOT / "notebooks"
