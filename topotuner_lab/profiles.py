"""Freezing profiles: which attention projections to train, saved as a versioned profile card.

A card ranks projections by a drift column of a drift table (topological by default) and keeps
the top-k high-drift or low-drift ones trainable, k given as a count or a trainable-parameter
budget. Random and magnitude-ranked cards with the same budget are the honest controls.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from . import atomic
from .errors import InputFileError, ProfileError
from .projections import Projection, enumerate_projections, is_llama_like
from .snapshot import Snapshot, extract_snapshot

SCHEMA_VERSION = 1
STRATEGIES: tuple[str, ...] = ("high-drift", "low-drift", "random", "magnitude")


@dataclass
class ModelIdentity:
    """The pretrained model a card was built for: its name, weight fingerprint and shapes."""

    name: str
    weights_hash: str
    architecture: str
    total_params: int
    shapes: dict[str, list[int]]

    @classmethod
    def from_snapshot(cls, snap: Snapshot, total_params: int) -> ModelIdentity:
        return cls(snap.base_model, snap.weights_hash, snap.architecture, int(total_params), {k: list(v) for k, v in snap.shapes.items()})

    @classmethod
    def of(cls, model: torch.nn.Module, name: str) -> ModelIdentity:
        return cls.from_snapshot(extract_snapshot(model, name=name), sum(p.numel() for p in model.parameters()))


@dataclass
class ProfileCard:
    """A reusable freezing profile (JSON, schema ``SCHEMA_VERSION``)."""

    model: ModelIdentity
    prior_task: str
    strategy: str
    metric: str  # drift-table column used for ranking
    drift_settings: dict[str, Any]
    ranking: list[dict[str, Any]]  # [{"pid", "score"}], best first for the strategy
    trainable: list[str]
    frozen: list[str]
    trainable_params: int
    trainable_fraction: float
    budget: dict[str, Any]  # {"count": k} or {"fraction": f}
    stop_threshold: float | None = None
    transferred_to: list[str] = field(default_factory=list)
    seed: int = 0
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    schema_version: int = SCHEMA_VERSION

    # --- files ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the card atomically as JSON, with its Markdown view beside it (``.md``)."""
        path = Path(path)
        atomic.write_json(path, self.to_dict())
        atomic.write_text(path.with_suffix(".md"), self.to_markdown())
        return path

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "card") -> ProfileCard:
        if not isinstance(data, dict):
            raise ProfileError(f"{where} is not a JSON object", "load a file written by ProfileCard.save / `topotuner-lab profile`")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ProfileError(
                f"{where} has schema_version {version!r}; this version of topotuner_lab reads {SCHEMA_VERSION}",
                "rebuild the card from its drift table with `topotuner-lab profile`, or use the topotuner_lab version that wrote it",
            )
        required = [f for f in cls.__dataclass_fields__ if f not in ("stop_threshold", "transferred_to", "seed", "created", "schema_version")]
        missing = [f for f in required if f not in data]
        if missing:
            raise ProfileError(f"{where} lacks field(s) {missing}", "rebuild the card with `topotuner-lab profile`")
        if data["strategy"] not in STRATEGIES:
            raise ProfileError(f"{where} has unknown strategy {data['strategy']!r}", f"use one of {', '.join(STRATEGIES)}")
        try:
            model = ModelIdentity(**data["model"])
        except TypeError as exc:
            raise ProfileError(f"{where} has a malformed 'model' entry ({exc})", "rebuild the card with `topotuner-lab profile`") from exc
        card = cls(**{**data, "model": model})
        unknown = sorted(set(card.trainable + card.frozen) - set(model.shapes))
        if unknown or set(card.trainable) & set(card.frozen):
            raise ProfileError(f"{where} lists unknown or doubly listed projection ids {unknown[:5]}", "rebuild the card; ids must be those of the model's snapshot")
        return card

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ProfileCard:
        path = Path(path)
        if not path.is_file():
            raise InputFileError(f"profile card {path} does not exist", "build one with `topotuner-lab profile DRIFT_TABLE ...`")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ProfileError(f"profile card {path} is not valid JSON ({exc})", "rebuild the card with `topotuner-lab profile`") from exc
        return cls.from_dict(data, str(path))

    # --- views ---------------------------------------------------------------------------
    def to_markdown(self) -> str:
        """A model-card-like summary for sharing."""
        top = "\n".join(f"| {i + 1} | `{r['pid']}` | {r['score']:.4g} | {'trainable' if r['pid'] in self.trainable else 'frozen'} |" for i, r in enumerate(self.ranking[:20]))
        return (
            f"# TopoTuner profile card: {self.strategy} on {self.prior_task}\n\n"
            f"- **Model**: {self.model.name} ({self.model.architecture}, weights `{self.model.weights_hash[:12]}`, {self.model.total_params:,} parameters)\n"
            f"- **Prior task**: {self.prior_task}\n- **Strategy**: {self.strategy}, ranked by `{self.metric}`\n"
            f"- **Budget**: {self.budget}; **trainable**: {len(self.trainable)} projections, {self.trainable_params:,} parameters "
            f"({100 * self.trainable_fraction:.2f}% of the model)\n"
            f"- **Trainable ids**: {', '.join(self.trainable)}\n"
            f"- **Stopping threshold**: {self.stop_threshold}\n- **Transferred to**: {', '.join(self.transferred_to) or 'none yet'}\n"
            f"- **Seed**: {self.seed}; **created**: {self.created}; schema v{self.schema_version}\n\n"
            f"## Ranking (top 20)\n\n| rank | projection | score | state |\n|---|---|---|---|\n{top}\n"
        )

    def spectrum_patterns(self, model: torch.nn.Module | None = None) -> list[str]:
        """``unfrozen_parameters`` regexes (Spectrum / axolotl format) for the trainable projections."""
        if model is None:
            if not is_llama_like(self.model.architecture):
                raise ProfileError(f"parameter names of a {self.model.architecture!r} model cannot be written without the model",
                                   "pass the model (card.to_spectrum_yaml(model)); GPT-2's fused q/k/v can only be unfrozen whole")
            return [rf"^model\.layers\.{pid.split('.')[0][1:]}\.self_attn\.{pid[-1]}_proj\.weight$" for pid in self.trainable]
        names = {p.pid: p.param_name for p in enumerate_projections(model)}
        return sorted({"^" + re.escape(names[pid]) + "$" for pid in self.trainable})

    def to_spectrum_yaml(self, model: torch.nn.Module | None = None) -> str:
        lines = [f"# TopoTuner profile: {self.strategy} on {self.prior_task}, {self.model.name}", "unfrozen_parameters:"]
        return "\n".join(lines + [f"- {p}" for p in self.spectrum_patterns(model)]) + "\n"


