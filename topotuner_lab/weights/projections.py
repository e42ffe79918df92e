"""Attention projections of a transformer, with stable ids such as ``L12.q``.

Each supported architecture maps parameter names to (layer, kind) with a regular expression.
A matrix is always returned in ``nn.Linear`` layout (out_features x in_features), so its rows
are the output neurons; GPT-2's fused, transposed ``c_attn`` is split into q, k and v.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

from topotuner_lab._io.errors import ParameterError, UnsupportedArchitectureError

if TYPE_CHECKING:
    import numpy as np
    import torch

#: a stored weight: a torch tensor (a loaded model) or a numpy array (a checkpoint read tensor by tensor)
Weight = TypeVar("Weight", "torch.Tensor", "np.ndarray")

KINDS: tuple[str, ...] = ("q", "k", "v", "o")

# ``(?:base_layer\.)?`` also finds the frozen base weight inside a peft LoRA layer.
_LLAMA_LIKE = (
    r"(?:^|\.)layers\.(\d+)\.self_attn\.(q|k|v|o)_proj\.(?:base_layer\.)?weight$",
    {"q": "q", "k": "k", "v": "v", "o": "o"},
)
_BERT_LIKE = (
    r"(?:^|\.)layer\.(\d+)\.attention\.(?:self\.(query|key|value)|output\.(dense))\.(?:base_layer\.)?weight$",
    {"query": "q", "key": "k", "value": "v", "dense": "o"},
)
_GPT2 = (r"(?:^|\.)h\.(\d+)\.attn\.(c_attn|c_proj)\.(?:base_layer\.)?weight$", {"c_attn": "qkv", "c_proj": "o"})

#: model_type -> (parameter-name pattern, name-to-kind map)
ARCHITECTURES: dict[str, tuple[str, dict[str, str]]] = {
    **{
        t: _LLAMA_LIKE
        for t in (
            "llama",
            "mistral",
            "mixtral",
            "qwen2",
            "qwen3",
            "qwen2_moe",
            "qwen3_moe",
            "gemma",
            "gemma2",
            "gemma3",
            "gemma3_text",
            "olmo",
            "olmo2",
        )
    },
    **{t: _BERT_LIKE for t in ("bert", "roberta", "xlm-roberta", "electra")},
    "gpt2": _GPT2,
}


def is_llama_like(architecture: str) -> bool:
    """True when the architecture names its projections ``model.layers.N.self_attn.{q,k,v,o}_proj``."""
    return ARCHITECTURES.get(architecture) is _LLAMA_LIKE


@dataclass(frozen=True)
class Projection:
    """One attention projection matrix: where it lives in the model and how to read it."""

    pid: str
    layer: int
    kind: str
    param_name: str
    transposed: bool = False  # stored as (in, out), e.g. GPT-2 Conv1D
    row_start: int = 0  # rows [row_start, row_stop) of the (out x in) matrix; fused q/k/v
    row_stop: int | None = None

    def from_weight(self, weight: Weight) -> Weight:
        """The (out x in) rows of this projection in a stored weight tensor (transposed and sliced as needed)."""
        weight = weight.T if self.transposed else weight
        return weight[self.row_start : self.row_stop]

    def matrix(self, model: torch.nn.Module) -> torch.Tensor:
        """The projection as an (out x in) tensor; under a LoRA adapter, the merged weight W + BA."""
        weight = model.get_parameter(self.param_name)
        if ".base_layer." in self.param_name:
            # a peft LoRA layer; its methods are not on ``torch.nn.Module``
            lora_layer = cast(Any, model.get_submodule(self.param_name.rsplit(".base_layer.", 1)[0]))
            for adapter in getattr(lora_layer, "active_adapters", []):
                weight = weight + lora_layer.get_delta_weight(adapter)
        return self.from_weight(weight)


def count_parameters(model: torch.nn.Module, *, trainable_only: bool = False) -> int:
    """Parameters of ``model``: all of them, or only those with ``requires_grad``."""
    return int(sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only))


def model_type(model: torch.nn.Module) -> str:
    """The ``model_type`` of a model's config (of the base model under a peft wrapper), else its class name."""
    if hasattr(model, "get_base_model"):  # a peft wrapper
        model = cast(Any, model).get_base_model()
    config = getattr(model, "config", None)
    return str(getattr(config, "model_type", type(model).__name__))


def enumerate_projections(model: torch.nn.Module) -> list[Projection]:
    """All attention projections of ``model``, ordered by layer then q, k, v, o."""
    return projections_in(((name, tuple(p.shape)) for name, p in model.named_parameters()), model_type(model))


#: a prefix naming one of these belongs to another modality's tower (a multimodal checkpoint), never the language model
_OTHER_TOWERS = re.compile(r"vision|visual|image|audio|speech")
_LANGUAGE_MODEL = re.compile(r"(?:^|\.)(?:language_model|text_model)(?:\.|$)")


def _pattern(mtype: str) -> tuple[re.Pattern[str], dict[str, str]]:
    if mtype not in ARCHITECTURES:
        raise UnsupportedArchitectureError(
            f"architecture {mtype!r} is not supported for attention-projection enumeration",
            f"use a model of a supported type: {', '.join(sorted(ARCHITECTURES))}; "
            "or add a pattern for it to topotuner_lab.weights.projections.ARCHITECTURES",
        )
    pattern, kinds = ARCHITECTURES[mtype]
    return re.compile(pattern), kinds


