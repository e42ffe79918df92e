"""Applying a card to a model (torch): check it fits, freeze everything but its trainable projections."""

from __future__ import annotations

import os
import warnings
from typing import Literal

import torch

from topotuner_lab._io.errors import ProfileError
from topotuner_lab.profiles.card import ModelIdentity, ProfileCard
from topotuner_lab.profiles.upstream import CONFIG_ONLY
from topotuner_lab.weights.extract import extract_snapshot
from topotuner_lab.weights.projections import (
    Projection,
    count_parameters,
    enumerate_projections,
    model_type,
    parse_pid,
)


def identity_of(model: torch.nn.Module, name: str) -> ModelIdentity:
    """The identity of an in-memory model (its attention matrices' hash, shapes and parameter count)."""
    return ModelIdentity.from_snapshot(extract_snapshot(model, name=name))


def _check_config_shape(card: ProfileCard, model: torch.nn.Module) -> None:
    """Refuse a config-only card whose architecture, projection shapes or parameter count differ from ``model``'s.

    The projection shapes say the layers, the heads (times their size) and the hidden size; the parameter count the
    rest of the config (vocabulary, MLP size). A card that fits is applied with a one-line warning that says so.
    """
    wanted = card.model
    shapes = {p.pid: list(p.from_weight(model.get_parameter(p.param_name)).shape) for p in enumerate_projections(model)}
    found = {"architecture": model_type(model), "parameter count": count_parameters(model)}
    expected = {"architecture": wanted.architecture, "parameter count": wanted.total_params}
    differ = [
        f"{what} {expected[what]} in the card, {found[what]} here" for what in found if found[what] != expected[what]
    ]
    layers = [len({parse_pid(pid)[0] for pid in s}) for s in (wanted.shapes, shapes)]
    if layers[0] != layers[1] or len(shapes) != len(wanted.shapes):
        differ.append(f"{layers[0]} layers ({len(wanted.shapes)} projections) in the card, {layers[1]} here")
    shape_differs = [pid for pid in wanted.shapes if pid in shapes and shapes[pid] != wanted.shapes[pid]]
    if shape_differs:
        pid = shape_differs[0]
        differ.append(
            f"{len(shape_differs)} projection shape(s), e.g. {pid} {wanted.shapes[pid]} in the card, {shapes[pid]} here"
        )
    if differ:
        raise ProfileError(
            f"card for {wanted.name!r} records its config shape only (no weight hash), and this model's differs: "
            + "; ".join(differ),
            f"apply the card to {wanted.name} (any checkpoint of it), or build a card for this model",
        )
    warnings.warn(
        f"card for {wanted.name!r} was checked by config only ({found['architecture']}, {layers[1]} layers, "
        f"{len(shapes)} projection shapes, {found['parameter count']:,} parameters): it records no weight hash",
        stacklevel=3,
    )


def check_card_fits(card: ProfileCard, model: torch.nn.Module) -> Literal["weights", "config"]:
    """Refuse a card built for another model; return what it was checked by: ``"weights"`` or ``"config"``.

    A card built from a model's weights must match its projection shapes and weight hash. A card built from a config
    alone (``weights_hash`` ``config-only``: the authors' released lists) must match its architecture, projection
    shapes and parameter count, and is applied with a warning that says it was checked by config only.
    """
    if card.model.weights_hash == CONFIG_ONLY:
        _check_config_shape(card, model)
        return "config"
    identity = identity_of(model, card.model.name)
    if identity.shapes != card.model.shapes:
        raise ProfileError(
            f"card was built for {card.model.name!r} ({len(card.model.shapes)} projections), but this model's "
            "projections differ "
            f"({identity.architecture}, {len(identity.shapes)} projections)",
            "apply the card to the model it was built for, or build a new card from this model's drift table",
        )
    if identity.weights_hash != card.model.weights_hash:
        raise ProfileError(
            f"card was built for weights {card.model.weights_hash[:12]} of {card.model.name!r}, this model has "
            f"{identity.weights_hash[:12]}",
            "apply the card to the same pretrained model (not a fine-tuned copy or another checkpoint), or rebuild "
            "the card",
        )
    return "weights"