def param_counts(shapes: dict[str, list[int]]) -> dict[str, int]:
    """Parameters per projection id, from the shapes a card or snapshot records."""
    return {pid: int(np.prod(shape)) for pid, shape in shapes.items()}


def select_projections(scores: pd.Series, params: dict[str, int], total_params: int, *, descending: bool, count: int | None = None, fraction: float | None = None) -> tuple[list[str], list[str]]:
    """Rank ids by score and keep the first ``count`` or those fitting ``fraction`` of the parameters.

    Returns ``(ranked_ids, selected_ids)``. Ties keep the table order (stable sort).
    """
    if (count is None) == (fraction is None):
        raise ProfileError("give exactly one of count (matrices) or budget fraction", "e.g. count=4, or fraction=0.01 for 1% of the model")
    ranked = list(scores.sort_values(ascending=not descending, kind="stable").index)
    if count is not None:
        if not 1 <= count <= len(ranked):
            raise ProfileError(f"count={count} is outside 1..{len(ranked)} (the number of projections)", f"pick between 1 and {len(ranked)} matrices")
        return ranked, ranked[:count]
    if not 0 < fraction <= 1:
        raise ProfileError(f"budget {fraction!r} is not a fraction in (0, 1] (above 100% or not positive)", "give the budget as a fraction: 0.01 for 1%, 0.02 for 2%")
    limit = fraction * total_params
    smallest = min(params.values())
    if limit < smallest:
        raise ProfileError(
            f"budget {100 * fraction:.3g}% = {limit:,.0f} parameters is below the smallest projection ({smallest:,} parameters)",
            f"raise the budget to at least {100 * smallest / total_params:.3g}% or give a count",
        )
    chosen, used = [], 0
    for pid in ranked:  # greedy in rank order; skip matrices that no longer fit
        if used + params[pid] <= limit:
            chosen.append(pid)
            used += params[pid]
    return ranked, chosen


