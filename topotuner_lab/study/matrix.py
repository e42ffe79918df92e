"""The transfer matrix of a comparison across task families.

Per prior x target, the card's score minus full FT's and minus LoRA's, each target on its own metric (accuracy, F1,
ROUGE-L, nDCG@10, pass@1...).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from topotuner_lab._io.errors import TaskError
from topotuner_lab.study.claims import recorded_metric, runs_at_chosen_rate
from topotuner_lab.study.plan import DEFAULT_RECIPE
from topotuner_lab.tasks.registry import get_task

#: the columns of :func:`transfer_matrix`
MATRIX_COLUMNS: tuple[str, ...] = (
    "prior",
    "target",
    "prior_family",
    "target_family",
    "metric",
    "seeds",
    "card",
    "full",
    "lora",
    "card_minus_full",
    "card_minus_lora",
    "non_commercial",
)


def task_family(task: str) -> str:
    """The family a task belongs to (its spec's ``metadata.family``), else the task's own name."""
    try:
        return str(get_task(task).metadata.get("family", task))
    except TaskError:
        return task


def _non_commercial(task: str) -> bool:
    try:
        return "non-commercial" in str(get_task(task).metadata.get("license", "")).lower()
    except TaskError:
        return False


def transfer_matrix(results: pd.DataFrame, strategy: str = "high-drift") -> pd.DataFrame:
    """One row per (prior, target): mean test score over seeds of the card, full FT and LoRA at their chosen rates.

    The card is the pre-specified one (``strategy``, the default recipe, the smallest budget run); LoRA is the one at
    the card's budget. Scores are each target's primary metric (``metric``); a missing arm leaves NaN.
    """
    runs = runs_at_chosen_rate(results)
    rows = []
    for (prior, target), group in runs.groupby(["prior", "target"], sort=False):
        recipe = group["recipe"].fillna(DEFAULT_RECIPE)
        cards = group[(group["method"] == "profile") & (group["strategy"] == strategy) & (recipe == DEFAULT_RECIPE)]
        if cards.empty:
            continue
        budget = cards["budget"].min()
        card = cards[cards["budget"] == budget]
        lora = group[(group["method"] == "lora") & (group["budget"] == budget)]
        full = group[group["method"] == "full"]
        scores = {name: arm["test_acc"].mean() for name, arm in (("card", card), ("full", full), ("lora", lora))}
        rows.append(
            {
                "prior": prior,
                "target": target,
                "prior_family": task_family(str(prior)),
                "target_family": task_family(str(target)),
                "metric": recorded_metric(group),
                "seeds": card["seed"].nunique(),
                **scores,
                "card_minus_full": scores["card"] - scores["full"],
                "card_minus_lora": scores["card"] - scores["lora"],
                "non_commercial": _non_commercial(str(target)),
            }
        )
    return pd.DataFrame(rows, columns=list(MATRIX_COLUMNS))


#: settings below which a correlation across the matrix is not read
MIN_SETTINGS = 5


def with_transfer_checks(matrix: pd.DataFrame, records: list[dict[str, Any]]) -> pd.DataFrame:
    """``matrix`` with each setting's transfer check (recorded before training): gradient cosine and agreement."""
    checks = pd.DataFrame(records, columns=["prior", "target", "median_cosine_card", "rank_agreement", "overlap"])
    return matrix.merge(checks.drop_duplicates(["prior", "target"]), on=["prior", "target"], how="left")


def check_predicts_gain(joined: pd.DataFrame) -> dict[str, tuple[float, int]]:
    """Spearman correlation of the transfer check's gradient cosine with the card's gain over each baseline.

    ``(rho, settings)`` per baseline difference; rho is NaN with fewer than :data:`MIN_SETTINGS` settings that have
    both numbers (too few to read a correlation) or when either side is constant.
    """
    from scipy.stats import spearmanr

    out = {}
    for gain in ("card_minus_full", "card_minus_lora"):
        both = joined[["median_cosine_card", gain]].dropna()
        varied = len(both) >= MIN_SETTINGS and both.nunique().min() > 1  # a constant side has no rank correlation
        rho = float(spearmanr(both.iloc[:, 0], both.iloc[:, 1]).statistic) if varied else np.nan
        out[gain] = (rho, len(both))
    return out
