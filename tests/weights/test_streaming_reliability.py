"""Streaming extraction against damaged and unusual checkpoints, adapters, runs and indexes, and the CLI's
reading of them: a clear error naming the fix before anything is written, or the result transformers and peft
themselves give."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import topotuner_lab.weights.streaming as streaming
from topotuner_lab._io.errors import (
    InputFileError,
    ModelLoadError,
    SnapshotMismatchError,
    TopoTunerError,
    UnsupportedArchitectureError,
)
from topotuner_lab.cli import main
from topotuner_lab.weights.extract import extract_snapshot
from topotuner_lab.weights.models import build_tiny_model, load_model
from topotuner_lab.weights.projections import enumerate_projections, projections_in
from topotuner_lab.weights.snapshot import load_snapshot, save_snapshot
from topotuner_lab.weights.streaming import stream_snapshot

Q0 = "model.layers.0.self_attn.q_proj.weight"


def tiny(name="tiny-llama", seed=0, **overrides):
    return build_tiny_model(name, seed=seed, **overrides).model


@pytest.fixture
def base(tmp_path):
    """A tiny LLaMA checkpoint folder (single file) and its model."""
    model = tiny()
    model.save_pretrained(tmp_path / "base")
    return tmp_path / "base", model


@pytest.fixture
def sharded(tmp_path):
    """A tiny LLaMA checkpoint in several shards with an index."""
    model = tiny()
    model.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 2
    return tmp_path / "sharded", model


def index_of(folder: Path) -> dict:
    return json.loads((folder / "model.safetensors.index.json").read_text())


def shard_of(folder: Path, name: str) -> Path:
    return folder / index_of(folder)["weight_map"][name]


def rewrite(path: Path, change) -> None:
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def cli_error(argv, capsys) -> str:
    """Run the CLI; it must fail as a user error (exit 2), with one 'error:' line and its fix, no traceback."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "\nerror: " in f"\n{err}" and "How to fix:" in err, err
    assert "internal error" not in err and "Traceback" not in err
    return err


def trained_lora(model, config):
    """A peft model with ``config`` whose LoRA B (and DoRA magnitudes) are moved off their init, as after training."""
    from peft import get_peft_model

    peft_model = get_peft_model(model, config)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name or "magnitude" in name or "modules_to_save" in name:
                param.add_(torch.randn(param.shape, generator=gen) * 0.05)
    return peft_model


def peft_merged(base_model, adapter: Path):
    """peft's own merge of an adapter folder into a base model: the reference."""
    from peft import PeftModel

    return extract_snapshot(PeftModel.from_pretrained(base_model, str(adapter)).merge_and_unload())


def untouched(path: Path, before: bytes) -> None:
    assert path.read_bytes() == before
    assert not [p for p in path.parent.iterdir() if p.name.startswith(f".{path.name}.")]  # no temporary left


# --- a multimodal Gemma-3 checkpoint: only the language model's layers are projections ---------------------


def tiny_gemma3_multimodal():
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    cfg = Gemma3Config(
        text_config=dict(
            vocab_size=300,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            sliding_window=16,
        ),
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=28,
            patch_size=14,
        ),
        mm_tokens_per_image=4,
    )
    torch.manual_seed(0)
    return Gemma3ForConditionalGeneration(cfg).eval()


def test_multimodal_gemma3_streams_the_language_model_only(tmp_path):
    model = tiny_gemma3_multimodal()
    model.save_pretrained(tmp_path / "g3")
    projections = enumerate_projections(model)
    assert [p.pid for p in projections] == [f"L{i}.{k}" for i in range(2) for k in "qkvo"]
    assert all("language_model" in p.param_name for p in projections)
    expected = extract_snapshot(model)
    snap = load_snapshot(stream_snapshot(tmp_path / "g3", tmp_path / "s.safetensors"))
    assert snap.weights_hash == expected.weights_hash and snap.shapes["L0.q"] == (64, 64)


