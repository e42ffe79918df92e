"""Budget curves: each card strategy's test score against the share of the model it trains, one point per budget.

Where the choice of matrices matters, the strategies' curves separate, and most at the small budget, where a card
holds few matrices; where they lie on top of each other, which matrices train did not change the score at that
budget. Full FT, the LoRA arms and Spectrum are drawn as single points beside the curves. Each point is the mean
over seeds and test examples at the arm's chosen rate, with the more conservative of the seed x example bootstrap
interval and the Student-t interval over seeds (:func:`~topotuner_lab.study.stats.conservative`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from topotuner_lab.study.claims import measure_values, runs_at_chosen_rate
from topotuner_lab.study.plan import DEFAULT_RECIPE, PAPER_LORA
from topotuner_lab.study.stats import LEVEL, conservative, seed_level_interval, two_way_bootstrap

#: the columns of :func:`budget_curves`' table
CURVE_COLUMNS = ("target", "arm", "curve", "budget", "share", "updated", "rel_change", "seeds", "score", "low", "high")


def _mean_recorded(read: Callable[[str, str], Any], run_dirs: list[str], key: str) -> float:
    """The mean of a run key over ``run_dirs``, NaN where any run did not record it (runs older than the key)."""
    try:
        values = [read(d, key) for d in run_dirs]
    except KeyError:
        return float("nan")
    return float("nan") if any(v is None for v in values) else float(np.mean(values))


def _curve(row: pd.Series) -> str:
    """The line a run belongs to: its card strategy (a further recipe named), LoRA matched to the cards, or its arm."""
    if row["method"] == "lora":
        return f"lora ({PAPER_LORA}, the paper's)" if row["strategy"] == PAPER_LORA else "lora (matched to the card)"
    if row["method"] != "profile":
        return str(row["method"])
    recipe = row.get("recipe")
    suffix = "" if pd.isna(recipe) or recipe == DEFAULT_RECIPE else f" [{recipe}]"
    return f"{row['strategy']}{suffix}"


def budget_curves(
    results: pd.DataFrame, read: Callable[[str, str], Any], measure: str = "accuracy", level: float = LEVEL
) -> pd.DataFrame:
    """One row per target and arm at its chosen rate: mean test score, interval and trainable share (Train.%).

    ``read(run_dir, key)`` returns a key of a run's verified ``results.json`` (as the claims read them); ``measure``
    is a claim measure (``accuracy`` or ``logprob``). ``share`` is the mean ``trainable_pct`` over the arm's seeds
    as a fraction (Train.%); ``updated`` the mean share of the model's weights the fine-tune moved by more than 1e-6
    (the paper's Upd.%, LoRA's merged update included) and ``rel_change`` their mean relative change, NaN for runs
    that did not record them; ``curve`` names the line (a card strategy) or the reference arm. An arm whose runs did
    not record the measure is left out. Every seed an arm ran enters its point (arms may have run different seeds).
    """
    rows = []
    for (target, arm), runs in runs_at_chosen_rate(results).groupby(["target", "run"], sort=False):
        run_dirs = [str(d) for d in runs.sort_values("seed")["run_dir"]]
        try:
            scores = np.array([measure_values(read, d, measure) for d in run_dirs])
        except KeyError:
            continue
        zeros = np.zeros_like(scores)  # the interval of mean(a) - 0: one arm's mean over seeds and examples
        bootstrap = two_way_bootstrap(scores, zeros, level=level)
        interval = conservative(bootstrap, seed_level_interval(scores, zeros, level=level))
        first = runs.iloc[0]
        rows.append(
            {
                "target": target,
                "arm": arm,
                "curve": _curve(first),
                "budget": first["budget"],
                "share": float(runs["trainable_pct"].mean()) / 100,
                "updated": _mean_recorded(read, run_dirs, "updated_fraction"),
                "rel_change": _mean_recorded(read, run_dirs, "update_rel_change"),
                "seeds": len(runs),
                "score": interval.estimate,
                "low": interval.low,
                "high": interval.high,
            }
        )
    return pd.DataFrame(rows, columns=list(CURVE_COLUMNS))
