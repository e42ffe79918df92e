"""End to end in a real browser: JupyterLab on 127.0.0.1, a notebook opened and run in Debian's
headless Chromium through Playwright; a plotly figure and an ipywidgets slider must render.

Needs /usr/bin/chromium (`.ci/run` installs it); without it the test is skipped with that reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest

from topotuner_lab.lab.notebooks import run_notebooks

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium not installed (apt-get install chromium)"),
]
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _settings(folder: Path) -> None:
    """Render every cell (no lazy windowing) and switch off the news pop-up."""
    (folder / "@jupyterlab" / "notebook-extension").mkdir(parents=True)
    (folder / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings").write_text(
        json.dumps({"windowingMode": "none"})
    )
    (folder / "@jupyterlab" / "apputils-extension").mkdir(parents=True)
    (folder / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )


def _wait_for_server(url: str, lab: subprocess.Popen, log: Path) -> None:
    for _ in range(240):
        if lab.poll() is not None:
            pytest.fail(f"JupyterLab exited with {lab.returncode}:\n{_tail(log)}")
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"JupyterLab did not answer in 2 minutes:\n{_tail(log)}")


def _tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.is_file() else "(no log)"


def _run_all_cells(page) -> None:
    """Run > Run All Cells, retried until a cell shows it ran: a click that lands before the notebook
    panel has focus or its kernel is connected does nothing, which is how this test once timed out."""
    for _ in range(4):
        page.locator(".jp-Notebook .jp-Cell").first.click()
        page.get_by_role("menuitem", name="Run", exact=True).click(timeout=30_000)
        page.get_by_text("Run All Cells", exact=True).click(timeout=30_000)
        try:
            page.wait_for_function(
                """() => [...document.querySelectorAll('.jp-InputPrompt')]"""
                """.some(e => /\\[(\\*|\\d+)\\]/.test(e.textContent))""",
                timeout=30_000,
            )
            return
        except Exception:  # playwright's TimeoutError: nothing started, try again
            page.keyboard.press("Escape")
    raise AssertionError("Run All Cells never started a cell")


@contextlib.contextmanager
def _lab_page(tmp_path: Path, book: nbformat.NotebookNode) -> Iterator[tuple[Any, Path]]:
    """``book`` served by JupyterLab on 127.0.0.1, opened in headless Chromium with every cell run.

    Yields the page (idle again after Run All) and the JupyterLab log; a failure inside the block reports a
    screenshot, the cell outputs and the log's tail.
    """
    from playwright.sync_api import sync_playwright

    served = tmp_path / "lab"
    served.mkdir()
    nbformat.write(book, served / "browser.ipynb")
    _settings(tmp_path / "settings")
    port, token = _free_port(), "topotuner-test"
    env = {
        **os.environ,
        "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "jcfg"),
    }
    log = tmp_path / "lab.log"
    with log.open("w") as sink:
        lab = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyterlab",
                "--no-browser",
                "--ip",
                "127.0.0.1",
                f"--port={port}",
                f"--IdentityProvider.token={token}",
                "--allow-root",
                f"--ServerApp.root_dir={served}",
            ],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_for_server(f"http://127.0.0.1:{port}/api/status?token={token}", lab, log)
        with sync_playwright() as pw:
            browser = pw.chromium.launch_persistent_context(
                str(tmp_path / "chrome"), executable_path=CHROMIUM, args=ARGS, viewport={"width": 1400, "height": 1000}
            )
            page = browser.new_page()
            console: list[str] = []  # the page's console and uncaught errors, for a failure's report
            page.on("console", lambda msg: console.append(f"{msg.type}: {msg.text}"))
            page.on("pageerror", lambda exc: console.append(f"pageerror: {exc}"))
            try:
                page.goto(f"http://127.0.0.1:{port}/lab/tree/browser.ipynb?token={token}", timeout=120_000)
                page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
                page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
                _run_all_cells(page)
                page.wait_for_selector(".js-plotly-plot .main-svg", timeout=180_000)
                page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=180_000)
                time.sleep(2)
                yield page, log
            except Exception as error:
                page.screenshot(path=str(tmp_path / "failure.png"))
                outputs = page.locator(".jp-OutputArea-output").all_inner_texts()
                raise AssertionError(
                    f"{error}\nscreenshot: {tmp_path / 'failure.png'}\ncell outputs: {outputs}\nbrowser console:\n"
                    + "\n".join(console[-60:])
                    + f"\nJupyterLab log:\n{_tail(log)}"
                ) from error
            finally:
                browser.close()
    finally:
        lab.terminate()
        lab.wait(timeout=30)


def _no_traceback(page) -> None:
    """No cell printed a traceback (an error that escaped a widget ends up there or in the kernel's log)."""
    stderr = ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
    assert page.locator(f"{stderr} >> text=Traceback").count() == 0
    assert page.locator(".jp-OutputArea-output >> text=Traceback").count() == 0


def test_notebook_renders_plotly_and_widgets_in_jupyterlab(tmp_path):
    run_notebooks("tiny", tmp_path / "run", names=("01_extract.ipynb",))  # the work folder notebook 2 reads
    book = nbformat.read(ROOT / "notebooks" / "02_persistence_diagrams.ipynb", as_version=4)
    book.cells[1].source = (
        f'work_dir = "{tmp_path / "run" / "work"}"\nfigures_dir = "{tmp_path / "figs"}"\n'
        'prior_task = "sst2"\nlayer = 1\nkind = "v"'
    )
    with _lab_page(tmp_path, book) as (page, _log):
        page.wait_for_selector(".widget-slider", timeout=180_000)
        assert page.locator(".js-plotly-plot .main-svg").count() >= 2
        # the explorer's live diagram, drawn before its view opened, has its title and points (not empty axes)
        live = page.locator(".jp-Cell").filter(has=page.locator(".widget-slider")).first.locator(".js-plotly-plot")
        # the view receives the figure's state from the kernel: over 30 s on a loaded machine
        assert live.first.locator(".gtitle").text_content(timeout=120_000) == "L1.v: persistence diagram"
        assert live.first.locator(".scatterlayer .trace .point").count() > 0
        assert page.locator(".widget-slider").count() >= 1
        _no_traceback(page)
        page.locator(".js-plotly-plot").first.scroll_into_view_if_needed()
        shot = ROOT / "figures" / "browser_screenshot.png"
        page.screenshot(path=str(shot), full_page=False)
        assert shot.stat().st_size > 10_000


def test_profile_builder_runs_every_strategy_in_jupyterlab(tmp_path):
    """Notebook 4's builder driven through every strategy it offers: each redraws its figure or shows its error."""
    run_notebooks("tiny", tmp_path / "run", {"extra_prior_seeds": "[]"}, names=("01_extract.ipynb",))
    book = nbformat.read(ROOT / "notebooks" / "04_build_profile.ipynb", as_version=4)
    params = next(i for i, c in enumerate(book.cells) if "parameters" in c.metadata.get("tags", []))
    book.cells[params].source = (
        f'model = "tiny-llama"\nwork_dir = "{tmp_path / "run" / "work"}"\nfigures_dir = "{tmp_path / "figs"}"\n'
        'prior_task = "sst2"\nrecipe = "default"\nstrategy = "high-drift"\nbudget_fraction = 0.05\nhomology_dim = 0\n'
        'normalization = "per-point"\nstop_threshold = 0.9\nextra_prior_seeds = []'
    )
    with _lab_page(tmp_path, book) as (page, _log):
        cell = page.locator(".jp-Cell").filter(has=page.locator(".widget-dropdown select")).first
        strategy = cell.locator(".widget-dropdown").filter(has_text="strategy").locator("select")
        live = cell.locator(".js-plotly-plot").first
        title = live.locator(".gtitle").first  # an SVG text: read with text_content (inner_text wants HTML)
        error = cell.locator(".widget-html b[style*='#b00']")
        offered = [o.strip() for o in strategy.locator("option").all_inner_texts()]
        assert {"snr", "alpha", "kappa", "relchange", "magnitude", "joint-hl"} <= set(offered), offered
        # the figure drawn before its view opened is there: its title and the heatmap's projection kinds
        assert title.text_content().startswith("high-drift selection"), title.text_content()
        assert [tick.text_content() for tick in live.locator(".xtick").all()] == ["q", "k", "v", "o"]
        seen = {}
        for name in [*offered[1:], offered[0]]:  # start away from the notebook's strategy, end back on it
            before = title.text_content()
            strategy.select_option(name)
            page.wait_for_function(
                "([el, before]) => el.textContent !== before",
                arg=[title.element_handle(), before],
                timeout=60_000,
            )
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
            seen[name] = title.text_content()
            if seen[name].startswith(f"{name} selection"):
                assert error.count() == 0, (name, error.all_inner_texts())
            else:  # the strategy cannot rank this table: its error is in the widget, the figure cleared
                assert seen[name].startswith("no selection") and error.count() == 1, (name, seen[name])
        assert all(text.startswith(f"{name} selection") for name, text in seen.items()), seen
        _no_traceback(page)


def test_study_explorer_redraws_the_forest_plot_when_a_claim_is_picked(tmp_path):
    """Notebook 8 on the committed ledger (no weights): picking one claim redraws the forest plot with its row only."""
    from topotuner_lab.lab.explorer import DEFAULT_STUDY

    book = nbformat.read(ROOT / "notebooks" / "08_explore_study.ipynb", as_version=4)
    params = next(i for i, c in enumerate(book.cells) if "parameters" in c.metadata.get("tags", []))
    book.cells[params].source = f'study_folder = "{ROOT / DEFAULT_STUDY}"\nfigures_dir = "{tmp_path / "figs"}"'
    with _lab_page(tmp_path, book) as (page, _log):
        cell = page.locator(".jp-Cell").filter(has=page.locator(".widget-dropdown select")).first
        claim = cell.locator(".widget-dropdown").filter(has=page.locator("label", has_text="claim")).locator("select")
        title = cell.locator(".js-plotly-plot .gtitle").first
        rows = cell.locator(".js-plotly-plot .ytick")
        page.wait_for_function("el => el.querySelectorAll('.ytick').length === 8", arg=cell.element_handle())
        assert "claim all; 8 shown" in title.text_content()
        before = title.text_content()
        claim.select_option("competitive with full fine-tuning")
        page.wait_for_function(
            "([el, before]) => el.textContent !== before", arg=[title.element_handle(), before], timeout=60_000
        )
        assert "claim competitive with full fine-tuning; 1 shown" in title.text_content()
        page.wait_for_function("el => el.querySelectorAll('.ytick').length === 1", arg=cell.element_handle())
        assert rows.first.text_content().startswith("competitive with full fine-tuning")
        _no_traceback(page)
        cell.scroll_into_view_if_needed()
        shot = ROOT / "figures" / "explorer.png"
        page.screenshot(path=str(shot), full_page=False)
        assert shot.stat().st_size > 10_000
