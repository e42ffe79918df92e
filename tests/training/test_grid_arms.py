"""The arms of the authors' grid: their element-wise relative-change selector (a card strategy), Spectrum's top 5%
as they ran it (a fine-tune method), and what every run trained (Train.%) and moved (Upd.%)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from topotuner_lab._io.errors import ProfileError
from topotuner_lab.drift.cache import DriftCache
from topotuner_lab.drift.compute import drift_table
from topotuner_lab.drift.settings import DriftSettings
from topotuner_lab.drift.signals import ELTWISE_COLUMN, relchange_table, with_relchange
from topotuner_lab.profiles.card import ModelIdentity
from topotuner_lab.profiles.select import CardSettings, build_profile
from topotuner_lab.training.config import FinetuneConfig
from topotuner_lab.training.finetune import run_finetune
from topotuner_lab.training.spectrum import ALWAYS_UNFROZEN, apply_spectrum, spectrum_patterns
from topotuner_lab.training.updates import update_measures
from topotuner_lab.weights.models import build_tiny_model
from topotuner_lab.weights.projections import count_parameters
from topotuner_lab.weights.snapshot import Snapshot, perturb_snapshot

TINY = dict(n_train=16, n_test=8, n_ood=8, n_ppl=2, batch_size=8, max_length=40, learning_rate=1e-3, epochs=1)


# --- the element-wise relative-change selector ---------------------------------------------------------------------


def _reference_eltwise(before: np.ndarray, after: np.ndarray) -> float:
    """``mean_abs_eltwise_relative`` of FDataLab/TopoTuner's ``eltwise_rel_llama_full_layer_epoch_curves.py``."""
    ref = torch.tensor(before, dtype=torch.float32).reshape(-1)
    new = torch.tensor(after, dtype=torch.float32).reshape(-1)
    den = ref.abs().clamp(min=1e-12)
    return float(((new - ref).abs() / den).mean().item())


@pytest.fixture
def prior_pair(tiny_snapshot):
    """A pretrained snapshot with exact zeros (where the formula's epsilon matters) and a fine-tuned copy of it."""
    matrices = {pid: m.copy() for pid, m in tiny_snapshot.matrices.items()}
    for m in matrices.values():
        m[0, :3] = 0.0
    pre = Snapshot(matrices, "tiny-llama", "tiny-llama", "seed=0", tiny_snapshot.architecture, total_params=139584)
    return pre, perturb_snapshot(pre, 0.05, seed=3)


def test_relchange_column_is_the_authors_formula(prior_pair):
    pre, after = prior_pair
    table = relchange_table(pre, after).set_index("pid")[ELTWISE_COLUMN]
    for pid, before in pre.matrices.items():
        a, b = before.astype(np.float64), after.matrices[pid].astype(np.float64)
        direct = np.mean(np.abs(b - a) / np.maximum(np.abs(a), 1e-12))
        assert table[pid] == pytest.approx(direct, rel=1e-12), pid
        assert table[pid] == pytest.approx(_reference_eltwise(before, after.matrices[pid]), rel=1e-5), pid
        assert table[pid] > 1e3  # the moved zeros divide by 1e-12 (the comparison script's 1e-6 gives ~1)


def test_relchange_averages_epoch_snapshots_like_the_avg_mode(prior_pair):
    pre, after = prior_pair
    other = perturb_snapshot(pre, 0.01, seed=4)
    both = relchange_table(pre, after, other)[ELTWISE_COLUMN].to_numpy()
    each = [relchange_table(pre, s)[ELTWISE_COLUMN].to_numpy() for s in (after, other)]
    np.testing.assert_allclose(both, (each[0] + each[1]) / 2, rtol=1e-12)


@pytest.fixture
def drift_pair(tiny_snapshot):
    after = perturb_snapshot(tiny_snapshot, 0.05, seed=1)
    table = drift_table(tiny_snapshot, after, DriftSettings(maxdim=0), n_jobs=1, cache=DriftCache(None))
    return tiny_snapshot, after, table


