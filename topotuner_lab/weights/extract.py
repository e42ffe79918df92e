"""A snapshot of an in-memory model: every attention projection copied as a float32 matrix (torch)."""

from __future__ import annotations

import torch

from topotuner_lab.weights.models import LoadedModel
from topotuner_lab.weights.projections import count_parameters, enumerate_projections, model_type
from topotuner_lab.weights.snapshot import Snapshot


def extract_snapshot(
    loaded: LoadedModel | torch.nn.Module, *, name: str | None = None, base_model: str | None = None, note: str = ""
) -> Snapshot:
    """Copy every attention projection of a model into a float32 snapshot."""
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
