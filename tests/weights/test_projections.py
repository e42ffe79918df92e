import pytest
import torch
from transformers import AutoModelForCausalLM, MistralConfig, Qwen3Config

from topotuner_lab._io.errors import ParameterError, UnsupportedArchitectureError
from topotuner_lab.weights.models import build_tiny_model
from topotuner_lab.weights.projections import enumerate_projections, parse_pid


def _ids(model):
    return [p.pid for p in enumerate_projections(model)]


EXPECTED_2_LAYERS = [f"L{layer}.{kind}" for layer in range(2) for kind in "qkvo"]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-gpt2", "tiny-bert"])
def test_ids_for_each_tiny_family(name):
    model = build_tiny_model(name).model
    assert _ids(model) == EXPECTED_2_LAYERS


@pytest.mark.parametrize("config_cls", [MistralConfig, Qwen3Config])
def test_ids_for_mistral_and_qwen3(config_cls):
    cfg = config_cls(
        vocab_size=128,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=3,
        intermediate_size=64,
        head_dim=8,
    )
    model = AutoModelForCausalLM.from_config(cfg)
    projections = enumerate_projections(model)
    assert [p.pid for p in projections] == [f"L{i}.{k}" for i in range(3) for k in "qkvo"]
    shapes = {p.kind: tuple(p.matrix(model).shape) for p in projections if p.layer == 0}
    assert shapes == {"q": (32, 32), "k": (16, 32), "v": (16, 32), "o": (32, 32)}


def test_grouped_query_attention_shapes():
    model = build_tiny_model("tiny-llama").model  # 4 heads, 2 KV heads, hidden 64
    shapes = {p.kind: tuple(p.matrix(model).shape) for p in enumerate_projections(model) if p.layer == 1}
    assert shapes == {"q": (64, 64), "k": (32, 64), "v": (32, 64), "o": (64, 64)}


def test_gpt2_fused_qkv_is_split_in_linear_layout():
    model = build_tiny_model("tiny-gpt2").model
    projections = {p.pid: p for p in enumerate_projections(model)}
    fused = model.transformer.h[0].attn.c_attn.weight  # Conv1D: (in=64, out=192)
    q, k, v = (projections[f"L0.{s}"].matrix(model) for s in "qkv")
    assert q.shape == k.shape == v.shape == (64, 64)
    assert torch.equal(torch.cat([q, k, v]), fused.T)
    assert torch.equal(projections["L0.o"].matrix(model), model.transformer.h[0].attn.c_proj.weight.T)


def test_unknown_architecture_lists_supported():
    with pytest.raises(UnsupportedArchitectureError) as info:
        enumerate_projections(torch.nn.Linear(4, 4))
    message = str(info.value)
    assert "Linear" in message and "llama" in message and "gpt2" in message and "bert" in message


def test_parse_pid():
    assert parse_pid("L12.q") == (12, "q")
    with pytest.raises(ParameterError, match="not a projection id"):
        parse_pid("layer12.q")


def test_public_api_is_lazy_complete_and_documented():
    import subprocess
    import sys

    import topotuner_lab

    assert set(topotuner_lab.__all__) == set(topotuner_lab._EXPORTS)
    for name in topotuner_lab.__all__:
        obj = getattr(topotuner_lab, name)
        assert obj.__doc__ and len(obj.__doc__) > 40, name
    for name in (
        "diagrams",
        "wasserstein",
        "bottleneck",
        "drift_table",
        "build_profile",
        "apply_profile",
        "load_model",
        "run_finetune",
    ):
        doc = getattr(topotuner_lab, name).__doc__
        assert "Parameters" in doc or "Keyword arguments" in doc, name
    code = "import sys, topotuner_lab; topotuner_lab.drift_table; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
