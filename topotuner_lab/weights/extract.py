"""A snapshot of an in-memory model: every attention projection copied as a float32 matrix (torch)."""

from __future__ import annotations

import torch

from topotuner_lab.weights.models import LoadedModel
from topotuner_lab.weights.projections import count_parameters, enumerate_projections, model_type
from topotuner_lab.weights.snapshot import Snapshot


def extract_snapshot(
    loaded: LoadedModel | torch.nn.Module, *, name: str | None = None, base_model: str | None = None, note: str = ""
) -> Snapshot:
    """Copy every attention projection of a model into a float32 snapshot.

    Parameters
    ----------
    loaded : LoadedModel or torch.nn.Module
        A model from :func:`load_model` (its name and revision are recorded), or any supported module (recorded by
        its class name, revision ``"in-memory"``).
    name : str, optional
        The model name to record instead.
    base_model : str, optional
        The pretrained model this one was fine-tuned from (default: the model's ``config.topotuner_base_model``, which
        a fine-tune records, else its name).
    note : str
        Free text recorded in the snapshot.

    Returns
    -------
    Snapshot
        Every attention projection (fused ones split into q, k, v) as a float32 copy, with the model's architecture
        and parameter count.

    Raises
    ------
    UnsupportedArchitectureError
        The model's attention projections cannot be enumerated.

    See Also
    --------
    stream_snapshot : the same from a checkpoint on disk, without loading the model.

    Examples
    --------
    >>> from topotuner_lab import extract_snapshot, load_model
    >>> snap = extract_snapshot(load_model("tiny-llama"))
    >>> snap.model, snap.architecture, snap.total_params
    ('tiny-llama', 'llama', 139584)
    >>> snap.shapes["L0.q"], snap.shapes["L0.k"]
    ((64, 64), (32, 64))
    """
    if isinstance(loaded, LoadedModel):
        model, model_name, revision = loaded.model, loaded.name, loaded.revision
    else:
        model, model_name, revision = loaded, type(loaded).__name__, "in-memory"
    model_name = name or model_name
    with torch.no_grad():
        matrices = {
            p.pid: p.matrix(model).detach().to(torch.float32).cpu().numpy().copy() for p in enumerate_projections(model)
        }
    base = base_model or getattr(getattr(model, "config", None), "topotuner_base_model", None) or model_name
    return Snapshot(
        matrices, model_name, base, revision, model_type(model), note=note, total_params=count_parameters(model)
    )