def build_profile(
    table: pd.DataFrame,
    identity: ModelIdentity,
    *,
    prior_task: str,
    strategy: str = "high-drift",
    metric: str = "h0_w1",
    count: int | None = None,
    fraction: float | None = None,
    seed: int = 0,
    stop_threshold: float | None = None,
    drift_settings: dict[str, Any] | None = None,
) -> ProfileCard:
    """Build a profile card from a drift table (one row per projection id)."""
    if strategy not in STRATEGIES:
        raise ProfileError(f"unknown strategy {strategy!r}", f"use one of {', '.join(STRATEGIES)}")
    rank_col = "rel_frobenius" if strategy == "magnitude" else metric
    if rank_col not in table.columns:
        numeric = [c for c in table.columns if c not in ("pid", "layer", "kind", "rows", "cols") and not c.startswith("n_h")]
        raise ProfileError(f"drift table has no column {rank_col!r}", f"rank by one of {numeric}")
    unknown = sorted(set(table["pid"]) - set(identity.shapes))
    if unknown:
        raise ProfileError(f"drift table ids {unknown[:5]} are not projections of {identity.name}", "use a drift table computed for this model")
    scores = table.set_index("pid")[rank_col].astype(float)
    if strategy == "random":
        scores = pd.Series(np.random.default_rng(seed).permutation(len(scores)).astype(float), index=scores.index)
    params = param_counts(identity.shapes)
    ranked, chosen = select_projections(scores, params, identity.total_params, descending=strategy != "low-drift", count=count, fraction=fraction)
    trainable_params = sum(params[p] for p in chosen)
    order = list(identity.shapes)
    return ProfileCard(
        model=identity,
        prior_task=prior_task,
        strategy=strategy,
        metric=rank_col,
        drift_settings=drift_settings or json.loads(table.attrs.get("settings", "{}")),
        ranking=[{"pid": p, "score": float(scores[p])} for p in ranked],
        trainable=[p for p in order if p in chosen],
        frozen=[p for p in order if p not in chosen],
        trainable_params=trainable_params,
        trainable_fraction=trainable_params / identity.total_params,
        budget={"count": count} if count is not None else {"fraction": fraction},
        stop_threshold=stop_threshold,
        seed=seed,
    )


def check_card_fits(card: ProfileCard, model: torch.nn.Module) -> None:
    """Refuse a card built for another model (shapes or weight hash differ)."""
    identity = ModelIdentity.of(model, card.model.name)
    if identity.shapes != card.model.shapes:
        raise ProfileError(
            f"card was built for {card.model.name!r} ({len(card.model.shapes)} projections), but this model's projections differ "
            f"({identity.architecture}, {len(identity.shapes)} projections)",
            "apply the card to the model it was built for, or build a new card from this model's drift table",
        )
    if identity.weights_hash != card.model.weights_hash:
        raise ProfileError(
            f"card was built for weights {card.model.weights_hash[:12]} of {card.model.name!r}, this model has {identity.weights_hash[:12]}",
            "apply the card to the same pretrained model (not a fine-tuned copy or another checkpoint), or rebuild the card",
        )


def apply_profile(model: torch.nn.Module, card: ProfileCard, *, check: bool = True) -> list[str]:
    """Freeze everything but the card's trainable projections; return the trainable parameter names.

    A fused parameter (GPT-2 ``c_attn``) that is only partly trainable gets a gradient mask, so
    its frozen rows never change (train with weight decay 0, which the fine-tune entry point does).
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
            keep = torch.zeros(param.shape, dtype=torch.bool)
            for part in parts:
                if part.transposed:
                    keep[:, part.row_start : part.row_stop] = True
                else:
                    keep[part.row_start : part.row_stop] = True
            param.register_hook(lambda grad, keep=keep: grad * keep.to(grad.dtype))
    return sorted(by_param)


def trainable_parameter_count(model: torch.nn.Module) -> int:
    return int(sum(p.numel() for p in model.parameters() if p.requires_grad))
