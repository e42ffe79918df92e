"""Fuzzing what streaming extraction reads: adapter configs and weights, profile-run overlays, checkpoint indexes.
"A clean error or the correct result, never a traceback, never a wrong number": an accepted adapter gives exactly
peft's own merge of it, an accepted overlay exactly the base with those tensors replaced, an accepted index exactly
the checkpoint's snapshot."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from topotuner_lab._io.errors import TopoTunerError
from topotuner_lab.weights.extract import extract_snapshot
from topotuner_lab.weights.models import build_tiny_model
from topotuner_lab.weights.snapshot import load_snapshot
from topotuner_lab.weights.streaming import stream_snapshot

FUZZ = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 70) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
MODULES = st.sampled_from(["q_proj", "k_proj", "v_proj", "o_proj", "layers.1.self_attn.q_proj", "mlp.up_proj", "x"])
#: values that mean something to the adapter config field they go into, and any JSON
ADAPTER_FIELDS = {
    "r": st.integers(-1, 8),
    "lora_alpha": st.integers(-4, 64) | st.floats(-4, 64),
    "rank_pattern": st.dictionaries(MODULES, st.integers(0, 8), max_size=2),
    "alpha_pattern": st.dictionaries(MODULES, st.integers(-4, 64) | st.floats(-4, 64), max_size=2),
    "use_rslora": st.booleans(),
    "use_dora": st.booleans(),
    "fan_in_fan_out": st.booleans(),
    "init_lora_weights": st.sampled_from([True, False, "gaussian", "pissa", "olora", "loftq", "eva", "corda"]),
    "target_modules": st.lists(MODULES, min_size=1, max_size=3) | MODULES,
    "modules_to_save": st.none() | st.lists(MODULES, max_size=2),
    "layers_to_transform": st.none() | st.lists(st.integers(0, 2), max_size=2) | st.integers(0, 2),
    "exclude_modules": st.none() | st.lists(MODULES, max_size=2),
    "lora_bias": st.booleans(),
    "peft_type": st.sampled_from(["LORA", "IA3", "LOHA", "lora"]),
    "use_qalora": st.booleans(),
}
BASE_PARAMS = [
    f"model.layers.{i}.{part}.weight"
    for i in range(2)
    for part in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.up_proj")
]


def tiny():
    return build_tiny_model("tiny-llama").model


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from peft import LoraConfig, get_peft_model

    tmp = tmp_path_factory.mktemp("ckpt")
    tiny().save_pretrained(tmp / "base")
    tiny().save_pretrained(tmp / "sharded", max_shard_size="40KB")
    peft_model = get_peft_model(tiny(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj"]))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    peft_model.save_pretrained(tmp / "adapter")
    return {"tmp": tmp, "snapshot": extract_snapshot(tiny()).weights_hash}


def streamed(source: Path, out: Path, base: Path | None = None) -> str | None:
    """The streamed snapshot's weight hash, or None for a clean refusal (nothing written then)."""
    try:
        result = load_snapshot(stream_snapshot(source, out, base=base)).weights_hash
    except TopoTunerError as exc:
        assert not out.exists()
        event(f"refused: {re.sub(r'/[^ ]*', 'PATH', exc.problem)[:50]}")
        return None
    event("accepted")
    return result


def peft_reference(adapter: Path) -> str:
    """peft's own merge of the adapter folder into the base: what an accepted adapter must give."""
    from peft import PeftModel

    return extract_snapshot(PeftModel.from_pretrained(tiny(), str(adapter)).merge_and_unload()).weights_hash