def test_attention_under_two_unnamed_prefixes_or_twice_is_refused():
    names = [(f"{tower}.layers.0.self_attn.{k}_proj.weight", (8, 8)) for tower in ("a", "b") for k in "qkvo"]
    with pytest.raises(UnsupportedArchitectureError, match="several prefixes"):
        projections_in(names, "llama")
    twice = [
        ("model.layers.0.self_attn.q_proj.weight", (8, 8)),
        ("model.layers.0.self_attn.q_proj.base_layer.weight", (8, 8)),
    ]
    with pytest.raises(UnsupportedArchitectureError, match="same attention projection"):
        projections_in(twice, "llama")


# --- every tensor is checked before writing; an unverified file never replaces a good one -----------------


@pytest.mark.parametrize("shape", [(64, 32), (48, 64), (64,)])
def test_overlay_of_another_shape_is_refused_and_the_old_output_kept(tmp_path, base, shape):
    folder, _ = base
    good = stream_snapshot(folder, tmp_path / "out.safetensors")
    before = good.read_bytes()
    (tmp_path / "run").mkdir()
    save_file({Q0: torch.randn(*shape)}, str(tmp_path / "run" / "trainable.safetensors"))
    with pytest.raises(InputFileError, match=r"q_proj.weight.*has shape"):
        stream_snapshot(tmp_path / "run", good, base=folder)
    untouched(good, before)


def test_a_matrix_that_does_not_fit_the_header_is_never_written(tmp_path, base, monkeypatch):
    folder, _ = base
    good = stream_snapshot(folder, tmp_path / "out.safetensors")
    before = good.read_bytes()
    real = streaming.Checkpoint.read
    monkeypatch.setattr(
        streaming.Checkpoint,
        "read",
        lambda self, name: real(self, name)[:, :7] if "k_proj" in name else real(self, name),
    )
    with pytest.raises(InputFileError, match="header"):
        stream_snapshot(folder, good)
    untouched(good, before)


def test_a_written_file_that_fails_verification_is_not_renamed_into_place(tmp_path, base, monkeypatch):
    folder, _ = base
    good = stream_snapshot(folder, tmp_path / "out.safetensors")
    before = good.read_bytes()
    monkeypatch.setattr(streaming, "combine_hashes", lambda hashes: "f" * 32)  # the header then lies about the data
    with pytest.raises(InputFileError, match="weight hash"):
        stream_snapshot(folder, good)
    untouched(good, before)


# --- adapters merge exactly as peft merges them (or are refused) ---------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {
            "r": 4,
            "lora_alpha": 8,
            "target_modules": ["q_proj", "v_proj"],
            "alpha_pattern": {"model.layers.1.self_attn.q_proj": 32},
        },
        {
            "r": 4,
            "lora_alpha": 16,
            "target_modules": ["q_proj", "k_proj", "o_proj"],
            "rank_pattern": {"q_proj": 2, "layers.1.self_attn.o_proj": 6},
        },
        {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], "use_dora": True},
        {"r": 2, "lora_alpha": 3, "target_modules": ["q_proj", "o_proj"], "use_dora": True, "use_rslora": True},
        {"r": 4, "target_modules": ["v_proj"], "modules_to_save": ["q_proj"]},
    ],
    ids=["alpha_pattern", "rank_pattern", "dora", "dora_rslora", "modules_to_save"],
)
def test_adapter_merges_bit_identically_to_peft(tmp_path, base, kwargs):
    from peft import LoraConfig

    folder, _ = base
    trained_lora(tiny(), LoraConfig(**kwargs)).save_pretrained(tmp_path / "adapter")
    expected = peft_merged(tiny(), tmp_path / "adapter")
    snap = load_snapshot(stream_snapshot(tmp_path / "adapter", tmp_path / "s.safetensors", base=folder))
    assert snap.weights_hash == expected.weights_hash
    assert snap.weights_hash != extract_snapshot(tiny()).weights_hash


