"""The claims as the report shows them: the paper's counts, time saved, and a forest plot of the paired claims."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from topotuner_lab.lab.plots import VERDICT_COLOURS, claims_forest
from topotuner_lab.lab.report.sections import claims_section
from topotuner_lab.study.claim_ids import ClaimId
from topotuner_lab.study.claims import (
    ClaimResult,
    claim_results,
    claims_frame,
    paper_count,
    paper_speed,
)


def _claim(claim, estimate, low, high, verdict, measure="card - lora:r16 (test accuracy)", threshold=0.0, band=0.02):
    return ClaimResult(claim, "gsm8k -> sst2", measure, estimate, low, high, threshold, verdict, band=band)


CLAIMS = [
    _claim(ClaimId.BEATS_PAPER_LORA, 0.01, 0.002, 0.018, "held"),
    _claim(ClaimId.BEATS_PAPER_LORA, 0.004, -0.01, 0.018, "equivalent"),
    _claim(ClaimId.BEATS_PAPER_LORA, -0.02, -0.04, 0.0, "inconclusive"),
    _claim(ClaimId.FASTER_THAN_FULL, 0.512, 0.41, 0.57, "held", "median profile / median full", 0.8, None),
    _claim(ClaimId.FASTER_THAN_LORA, 0.87, 0.73, 0.95, "held", "median profile / median lora", 1.0, None),
]


def test_the_papers_counts_come_from_the_claims():
    assert paper_count(CLAIMS) == (
        f"The card {ClaimId.BEATS_PAPER_LORA} in 2 of 3 settings (a setting: one transfer at one card budget) by the "
        "point estimate (the paper's count); its interval clears zero in 1 of 3."
    )
    assert paper_speed(CLAIMS) == (
        "A card run takes 48.8% less than full FT (the paper: 20.4%) and 13.0% less than LoRA (the paper: 5.5%) of "
        "the time per epoch, median against median."
    )
    slower = [replace(CLAIMS[-1], estimate=1.139)]  # a card run slower than LoRA's: "more", never "-13.9% less"
    assert paper_speed(slower) == (
        "A card run takes 13.9% more than LoRA (the paper: 5.5%) of the time per epoch, median against median."
    )
    assert paper_count(CLAIMS[3:]) == "" and paper_speed(CLAIMS[:3]) == ""
    text = claims_section(CLAIMS, "figures/results_claims.png")
    assert paper_count(CLAIMS) in text and "(figures/results_claims.png)" in text


def test_the_claims_table_names_the_level_its_intervals_are_at():
    assert "| estimate [95% CI]" in claims_section(CLAIMS) and "CI level" not in claims_section(CLAIMS)
    at_look = [replace(c, level=0.994425) for c in CLAIMS]  # a group-sequential look's level
    text = claims_section(at_look, "figures/results_claims.png")
    assert "| estimate [99.44% CI]" in text and "95%" not in text.split("Over all settings")[0].split("|", 1)[1]
    assert "estimate, 99.44% interval, threshold" in text
    mixed = [*at_look[:3], *CLAIMS[3:]]  # paired claims at the look, the speed ratios at 95%
    text = claims_section(mixed, "figures/results_claims.png")
    assert "| estimate [CI]" in text and "| CI level" in text and "| 99.44%" in text and "| 95%" in text
    assert "estimate, interval at the level in the table, threshold" in text


def test_the_forest_plot_shows_each_difference_with_its_threshold_band_and_verdict():
    fig = claims_forest(claims_frame(CLAIMS))
    shown = {trace.name: list(trace.x) for trace in fig.data}
    assert shown == {"held": [0.01], "equivalent": [0.004], "inconclusive": [-0.02]}  # ratios are left out
    assert [t.marker.color for t in fig.data] == [VERDICT_COLOURS[v] for v in shown]
    lines = [s for s in fig.layout.shapes if s.type == "line"]
    bands = [s for s in fig.layout.shapes if s.type == "rect"]
    assert len(lines) == 3 and {s.x0 for s in lines} == {0.0}
    assert len(bands) == 3 and {(s.x0, s.x1) for s in bands} == {(-0.02, 0.02)}
    assert list(fig.data[0].error_x.array) == [0.018 - 0.01] and list(fig.data[0].error_x.arrayminus) == [0.01 - 0.002]


def test_the_papers_lora_gets_its_own_claim_against_the_named_card():
    import pandas as pd

    rng = np.random.default_rng(0)
    card = (rng.random(400) < 0.8).astype(int)
    lora = (rng.random(400) < 0.5).astype(int)
    rows, stored = [], {}
    for seed in (0, 1):
        for run, values in (("profile:high-drift@0.01", card), ("lora:r16", lora)):
            stored[(f"{run}/{seed}", "test_correct")] = list(values)
            method, _, strategy = run.partition(":")
            rows.append(
                dict(prior="gsm8k", target="sst2", seed=seed, run=run, selected=True, schedule="linear",
                     method=method, strategy=strategy.split("@")[0], budget=0.01 if method == "profile" else None,
                     recipe="default", test_acc=float(values.mean()), run_dir=f"{run}/{seed}", sec_per_epoch=1.0,
                     stop_epoch=None, epochs_run=4)
            )  # fmt: skip
    claims = claim_results(pd.DataFrame(rows), lambda d, k: stored[(d, k)])
    paper = [c for c in claims if c.claim == ClaimId.BEATS_PAPER_LORA]
    assert len(paper) == 1 and paper[0].measure.startswith("profile:high-drift@0.01 - lora:r16")
    assert paper[0].verdict == "held" and paper[0].estimate > 0.2
