"""Cards built from a config alone (``profile --from-upstream``: no weights, ``weights_hash`` "config-only") train
with ``finetune --method profile``: checked against the model's config shape, with a one-line warning saying so; a
model of another shape is one named error."""

from __future__ import annotations

import copy

import pytest
import torch

from topotuner_lab._io.errors import ProfileError
from topotuner_lab.cli import main
from topotuner_lab.profiles import upstream
from topotuner_lab.profiles.apply import apply_profile
from topotuner_lab.profiles.card import ProfileCard
from topotuner_lab.training.results import load_results
from topotuner_lab.weights.models import build_tiny_model

#: the config fields the stored upstream models record
CONFIG_FIELDS = (
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "tie_word_embeddings",
)
SIZES = ["--epochs", "1", "--n-train", "8", "--n-test", "4", "--n-ood", "0", "--n-ppl", "0", "--max-length", "32"]


@pytest.fixture
def upstream_card_path(tmp_path, monkeypatch, tiny_llama, capsys):
    """A card from ``profile --from-upstream tiny-llama``: the stored upstream data with tiny-llama's config shape
    (its parameter count from the config, on the meta device) and published-style orderings (layer 1, then 0)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = {name: getattr(tiny_llama.model.config, name) for name in CONFIG_FIELDS}
    with torch.device("meta"):
        shaped = AutoModelForCausalLM.from_config(LlamaConfig(**{k: v for k, v in config.items() if k != "model_type"}))
    data = copy.deepcopy(upstream.upstream_data())
    data["models"]["tiny_llama"] = {
        "name": "tiny-llama",
        "config": config,
        "total_params": sum(p.numel() for p in shaped.parameters()),
    }
    data["sources"]["orderings"]["text"] += "".join(f"{k}_ORDERED_LAYERS_TINY_LLAMA=(1 0)\n" for k in "QKV")
    monkeypatch.setattr(upstream, "upstream_data", lambda: data)
    path = tmp_path / "card.json"
    assert main(["profile", "--from-upstream", "tiny-llama", "--size", "1", "-o", str(path)]) == 0
    capsys.readouterr()
    return path


@pytest.mark.slow  # a fine-tune
def test_a_config_only_card_trains_with_finetune_method_profile(tmp_path, upstream_card_path, capsys):
    card = ProfileCard.load(upstream_card_path)
    assert card.model.weights_hash == upstream.CONFIG_ONLY and card.trainable == ["L0.q", "L0.k", "L0.v"]
    out = tmp_path / "run"
    argv = ["finetune", "--model", "tiny-llama", "--method", "profile", "--profile", str(upstream_card_path)]
    assert main([*argv, *SIZES, "-o", str(out)]) == 0
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if "checked by config only" in line]
    assert notes == [
        "warning: card for 'tiny-llama' was checked by config only (llama, 2 layers, 8 projection shapes, "
        f"{card.model.total_params:,} parameters): it records no weight hash"
    ]
    results = load_results(out / "results.json")
    assert results["profile"]["checked_by"] == "config"
    assert results["trainable_param_names"] == [f"model.layers.0.self_attn.{k}_proj.weight" for k in "kqv"]
    assert 0 < results["updated_params"] and results["trainable_params"] == card.trainable_params


@pytest.mark.parametrize(
    "model, overrides, differs",
    [
        ("tiny-qwen3", {}, "architecture llama in the card, qwen3 here; parameter count"),
        ("tiny-llama", {"num_key_value_heads": 4}, "4 projection shape(s), e.g. L0.k [32, 64] in the card, [64, 64]"),
        ("tiny-llama", {"num_hidden_layers": 3}, "2 layers (8 projections) in the card, 3 here"),
        ("tiny-llama", {"vocab_size": 600}, "parameter count "),
    ],
)
def test_a_model_of_another_config_shape_is_one_named_error(upstream_card_path, model, overrides, differs):
    card = ProfileCard.load(upstream_card_path)
    with pytest.raises(ProfileError) as info:
        apply_profile(build_tiny_model(model, **overrides).model, card)
    assert info.value.problem.startswith(
        "card for 'tiny-llama' records its config shape only (no weight hash), and this model's differs: "
    )
    assert differs in info.value.problem and "apply the card to tiny-llama" in info.value.fix


def test_a_config_shape_mismatch_on_the_command_line(tmp_path, upstream_card_path, capsys):
    argv = ["finetune", "--model", "tiny-qwen3", "--method", "profile", "--profile", str(upstream_card_path)]
    assert main([*argv, *SIZES, "-o", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "checked by config only" not in err
    assert "error: card for 'tiny-llama' records its config shape only" in err and "How to fix: apply" in err