def apply_profile(model: torch.nn.Module, card: ProfileCard, *, check: bool = True) -> list[str]:
    """Freeze everything but the card's trainable projections; return the trainable parameter names.

    Freezing is ``requires_grad`` alone for separate q/k/v/o parameters (LLaMA, Mistral, Qwen, Gemma...), so it works
    unchanged under DDP and under FSDP with ``use_orig_params=True``. A fused parameter (GPT-2 ``c_attn``) that is only
    partly trainable gets a gradient mask, so its frozen rows never change (train with weight decay 0, which the
    fine-tune entry point does); FSDP cannot run that hook, and the case is refused under it.

    Parameters
    ----------
    model : torch.nn.Module
        The pretrained model (not a copy already changed by training); changed in place.
    card : ProfileCard
        The profile card; with ``check`` it must have been built for this model (shapes and weight hash, or the
        config shape for a config-only card: see :func:`check_card_fits`).
    check : bool, default True
        Check that the card fits the model first.

    Returns
    -------
    list of str
        The names of the parameters left trainable.

    Raises
    ------
    ProfileError
        The card was built for another model (other projections, shapes or weights), or trains part of a fused
        parameter under FSDP.

    Examples
    --------
    >>> from topotuner_lab import (CardSettings, DriftCache, DriftSettings, ModelIdentity, ProfileError,
    ...                            apply_profile, build_profile, drift_table, extract_snapshot, load_model,
    ...                            perturb_snapshot, upstream_card)
    >>> loaded = load_model("tiny-llama")
    >>> pre = extract_snapshot(loaded)
    >>> table = drift_table(pre, perturb_snapshot(pre, 0.1), DriftSettings(maxdim=0), n_jobs=1, cache=DriftCache(None))
    >>> card = build_profile(table, ModelIdentity.from_snapshot(pre), CardSettings(prior_task="sst2", count=2))
    >>> names = apply_profile(loaded.model, card)
    >>> len(names), all(name.endswith("_proj.weight") for name in names)
    (2, True)
    >>> sum(p.numel() for p in loaded.model.parameters() if p.requires_grad) == card.trainable_params
    True
    >>> try:
    ...     apply_profile(loaded.model, upstream_card("Qwen3-8B-Base", size=3))
    ... except ProfileError as err:
    ...     print(err.problem)
    card for 'Qwen/Qwen3-8B-Base' records its config shape only (no weight hash), and this model's differs: ...
    """
    if check:
        check_card_fits(card, model)
    projections: dict[str, Projection] = {p.pid: p for p in enumerate_projections(model)}
    for param in model.parameters():
        param.requires_grad_(False)
    by_param: dict[str, list[Projection]] = {}
    for pid in card.trainable:
        by_param.setdefault(projections[pid].param_name, []).append(projections[pid])
    for name, parts in by_param.items():
        param = model.get_parameter(name)
        param.requires_grad_(True)
        siblings = [p for p in projections.values() if p.param_name == name]
        if len(parts) < len(siblings):  # part of a fused matrix: mask the frozen rows' gradients
            if os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true"):
                raise ProfileError(
                    f"the card trains only part of the fused parameter {name} (GPT-2 c_attn), which needs a "
                    "gradient hook; "
                    "FSDP flattens parameters and does not run such hooks",
                    "train this model with DDP (no --use_fsdp), or a card that trains all of q, k and v of a layer",
                )
            keep = torch.zeros(param.shape, dtype=torch.bool)
            for part in parts:
                if part.transposed:
                    keep[:, part.row_start : part.row_stop] = True
                else:
                    keep[part.row_start : part.row_stop] = True
            param.register_hook(lambda grad, keep=keep: grad * keep.to(grad.dtype))
    return sorted(by_param)
