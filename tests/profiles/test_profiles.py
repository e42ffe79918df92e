from dataclasses import replace

import numpy as np
import pytest
import torch

from topotuner_lab._io.errors import InputFileError, ProfileError
from topotuner_lab.drift.cache import DriftCache
from topotuner_lab.drift.compute import drift_table
from topotuner_lab.profiles.apply import apply_profile, identity_of
from topotuner_lab.profiles.card import ProfileCard
from topotuner_lab.profiles.select import CardSettings, build_profile
from topotuner_lab.weights.extract import extract_snapshot
from topotuner_lab.weights.models import build_tiny_model
from topotuner_lab.weights.projections import count_parameters
from topotuner_lab.weights.snapshot import perturb_snapshot


@pytest.fixture
def setup(tiny_llama, tiny_snapshot):
    table = drift_table(tiny_snapshot, perturb_snapshot(tiny_snapshot, 0.05), n_jobs=1, cache=DriftCache(None))
    identity = identity_of(tiny_llama.model, "tiny-llama")
    return tiny_llama, table, identity


def test_selection_by_count_follows_the_ranking(setup):
    _, table, identity = setup
    high = build_profile(table, identity, CardSettings(prior_task="sst2", strategy="high-drift", count=3))
    low = build_profile(table, identity, CardSettings(prior_task="sst2", strategy="low-drift", count=3))
    per_point = table.assign(score=table["h0_w1"] / table["n_h0_before"])  # the default normalization
    by_drift = per_point.sort_values("score", kind="stable").pid.tolist()
    assert set(high.trainable) == set(by_drift[-3:])
    assert set(low.trainable) == set(by_drift[:3])
    assert set(high.trainable) | set(high.frozen) == set(table.pid) and not set(high.trainable) & set(high.frozen)
    assert [r["pid"] for r in high.ranking] == by_drift[::-1]


def test_selection_by_budget_stays_within_it(setup):
    _, table, identity = setup
    card = build_profile(table, identity, CardSettings(prior_task="sst2", fraction=0.05))
    limit = 0.05 * identity.total_params
    assert 0 < card.trainable_params <= limit
    sizes = {pid: int(np.prod(s)) for pid, s in identity.shapes.items()}
    assert card.trainable_params == sum(sizes[p] for p in card.trainable)
    assert card.trainable_fraction == pytest.approx(card.trainable_params / identity.total_params)
    # greedy in rank order: no frozen matrix ranked above the last chosen one would still fit
    left = limit - card.trainable_params
    ranked = [r["pid"] for r in card.ranking]
    last = max(ranked.index(p) for p in card.trainable)
    assert all(sizes[p] > left for p in ranked[:last] if p not in card.trainable)


def test_controls_magnitude_and_random(setup):
    _, table, identity = setup
    mag = build_profile(table, identity, CardSettings(prior_task="sst2", strategy="magnitude", count=2))
    assert mag.metric == "rel_frobenius"
    assert set(mag.trainable) == set(table.nlargest(2, "rel_frobenius").pid)
    r1 = build_profile(table, identity, CardSettings(prior_task="sst2", strategy="random", count=4, seed=1))
    r2 = build_profile(table, identity, CardSettings(prior_task="sst2", strategy="random", count=4, seed=1))
    r3 = build_profile(table, identity, CardSettings(prior_task="sst2", strategy="random", count=4, seed=2))
    assert r1.trainable == r2.trainable and r1.ranking != r3.ranking
    topology_only = table.drop(columns=["rel_frobenius", "rel_spectral", "row_cosine_change"])
    with pytest.raises(ProfileError, match="(?s)no measure column 'rel_frobenius'.*without --no-magnitude"):
        build_profile(topology_only, identity, CardSettings(prior_task="sst2", strategy="magnitude", count=2))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        pytest.param({"fraction": 1.5}, r"fraction=1.5 is not a fraction in \(0, 1\]", id="above-100%"),
        pytest.param({"fraction": True}, r"fraction=True is not a fraction", id="fraction-bool"),
        pytest.param({"fraction": "0.1"}, r"fraction='0.1' is not a fraction", id="fraction-text"),
        pytest.param({"fraction": 1e-6}, "below the smallest projection", id="below-smallest"),
        pytest.param({"count": 0}, "count=0 is not a whole number >= 1", id="count-0"),
        pytest.param({"count": 9}, "outside 1..8", id="count-too-many"),
        pytest.param({"count": True}, "count=True is not a whole number", id="count-bool"),
        pytest.param({"count": 2.5}, "count=2.5 is not a whole number", id="count-float"),
        pytest.param({"count": 2, "fraction": 0.1}, "exactly one", id="two-budgets"),
        pytest.param({}, "exactly one", id="no-budget"),
        pytest.param({"count": 2, "strategy": "middle"}, "strategy='middle' is not one of", id="strategy"),
        pytest.param({"count": 2, "stop_threshold": 2.0}, "stop_threshold=2.0 is not a number in", id="threshold"),
        pytest.param({"count": 2, "metric": "h3_w1"}, "no measure column 'h3_w1'", id="metric-h3"),
        pytest.param({"count": 2, "metric": "pid"}, "no measure column 'pid'", id="metric-pid"),
        pytest.param({"count": 2, "metric": "n_h0_before"}, "no measure column", id="metric-size"),
    ],
)
def test_bad_budgets_and_options(setup, kwargs, message):
    _, table, identity = setup
    with pytest.raises(ProfileError, match=message):
        build_profile(table, identity, CardSettings(prior_task="sst2", **kwargs))


