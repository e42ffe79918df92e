"""Regenerate ``tests/golden/tiny`` from a fresh ``topotuner-lab reproduce --preset tiny``.

Only for a deliberate change of behaviour: say in the commit which numbers change and why.
Run from the project root: ``.venv/bin/python tests/golden/regenerate.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

GOLDEN = Path(__file__).parent / "tiny"
TABLES = {
    "drift-sst2.parquet": "drift-sst2.csv",
    "noise/noise-0.parquet": "noise-0.csv",
    "noise/noise-1.parquet": "noise-1.csv",
    "models/tiny-qwen2/drift-sst2.parquet": "tiny-qwen2-drift-sst2.csv",
}


def main() -> None:
    out = Path(tempfile.mkdtemp()) / "tiny"
    env = {**os.environ, "TOPOTUNER_CACHE": f"{out}-cache"}
    command = [sys.executable, "-m", "topotuner_lab.cli", "reproduce", "--preset", "tiny", "-o", str(out)]
    subprocess.run(command, check=True, env=env)
    columns = pd.read_csv(GOLDEN / "results.csv").columns
    pd.read_csv(out / "results.csv")[columns].to_csv(GOLDEN / "results.csv", index=False)
    for written, golden in TABLES.items():
        pd.read_parquet(out / written).to_csv(GOLDEN / golden, index=False, float_format="%.17g")
    for card in (out / "cards").glob("*.json"):
        data = json.loads(card.read_text())
        data.pop("created")
        (GOLDEN / card.name).write_text(json.dumps(data, indent=1))
    print(f"regenerated {GOLDEN}")


if __name__ == "__main__":
    main()
