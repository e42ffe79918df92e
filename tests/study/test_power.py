"""The size a paired comparison needs to decide its claim, from the variances it measured."""

from __future__ import annotations

import math

import numpy as np
import pytest

from topotuner_lab.study.power import Z95, Design, runs_to_decide_ratio, size_to_decide, variance_components
from topotuner_lab.study.stats import two_way_bootstrap


def _synthetic(seeds: int, examples: int, seed_sd: float, example_sd: float, rng: np.random.Generator):
    """Two arms' per-example scores whose difference has known seed and example parts."""
    a = rng.normal(size=(seeds, examples))
    shift = rng.normal(0, seed_sd, size=(seeds, 1)) + rng.normal(0, example_sd, size=(1, examples))
    return a + shift, a


def test_variance_components_recover_the_known_seed_and_example_parts():
    rng = np.random.default_rng(0)
    a, b = _synthetic(60, 3000, seed_sd=0.05, example_sd=0.4, rng=rng)
    design = variance_components(a, b)
    assert design.seed_var == pytest.approx(0.05**2, rel=0.4)
    assert design.example_var == pytest.approx(0.4**2, rel=0.1)
    assert (design.seeds, design.examples) == (60, 3000)
    one = variance_components(a[:1], b[:1])
    assert one.seed_var == 0.0  # one seed cannot measure it


def test_the_half_width_matches_the_two_way_bootstrap():
    rng = np.random.default_rng(1)
    a, b = _synthetic(8, 400, seed_sd=0.1, example_sd=0.5, rng=rng)
    interval = two_way_bootstrap(a, b)
    assert interval.design is not None
    measured = (interval.high - interval.low) / 2
    assert interval.design.half_width() == pytest.approx(measured, rel=0.3)


def test_size_to_decide():
    design = Design(seed_var=0.0004, example_var=0.1, seeds=3, examples=1000)
    # gap 0.02: (0.02 / 1.96)^2 = 1.04e-4 - 1e-4 = 4.1e-6 room -> ~97 seeds
    text = size_to_decide(design, estimate=-0.01, threshold=-0.03)
    seeds = math.ceil(0.0004 / ((0.02 / Z95) ** 2 - 0.1 / 1000))
    assert text == f"~{seeds} seeds x 1000 examples" and design.half_width(seeds) <= 0.02 + 1e-9
    assert size_to_decide(design, 0.0, 0.0).startswith("not by size")
    tight = size_to_decide(design, estimate=0.005, threshold=0.0)  # example noise alone exceeds the gap
    assert tight == "more examples than measured: ~30732 examples (and ~123 seeds)"
    assert design.half_width(123, 30732) <= 0.005 + 1e-9  # the size it names does decide it
    hopeless = size_to_decide(design, estimate=0.0005, threshold=0.0)  # ~3 million examples: not a plan
    assert hopeless == "not practically by size: the estimate sits 0.0005 from the threshold (~3073168 examples)"
    # the normal approximation calls the measured size enough where the bootstrap interval did not: never "suffices"
    flat = Design(seed_var=0.0, example_var=0.1, seeds=5, examples=1000)
    assert size_to_decide(flat, 0.03, 0.0).startswith("a little more than measured (~6 seeds or more)")
    assert size_to_decide(Design(0.0, 0.1, 1, 1000), 0.03, 0.0).startswith("more seeds: one seed cannot measure")


def test_an_inconclusive_claim_says_what_would_decide_it():
    from topotuner_lab.study.claims import _result

    rng = np.random.default_rng(2)
    a, b = _synthetic(3, 300, seed_sd=0.05, example_sd=0.5, rng=rng)
    a = a - (a - b).mean() + 0.02  # a small true-looking gain, well inside the noise of 3 x 300
    unclear = _result("c", "s", "a - b", two_way_bootstrap(a, b), 0.0)
    assert unclear.verdict == "inconclusive" and ("seeds" in unclear.to_decide or "examples" in unclear.to_decide)
    clear = _result("c", "s", "a - b", two_way_bootstrap(a + 1.0, b), 0.0)
    assert clear.verdict == "held" and clear.to_decide == ""