def test_card_round_trip_and_views(setup, tmp_path):
    _, table, identity = setup
    card = build_profile(table, identity, CardSettings(prior_task="sst2", count=2, stop_threshold=0.4))
    path = card.save(tmp_path / "card.json")
    back = ProfileCard.load(path)
    assert back == card
    md = path.with_suffix(".md").read_text()
    assert "high-drift on sst2" in md and card.trainable[0] in md
    yaml_text = card.to_spectrum_yaml()
    import yaml

    patterns = yaml.safe_load(yaml_text)["unfrozen_parameters"]
    model = setup[0].model
    matched = {n for n, _ in model.named_parameters() for p in patterns if __import__("re").match(p, n)}
    assert len(matched) == 2 and all("self_attn" in n for n in matched)


def test_a_rebuilt_card_keeps_the_file_it_matches_and_replaces_one_it_does_not(setup, tmp_path):
    _, table, identity = setup
    card = build_profile(table, identity, CardSettings(prior_task="sst2", count=2, stop_threshold=0.4))
    path = card.save_unless_same(tmp_path / "card.json")
    first = path.read_bytes()
    rebuilt = replace(card, created="2030-01-01T00:00:00+00:00")  # a resumed study builds it again, later
    assert rebuilt.save_unless_same(path) == path and path.read_bytes() == first
    replace(card, transferred_to=["boolq"]).save(path)  # a finished study records the tasks it was used on
    first = path.read_bytes()
    assert rebuilt.save_unless_same(path) == path and path.read_bytes() == first  # and a resumed one keeps them
    rounded = [{**r, "score": r["score"] * (1 + 1e-13)} for r in card.ranking]  # another CPU's last bits
    assert replace(card, ranking=rounded).save_unless_same(path) == path and path.read_bytes() == first
    moved = [{**r, "score": r["score"] * (1 + 1e-6)} for r in card.ranking]  # a score that really differs
    replace(card, ranking=moved).save_unless_same(path)
    assert ProfileCard.load(path).ranking == moved
    changed = replace(rebuilt, stop_threshold=0.3)
    changed.save_unless_same(path)
    assert ProfileCard.load(path) == changed
    path.write_text("{ not json")  # a broken file is written afresh, never trusted
    card.save_unless_same(path)
    assert ProfileCard.load(path) == card


def test_card_validation_errors(setup, tmp_path):
    _, table, identity = setup
    data = build_profile(table, identity, CardSettings(prior_task="sst2", count=2)).to_dict()
    with pytest.raises(ProfileError, match="schema_version 99"):
        ProfileCard.from_dict({**data, "schema_version": 99})
    with pytest.raises(ProfileError, match="lacks field"):
        ProfileCard.from_dict({k: v for k, v in data.items() if k != "trainable"})
    with pytest.raises(ProfileError, match=r"ids \['L7.q'\] that the model does not have"):
        ProfileCard.from_dict({**data, "trainable": ["L7.q"]})
    with pytest.raises(ProfileError, match=r"ids \['L0.q'\] more than once"):
        ProfileCard.from_dict({**data, "trainable": [*data["trainable"], "L0.q"], "frozen": data["frozen"]})
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ProfileError, match="not valid JSON"):
        ProfileCard.load(bad)
    with pytest.raises(InputFileError, match="does not exist"):
        ProfileCard.load(tmp_path / "missing.json")