def test_a_missing_lora_alpha_is_peft_default_8_not_r(tmp_path, base):
    from peft import LoraConfig

    folder, _ = base
    trained_lora(tiny(), LoraConfig(r=4, lora_alpha=4, target_modules=["q_proj"])).save_pretrained(tmp_path / "a")
    config = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    del config["lora_alpha"]
    (tmp_path / "a" / "adapter_config.json").write_text(json.dumps(config))
    expected = peft_merged(tiny(), tmp_path / "a")
    snap = load_snapshot(stream_snapshot(tmp_path / "a", tmp_path / "s.safetensors", base=folder))
    assert snap.weights_hash == expected.weights_hash


def test_gpt2_adapter_with_patterns_and_dora_merges_as_peft(tmp_path):
    from peft import LoraConfig

    tiny("tiny-gpt2").save_pretrained(tmp_path / "base")
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["c_attn", "c_proj"], fan_in_fan_out=True, use_dora=True,
        alpha_pattern={"h.1.attn.c_attn": 2}, rank_pattern={"c_proj": 2},
    )  # fmt: skip
    trained_lora(tiny("tiny-gpt2"), config).save_pretrained(tmp_path / "adapter")
    expected = peft_merged(tiny("tiny-gpt2"), tmp_path / "adapter")
    snap = load_snapshot(stream_snapshot(tmp_path / "adapter", tmp_path / "s.safetensors", base=tmp_path / "base"))
    assert snap.weights_hash == expected.weights_hash


def test_lora_bias_merges_where_peft_can_and_is_refused_where_peft_refuses(tmp_path):
    from peft import LoraConfig

    config = LoraConfig(r=4, target_modules=["q_proj"], lora_bias=True)
    tiny("tiny-qwen2").save_pretrained(tmp_path / "qwen")  # q_proj has a bias: peft merges
    trained_lora(tiny("tiny-qwen2"), config).save_pretrained(tmp_path / "qa")
    snap = load_snapshot(stream_snapshot(tmp_path / "qa", tmp_path / "q.safetensors", base=tmp_path / "qwen"))
    assert snap.weights_hash == peft_merged(tiny("tiny-qwen2"), tmp_path / "qa").weights_hash
    tiny().save_pretrained(tmp_path / "llama")  # no bias: peft cannot merge lora_bias, so neither do we
    trained_lora(tiny(), config).save_pretrained(tmp_path / "la")
    with pytest.raises(InputFileError, match="peft cannot merge"):
        stream_snapshot(tmp_path / "la", tmp_path / "l.safetensors", base=tmp_path / "llama")


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"init_lora_weights": "pissa"}, "init_lora_weights is 'pissa'"),
        ({"init_lora_weights": "olora"}, "init_lora_weights is 'olora'"),
        ({"alora_invocation_tokens": [1, 2]}, "alora_invocation_tokens"),
        ({"layer_replication": [[0, 2]]}, "layer_replication"),
        ({"peft_type": "IA3"}, "only LoRA"),
        ({"r": 0}, "r is 0"),
        ({"lora_alpha": "8"}, "lora_alpha is '8'"),
        ({"use_dora": "yes"}, "use_dora is 'yes'"),
        ({"rank_pattern": [1]}, "rank_pattern"),
        ({"alpha_pattern": {"q_proj": None}}, "alpha_pattern"),
        ({"target_modules": ["k_proj"]}, "targets model.layers.0.self_attn.k_proj but"),  # tensors for q_proj only
    ],
)
def test_adapter_configs_that_cannot_be_merged_exactly_are_refused(tmp_path, base, edit, message):
    from peft import LoraConfig

    folder, _ = base
    trained_lora(tiny(), LoraConfig(r=4, target_modules=["q_proj"])).save_pretrained(tmp_path / "a")
    config = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    (tmp_path / "a" / "adapter_config.json").write_text(json.dumps({**config, **edit}))
    with pytest.raises(InputFileError, match=message):
        stream_snapshot(tmp_path / "a", tmp_path / "s.safetensors", base=folder)
    assert not (tmp_path / "s.safetensors").exists()


