"""End to end in a real browser: JupyterLab on 127.0.0.1, a notebook opened and run in Debian's
headless Chromium through Playwright; a plotly figure and an ipywidgets slider must render.

Needs /usr/bin/chromium (`.ci/run` installs it); without it the test is skipped with that reason.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from topotuner_lab.notebooks import run_notebooks

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium")
pytestmark = [pytest.mark.browser, pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium not installed (apt-get install chromium)")]
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _settings(folder: Path) -> None:
    """Render every cell (no lazy windowing) and switch off the news pop-up."""
    (folder / "@jupyterlab" / "notebook-extension").mkdir(parents=True)
    (folder / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    (folder / "@jupyterlab" / "apputils-extension").mkdir(parents=True)
    (folder / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))


def test_notebook_renders_plotly_and_widgets_in_jupyterlab(tmp_path):
    from playwright.sync_api import sync_playwright

    run_notebooks("tiny", tmp_path / "run", names=("01_extract.ipynb",))  # the work folder notebook 2 reads
    book = nbformat.read(ROOT / "notebooks" / "02_persistence_diagrams.ipynb", as_version=4)
    book.cells[1].source = f'work_dir = "{tmp_path / "run" / "work"}"\nfigures_dir = "{tmp_path / "figs"}"\nprior_task = "sst2"\nlayer = 1\nkind = "v"'
    served = tmp_path / "lab"
    served.mkdir()
    nbformat.write(book, served / "browser.ipynb")
    _settings(tmp_path / "settings")
    port, token = _free_port(), "topotuner-test"
    env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"), "JUPYTER_CONFIG_DIR": str(tmp_path / "jcfg")}
    lab = subprocess.Popen([sys.executable, "-m", "jupyterlab", "--no-browser", "--ip", "127.0.0.1", f"--port={port}", f"--IdentityProvider.token={token}",
                            "--allow-root", f"--ServerApp.root_dir={served}"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        with sync_playwright() as pw:
            browser = pw.chromium.launch_persistent_context(str(tmp_path / "chrome"), executable_path=CHROMIUM, args=ARGS, viewport={"width": 1400, "height": 1000})
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{port}/lab/tree/browser.ipynb?token={token}", timeout=120_000)
            page.wait_for_selector(".jp-Notebook", timeout=120_000)
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
            page.get_by_role("menuitem", name="Run", exact=True).click(timeout=30_000)
            page.get_by_text("Run All Cells", exact=True).click(timeout=30_000)
            page.wait_for_selector(".js-plotly-plot .main-svg", timeout=180_000)
            page.wait_for_selector(".widget-slider", timeout=180_000)
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=180_000)
            time.sleep(2)
            assert page.locator(".js-plotly-plot .main-svg").count() >= 2
            assert page.locator(".widget-slider").count() >= 1
            assert page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr'] >> text=Traceback").count() == 0
            page.locator(".js-plotly-plot").first.scroll_into_view_if_needed()
            shot = ROOT / "figures" / "browser_screenshot.png"
            page.screenshot(path=str(shot), full_page=False)
            assert shot.stat().st_size > 10_000
            browser.close()
    finally:
        lab.terminate()
        lab.wait(timeout=30)