def test_exactly_the_listed_projections_train(setup):
    loaded, table, identity = setup
    card = build_profile(table, identity, CardSettings(prior_task="sst2", count=3))
    model = loaded.model
    names = apply_profile(model, card)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == set(names) and len(names) == 3
    assert count_parameters(model, trainable_only=True) == card.trainable_params
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.0)
    ids = torch.randint(0, 256, (2, 12))
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    for n, p in model.named_parameters():
        if n in trainable:
            assert p.grad is not None and p.grad.abs().sum() > 0
        else:
            assert p.grad is None
    opt.step()
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]) != (n in trainable), n


def test_fused_gpt2_rows_are_masked():
    loaded = build_tiny_model("tiny-gpt2")
    snap = extract_snapshot(loaded)
    table = drift_table(snap, perturb_snapshot(snap, 0.05), n_jobs=1, cache=DriftCache(None))
    identity = identity_of(loaded.model, "tiny-gpt2")
    card = build_profile(table, identity, CardSettings(prior_task="sst2", count=1, metric="h0_w1"))
    card = replace(card, trainable=["L0.k"], frozen=[p for p in identity.shapes if p != "L0.k"])
    model = loaded.model
    apply_profile(model, card)
    fused = model.transformer.h[0].attn.c_attn.weight
    before = fused.detach().clone()
    ids = torch.randint(0, 256, (2, 10))
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    torch.optim.SGD([fused], lr=1.0).step()
    changed = (fused.detach() != before).any(dim=0)  # columns of the Conv1D weight = output rows
    assert changed[64:128].all() and not changed[:64].any() and not changed[128:].any()


def test_card_for_another_model_is_refused(setup):
    _, table, identity = setup
    card = build_profile(table, identity, CardSettings(prior_task="sst2", count=2))
    with pytest.raises(ProfileError, match="projections differ"):
        apply_profile(build_tiny_model("tiny-llama", num_hidden_layers=3).model, card)
    with pytest.raises(ProfileError, match="weights"):
        apply_profile(build_tiny_model("tiny-llama", seed=5).model, card)


def _v2(card: ProfileCard) -> dict:
    """The card as schema v2 wrote it: no recipe, aggregation or gradient task."""
    data = {k: v for k, v in card.to_dict().items() if k not in ("recipe", "aggregation", "gradient_task")}
    return {**data, "schema_version": 2}


def test_a_v2_card_loads_with_the_recipe_of_its_drift_settings_and_final_drift(setup, tmp_path):
    from topotuner_lab.profiles.card import SCHEMA_VERSION

    _, table, identity = setup
    card = build_profile(table, identity, CardSettings(prior_task="sst2", count=2))
    assert (card.recipe, card.aggregation, card.gradient_task, card.schema_version) == ("default", "final", None, 3)
    path = tmp_path / "v2.json"
    path.write_text(__import__("json").dumps(_v2(card)))
    old = ProfileCard.load(path)
    assert old == card and old.schema_version == SCHEMA_VERSION == 3
    path.with_suffix(".md").write_text("the v2 view")
    card.save_unless_same(path)  # the same card: its file is brought up to the current schema all the same
    assert __import__("json").loads(path.read_text())["schema_version"] == 3
    unrecorded = ProfileCard.from_dict({**_v2(card), "drift_settings": {}})
    assert unrecorded.recipe is None and unrecorded.aggregation == "final"
    foreign = ProfileCard.from_dict({**_v2(card), "drift_settings": {"maxdim": 7}})
    assert foreign.recipe == "custom"  # settings this version cannot read are no named recipe


def test_cards_record_the_recipe_and_aggregation_of_their_table(setup, tiny_snapshot):
    _, table, identity = setup
    from topotuner_lab.drift.settings import DriftSettings

    reference = drift_table(
        tiny_snapshot,
        perturb_snapshot(tiny_snapshot, 0.05),
        DriftSettings.recipe("reference"),
        n_jobs=1,
        cache=DriftCache(None),
    )
    assert build_profile(reference, identity, CardSettings(prior_task="sst2", count=2)).recipe == "reference"
    mean = table.copy()
    mean.attrs.update(aggregation="mean", epochs=3)
    card = build_profile(mean, identity, CardSettings(prior_task="sst2", count=2))
    assert card.aggregation == "mean" and card.recipe == "default"
    assert ProfileCard.from_dict(card.to_dict()) == card
    mean.attrs["aggregation"] = "median"
    with pytest.raises(ProfileError, match="aggregation='median' is not one of final, mean"):
        build_profile(mean, identity, CardSettings(prior_task="sst2", count=2))
    with pytest.raises(ProfileError, match="records recipe 'reference', but its drift settings are recipe 'default'"):
        ProfileCard.from_dict({**card.to_dict(), "recipe": "reference"})
