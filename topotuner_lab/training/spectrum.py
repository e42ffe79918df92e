"""Spectrum's top-N% selection as the authors ran it: the fine-tune method ``spectrum-top5``.

Spectrum (cognitivecomputations/spectrum, ``spectrum.py``) scores every module with a weight by its SNR
(:func:`~topotuner_lab.topology.spectral.spectrum_snr`; a 1-D weight as one row, whose SNR is exactly 1), groups the
modules by weight type (the name after the layer index: ``self_attn.q_proj``, ``mlp.down_proj``,
``input_layernorm``...; a module outside the layers is its own type), keeps the ``int(n * N / 100)`` highest of each
type (ties in model order) and writes an ``unfrozen_parameters`` list that also always names ``^lm_head.weight$`` and
``^model.embed_tokens.weight$``. The authors' runs froze everything else and trained what those patterns match:
attention and MLP matrices, norms, the embeddings and the head (~16% of Llama-3.1-8B at 5%).

A card holds attention projections only, so this is a method of its own, computed from the pretrained weights at
the start of the run (:func:`apply_spectrum`), not a card.

References
----------
FDataLab/TopoTuner (commit 5e10056c6cb0069dba7c189417188b551286dffb): ``codes/models/spectrum/spectrum.py``
(``get_weight_types``, ``calculate_snr_for_layer``, ``generate_unfrozen_params_yaml``; the grid scans every type,
``--non-interactive``); ``codes/models/spectrum/run_competitor_spectrum_tri_task_grid.py`` (top 5% by default,
``write_spectrum_unfrozen_yaml_from_snr_json``: a NaN SNR ranks last; ``train_one`` applies the YAML with no
module filter); ``codes/models/gsm8k/finetune_gsm8k_competitor.py`` (``_match_pattern``: a pattern with ``^`` or
``$`` is a regular expression, any other a substring of the parameter name; ``apply_spectrum_freezing``).
"""

from __future__ import annotations

import math
import re
import weakref
from typing import TypedDict, cast

import numpy as np
import torch

from topotuner_lab._io.errors import ParameterError
from topotuner_lab.topology.spectral import spectrum_snr

#: the share of each weight type the ``spectrum-top5`` method trains, in percent
TOP_PERCENT = 5
#: what Spectrum's YAML unfreezes whatever the SNRs (the head and the input embeddings)
ALWAYS_UNFROZEN: tuple[str, ...] = ("^lm_head.weight$", "^model.embed_tokens.weight$")

#: per pretrained model object and percent, its selection (the SVDs are computed once per process)
_SELECTIONS: weakref.WeakKeyDictionary[torch.nn.Module, dict[int, list[str]]] = weakref.WeakKeyDictionary()


class SpectrumRecord(TypedDict):
    """``results.json``'s ``spectrum`` field: the percent and the ``unfrozen_parameters`` patterns it trained."""

    top_percent: int
    unfrozen_parameters: list[str]


def weight_type(module_name: str) -> str:
    """Spectrum's weight type of a module: its name after the first all-digit part (the layer index), else itself."""
    parts = module_name.split(".")
    index = next((i for i, part in enumerate(parts) if part.isdigit()), -1)
    return ".".join(parts[index + 1 :]) if index != -1 else module_name


def _types_in_scan_order(model: torch.nn.Module) -> list[str]:
    """Every weight type, in the order Spectrum scans them (by first name component, then name)."""
    types = {
        weight_type(name)
        for name, module in model.named_modules()
        if any(hasattr(module, attr) for attr in ("weight", "bias", "inv_freq"))
    }
    return sorted(types, key=lambda t: (t.split(".")[0], t))


def _weighted_modules(model: torch.nn.Module) -> dict[str, str]:
    """Module name -> the type Spectrum files it under, in the order its SNR table lists them.

    A type's members are the modules whose name contains it (Spectrum's substring test); a module that falls under
    two types keeps its first place and the later type, as Spectrum's dict does.
    """
    typed: dict[str, str] = {}
    modules = [(name, m) for name, m in model.named_modules() if isinstance(getattr(m, "weight", None), torch.Tensor)]
    for layer_type in _types_in_scan_order(model):
        for name, _ in modules:
            if layer_type in name:
                typed[name] = layer_type
    return typed


def _snr(weight: torch.Tensor) -> float:
    """Spectrum's SNR of one weight (1-D as one row); NaN ranks last, as the authors' grid script maps it."""
    value = spectrum_snr(np.atleast_2d(weight.detach().to("cpu", torch.float64).numpy()))
    return -math.inf if math.isnan(value) else value


def spectrum_patterns(model: torch.nn.Module, top_percent: int = TOP_PERCENT) -> list[str]:
    """Spectrum's ``unfrozen_parameters`` for ``model``: :data:`ALWAYS_UNFROZEN`, then the top modules of each type.

    Each type keeps ``int(n * top_percent / 100)`` of its ``n`` modules, highest SNR first (ties in model order);
    a type that keeps none is not scored (the selection is the same, without its SVDs).
    """
    typed = _weighted_modules(model)
    by_type: dict[str, list[str]] = {}
    for name, layer_type in typed.items():
        by_type.setdefault(layer_type, []).append(name)
    picked: list[str] = []
    for names in by_type.values():
        keep = int(len(names) * top_percent / 100)
        if keep:
            scores = {name: _snr(cast(torch.Tensor, model.get_submodule(name).weight)) for name in names}
            picked += sorted(names, key=lambda n: scores[n], reverse=True)[:keep]  # stable: ties keep model order
    return [*ALWAYS_UNFROZEN, *picked]


def matches(name: str, pattern: str) -> bool:
    """Whether a parameter name matches an ``unfrozen_parameters`` pattern, as the authors' fine-tune applied it.

    A pattern that starts with ``^`` or ends with ``$`` is a regular expression (searched); any other is a substring.
    """
    if pattern.startswith("^") or pattern.endswith("$"):
        return re.search(pattern, name) is not None
    return pattern in name


def apply_spectrum(
    model: torch.nn.Module, pretrained: torch.nn.Module, top_percent: int = TOP_PERCENT
) -> tuple[list[str], SpectrumRecord]:
    """Freeze ``model`` but what Spectrum's top ``top_percent``% selection of ``pretrained`` names.

    ``model`` is a copy of ``pretrained`` about to train; the SNRs are of ``pretrained`` (computed once per model
    object). Returns the trainable parameter names and the record the results keep.

    Raises
    ------
    ParameterError
        When the patterns match no parameter of ``model`` (names unlike Llama's ``model.layers.N``).
    """
    selections = _SELECTIONS.setdefault(pretrained, {})
    if top_percent not in selections:
        selections[top_percent] = spectrum_patterns(pretrained, top_percent)
    patterns = selections[top_percent]
    trainable: list[str] = []
    for name, param in model.named_parameters():
        param.requires_grad_(any(matches(name, p) for p in patterns))
        if param.requires_grad:
            trainable.append(name)
    if not trainable:
        raise ParameterError(
            f"Spectrum's top {top_percent}% selection matches no parameter of this model (patterns {patterns[:4]})",
            "train a model with Llama-style parameter names (model.embed_tokens, model.layers.N, lm_head), or "
            "another method",
        )
    return trainable, {"top_percent": top_percent, "unfrozen_parameters": patterns}