def test_an_adapter_missing_tensors_its_config_targets_is_refused(tmp_path, base):
    from peft import LoraConfig

    folder, _ = base
    trained_lora(tiny(), LoraConfig(r=4, target_modules=["q_proj"])).save_pretrained(tmp_path / "a")
    rewrite(tmp_path / "a" / "adapter_model.safetensors", lambda t: [t.pop(k) for k in list(t) if "layers.1." in k])
    with pytest.raises(InputFileError, match="incomplete"):
        stream_snapshot(tmp_path / "a", tmp_path / "s.safetensors", base=folder)


# --- an adapter or overlay that changes no attention matrix; a finished profile run -------------------------


def test_an_mlp_only_adapter_is_refused(tmp_path, base):
    from peft import LoraConfig

    folder, _ = base
    trained_lora(tiny(), LoraConfig(r=4, target_modules=["gate_proj", "up_proj"])).save_pretrained(tmp_path / "a")
    with pytest.raises(InputFileError, match="changes no attention projection"):
        stream_snapshot(tmp_path / "a", tmp_path / "s.safetensors", base=folder)


def test_an_adapter_for_another_model_is_refused(tmp_path, base):
    from peft import LoraConfig

    folder, _ = base
    trained_lora(tiny("tiny-gpt2"), LoraConfig(r=4, target_modules=["c_attn"], fan_in_fan_out=True)).save_pretrained(
        tmp_path / "gpt2"
    )
    with pytest.raises(InputFileError, match="changes no attention projection"):
        stream_snapshot(tmp_path / "gpt2", tmp_path / "s.safetensors", base=folder)
    trained_lora(tiny(num_hidden_layers=3), LoraConfig(r=4, target_modules=["q_proj"])).save_pretrained(
        tmp_path / "deep"
    )
    with pytest.raises(InputFileError, match="another model"):
        stream_snapshot(tmp_path / "deep", tmp_path / "s.safetensors", base=folder)


@pytest.mark.parametrize(
    "tensors, message",
    [
        ({"encoder.block.0.weight": torch.zeros(64, 64)}, "does not have"),
        ({"model.layers.0.mlp.up_proj.weight": torch.zeros(128, 64)}, "changes no attention projection"),
        ({"L0.q": torch.zeros(64, 64)}, "does not have"),  # a snapshot's tensors are no parameters
    ],
)
def test_an_overlay_that_changes_no_attention_parameter_is_refused(tmp_path, base, tensors, message):
    folder, _ = base
    (tmp_path / "run").mkdir()
    save_file(tensors, str(tmp_path / "run" / "trainable.safetensors"))
    with pytest.raises(InputFileError, match=message):
        stream_snapshot(tmp_path / "run", tmp_path / "s.safetensors", base=folder)


def finished_run(tmp_path: Path, tuned) -> Path:
    """A profile run folder as run_finetune leaves it with --save-snapshot: results.json and after.safetensors."""
    run = tmp_path / "run"
    run.mkdir()
    save_snapshot(extract_snapshot(tuned, name="tiny@sst2-profile", base_model="tiny"), run / "after.safetensors")
    (run / "results.json").write_text("{}")
    return run


def test_a_finished_profile_run_gives_its_own_fine_tuned_snapshot(tmp_path, base):
    folder, _ = base
    tuned = tiny()
    with torch.no_grad():
        tuned.model.layers[1].self_attn.v_proj.weight.add_(0.1)
    run = finished_run(tmp_path, tuned)
    snap = load_snapshot(stream_snapshot(run, tmp_path / "s.safetensors", base=folder))
    assert snap.weights_hash == extract_snapshot(tuned).weights_hash != extract_snapshot(tiny()).weights_hash
    assert (snap.model, snap.base_model) == ("tiny@sst2-profile", "tiny")
    with pytest.raises(TopoTunerError, match="run's own snapshot"):
        stream_snapshot(run, run / "after.safetensors", base=folder)