@FUZZ
@given(edits=st.lists(st.sampled_from(sorted(ADAPTER_FIELDS)), min_size=1, max_size=3, unique=True), data=st.data())
def test_fuzzed_adapter_configs_merge_as_peft_or_fail_cleanly(world, tmp_path_factory, edits, data):
    folder = tmp_path_factory.mktemp("adapter") / "a"
    shutil.copytree(world["tmp"] / "adapter", folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    for name in edits:
        if data.draw(st.booleans(), label=f"drop {name}"):
            config.pop(name, None)
        else:
            config[name] = data.draw(ADAPTER_FIELDS[name] | JSON, label=name)
    (folder / "adapter_config.json").write_text(json.dumps(config))
    ours = streamed(folder, folder.parent / "s.safetensors", world["tmp"] / "base")
    if ours is not None:  # accepted: exactly peft's merge (which must itself accept the adapter)
        assert ours == peft_reference(folder)


@FUZZ
@given(position=st.integers(0, 10**9), byte=st.integers(0, 255), cut=st.booleans())
def test_fuzzed_adapter_weights_merge_as_peft_or_fail_cleanly(world, tmp_path_factory, position, byte, cut):
    folder = tmp_path_factory.mktemp("adapter") / "a"
    shutil.copytree(world["tmp"] / "adapter", folder)
    weights = folder / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    where = position % len(data)
    data = data[:where] if cut else data[:where] + bytes([byte]) + data[where + 1 :]
    weights.write_bytes(bytes(data))
    ours = streamed(folder, folder.parent / "s.safetensors", world["tmp"] / "base")
    if ours is not None:
        assert ours == peft_reference(folder)


OVERLAY_TENSOR = st.tuples(
    st.sampled_from([*BASE_PARAMS, "L0.q", "model.layers.7.self_attn.q_proj.weight", "lm_head.bias"]),
    st.none() | st.lists(st.sampled_from([0, 1, 32, 64, 128]), min_size=0, max_size=3),  # None: the base's shape
    st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.bool, torch.float8_e4m3fn]),
)


@FUZZ
@given(tensors=st.lists(OVERLAY_TENSOR, min_size=1, max_size=3, unique_by=lambda t: t[0]), seed=st.integers(0, 99))
def test_fuzzed_overlays_replace_exactly_their_tensors_or_fail_cleanly(world, tmp_path_factory, tensors, seed):
    run = tmp_path_factory.mktemp("run")
    gen = torch.Generator().manual_seed(seed)
    shapes = {name: tuple(p.shape) for name, p in tiny().named_parameters()}
    overlay = {
        name: torch.randn(shapes.get(name, (64, 64)) if shape is None else tuple(shape), generator=gen).to(dtype)
        for name, shape, dtype in tensors
    }
    save_file(overlay, str(run / "trainable.safetensors"))
    ours = streamed(run, run / "s.safetensors", world["tmp"] / "base")
    if ours is None:
        return
    tuned = tiny()  # accepted: the base with exactly these tensors in place
    tuned.load_state_dict({name: t.float() for name, t in overlay.items()}, strict=False)
    assert ours == extract_snapshot(tuned).weights_hash
    assert all(overlay[n].dtype in (torch.float32, torch.bfloat16, torch.float16) for n in overlay if "attn" in n)


@FUZZ
@given(value=JSON)
def test_fuzzed_index_json_is_refused_cleanly(world, tmp_path_factory, value):
    folder = tmp_path_factory.mktemp("index") / "ckpt"
    shutil.copytree(world["tmp"] / "sharded", folder)
    (folder / "model.safetensors.index.json").write_text(json.dumps(value))
    ours = streamed(folder, folder.parent / "s.safetensors")
    assert ours is None or ours == world["snapshot"]


@FUZZ
@given(
    edits=st.lists(
        st.tuples(st.sampled_from(["drop", "move", "add", "rename"]), st.integers(0, 100), st.text(max_size=12)),
        min_size=1,
        max_size=3,
    )
)
def test_fuzzed_weight_maps_give_the_checkpoint_or_fail_cleanly(world, tmp_path_factory, edits):
    folder = tmp_path_factory.mktemp("index") / "ckpt"
    shutil.copytree(world["tmp"] / "sharded", folder)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    weight_map = index["weight_map"]
    shards = sorted(set(weight_map.values()))
    for op, which, text in edits:
        names = sorted(weight_map)
        name = names[which % len(names)] if names else text
        if op == "drop":
            weight_map.pop(name, None)
        elif op == "move":
            weight_map[name] = shards[which % len(shards)]
        elif op == "add":
            weight_map[text or "x"] = shards[which % len(shards)]
        else:
            weight_map[name] = text
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    ours = streamed(folder, folder.parent / "s.safetensors")
    assert ours is None or ours == world["snapshot"]
