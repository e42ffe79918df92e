"""The `tiny` preset's drift tables, cards and results equal the ones recorded before the package was reorganized.

`tests/golden/tiny/` holds what `topotuner-lab reproduce --preset tiny` wrote at commit 899a9e7 (flat layout):
the drift tables, the four cards (less their creation time) and every deterministic column of `results.csv`
(timings and memory left out). A refactor that changes a number, a pick or a run fails here. A deliberate change of
behaviour regenerates the files and says so in its commit.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from topotuner_lab.cli import main

GOLDEN = Path(__file__).parent / "golden" / "tiny"
TABLES = {
    "drift-sst2.csv": "drift-sst2.parquet",
    "noise-0.csv": "noise/noise-0.parquet",
    "noise-1.csv": "noise/noise-1.parquet",
    "tiny-qwen2-drift-sst2.csv": "models/tiny-qwen2/drift-sst2.parquet",
}
#: card fields that say when and by which schema a card was written, not what it selects
PROVENANCE = ("created", "schema_version")


@pytest.fixture(scope="module")
def reproduced(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("golden") / "tiny"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TOPOTUNER_CACHE", str(out.parent / "cache"))
        assert main(["reproduce", "--preset", "tiny", "-o", str(out)]) == 0
    return out


@pytest.mark.slow
@pytest.mark.parametrize("golden, written", sorted(TABLES.items()), ids=sorted(TABLES))
def test_drift_tables_unchanged(reproduced: Path, golden: str, written: str) -> None:
    expected = pd.read_csv(GOLDEN / golden)
    table = pd.read_parquet(reproduced / written)
    pd.testing.assert_frame_equal(table[expected.columns].reset_index(drop=True), expected, rtol=1e-12, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("card", sorted(p.name for p in GOLDEN.glob("*.json")))
def test_cards_unchanged(reproduced: Path, card: str) -> None:
    expected = json.loads((GOLDEN / card).read_text())
    written = json.loads((reproduced / "cards" / card).read_text())
    for key in PROVENANCE:
        expected.pop(key, None)
        written.pop(key, None)
    assert written == expected


@pytest.mark.slow
def test_results_unchanged(reproduced: Path) -> None:
    expected = pd.read_csv(GOLDEN / "results.csv")
    results = pd.read_csv(reproduced / "results.csv")
    pd.testing.assert_frame_equal(results[expected.columns], expected, rtol=1e-9, atol=0)