def test_a_finished_run_of_another_model_or_without_weights_is_refused(tmp_path, base):
    folder, _ = base
    run = finished_run(tmp_path, tiny(num_hidden_layers=3))
    with pytest.raises(SnapshotMismatchError, match="another model"):
        stream_snapshot(run, tmp_path / "s.safetensors", base=folder)
    (run / "after.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="--save-snapshot"):
        stream_snapshot(run, tmp_path / "s.safetensors", base=folder)
    (run / "checkpoint-3").mkdir()
    save_file({Q0: torch.zeros(64, 64)}, str(run / "checkpoint-3" / "trainable.safetensors"))
    with pytest.raises(ModelLoadError, match="checkpoint-3"):
        stream_snapshot(run, tmp_path / "s.safetensors", base=folder)


# --- the index is cross-checked against the shards ------------------------------------------------------------


def test_an_index_listing_a_tensor_its_shard_lacks_is_refused(tmp_path, sharded):
    folder, _ = sharded
    rewrite(shard_of(folder, Q0), lambda t: t.pop(Q0))
    with pytest.raises(InputFileError, match="no shard holds it"):
        stream_snapshot(folder, tmp_path / "s.safetensors")
    assert not (tmp_path / "s.safetensors").exists()


def test_a_tensor_in_two_shards_is_refused(tmp_path, sharded):
    folder, model = sharded
    other = next(p for p in sorted(folder.glob("*.safetensors")) if p != shard_of(folder, Q0))
    rewrite(other, lambda t: t.update({Q0: torch.zeros(64, 64)}))
    with pytest.raises(InputFileError, match="stored twice"):
        stream_snapshot(folder, tmp_path / "s.safetensors")


def test_an_index_naming_the_wrong_shard_or_missing_a_tensor_is_refused(tmp_path, sharded):
    folder, _ = sharded
    index = index_of(folder)
    right = index["weight_map"][Q0]
    index["weight_map"][Q0] = next(s for s in index["weight_map"].values() if s != right)
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(InputFileError, match="but it is stored in"):
        stream_snapshot(folder, tmp_path / "s.safetensors")
    del index["weight_map"][Q0]
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(InputFileError, match="does not list"):
        stream_snapshot(folder, tmp_path / "s.safetensors")
    index["weight_map"][Q0] = "model-09-of-09.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(InputFileError, match="shards that are missing"):
        stream_snapshot(folder, tmp_path / "s.safetensors")


def test_an_index_leaving_out_a_whole_shard_is_refused(tmp_path):
    tiny().save_pretrained(tmp_path / "ckpt", max_shard_size="10KB")  # about one tensor per shard
    folder = tmp_path / "ckpt"
    index = index_of(folder)
    lone = next(
        n
        for n, s in index["weight_map"].items()
        if "self_attn" in n and list(index["weight_map"].values()).count(s) == 1
    )
    del index["weight_map"][lone]
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(InputFileError, match="does not list"):
        stream_snapshot(folder, tmp_path / "s.safetensors")


@pytest.mark.parametrize("drop", ["model.layers.0.self_attn.k_proj.weight", "model.layers.1.self_attn.o_proj.weight"])
def test_a_checkpoint_missing_a_projection_is_refused(tmp_path, base, drop):
    folder, _ = base
    rewrite(folder / "model.safetensors", lambda t: t.pop(drop))
    with pytest.raises(InputFileError, match=r"missing \['L[01]\.[ko]'\]"):
        stream_snapshot(folder, tmp_path / "s.safetensors")


# --- only float weights (or properly dequantized FP8); shapes must fit the config -----------------------------


@pytest.mark.parametrize("dtype", [torch.int8, torch.bool, torch.float8_e4m3fn, torch.uint8])
def test_non_float_weights_are_refused(tmp_path, base, dtype):
    folder, _ = base
    rewrite(folder / "model.safetensors", lambda t: t.update({Q0: t[Q0].to(dtype)}))
    with pytest.raises(InputFileError, match="q_proj.weight.*(not a float type|FP8 without its weight_scale_inv)"):
        stream_snapshot(folder, tmp_path / "s.safetensors")


def test_fp8_weights_are_dequantized_as_transformers_does(tmp_path, base):
    from transformers import AutoModelForCausalLM, FineGrainedFP8Config

    folder, _ = base

    def quantize(tensors):  # 32x32 blocks, as DeepSeek/Qwen FP8 checkpoints store 128x128 ones
        for name in [n for n in tensors if "self_attn" in n]:
            weight = tensors[name]
            blocks = weight.reshape(weight.shape[0] // 32, 32, weight.shape[1] // 32, 32)
            inverse = blocks.abs().amax(dim=(1, 3)) / 448.0
            tensors[name] = (blocks / inverse[:, None, :, None]).reshape(weight.shape).to(torch.float8_e4m3fn)
            tensors[name + "_scale_inv"] = inverse

    rewrite(folder / "model.safetensors", quantize)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fp8",
        "weight_block_size": [32, 32],
        "activation_scheme": "dynamic",
    }
    (folder / "config.json").write_text(json.dumps(config))
    reference = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, quantization_config=FineGrainedFP8Config(dequantize=True)
    )
    snap = load_snapshot(stream_snapshot(folder, tmp_path / "s.safetensors"))
    assert snap.weights_hash == extract_snapshot(reference).weights_hash
    assert snap.weights_hash != extract_snapshot(tiny()).weights_hash  # FP8 rounding: not the float weights
    np.testing.assert_allclose(snap.matrices["L0.q"], extract_snapshot(tiny()).matrices["L0.q"], atol=0.01)


