"""Every README figure that quotes a report (fine-tunes, hours, a measured score) appears in the report it cites.

Each entry reads the figure out of README.md with a pattern (the pattern must still match: a README rewording fails
the test, so the list keeps up) and looks for it in the report where the report states it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

#: (what, README pattern whose group 1 is the figure, report under docs/, where the report states it: {} = figure)
QUOTES = [
    (
        "cpu-decide drift rule's cost when stopping",
        r"costs what stopping every run at\s+epoch 2 costs \(test accuracy (-[\d.]+ \[-[\d.]+, -[\d.]+\]) against",
        "RESULTS-cpu-decide.md",
        "2.1  |          0.9 | 1.00 [0.83, 1.00]      | {}",
    ),
    (
        "cpu-decide fixed epoch's cost",
        r"costs \(test accuracy -[\d.]+ \[-[\d.]+, -[\d.]+\] against (-[\d.]+ \[-[\d.]+, -[\d.]+\])\)",
        "RESULTS-cpu-decide.md",
        "2    |          0   | 1.00 [0.83, 1.00]      | {}",
    ),
    (
        "cpu-decide fine-tunes",
        r"complete `cpu-decide` run's report \((\d+) fine-tunes",
        "RESULTS-cpu-decide.md",
        "; {} fine-tunes in all,",
    ),
    (
        "cpu-decide hours",
        r"run's report \(\d+ fine-tunes, ([\d.]+) h of compute",
        "RESULTS-cpu-decide.md",
        "fine-tunes in all, {} h.",
    ),
    (
        "cpu-decide BoolQ zero-shot",
        r"scores below chance zero-shot \(([\d.]+) against",
        "RESULTS-cpu-decide.md",
        "boolq accuracy, zero-shot {} (chance",
    ),
    (
        "cpu-grid fine-tunes and hours",
        r"complete `cpu-grid` run's report \((\d+ fine-tunes in all, [\d.]+ h)",
        "RESULTS.md",
        "; {}.",
    ),
    (
        "cpu-grid thesis",
        r"\((-[\d.]+ \[-[\d.]+, -[\d.]+\]) gold-label probability: the thesis did not hold\)",
        "RESULTS.md",
        "profile:high-drift@0.01 - profile:low-drift@0.01 (test gold-label probability) | {} |",
    ),
    (
        "cpu-grid random control",
        r"below the stratified random card\s+\((-[\d.]+ \[-[\d.]+, -[\d.]+\])\)",
        "RESULTS.md",
        "profile:high-drift@0.01 - profile:random@0.01 (test gold-label probability) | {} |",
    ),
    (
        "cpu-grid LoRA count",
        r"The card beats LoRA as\s+the paper runs it in (\d+ of \d+) settings",
        "RESULTS.md",
        "(rank 16) in {} settings",
    ),
    (
        "cpu-grid time per epoch",
        r"a card run takes ([\d.]+%) less time per epoch than full FT",
        "RESULTS.md",
        "A card run takes {} less than full FT",
    ),
    (
        "cpu-grid stability",
        r"mean Jaccard index of\s+([\d.]+ \[[\d.]+, [\d.]+\]) across prior seeds",
        "RESULTS.md",
        "noise-only drift tables, mean over 10 pairs) | {} |",
    ),
    (
        "cpu-grid stability null",
        r"across prior seeds, against ([\d.]+) for cards from noise-only drift tables",
        "RESULTS.md",
        "with each other (mean {})",
    ),
    (
        "cpu-grid stability size",
        r"its measured spread says\s+(~\d+ prior seeds or more) would decide it",
        "RESULTS.md",
        "inconclusive | {} (",
    ),
    (
        "families noise ratio",
        r"move the weights only ([\d.]+)-[\d.]+x\s+the perturbation floor",
        "RESULTS-families.md",
        "fine-tune drift is {}",
    ),
    (
        "models noise ratio",
        r"SmolLM2's priors move its weights only ([\d.]+)x the perturbation floor",
        "RESULTS-models.md",
        "fine-tune drift is {}x the noise floor",
    ),
    (
        "models V/O share difference",
        r"in the V/O share of the picks: (\+[\d.]+)\)",
        "RESULTS-models.md",
        "Qwen/Qwen2.5-Coder-0.5B-Instruct (prior seeds: 3 and 3) | {} [",
    ),
    (
        "families hours",
        r"`families` \(([\d.]+) h of fine-tunes measured here; report in `docs/RESULTS-families.md`\)",
        "RESULTS-families.md",
        "fine-tunes in all, {} h.",
    ),
    (
        "selectors fine-tunes",
        r"AG News prior -> SST-2, 2 rates x 2 seeds, (\d+) fine-tunes\)",
        "RESULTS-selectors.md",
        "; {} fine-tunes in all,",
    ),
]
#: quotes the README gets wrong today, with the report's figure (strict: fixing the README makes these fail, and
#: the entry goes); the README is the lead's to edit
WRONG: dict[str, str] = {}  # a figure known to be wrong, with why: an expected failure until the README is mended


def _readme_figure(pattern: str) -> str:
    found = re.search(pattern, README.read_text())
    assert found, (
        f"README.md no longer says {pattern!r}: update tests/project/test_readme_figures.py with the new wording"
    )
    return found.group(1)


@pytest.mark.parametrize(
    "what, pattern, report, stated",
    [
        pytest.param(*quote, marks=pytest.mark.xfail(strict=True, reason=WRONG[quote[0]]))
        if quote[0] in WRONG
        else quote
        for quote in QUOTES
    ],
    ids=[quote[0] for quote in QUOTES],
)
def test_a_readme_figure_appears_in_the_report_it_quotes(what, pattern, report, stated):
    figure = _readme_figure(pattern)
    text = (ROOT / "docs" / report).read_text()
    if what == "families noise ratio":  # the README rounds the report's two ratios (1.78x, 1.94x) to one decimal
        ratios = [float(r) for r in re.findall(r"fine-tune drift is ([\d.]+)x the noise floor", text)]
        assert ratios and f"{min(ratios):.1f}" == figure, f"{what}: README {figure}, report {ratios}"
        return
    padded = re.escape(stated.format(figure)).replace(r"\ ", r"\s+")  # a table pads its cells with spaces
    assert re.search(padded, text), f"{what}: README quotes {figure}; docs/{report} does not say {stated!r}"
