"""Tables as Markdown, numbers rounded for reading (the comparison's ``results.md`` and the report)."""

from __future__ import annotations

import pandas as pd


def markdown_table(table: pd.DataFrame) -> str:
    """A results table as Markdown: numbers rounded for reading, missing cells blank, a one-value ``seed`` left out."""
    shown = table.drop(columns=["seed"] if "seed" in table and table["seed"].nunique() == 1 else []).copy()
    for col in shown.columns:
        if shown[col].dtype.kind == "f":
            shown[col] = shown[col].map(lambda v: f"{v:.3g}", na_action="ignore")
    return shown.astype(object).where(shown.notna(), "").to_markdown(index=False)  # a missing text cell is blank
