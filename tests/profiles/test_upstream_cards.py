"""Cards from the authors' released orderings (FDataLab/TopoTuner): the published lists round-trip through a card,
the identities match the real model classes (built on the meta device, no weights), and each card says where its
lists come from and that the listed matrices train."""

from __future__ import annotations

import ast
import json
import re
import warnings

import pytest
import torch
import yaml

from topotuner_lab._io.errors import ProfileError
from topotuner_lab.cli import main
from topotuner_lab.profiles.card import ProfileCard
from topotuner_lab.profiles.export import export_card
from topotuner_lab.profiles.upstream import (
    CONFIG_ONLY,
    upstream_card,
    upstream_data,
    upstream_identity,
    upstream_models,
)
from topotuner_lab.weights.projections import parse_pid

MODELS = list(upstream_models())


def orderings_in_file(key: str) -> dict[str, list[int]]:
    """The Q/K/V arrays of one model as the stored file spells them (``Q_ORDERED_LAYERS_<KEY>=(...)``)."""
    text = upstream_data()["sources"]["orderings"]["text"]
    arrays = {}
    for line in text.splitlines():
        if line.startswith(tuple(f"{k}_ORDERED_LAYERS_{key.upper()}=(" for k in "QKV")):
            name, values = line.split("=", 1)
            arrays[name[0].lower()] = [int(v) for v in values.strip("()").split(" ")]
    return arrays


def vo_lists_in_file() -> dict:
    text = upstream_data()["sources"]["vo-lists"]["text"]
    return ast.literal_eval(text[text.index("EXPECTED_FROZEN_LAYERS = ") + len("EXPECTED_FROZEN_LAYERS = ") :])


def published_order(card: ProfileCard, kind: str) -> list[int]:
    """A card's ranked layers of one kind in the published order (its scores are the positions in the list)."""
    ranked = sorted((r["score"], parse_pid(r["pid"])[0]) for r in card.ranking if parse_pid(r["pid"])[1] == kind)
    return [layer for _, layer in ranked]


def test_the_stored_sources_are_the_authors_files_with_their_commits():
    data = upstream_data()
    assert data["repository"] == "FDataLab/TopoTuner"
    for source in data["sources"].values():
        assert re.fullmatch(r"[0-9a-f]{40}", source["commit"]) and source["path"].startswith("codes/")
    text = data["sources"]["orderings"]["text"]
    assert text.startswith("# Layer orderings by Wasserstein distance (lowest to highest)\n") and len(text) == 4527
    for key in MODELS:  # each array is repeated in the file's copy-paste block: both must agree
        copies = re.findall(r"^# ([QKV])_ORDERED_LAYERS=\(([\d ]+)\)$", text.split(f"# Model: {key}\n")[1], re.M)[:3]
        assert {k.lower(): [int(v) for v in values.split()] for k, values in copies} == orderings_in_file(key)
        assert all(sorted(order) == list(range(len(order))) for order in orderings_in_file(key).values())


@pytest.mark.parametrize("strategy", ["low-drift", "high-drift"])
@pytest.mark.parametrize("key", MODELS)
def test_the_qkv_orderings_round_trip_through_a_card(key, strategy):
    card = upstream_card(key, size=5, strategy=strategy)
    for kind, order in orderings_in_file(key).items():
        assert published_order(card, kind) == order
        chosen = order[:5] if strategy == "low-drift" else order[-5:]
        assert sorted(parse_pid(p)[0] for p in card.trainable if p.endswith(kind)) == sorted(chosen)
    assert not [p for p in card.trainable if p.endswith(".o")]
    assert [r["pid"] for r in card.ranking][:3] == [  # best first for the strategy
        f"L{orderings_in_file(key)[k][0 if strategy == 'low-drift' else -1]}.{k}" for k in "qkv"
    ]


@pytest.mark.parametrize("selector", ["wasserstein", "norm"])
def test_the_qwen3_vo_lists_round_trip_through_a_card(selector):
    lists = vo_lists_in_file()["qwen-base"]["wass" if selector == "wasserstein" else "norm"]
    assert sorted(lists) == sorted(f"{end}-{n}" for end in ("low", "high") for n in (3, 6, 9, 15))
    for variant, kinds in lists.items():
        end, size = variant.split("-")
        card = upstream_card(
            "Qwen/Qwen3-8B-Base", selector=selector, size=int(size), strategy=f"{end}-drift", source="vo-lists"
        )
        assert {kind: published_order(card, kind) for kind in ("v", "o")} == kinds
        assert set(card.trainable) == {f"L{layer}.{kind}" for kind, layers in kinds.items() for layer in layers}
        assert card.budget == {"per_kind": {"v": int(size), "o": int(size)}}
        assert f"[{variant!r}]" in card.metric