def test_holm_keeps_the_primary_claim_and_corrects_the_secondary_ones():
    from topotuner_lab.study.claims import ClaimResult, with_holm

    def claim(name: str, p: float | None, verdict: str = "held") -> ClaimResult:
        return ClaimResult(name, "s", "m", 0.1, 0.01, 0.2, 0.0, verdict, p_value=p)

    claims = [claim("primary one", 0.04), claim("a", 0.001), claim("b", 0.03), claim("c", 0.04), claim("d", None)]
    judged = with_holm(claims, "primary one")
    assert [c.role for c in judged] == ["primary"] + ["secondary"] * 4
    assert judged[0].verdict == "held"  # the primary claim is judged on its own interval
    # secondary p-values 0.001, 0.03, 0.04 against 0.05/3, 0.05/2, 0.05/1: only the first is rejected
    assert [c.verdict for c in judged[1:]] == ["held", "inconclusive (Holm)", "inconclusive (Holm)", "held"]
    # a claim the setup cannot test is no member of the family (counted, 0.03 would have to clear 0.05/2)
    untestable = claim("e", 0.2, "not testable here")
    two = with_holm([claim("a", 0.001), claim("b", 0.03), untestable], "primary one")
    assert [c.verdict for c in two] == ["held", "held", "not testable here"]  # 0.03 < 0.05/1 after 0.001 < 0.05/2


def test_a_claim_holm_leaves_inconclusive_is_sized_at_the_familys_strictest_level():
    from topotuner_lab.study.claims import ClaimResult, with_holm

    design = Design(seed_var=0.002, example_var=0.1, seeds=5, examples=872)

    def claim(name: str, p: float, verdict: str = "held") -> ClaimResult:
        return ClaimResult(name, "s", "m", 0.03, 0.005, 0.055, 0.0, verdict, p_value=p, design=design)

    judged = with_holm([claim("a", 0.001), claim("b", 0.03), claim("c", 0.2, "inconclusive")], "primary one")
    assert [c.verdict for c in judged] == ["held", "inconclusive (Holm)", "inconclusive"]
    assert judged[0].to_decide == ""
    seeds = lambda text: int(text.split("~")[1].split(" seeds")[0])  # noqa: E731
    unadjusted = seeds(size_to_decide(design, 0.03, 0.0))  # what a lone 95% interval would need: 17 seeds
    for sized in judged[1:]:  # Holm's and the plain inconclusive claim: both at 0.05/3
        assert sized.to_decide.endswith("(Holm: at 0.05/3)") and seeds(sized.to_decide) > unadjusted
        assert design.half_width(seeds(sized.to_decide)) <= 0.03 * 1.959964 / 2.394 + 1e-9
    assert "design" not in judged[1].as_row()  # the variance components are not a table column


def test_a_difference_inside_the_band_reads_equivalent():
    from topotuner_lab.study.claims import _result

    rng = np.random.default_rng(4)
    a, b = _synthetic(5, 800, seed_sd=0.005, example_sd=0.2, rng=rng)
    same = a - (a - b).mean()  # no difference, measured tightly
    assert _result("c", "s", "a - b", two_way_bootstrap(same, b), 0.0, band=0.05).verdict == "equivalent"
    assert _result("c", "s", "a - b", two_way_bootstrap(same, b), 0.0).verdict == "inconclusive"  # no band stated
    assert _result("c", "s", "a - b", two_way_bootstrap(same, b), 0.0, band=0.001).verdict == "inconclusive"


def test_paired_claims_carry_a_two_sided_p_value():
    from topotuner_lab.study.claims import _result

    rng = np.random.default_rng(3)
    a, b = _synthetic(3, 300, seed_sd=0.01, example_sd=0.3, rng=rng)
    far = _result("c", "s", "a - b", two_way_bootstrap(a + 0.5, b), 0.0)
    assert far.p_value is not None and far.p_value < 0.001
    near = _result("c", "s", "a - b", two_way_bootstrap(a - (a - b).mean(), b), 0.0)
    assert near.p_value is not None and near.p_value > 0.5


def test_a_ratio_is_sized_by_the_side_of_its_interval_that_faces_the_threshold():
    # cpu-grid's card / LoRA time: 0.694 [0.436, 1.19] against 1 on 6 runs: the upper side, log(1.19 / 0.694) = 0.539,
    # must shrink to the gap log(1 / 0.694) = 0.365: 6 x (0.539 / 0.365)^2 = 13.1 -> 14 runs
    assert runs_to_decide_ratio(0.694, 0.436, 1.19, 1.0, 6) == "~14 runs of each method (here 6 of the rarer)"
    assert runs_to_decide_ratio(1.3, 0.7, 1.5, 1.0, 6).startswith("~")  # above the threshold: the lower side counts
    assert runs_to_decide_ratio(1.0, 0.7, 1.5, 1.0, 6) == "not by size: the estimate sits on the threshold"
    # log(1.02 / 0.9) = 0.125 against log(1 / 0.9) = 0.105: 4 x 1.415 = 5.7 -> 6
    assert runs_to_decide_ratio(0.9, 0.85, 1.02, 1.0, 4) == "~6 runs of each method (here 4 of the rarer)"
    assert runs_to_decide_ratio(float("nan"), 0.7, 1.5, 1.0, 6) == ""
