"""Streaming extraction from safetensors checkpoints equals extraction from the loaded model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import topotuner_lab.weights.models as models_mod
from topotuner_lab._io.errors import ModelLoadError
from topotuner_lab.cli import main
from topotuner_lab.weights.extract import extract_snapshot
from topotuner_lab.weights.models import build_tiny_model
from topotuner_lab.weights.snapshot import load_snapshot
from topotuner_lab.weights.streaming import stream_snapshot


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-gpt2"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_sharded_checkpoint_streams_to_the_same_snapshot(tmp_path, name, dtype):
    model = build_tiny_model(name).model.to(dtype)
    model.save_pretrained(tmp_path / "ckpt", max_shard_size="100KB")  # several shards and an index
    assert (tmp_path / "ckpt" / "model.safetensors.index.json").is_file() or dtype != torch.float32
    expected = extract_snapshot(model.float(), name=name)
    snap = load_snapshot(stream_snapshot(tmp_path / "ckpt", tmp_path / "s.safetensors"))
    assert snap.weights_hash == expected.weights_hash and snap.architecture == expected.architecture
    assert snap.total_params == sum(p.numel() for p in model.parameters())
    assert isinstance(snap.matrices["L0.q"], np.memmap)  # read lazily from the file


def test_lora_adapter_is_merged_on_the_fly(tmp_path):
    from peft import LoraConfig, get_peft_model

    base = build_tiny_model("tiny-llama").model
    base.save_pretrained(tmp_path / "base")
    peft_model = get_peft_model(
        build_tiny_model("tiny-llama").model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)  # a trained adapter (B starts at zero)
    peft_model.save_pretrained(tmp_path / "adapter")
    expected = extract_snapshot(peft_model.merge_and_unload())
    snap = load_snapshot(stream_snapshot(tmp_path / "adapter", tmp_path / "s.safetensors", base=tmp_path / "base"))
    assert not np.allclose(snap.matrices["L0.q"], extract_snapshot(base).matrices["L0.q"])  # the adapter changed q
    for pid, matrix in expected.matrices.items():
        np.testing.assert_allclose(snap.matrices[pid], matrix, rtol=1e-5, atol=1e-6, err_msg=pid)
    with pytest.raises(ModelLoadError, match="base model is needed"):
        stream_snapshot(tmp_path / "adapter", tmp_path / "t.safetensors")


def test_profile_checkpoint_overlays_its_trainable_tensors_on_the_base(tmp_path):
    from safetensors.torch import save_file

    base = build_tiny_model("tiny-llama").model
    base.save_pretrained(tmp_path / "base")
    tuned = build_tiny_model("tiny-llama").model
    with torch.no_grad():
        tuned.model.layers[1].self_attn.v_proj.weight.add_(0.1)
    (tmp_path / "run").mkdir()
    save_file(
        {"model.layers.1.self_attn.v_proj.weight": tuned.model.layers[1].self_attn.v_proj.weight.detach().contiguous()},
        str(tmp_path / "run" / "trainable.safetensors"),
    )
    snap = load_snapshot(stream_snapshot(tmp_path / "run", tmp_path / "s.safetensors", base=tmp_path / "base"))
    assert snap.weights_hash == extract_snapshot(tuned).weights_hash


def test_cli_extract_streams_a_folder_without_loading_the_model(tmp_path, monkeypatch, capsys):
    build_tiny_model("tiny-llama").model.save_pretrained(tmp_path / "ckpt")

    def no_loading(*args, **kwargs):
        raise AssertionError("extract loaded the model")

    monkeypatch.setattr(models_mod, "load_model", no_loading)
    assert main(["extract", str(tmp_path / "ckpt"), "-o", str(tmp_path / "s.safetensors")]) == 0
    assert "streaming" in capsys.readouterr().err
    assert (
        load_snapshot(tmp_path / "s.safetensors").weights_hash
        == extract_snapshot(build_tiny_model("tiny-llama")).weights_hash
    )
