"""The pipeline on every tiny decoder family (LLaMA, Mistral, Qwen2, Qwen3, Gemma-3): extraction in memory and
streamed from a checkpoint folder, drift, a profile card, applying it, and a short profile fine-tune."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from topotuner_lab.drift.cache import DriftCache
from topotuner_lab.drift.compute import drift_table
from topotuner_lab.drift.tables import load_table, save_table
from topotuner_lab.profiles.apply import apply_profile, identity_of
from topotuner_lab.profiles.card import ProfileCard
from topotuner_lab.profiles.select import CardSettings, build_profile
from topotuner_lab.training.config import FinetuneConfig
from topotuner_lab.training.finetune import run_finetune
from topotuner_lab.weights.extract import extract_snapshot
from topotuner_lab.weights.models import TINY_DECODERS, TINY_SLIDING_WINDOW, build_tiny_model
from topotuner_lab.weights.projections import enumerate_projections, expected_shape
from topotuner_lab.weights.snapshot import load_snapshot, perturb_snapshot
from topotuner_lab.weights.streaming import stream_snapshot

ARCHITECTURES = {
    "tiny-llama": "llama",
    "tiny-mistral": "mistral",
    "tiny-qwen2": "qwen2",
    "tiny-qwen3": "qwen3",
    "tiny-gemma3": "gemma3_text",
}
#: (q, k, v, o) shapes: Qwen3's explicit head_dim (32) makes q and o wider than the hidden size (64)
SHAPES = {
    name: {"q": (64, 64), "k": (32, 64), "v": (32, 64), "o": (64, 64)} for name in ARCHITECTURES if name != "tiny-qwen3"
} | {"tiny-qwen3": {"q": (128, 64), "k": (64, 64), "v": (64, 64), "o": (64, 128)}}
SEQ_LEN = 40  # the fine-tune's max_length below; longer than the sliding window
TINY = dict(n_train=16, n_test=4, n_ood=4, n_ppl=2, batch_size=8, max_length=SEQ_LEN, learning_rate=1e-3)

parametrized = pytest.mark.parametrize("name", list(ARCHITECTURES))


def test_the_parametrization_covers_every_tiny_decoder():
    assert tuple(ARCHITECTURES) == TINY_DECODERS
    assert SEQ_LEN > 2 * TINY_SLIDING_WINDOW  # so two windowed layers cannot see the whole sequence


@pytest.fixture(scope="module")
def models():
    return {name: build_tiny_model(name, seed=0) for name in ARCHITECTURES}


@pytest.fixture(scope="module")
def cards(models, tmp_path_factory):
    """One small card per family (2 matrices, high drift against a perturbed copy), saved to a file."""
    folder = tmp_path_factory.mktemp("cards")
    paths = {}
    for name, loaded in models.items():
        pre = extract_snapshot(loaded)
        table = drift_table(pre, perturb_snapshot(pre, 0.05), n_jobs=1, cache=DriftCache(None))
        card = build_profile(table, identity_of(loaded.model, name), CardSettings(prior_task="sst2", count=2))
        paths[name] = card.save(folder / f"{name}.json")
    return paths


@parametrized
def test_each_family_is_its_own_architecture_with_the_byte_tokenizers_ids(name, models):
    loaded = models[name]
    config = loaded.model.config
    assert config.model_type == ARCHITECTURES[name]
    byte_ids = (loaded.tokenizer.pad_token_id, loaded.tokenizer.eos_token_id)
    assert (config.pad_token_id, config.eos_token_id) == byte_ids == (256, 257)
    assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (64, 2, 512)
    projections = enumerate_projections(loaded.model)
    assert [p.pid for p in projections] == [f"L{i}.{k}" for i in range(2) for k in "qkvo"]
    assert {p.kind: tuple(p.matrix(loaded.model).shape) for p in projections if p.layer == 1} == SHAPES[name]
    as_saved = config.to_dict()
    assert {k: expected_shape(as_saved, config.model_type, k) for k in "qkvo"} == SHAPES[name]


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-gemma3"])
def test_qwen3_and_gemma3_have_query_and_key_norms(name, models):
    names = {n for n, _ in models[name].model.named_parameters()}
    assert {"model.layers.0.self_attn.q_norm.weight", "model.layers.0.self_attn.k_norm.weight"} <= names


def _reach_of_the_first_token(model: torch.nn.Module, layer_output: int) -> int:
    """The last position whose hidden state after ``layer_output`` layers changes when only token 0 changes."""
    ids = torch.randint(0, 256, (1, SEQ_LEN), generator=torch.Generator().manual_seed(0))
    other = ids.clone()
    other[0, 0] = (ids[0, 0] + 1) % 256
    with torch.no_grad():
        a = model(ids, output_hidden_states=True).hidden_states[layer_output]
        b = model(other, output_hidden_states=True).hidden_states[layer_output]
    return int((a - b).abs().amax(-1)[0].nonzero().max())


@pytest.mark.parametrize(
    "name, layers, reach",
    [
        ("tiny-mistral", 1, TINY_SLIDING_WINDOW - 1),  # one windowed layer: token 0 reaches positions 0..window-1
        ("tiny-mistral", 2, 2 * (TINY_SLIDING_WINDOW - 1)),  # two windowed layers
        ("tiny-gemma3", 1, TINY_SLIDING_WINDOW - 1),  # Gemma-3's first layer is a sliding one ...
        ("tiny-gemma3", 2, SEQ_LEN - 1),  # ... its second attends globally
        ("tiny-llama", 1, SEQ_LEN - 1),  # no window
    ],
)
def test_the_sliding_window_takes_effect_within_the_test_sequence(name, layers, reach, models):
    assert _reach_of_the_first_token(models[name].model, layers) == reach


@parametrized
def test_streamed_extraction_from_a_saved_folder_equals_the_in_memory_one(name, models, tmp_path):
    loaded = models[name]
    loaded.model.save_pretrained(tmp_path / name)
    in_memory = extract_snapshot(loaded)
    streamed = load_snapshot(stream_snapshot(tmp_path / name, tmp_path / "s.safetensors"))
    assert streamed.architecture == in_memory.architecture == ARCHITECTURES[name]
    assert list(streamed.matrices) == list(in_memory.matrices)
    for pid, matrix in in_memory.matrices.items():
        assert streamed.matrices[pid].dtype == np.float32
        np.testing.assert_array_equal(streamed.matrices[pid], matrix, err_msg=pid)
    assert streamed.weights_hash == in_memory.weights_hash


@parametrized
def test_drift_table_against_a_perturbed_copy(name, models, tmp_path):
    pre = extract_snapshot(models[name])
    table = drift_table(pre, perturb_snapshot(pre, 0.05), n_jobs=1, cache=DriftCache(None))
    assert list(table["pid"]) == list(pre.matrices)
    assert table.attrs["before_hash"] == pre.weights_hash
    drift = table["rel_frobenius"].to_numpy()
    assert np.isfinite(drift).all() and (drift > 0).all()
    again = load_table(save_table(table, tmp_path / "t.parquet"))
    assert list(again["pid"]) == list(table["pid"]) and again.attrs["before_hash"] == pre.weights_hash
    # no drift against itself
    assert np.allclose(drift_table(pre, pre, n_jobs=1, cache=DriftCache(None))["rel_frobenius"], 0)


@parametrized
def test_applying_a_card_gives_gradients_to_exactly_its_matrices(name, models, cards):
    loaded = build_tiny_model(name, seed=0)  # a fresh copy: apply_profile freezes in place
    card = ProfileCard.load(cards[name])
    assert len(card.trainable) == 2
    trainable = apply_profile(loaded.model, card)
    by_pid = {p.pid: p.param_name for p in enumerate_projections(loaded.model)}
    assert trainable == sorted(by_pid[pid] for pid in card.trainable)
    loaded.model.train()
    batch = loaded.tokenizer(["a tiny sentence, longer than the window", "b"], return_tensors="pt", padding=True)
    loaded.model(**batch, labels=batch["input_ids"]).loss.backward()
    with_grad = {n for n, p in loaded.model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert with_grad == set(trainable)
    assert {n for n, p in loaded.model.named_parameters() if p.requires_grad} == set(trainable)


@pytest.mark.slow
@parametrized
def test_profile_finetune_changes_only_the_cards_matrices(name, models, cards, tmp_path):
    loaded = models[name]
    pre = extract_snapshot(loaded)
    res = run_finetune(
        loaded,
        FinetuneConfig(
            method="profile",
            profile=str(cards[name]),
            task="sst2",
            output_dir=str(tmp_path / "run"),
            epochs=1,
            save_snapshot=True,
            **TINY,
        ),
    )
    card = json.loads(cards[name].read_text())
    assert res.trainable_params == card["trainable_params"]
    after = load_snapshot(res.snapshot)
    assert after.architecture == ARCHITECTURES[name]
    changed = {pid for pid in pre.matrices if not np.array_equal(pre.matrices[pid], after.matrices[pid])}
    assert changed == set(card["trainable"])
    assert extract_snapshot(loaded).weights_hash == pre.weights_hash  # the caller's model is left untouched