def test_a_relchange_card_trains_the_most_changed_matrices(drift_pair):
    pre, after, table = drift_pair
    joined = with_relchange(table, pre, after)
    assert joined.attrs == table.attrs
    card = build_profile(
        joined, ModelIdentity.from_snapshot(pre), CardSettings(prior_task="sst2", strategy="relchange", count=3)
    )
    values = {pid: _reference_eltwise(m, after.matrices[pid]) for pid, m in pre.matrices.items()}
    expected = sorted(values, key=values.get, reverse=True)
    assert [r["pid"] for r in card.ranking] == expected
    assert card.metric == ELTWISE_COLUMN and card.normalization == "raw" and set(card.trainable) == set(expected[:3])


def test_relchange_refuses_another_fine_tune_and_says_how_to_add_its_column(drift_pair):
    pre, after, table = drift_pair
    with pytest.raises(ProfileError, match="fine-tuned weights"):
        with_relchange(table, pre, perturb_snapshot(pre, 0.05, seed=2))
    with pytest.raises(ProfileError, match="with_relchange"):
        build_profile(
            table, ModelIdentity.from_snapshot(pre), CardSettings(prior_task="sst2", strategy="relchange", count=2)
        )


# --- Spectrum's top 5% ------------------------------------------------------------------------------------------


def _spectrum_py_yaml(model: torch.nn.Module, top_percent: int) -> list[str]:
    """cognitivecomputations/spectrum's ``spectrum.py`` scan of every weight type, then its YAML list, step by step."""
    types = set()
    for name, module in model.named_modules():
        parts = name.split(".")
        if any(hasattr(module, attr) for attr in ["weight", "bias", "inv_freq"]):
            index = next((i for i, part in enumerate(parts) if part.isdigit()), -1)
            types.add(".".join(parts[index + 1 :]) if index != -1 else name)
    categories: dict[str, list[str]] = {}
    for wt in types:
        categories.setdefault(wt.split(".")[0], []).append(wt)
    ordered = [wt for _, v in sorted(categories.items()) for wt in sorted(v)]
    layer_snr: dict[str, dict] = {}
    for layer_type in ordered:
        for name, module in model.named_modules():
            if layer_type in name and hasattr(module, "weight"):
                weights = module.weight.detach().double()
                if weights.ndim < 2:
                    weights = weights.unsqueeze(0)
                s = torch.linalg.svdvals(weights)
                sigma = (torch.quantile(s, 0.75) - torch.quantile(s, 0.25)) / 1.349
                n, m = weights.shape[-2:]
                beta = n / m if n < m else m / n
                mask = s > sigma * np.sqrt((1 + np.sqrt(beta)) ** 2)
                signal = s[mask].sum() if mask.any() else torch.tensor(0.0)
                noise = s[~mask].sum() if (~mask).any() else torch.tensor(1.0)
                layer_snr[name] = {"type": layer_type, "snr": float(signal / noise / s[0])}
    by_type: dict[str, list] = {}
    for name, info in layer_snr.items():
        by_type.setdefault(info["type"], []).append((name, info["snr"]))
    yaml = ["^lm_head.weight$", "^model.embed_tokens.weight$"]
    for layers in by_type.values():
        yaml += [n for n, _ in sorted(layers, key=lambda x: x[1], reverse=True)[: int(len(layers) * top_percent / 100)]]
    return yaml


@pytest.fixture
def deep_llama():
    """A tiny Llama with 20 layers: 5% of each per-layer type is one module, as 5% of SmolLM2's 30 layers is."""
    return build_tiny_model("tiny-llama", seed=0, num_hidden_layers=20)


def test_spectrum_selection_follows_spectrum_py(deep_llama):
    with torch.no_grad():  # distinct norm weights: the norms' SNR is still exactly 1, so the first layer's win
        for p in deep_llama.model.parameters():
            if p.ndim == 1:
                p.mul_(torch.rand_like(p) + 0.5)
    ours = spectrum_patterns(deep_llama.model)
    assert ours == _spectrum_py_yaml(deep_llama.model, 5)
    assert len(ours) == len(ALWAYS_UNFROZEN) + 9  # q, k, v, o, gate, up, down and the two norms: one of each
    assert "model.layers.0.input_layernorm" in ours and "model.layers.0.post_attention_layernorm" in ours
    assert spectrum_patterns(deep_llama.model, 10) == _spectrum_py_yaml(deep_llama.model, 10)


