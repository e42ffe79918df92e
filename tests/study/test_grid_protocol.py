"""The grid's protocol pieces: kind-matched cards, the paper's LoRA and Spectrum arms, per-target fine-tune fields,
per-epoch scoring only where a claim reads it."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from topotuner_lab._io.errors import ParameterError
from topotuner_lab.drift.cache import DriftCache
from topotuner_lab.drift.compute import drift_table
from topotuner_lab.drift.settings import DriftSettings
from topotuner_lab.profiles.card import ModelIdentity, ProfileCard
from topotuner_lab.profiles.select import CardSettings, build_profile, kind_composition
from topotuner_lab.study.cards import CardKey, _kind_matched_cards
from topotuner_lab.study.plan import RunKey, RunSpec, arms, every_seed, plan, run_owner
from topotuner_lab.study.presets import Preset
from topotuner_lab.study.protocol import config_for
from topotuner_lab.study.sequential import look_rows
from topotuner_lab.study.workspace import WorkDir
from topotuner_lab.training.config import FinetuneConfig
from topotuner_lab.weights.snapshot import perturb_snapshot

GRID = dict(
    prior_tasks=("gsm8k",),
    target_tasks=("sst2", "boolq"),
    strategies=("high-drift", "low-drift", "random"),
    baselines=("full", "lora", "lora-paper", "spectrum-top5"),
    lr_grid={"full": (1e-4,), "lora": (1e-3,), "profile": (1e-3,), "spectrum-top5": (1e-4,)},
    match_kinds=("low-drift",),
    constant_lr=(),
    epoch_eval=("profile",),
    target_overrides={"boolq": {"max_length": 256}},
    target=FinetuneConfig(epochs=2, n_train=8, n_val=4, eval_each_epoch=True, observe_only=True),
)


def test_the_low_drift_card_takes_the_high_drift_cards_kinds(tmp_path, tiny_snapshot):
    table = drift_table(
        tiny_snapshot, perturb_snapshot(tiny_snapshot, 0.05), DriftSettings(maxdim=0), n_jobs=1, cache=DriftCache(None)
    )
    identity = ModelIdentity.from_snapshot(tiny_snapshot)
    preset = Preset(**{**GRID, "budgets": (0.05,)})
    work = WorkDir(tmp_path)
    high = build_profile(table, identity, CardSettings(prior_task="gsm8k", fraction=0.05))
    path = work.card("high")
    high.save(path)
    matched = _kind_matched_cards(
        preset, {CardKey("gsm8k", "high-drift", 0.05): path}, table, [], identity, "gsm8k", work
    )
    low = ProfileCard.load(matched[CardKey("gsm8k", "low-drift", 0.05)])
    assert low.strategy == "low-drift" and kind_composition(low) == kind_composition(high)
    unmatched = build_profile(table, identity, CardSettings(prior_task="gsm8k", strategy="low-drift", fraction=0.05))
    scores = {r["pid"]: r["score"] for r in low.ranking}
    for kind, count in kind_composition(high).items():  # within each kind, the lowest-drift matrices
        of_kind = sorted((p for p in scores if p.endswith(f".{kind}")), key=scores.get)
        assert sorted(p for p in low.trainable if p.endswith(f".{kind}")) == sorted(of_kind[:count])
    assert unmatched.budget != low.budget  # a global low-drift ranking is a different card


def test_the_papers_lora_and_spectrum_are_arms_shared_by_every_prior(tmp_path):
    preset = Preset(**{**GRID, "prior_tasks": ("gsm8k", "agnews")})
    keys = arms(preset)
    assert RunKey("lora", "r16") in keys and RunKey("spectrum-top5") in keys
    assert RunKey.parse("lora:r16") == RunKey("lora", "r16") and RunKey("lora", "r16").name == "lora:r16"
    for key in (RunKey("full"), RunKey("lora", "r16"), RunKey("spectrum-top5")):
        assert run_owner(preset, RunSpec("agnews", "sst2", 0, key, "chosen")) == "gsm8k"  # one run serves both
    matched = RunKey("lora", None, 0.01)
    assert run_owner(preset, RunSpec("agnews", "sst2", 0, matched, "chosen")) == "agnews"  # its prior's card
    lora = config_for(preset, RunSpec("gsm8k", "sst2", 0, RunKey("lora", "r16"), "chosen"), {}, 1e-3, tmp_path)
    assert lora.method == "lora" and lora.lora_rank == 16 and lora.profile is None
    spectrum = config_for(preset, RunSpec("gsm8k", "boolq", 0, RunKey("spectrum-top5"), "chosen"), {}, 1e-4, tmp_path)
    assert spectrum.method == "spectrum-top5" and spectrum.max_length == 256  # boolq's own length
    assert not spectrum.eval_each_epoch and not lora.eval_each_epoch  # scored at the end: no claim reads epochs
    assert lora.max_length == FinetuneConfig().max_length  # sst2 keeps the target config's


@pytest.mark.parametrize(
    "change, message",
    [
        pytest.param({"match_kinds": ("magnitude",)}, "match_kinds names strategies", id="match-unknown"),
        pytest.param({"target_overrides": {"boolq": {"max_len": 9}}}, "target_overrides.boolq", id="bad-field"),
        pytest.param({"lr_grid": {"full": (1e-4,), "profile": (1e-3,)}}, r"no rates for \['lora'", id="no-lora"),
        pytest.param({"margins": {"sst2": -0.1}}, "margins=", id="negative-margin"),
        pytest.param({"claim_budgets": (0.0025,)}, r"claim_budgets \[0.0025\] are not budgets", id="claim-budget"),
    ],
)
def test_grid_fields_are_checked(change, message):
    with pytest.raises(ParameterError, match=message):
        Preset(**{**GRID, **change})


def test_side_arms_run_only_their_seeds_and_the_claims_arms_run_every_seed():
    preset = Preset(**{**GRID, "strategies": ("high-drift", "low-drift", "random", "snr")}, seeds=(0, 1, 2, 3))
    capped = Preset.from_dict({**preset.to_dict(), "side_arm_seeds": 2})
    seeds_of = lambda p: {  # noqa: E731
        key: sorted({s.seed for s in plan(p) if s.key == key and s.role == "chosen"}) for key in arms(p)
    }
    every, side = seeds_of(preset), seeds_of(capped)
    assert all(seeds == [1, 2, 3] for seeds in every.values())  # seed 0 sweeps the rates
    sequential = {key.name for key in arms(capped) if key.sequential}
    assert sequential == {"full", *(f"profile:{s}@0.01" for s in ("high-drift", "low-drift", "random"))}
    for key, seeds in side.items():
        assert seeds == ([1, 2, 3] if key.name in sequential else [1]), key.name
    fixed = Preset.from_dict({**capped.to_dict(), "margins": {t: 0.1 for t in capped.target_tasks}})
    assert seeds_of(fixed) == {**side, RunKey("full"): [1]}  # no gain to measure: full FT is a side arm


def test_only_the_claim_budgets_cards_run_every_seed_and_decide_a_look():
    preset = Preset(
        **{**GRID, "budgets": (0.0025, 0.01), "claim_budgets": (0.01,)}, seeds=(0, 1, 2, 3), side_arm_seeds=2
    )
    seeds_of = {
        key: sorted({s.seed for s in plan(preset) if s.key == key and s.role == "chosen"}) for key in arms(preset)
    }
    for strategy in GRID["strategies"]:
        assert seeds_of[RunKey("profile", strategy, 0.01)] == [1, 2, 3]
        assert seeds_of[RunKey("profile", strategy, 0.0025)] == [1]  # a budget curve's point, not a decision
    claims_arm = [every_seed(preset, spec.key) for spec in plan(preset)]
    assert claims_arm == sorted(claims_arm, reverse=True)  # the runs that decide come first
    table = pd.DataFrame({"run": ["full", "a", "b", "lora"], "budget": [None, 0.0025, 0.01, 0.0025]})
    assert list(look_rows(preset, table)["run"]) == ["full", "b"]
    assert list(look_rows(replace(preset, claim_budgets=()), table)["run"]) == ["full", "a", "b", "lora"]
