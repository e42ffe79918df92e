"""How much of a model a fine-tune changed: Upd.% and the mean relative change, beside Train.%.

Train.% (``trainable_fraction``) counts the parameters that had ``requires_grad``; what a run actually moved can be
less (a card's rows that got no gradient, embedding rows of tokens never seen) or, for LoRA, far more: its few
adapter parameters change every entry of the matrices they wrap. :func:`update_measures` compares the trained model
with the pretrained one, parameter by parameter, without a second copy of either: the pretrained model stays in
memory unchanged (``run_finetune`` trains a copy), and one parameter's difference exists at a time.

References
----------
FDataLab/TopoTuner, ``codes/analysis/freeze_comparison_multi_metric.py`` (commit c8ab0bd): ``frac_changed``
(entries with ``|dw| > 0``) and ``mean_pct_change`` (mean of ``|dw| / (|w| + 1e-6)``, ``EPS = 1e-6``), per
matrix. Here an entry counts as updated above :data:`UPDATE_TOL` (float32 rounding of an unchanged weight stays
below it), and the relative change is averaged over the updated entries only, over the whole model.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypedDict, cast

import torch

from topotuner_lab._io.errors import ParameterError

#: an entry counts as updated when it moved by more than this (absolute)
UPDATE_TOL = 1e-6
#: added to ``|w|`` in the relative change, as the reference script does (a zero weight that moved stays finite)
RELATIVE_EPS = 1e-6


class UpdateMeasures(TypedDict):
    """``results.json``'s update fields: entries moved by more than :data:`UPDATE_TOL`, their share, mean change.

    ``updated_fraction`` is over every parameter of the pretrained model (tied ones once): the paper's Upd.%.
    ``update_rel_change`` is the mean of ``|dw| / (|w| + 1e-6)`` over the updated entries (None when none moved).
    """

    updated_params: int
    updated_fraction: float
    update_rel_change: float | None


def merged_deltas(pretrained: torch.nn.Module, trained: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, trained - pretrained)`` per parameter of ``pretrained``, one at a time, float32 on the CPU.

    ``trained`` is a trained copy of ``pretrained`` (same parameter names) or a peft LoRA wrapper of one: a wrapped
    module's delta is then the merged view ``(alpha / r) * B @ A`` of its adapters (peft's ``get_delta_weight``, in
    the weight's own layout) plus any change of its base weight.
    """
    base = cast(Any, trained).get_base_model() if hasattr(trained, "get_base_model") else trained
    for name, before in pretrained.named_parameters():
        owner, _, attr = name.rpartition(".")
        module: Any = base.get_submodule(owner)
        lora = hasattr(module, "lora_A")  # a peft LoRA layer wrapping the pretrained module
        after = getattr(module.get_base_layer() if lora else module, attr)
        if after.shape != before.shape:
            raise ParameterError(
                f"parameter {name} is {tuple(after.shape)} in the trained model, {tuple(before.shape)} in the "
                "pretrained one",
                "compare a trained copy of the same pretrained model (not a sharded FSDP model)",
            )
        with torch.no_grad():
            delta = after.detach().to("cpu", torch.float32) - before.detach().to("cpu", torch.float32)
            if lora and attr == "weight":
                for adapter in (a for a in module.active_adapters if a in module.lora_A):  # as peft's merge
                    delta += module.get_delta_weight(adapter).detach().to("cpu", torch.float32)
        yield name, delta


def update_measures(pretrained: torch.nn.Module, trained: torch.nn.Module, tol: float = UPDATE_TOL) -> UpdateMeasures:
    """Upd.%: the share of ``pretrained``'s weights that moved by more than ``tol``, and their mean relative change.

    Parameters
    ----------
    pretrained : the model before fine-tuning (left unchanged).
    trained : the fine-tuned copy, or its peft LoRA wrapper (deltas merged, see :func:`merged_deltas`).
    tol : the absolute change above which an entry counts as updated.

    Returns
    -------
    :class:`UpdateMeasures`; ``updated_fraction`` is over every parameter of ``pretrained`` (tied ones once).
    """
    total = updated = 0
    relative = 0.0
    weights = dict(pretrained.named_parameters())
    for name, delta in merged_deltas(pretrained, trained):
        moved = delta.abs() > tol
        total += delta.numel()
        updated += int(moved.sum())
        if moved.any():
            w = weights[name].detach().to("cpu", torch.float32)[moved].abs().double()
            relative += float((delta[moved].abs().double() / (w + RELATIVE_EPS)).sum())
    return {
        "updated_params": updated,
        "updated_fraction": updated / total if total else 0.0,
        "update_rel_change": relative / updated if updated else None,
    }
