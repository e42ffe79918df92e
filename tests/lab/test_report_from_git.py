"""Every committed report either comes back byte for byte from its ledger in git, or says it is a pilot that cannot.

A fresh clone of HEAD holds the ledgers git keeps (results, tables, cards, the facts of the weights) and no weights;
``topotuner-lab report FOLDER`` run there must write each committed report's exact bytes. A report whose ledger is
not in git (the side studies) must carry the pilot header saying so.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from topotuner_lab.cli import main

REPO = Path(__file__).resolve().parents[2]
#: the line a report whose ledger is not in git carries right under its title
PILOT_HEADER = "> **Pilot, not regenerated.**"
#: the command a report's header names: ``report FOLDER``, or ``reproduce --preset P`` (folder runs/reproduce-P)
_COMMAND = re.compile(r"Produced by `topotuner-lab (?:report (?P<folder>\S+)|reproduce --preset (?P<preset>\S+))`")


def _git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def _ledger(report: Path) -> str:
    """The comparison folder a report's header says it was produced from."""
    found = _COMMAND.search(report.read_text())
    assert found, f"{report.name} names no `topotuner-lab report/reproduce` command in its header"
    return found["folder"] or f"runs/reproduce-{found['preset']}"


def _tracked(folder: str) -> bool:
    """Whether git keeps the ledger of ``folder`` at HEAD (its results table)."""
    return bool(_git("ls-tree", "--name-only", "HEAD", f"{folder}/results.csv").strip())


def _committed_reports() -> list[str]:
    return sorted(Path(p).name for p in _git("ls-tree", "--name-only", "HEAD", "docs/").split() if "/RESULTS" in p)


def _regenerable() -> list[str]:
    if not (REPO / ".git").exists():
        return []
    return [name for name in _committed_reports() if _tracked(_ledger(REPO / "docs" / name))]


pytestmark = pytest.mark.skipif(not (REPO / ".git").exists(), reason="not a git checkout: there is no HEAD to clone")


def test_every_committed_report_is_regenerable_from_git_or_carries_the_pilot_header():
    reports = _committed_reports()
    assert "RESULTS.md" in reports and len(reports) >= 4
    for name in reports:
        text = (REPO / "docs" / name).read_text()
        folder = _ledger(REPO / "docs" / name)
        if _tracked(folder):
            assert PILOT_HEADER not in text, f"{name} is regenerated from {folder}: no hand-written header"
        else:
            second = text.split("\n")[2]  # title, blank line, then the header
            assert second.startswith(PILOT_HEADER), f"{name}: ledger {folder} is not in git and it has no pilot header"
            assert "has not been regenerated with the current code" in second and "preset_files/" in second
    assert "RESULTS.md" in _regenerable()  # the decisive run's ledger is kept in git


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """A fresh clone of HEAD (no weights: git does not keep them)."""
    dest = tmp_path_factory.mktemp("fresh") / "repo"
    _git("clone", "--quiet", "--no-local", str(REPO), str(dest))
    assert not list((dest / "runs").rglob("*.safetensors"))
    return dest


@pytest.mark.slow
@pytest.mark.parametrize("name", _regenerable())
def test_report_regenerates_byte_for_byte_on_a_fresh_clone_without_weights(clone, name, tmp_path, monkeypatch):
    folder = _ledger(clone / "docs" / name)
    out = tmp_path / "docs" / name  # beside its own figures folder, as docs/ holds it: the same relative links
    out.parent.mkdir()
    monkeypatch.chdir(clone)  # the header names the folder as given, relative to the repository
    assert main(["report", folder, "--report", str(out)]) == 0
    committed = (clone / "docs" / name).read_bytes()
    assert out.read_bytes() == committed, f"`topotuner-lab report {folder}` no longer writes the committed {name}"