def language_model_matches(names: Iterable[str], mtype: str) -> dict[str, tuple[int, str]]:
    """``name -> (layer, stored kind)`` for the parameter names that are attention projections of the language model.

    A multimodal checkpoint also has a vision (or audio) tower whose layers match the same pattern; those are left
    out. Two language-model candidates (neither named ``language_model`` nor ``text_model``) are refused, as are two
    names for one projection.
    """
    regex, kinds = _pattern(mtype)
    groups: dict[str, dict[str, tuple[int, str]]] = {}
    for name in names:
        match = regex.search(name)
        if match:
            raw = next(g for g in match.groups()[1:] if g)
            groups.setdefault(name[: match.start()], {})[name] = (int(match.group(1)), kinds[raw])
    candidates = [prefix for prefix in groups if not _OTHER_TOWERS.search(prefix)]
    if len(candidates) > 1:
        named = [prefix for prefix in candidates if _LANGUAGE_MODEL.search(prefix)]
        if len(named) != 1:
            raise UnsupportedArchitectureError(
                f"attention layers under several prefixes ({', '.join(sorted(candidates))}) and not one of them is "
                "clearly the language model",
                "extract a checkpoint of the language model alone (its layers under one prefix)",
            )
        candidates = named
    chosen = groups[candidates[0]] if candidates else {}
    seen: dict[tuple[int, str], str] = {}
    for name, key in chosen.items():
        if key in seen:
            raise UnsupportedArchitectureError(
                f"two tensors are the same attention projection (layer {key[0]}, {key[1]}): {seen[key]} and {name}",
                "extract a checkpoint with one tensor per projection (one language model, one copy of each weight)",
            )
        seen[key] = name
    return chosen


def projections_in(named_shapes: Iterable[tuple[str, tuple[int, ...]]], mtype: str) -> list[Projection]:
    """The attention projections among parameter (or checkpoint tensor) names and shapes of a ``mtype`` model.

    Only the language model's layers count: a multimodal model's vision tower is left out.
    """
    shapes = dict(named_shapes)
    found: list[Projection] = []
    for name, (layer, kind) in language_model_matches(shapes, mtype).items():
        if kind == "qkv":  # GPT-2: Conv1D weight (in, 3*out), q/k/v stacked along out
            width = shapes[name][-1] // 3
            for i, sub in enumerate("qkv"):
                found.append(Projection(f"L{layer}.{sub}", layer, sub, name, True, i * width, (i + 1) * width))
        else:
            found.append(Projection(f"L{layer}.{kind}", layer, kind, name, mtype == "gpt2"))
    if not found:
        raise UnsupportedArchitectureError(
            f"no attention projections found in a {mtype!r} model",
            "check that the model is a standard Hugging Face implementation (custom remote code may rename layers)",
        )
    found.sort(key=lambda p: (p.layer, KINDS.index(p.kind)))
    return found


def _config_ints(config: dict[str, Any]) -> dict[str, int]:
    """The positive whole numbers of a model config (of its ``text_config`` for a multimodal model)."""
    text = config.get("text_config")
    cfg = text if isinstance(text, dict) else config
    return {k: v for k, v in cfg.items() if isinstance(v, int) and not isinstance(v, bool) and v > 0}


def expected_layers(config: dict[str, Any]) -> int | None:
    """The language model's layer count under a model config (``config.json``); None if it does not say."""
    ints = _config_ints(config)
    return ints.get("num_hidden_layers", ints.get("n_layer"))


def expected_shape(config: dict[str, Any], mtype: str, kind: str) -> tuple[int, int] | None:
    """The (out x in) shape a ``kind`` projection has under a model config (``config.json``); None if it cannot tell.

    A multimodal config's ``text_config`` describes the language model.
    """
    ints = _config_ints(config)
    if mtype == "gpt2":
        return (ints["n_embd"], ints["n_embd"]) if "n_embd" in ints else None
    hidden, heads = ints.get("hidden_size"), ints.get("num_attention_heads")
    if hidden is None or heads is None:
        return None
    if not is_llama_like(mtype):  # BERT-like: square
        return (hidden, hidden)
    head_dim = ints.get("head_dim", hidden // heads)
    kv = ints.get("num_key_value_heads", heads)
    return {"q": (heads * head_dim, hidden), "k": (kv * head_dim, hidden), "v": (kv * head_dim, hidden)}.get(
        kind, (hidden, heads * head_dim)
    )


PID_PATTERN = re.compile(r"L(\d+)\.([qkvo])")


def parse_pid(pid: str) -> tuple[int, str]:
    """``"L12.q"`` -> ``(12, "q")``."""
    match = PID_PATTERN.fullmatch(pid) if isinstance(pid, str) else None
    if not match:
        raise ParameterError(
            f"{pid!r} is not a projection id", "ids look like 'L12.q' (layer number, then one of q, k, v, o)"
        )
    return int(match.group(1)), match.group(2)
