"""The claims a comparison judges, by id: one registry read by presets, the claims code, the report and the tests.

A claim's id is its title as tables and reports print it (``"competitive with full fine-tuning"``); a preset names
its pre-registered primary claim by that title (``primary_claim``), checked against :class:`ClaimId` when the preset
is read. A new claim is a new member here, judged in :mod:`topotuner_lab.study.claims` (or
:mod:`topotuner_lab.study.stability` for the claims about the cards themselves).
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["CLAIM_TITLES", "ClaimId"]


class ClaimId(StrEnum):
    """Every claim a comparison judges (:mod:`~topotuner_lab.study.claims`, :mod:`~topotuner_lab.study.stability`).

    Each is valued by its printed title.

    A member is a ``str``: it compares equal to its title and prints as it, so results tables and preset files hold
    the title itself.
    """

    #: the card's test score is at most the target's margin below full FT's (non-inferiority, paired)
    COMPETITIVE = "competitive with full fine-tuning"
    #: the card loses less out-of-domain accuracy than full FT (paired, with an equivalence band)
    LESS_FORGETTING = "less forgetting than full FT"
    #: the card beats LoRA of the same parameter budget on the target's test score
    BEATS_LORA = "beats LoRA at a matched budget"
    #: the paper's headline comparison: the card against LoRA as the paper runs it (rank 16 on q, k, v, o)
    BEATS_PAPER_LORA = "beats LoRA as the paper runs it (rank 16)"
    #: the pre-specified topology card against every other selector of the same budget (Spectrum, WeightWatcher...)
    BEATS_SELECTORS = "topology beats the field's selectors (not a paper claim)"
    #: the direct test of the thesis: the high-drift card against the low-drift card at the same budget and recipe
    THESIS = "high drift beats low drift (the thesis)"
    #: forgetting as the rise of each held-out text's NLL, the card against full FT (lower is better)
    LESS_FORGETTING_NLL = "less forgetting than full FT (held-out text NLL)"
    #: the score at the early-stopping epoch is at most the margin below the same run's full-budget score
    STOP_KEEPS_ACCURACY = "early stopping keeps the accuracy"
    #: the topology card against the random and magnitude controls of the same budget
    BEATS_CONTROLS = "topology beats the controls (not a paper claim)"
    #: a card run's median seconds per epoch against full FT's (the paper: 20.4% less)
    FASTER_THAN_FULL = "faster per epoch than full FT"
    #: a card run's median seconds per epoch against LoRA's (the paper: 5.5% less)
    FASTER_THAN_LORA = "faster per epoch than LoRA"
    #: most card runs (linear schedule) stop by half the epoch budget
    STOPS_EARLY = "early stopping often stops after 2-3 of 6 epochs"
    #: the same share under a constant learning rate (early stopping seen apart from a decaying rate)
    STOPS_EARLY_CONSTANT_LR = "early stopping, constant learning rate (not a paper claim)"
    #: the cards of several prior seeds pick more of the same matrices than random cards of their size
    PICKS_HOLD = "a card's picks hold across prior runs (not a paper claim)"
    #: the value / output share of the high-drift picks differs between the two model families the paper names
    KINDS_DEPEND_ON_FAMILY = "which kinds drift depends on the model family"
    #: the same difference between models the paper makes no claim about
    KINDS_DEPEND_ON_FAMILY_UNCLAIMED = "which kinds drift depends on the model family (not a paper claim)"


#: every claim's title, in the order :class:`ClaimId` declares them
CLAIM_TITLES: tuple[str, ...] = tuple(claim.value for claim in ClaimId)