def test_spectrum_top5_trains_its_picks_the_embeddings_and_the_head(deep_llama):
    model = copy.deepcopy(deep_llama.model)
    names, record = apply_spectrum(model, deep_llama.model)
    picked = record["unfrozen_parameters"][len(ALWAYS_UNFROZEN) :]
    assert sorted(names) == sorted(["model.embed_tokens.weight", "lm_head.weight", *(f"{n}.weight" for n in picked)])
    assert {n for n, p in model.named_parameters() if p.requires_grad} == set(names)
    # one module of each per-layer type (all layers have the same shapes), two norms, embeddings and head
    per_layer = 64 * 64 + 32 * 64 + 32 * 64 + 64 * 64 + 3 * 128 * 64 + 2 * 64
    assert count_parameters(model, trainable_only=True) == 2 * 512 * 64 + per_layer


@pytest.mark.slow
def test_spectrum_top5_is_a_fine_tune_method(tiny_llama, tmp_path):
    res = run_finetune(tiny_llama, FinetuneConfig(method="spectrum-top5", output_dir=str(tmp_path / "s"), **TINY))
    # two layers: 5% of each per-layer type is no module, so the embeddings and the head train alone
    assert sorted(res.trainable_param_names) == ["lm_head.weight", "model.embed_tokens.weight"]
    assert res.trainable_params == 2 * 512 * 64 and res.spectrum["top_percent"] == 5
    assert 0 < res.updated_fraction <= res.trainable_fraction < 1


# --- Train.% and Upd.% --------------------------------------------------------------------------------------------


def test_upd_counts_entries_moved_beyond_the_tolerance(tiny_llama):
    trained = copy.deepcopy(tiny_llama.model)
    with torch.no_grad():
        q = trained.get_parameter("model.layers.0.self_attn.q_proj.weight")
        q[:5] += 1e-3  # 5 rows of 64 move
        trained.get_parameter("model.norm.weight").add_(1e-7)  # below the tolerance: not an update
    measures = update_measures(tiny_llama.model, trained)
    total = count_parameters(tiny_llama.model)
    assert measures["updated_params"] == 5 * 64 and measures["updated_fraction"] == 5 * 64 / total
    w = tiny_llama.model.get_parameter("model.layers.0.self_attn.q_proj.weight")[:5].detach().double()
    moved = (q[:5].detach().double() - w).abs()
    assert measures["update_rel_change"] == pytest.approx(float((moved / (w.abs() + 1e-6)).mean()), rel=1e-4)
    assert update_measures(tiny_llama.model, copy.deepcopy(tiny_llama.model))["update_rel_change"] is None


def test_upd_of_lora_is_its_merged_delta(tiny_llama):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(copy.deepcopy(tiny_llama.model), LoraConfig(r=2, lora_alpha=4, target_modules=["v_proj"]))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    measures = update_measures(tiny_llama.model, model)
    merged = copy.deepcopy(model).merge_and_unload()
    moved = sum(int(((p - merged.get_parameter(n)).abs() > 1e-6).sum()) for n, p in tiny_llama.model.named_parameters())
    assert measures["updated_params"] == moved > 0.9 * 2 * 32 * 64  # the v matrices, all but a few entries
    assert measures["updated_params"] > count_parameters(model, trainable_only=True)  # Upd.% above Train.%


@pytest.mark.slow
def test_every_method_records_train_and_upd(tiny_llama, card_path, tmp_path):
    runs = {
        method: run_finetune(
            tiny_llama,
            FinetuneConfig(method=method, output_dir=str(tmp_path / method), profile=str(card_path), **TINY),
        )
        for method in ("full", "profile", "lora")
    }
    for method in runs:
        on_disk = json.loads((tmp_path / method / "results.json").read_text())
        assert {"updated_params", "updated_fraction", "update_rel_change"} <= set(on_disk), method
        assert on_disk["update_rel_change"] > 0, method
    embedding = 512 * 64 / count_parameters(tiny_llama.model)  # rows of tokens never seen get no gradient
    assert runs["full"].trainable_fraction == 1 and runs["full"].updated_fraction > 1 - embedding
    assert 0 < runs["profile"].updated_fraction <= runs["profile"].trainable_fraction
    lora = runs["lora"]
    wrapped = sum(64 * 64 + 32 * 64 + 32 * 64 + 64 * 64 for _ in range(2))  # q, k, v, o of both layers
    assert lora.trainable_fraction < lora.updated_fraction <= wrapped / count_parameters(tiny_llama.model)