@pytest.mark.parametrize("shape", [(48, 64), (64,), (2, 64, 32), (0, 64)])
def test_a_base_projection_of_the_wrong_shape_is_refused(tmp_path, base, shape):
    folder, _ = base
    rewrite(folder / "model.safetensors", lambda t: t.update({Q0: torch.zeros(shape)}))
    with pytest.raises(InputFileError, match="q_proj"):
        stream_snapshot(folder, tmp_path / "s.safetensors")


# --- "internal error" cases: each is a user error (exit 2) with its fix ------------------------------------------


def _write(path: Path, text: str) -> None:
    path.write_text(text)


def _q_proj(shape):
    return lambda folder: rewrite(folder / "model.safetensors", lambda t: t.update({Q0: torch.zeros(shape)}))


DAMAGE = {
    "config not JSON": (lambda f: _write(f / "config.json", "{not json"), "not valid JSON"),
    "config a list": (lambda f: _write(f / "config.json", "[]"), "JSON list"),
    "config binary": (lambda f: (f / "config.json").write_bytes(b"\xff\xfe\x00"), "not valid JSON"),
    "1-D q_proj": (_q_proj((64,)), "q_proj"),
    "3-D q_proj": (_q_proj((2, 64, 32)), "q_proj"),
}
INDEX_DAMAGE = {
    "index not JSON": ("{", "not valid JSON"),
    "index a list": ("[]", "JSON list"),
    "index without weight_map": ('{"metadata": {}}', "weight_map"),
    "weight_map a list": ('{"weight_map": []}', "weight_map"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_cli_extract_of_a_damaged_checkpoint_is_a_user_error(tmp_path, base, capsys, case):
    folder, _ = base
    damage, message = DAMAGE[case]
    damage(folder)
    assert message in cli_error(["extract", str(folder), "-o", str(tmp_path / "s.safetensors")], capsys)


@pytest.mark.parametrize("case", sorted(INDEX_DAMAGE))
def test_cli_extract_with_a_damaged_index_is_a_user_error(tmp_path, sharded, capsys, case):
    folder, _ = sharded
    text, message = INDEX_DAMAGE[case]
    (folder / "model.safetensors.index.json").write_text(text)
    assert message in cli_error(["extract", str(folder), "-o", str(tmp_path / "s.safetensors")], capsys)


@pytest.fixture
def adapter(tmp_path):
    from peft import LoraConfig

    trained_lora(tiny(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).save_pretrained(tmp_path / "adapter")
    return tmp_path / "adapter"


def test_cli_adapter_errors_are_user_errors(tmp_path, base, adapter, capsys):
    folder, _ = base
    out = str(tmp_path / "s.safetensors")
    err = cli_error(["extract", str(adapter), "-o", out], capsys)
    assert "is a LoRA adapter" in err and "--base" in err
    weights = adapter / "adapter_model.safetensors"
    saved = weights.read_bytes()
    rewrite(weights, lambda t: t.update({k: v[:0] if "lora_A" in k else v[:, :0] for k, v in t.items()}))
    assert "rank >= 1" in cli_error(["extract", str(adapter), "--base", str(folder), "-o", out], capsys)
    weights.write_bytes(saved)
    tiny(hidden_size=32, num_attention_heads=2, num_key_value_heads=1).save_pretrained(tmp_path / "narrow")
    assert "another width" in cli_error(
        ["extract", str(adapter), "--base", str(tmp_path / "narrow"), "-o", out], capsys
    )
    (adapter / "adapter_config.json").write_text("{r: 4")
    assert "not valid JSON" in cli_error(["extract", str(adapter), "--base", str(folder), "-o", out], capsys)
    assert not Path(out).exists()


def test_load_model_of_files_that_are_no_model_says_what_they_are(tmp_path, base, adapter):
    import struct

    folder, _ = base
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF" + struct.pack("<I", 3) + b"\x01\x02")  # struct.error inside the GGUF reader
    with pytest.raises(ModelLoadError, match="not a GGUF model"):
        load_model(fake)
    with pytest.raises(ModelLoadError, match="no usable tokenizer"):
        load_model(folder)  # save_pretrained of the model alone: no tokenizer files
    with pytest.raises(ModelLoadError, match="single .safetensors file, not a model"):
        load_model(folder / "model.safetensors")
    with pytest.raises(ModelLoadError, match="LoRA adapter"):
        load_model(adapter)
    (folder / "config.json").write_text("[]")
    with pytest.raises(InputFileError, match="JSON list"):
        load_model(folder)


# --- peak memory does not grow with the layer count ---------------------------------------------------------


def _peak_rss_mb(folder: Path, output: Path) -> float:
    """Peak resident memory of ``topotuner-lab extract FOLDER`` in a fresh process (its own VmHWM)."""
    code = (
        "import re, sys; from topotuner_lab.cli import main; assert main(sys.argv[1:]) == 0; "
        "print(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, "-c", code, "extract", str(folder), "-o", str(output)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return int(run.stdout.split()[-1]) / 1024


def test_streaming_peak_memory_does_not_grow_with_the_layer_count(tmp_path):
    """Extraction of 2 and 10 layers of 1024-wide attention (16 MB of float32 per layer) peaks alike.

    Before the fix, the CLI's read-back of the written snapshot kept every page of it resident: +16 MB per layer.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    peaks = {}
    for layers in (2, 10):
        config = LlamaConfig(
            vocab_size=512, hidden_size=1024, intermediate_size=64, num_attention_heads=8, num_key_value_heads=8,
            num_hidden_layers=layers,
        )  # fmt: skip
        LlamaForCausalLM(config).save_pretrained(tmp_path / f"m{layers}")
        peaks[layers] = _peak_rss_mb(tmp_path / f"m{layers}", tmp_path / f"s{layers}.safetensors")
        assert (tmp_path / f"s{layers}.safetensors").stat().st_size > layers * 16e6
        shutil.rmtree(tmp_path / f"m{layers}")
    assert peaks[10] - peaks[2] < 40, peaks  # 8 more layers: +128 MB if the peak grew with them