def test_training_the_listed_vo_matrices_is_the_papers_budget():
    fractions = {n: upstream_card("qwen_8b_base", size=n, source="vo-lists").trainable_fraction for n in (3, 6)}
    assert 0.0076 < fractions[3] < 0.0077 and 0.0153 < fractions[6] < 0.0154  # 1-2% of the parameters


@pytest.fixture(scope="module")
def meta_models():
    """Each upstream model's real class built from the stored config on the meta device (shapes, no weights)."""
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    built = {}
    for key in MODELS:
        config = dict(upstream_data()["models"][key]["config"])
        with torch.device("meta"):
            built[key] = AutoModelForCausalLM.from_config(CONFIG_MAPPING[config.pop("model_type")](**config))
    return built


@pytest.mark.parametrize("key", MODELS)
def test_identities_match_the_model_classes_and_exports_name_their_parameters(meta_models, key):
    from topotuner_lab.weights.projections import enumerate_projections

    model = meta_models[key]
    identity = upstream_identity(key)
    assert identity.weights_hash == CONFIG_ONLY and identity.name == upstream_models()[key]
    assert identity.total_params == sum(p.numel() for p in model.parameters())
    assert identity.shapes == {
        p.pid: list(model.get_parameter(p.param_name).shape) for p in enumerate_projections(model)
    }
    card = upstream_card(key, size=2)
    names = {n for n, _ in model.named_parameters()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        patterns = yaml.safe_load(export_card(card, "axolotl"))["unfrozen_parameters"]
    assert {n for n in names if any(re.match(p, n) for p in patterns)} == {
        p.param_name for p in enumerate_projections(model) if p.pid in card.trainable
    }


def test_cards_say_where_their_lists_come_from_and_that_they_train():
    card = upstream_card("mistral7b_v03", size=4, strategy="low-drift")
    source = upstream_data()["sources"]["orderings"]
    assert f"FDataLab/TopoTuner@{source['commit']}:{source['path']}" in card.metric
    assert "trains the 4 lowest layers of each of q, k, v" in card.metric
    assert card.prior_task == "imdb+sst2+mmlu" and card.recipe is None and card.aggregation == "mean"
    vo = upstream_card("Qwen3-8B-Base", selector="norm", size=9)
    assert "TRAINS the listed V and O layers" in vo.metric and "expected frozen" in vo.metric
    assert upstream_data()["sources"]["vo-lists"]["commit"] in vo.metric and vo.prior_task == "unrecorded"
    assert ProfileCard.from_dict(json.loads(json.dumps(vo.to_dict()))) == vo  # a valid card, saved and read back


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"model": "gpt2"}, "(?s)no orderings for 'gpt2'.*Qwen/Qwen3-8B-Base"),
        ({"model": "llama31_8b", "selector": "norm"}, "V/O lists cover Qwen3-8B-Base only"),
        ({"model": "llama31_8b", "source": "orderings", "selector": "norm"}, "Wasserstein drift only"),
        ({"model": "llama32_3b", "size": 29}, "1 to 28"),
        ({"model": "llama32_3b", "size": 0}, "1 to 28"),
        ({"model": "qwen_8b_base", "source": "vo-lists", "size": 4}, r"one of \[3, 6, 9, 15\]"),
        ({"model": "qwen_8b_base", "strategy": "random"}, "strategy 'random' is not one of"),
    ],
)
def test_bad_requests_name_the_fix(kwargs, message):
    with pytest.raises(ProfileError, match=message):
        upstream_card(**kwargs)


def test_profile_from_upstream_on_the_command_line(tmp_path, capsys):
    out = tmp_path / "card.json"
    argv = ["profile", "--from-upstream", "Qwen/Qwen3-8B-Base", "--selector", "norm", "--size", "6"]
    assert main([*argv, "--strategy", "low-drift", "-o", str(out), "--spectrum", str(tmp_path / "c.yaml")]) == 0
    card = ProfileCard.load(out)
    expected = upstream_card("Qwen/Qwen3-8B-Base", selector="norm", size=6, strategy="low-drift")
    assert card.to_dict() | {"created": ""} == expected.to_dict() | {"created": ""}
    assert "12 trainable projections" in capsys.readouterr().out
    assert yaml.safe_load((tmp_path / "c.yaml").read_text())["unfrozen_parameters"][0].startswith("^model.layers.")
    assert main([*argv, "table.parquet", "--count", "2", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "a drift table, --count were given too" in err and "How to fix" in err
    assert main(["profile", "-o", str(out)]) == 2
    assert "--from-upstream MODEL" in capsys.readouterr().err
