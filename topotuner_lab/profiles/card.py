"""Freezing profiles: which attention projections to train, saved as a versioned profile card.

A card ranks projections by a drift column of a drift table (topological by default) and keeps
the top-k high-drift or low-drift ones trainable, k given as a count or a trainable-parameter
budget. Random and magnitude-ranked cards with the same budget are the honest controls.
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from topotuner_lab._io import atomic
from topotuner_lab._io.errors import InputFileError, ProfileError
from topotuner_lab.weights.projections import Projection, enumerate_projections, is_llama_like
from topotuner_lab.weights.snapshot import Snapshot, extract_snapshot

SCHEMA_VERSION = 1
STRATEGIES: tuple[str, ...] = ("high-drift", "low-drift", "random", "magnitude")
#: how a drift column is made comparable across matrices of different sizes before ranking:
#: raw W; W per diagram point; W over the pretrained diagram's total persistence; z-score against noise drift
NORMALIZATIONS: tuple[str, ...] = ("raw", "per-point", "relative", "noise-z")


@dataclass
class ModelIdentity:
    """The pretrained model a card was built for: its name, weight fingerprint and shapes."""

    name: str
    weights_hash: str
    architecture: str
    total_params: int
    shapes: dict[str, list[int]]

    @classmethod
    def from_snapshot(cls, snap: Snapshot, total_params: int | None = None) -> ModelIdentity:
        """The identity of the snapshot's model; ``total_params`` defaults to the count the snapshot records."""
        total = snap.total_params if total_params is None else total_params
        attention = sum(int(np.prod(s)) for s in snap.shapes.values())
        if total is None:
            raise ProfileError(
                f"snapshot of {snap.model!r} records no parameter count (written by an older version)",
                "re-extract it with `topotuner-lab extract`, or pass --total-params N / --model MODEL",
            )
        if isinstance(total, bool) or not isinstance(total, (int, np.integer)) or total < attention:
            raise ProfileError(
                f"total parameter count {total!r} is below the {attention:,} parameters of the attention matrices "
                "alone",
                "pass the whole model's parameter count (or omit --total-params to use the one the snapshot records)",
            )
        return cls(
            snap.base_model,
            snap.weights_hash,
            snap.architecture,
            int(total),
            {k: list(v) for k, v in snap.shapes.items()},
        )

    @classmethod
    def of(cls, model: torch.nn.Module, name: str) -> ModelIdentity:
        return cls.from_snapshot(extract_snapshot(model, name=name))


@dataclass
class ProfileCard:
    """A reusable freezing profile (JSON, schema ``SCHEMA_VERSION``), validated on load.

    Attributes
    ----------
    model : the pretrained model it was built for (name, weight hash, architecture, parameter count, shapes).
    prior_task, strategy, metric, normalization : where the ranking came from and how it was made.
    ranking : ``[{"pid", "score"}]`` best first for the strategy. ``trainable`` / ``frozen``: projection ids.
    trainable_params, trainable_fraction : the trainable share of all model parameters (a fraction: 0.01 is 1%).
    budget : ``{"count": k}`` or ``{"fraction": f}``. ``stop_threshold``: early-stopping threshold in (0, 1) or None.
    """

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
    normalization: str = "raw"  # one of NORMALIZATIONS: how ranking scores were made comparable across matrix sizes
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
        """Validate and build a card from parsed JSON; any problem is a :class:`ProfileError` naming the field."""
        rebuild = "rebuild the card with `topotuner-lab profile`"
        if not isinstance(data, dict):
            raise ProfileError(
                f"{where} is not a JSON object", "load a file written by ProfileCard.save / `topotuner-lab profile`"
            )
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ProfileError(
                f"{where} has schema_version {version!r}; this version of topotuner_lab reads {SCHEMA_VERSION}",
                "rebuild the card from its drift table with `topotuner-lab profile`, or use the topotuner_lab "
                "version that wrote it",
            )
        fields = cls.__dataclass_fields__
        missing = [f for f in fields if f not in _OPTIONAL_FIELDS and f not in data]
        extra = sorted(set(data) - set(fields))
        if missing or extra:
            raise ProfileError(
                f"{where} "
                + "; ".join(
                    filter(None, [missing and f"lacks field(s) {missing}", extra and f"has unknown field(s) {extra}"])
                ),
                rebuild,
            )
        wrong = [name for name, check in _FIELD_CHECKS.items() if name in data and not check(data[name])]
        if wrong:
            raise ProfileError(f"{where} has field(s) {wrong} of the wrong type or value", rebuild)
        if data["strategy"] not in STRATEGIES:
            raise ProfileError(
                f"{where} has unknown strategy {data['strategy']!r}", f"use one of {', '.join(STRATEGIES)}"
            )
        try:
            model = ModelIdentity(**data["model"])
        except TypeError as exc:
            raise ProfileError(f"{where} has a malformed 'model' entry ({exc})", rebuild) from exc
        if not (
            isinstance(model.shapes, dict)
            and all(_is_shape(v) for v in model.shapes.values())
            and _is_count(model.total_params)
        ):
            raise ProfileError(f"{where} has a malformed 'model' entry (shapes or total_params)", rebuild)
        card = cls(**{**data, "model": model})
        known = set(model.shapes)
        unknown = sorted(set(card.trainable + card.frozen + [r["pid"] for r in card.ranking]) - known)
        if unknown:
            raise ProfileError(f"{where} lists projection ids {unknown[:5]} that the model does not have", rebuild)
        twice = sorted(set(card.trainable) & set(card.frozen)) or sorted(
            {p for p in card.trainable + card.frozen if (card.trainable + card.frozen).count(p) > 1}
        )
        if twice:
            raise ProfileError(
                f"{where} lists projection ids {twice[:5]} more than once (trainable and frozen, or repeated)", rebuild
            )
        if set(card.trainable) | set(card.frozen) != known:
            raise ProfileError(
                f"{where} leaves projection ids {sorted(known - set(card.trainable) - set(card.frozen))[:5]} "
                "neither trainable nor frozen",
                rebuild,
            )
        if not card.trainable:
            raise ProfileError(f"{where} has no trainable projection", rebuild)
        return card

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ProfileCard:
        path = Path(path)
        if not path.is_file():
            raise InputFileError(
                f"profile card {path} does not exist", "build one with `topotuner-lab profile DRIFT_TABLE ...`"
            )
        try:
            data = json.loads(path.read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise ProfileError(
                f"profile card {path} is not valid UTF-8 JSON ({exc.__class__.__name__}: {str(exc)[:100]})",
                "rebuild the card with `topotuner-lab profile`",
            ) from exc
        return cls.from_dict(data, str(path))

    # --- views ---------------------------------------------------------------------------
    def to_markdown(self) -> str:
        """A model-card-like summary for sharing."""
        top = "\n".join(
            f"| {i + 1} | `{r['pid']}` | {r['score']:.4g} | {'trainable' if r['pid'] in self.trainable else 'frozen'} |"
            for i, r in enumerate(self.ranking[:20])
        )
        return (
            f"# TopoTuner profile card: {self.strategy} on {self.prior_task}\n\n"
            f"- **Model**: {self.model.name} ({self.model.architecture}, weights `{self.model.weights_hash[:12]}`, "
            f"{self.model.total_params:,} parameters)\n"
            f"- **Prior task**: {self.prior_task}\n- **Strategy**: {self.strategy}, ranked by `{self.metric}` "
            f"({self.normalization})\n"
            f"- **Budget**: {self.budget}; **trainable**: {len(self.trainable)} projections, "
            f"{self.trainable_params:,} parameters "
            f"({100 * self.trainable_fraction:.2f}% of the model)\n"
            f"- **Trainable ids**: {', '.join(self.trainable)}\n"
            f"- **Stopping threshold**: {self.stop_threshold}\n- **Transferred to**: "
            f"{', '.join(self.transferred_to) or 'not in the card (each run records its card in results.json)'}\n"
            f"- **Seed**: {self.seed}; **created**: {self.created}; schema v{self.schema_version}\n\n"
            f"## Ranking (top 20)\n\n| rank | projection | score | state |\n|---|---|---|---|\n{top}\n"
        )

    def spectrum_patterns(self, model: torch.nn.Module | None = None) -> list[str]:
        """``unfrozen_parameters`` regexes (Spectrum / axolotl format) for the trainable projections."""
        if model is None:
            if not is_llama_like(self.model.architecture):
                raise ProfileError(
                    f"parameter names of a {self.model.architecture!r} model cannot be written without the model",
                    "pass the model (card.to_spectrum_yaml(model)); GPT-2's fused q/k/v can only be unfrozen whole",
                )
            return [
                rf"^model\.layers\.{pid.split('.')[0][1:]}\.self_attn\.{pid[-1]}_proj\.weight$"
                for pid in self.trainable
            ]
        names = {p.pid: p.param_name for p in enumerate_projections(model)}
        return sorted({"^" + re.escape(names[pid]) + "$" for pid in self.trainable})

    def to_spectrum_yaml(self, model: torch.nn.Module | None = None) -> str:
        lines = [
            f"# TopoTuner profile: {self.strategy} on {self.prior_task}, {self.model.name}",
            "unfrozen_parameters:",
        ]
        return "\n".join(lines + [f"- {p}" for p in self.spectrum_patterns(model)]) + "\n"


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _is_shape(v: Any) -> bool:
    return isinstance(v, list) and len(v) == 2 and all(_is_count(x) and x > 0 for x in v)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_ids(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


_OPTIONAL_FIELDS = ("stop_threshold", "transferred_to", "seed", "created", "schema_version", "normalization")
#: field -> check of its JSON value (the dataclass types, enforced on load)
_FIELD_CHECKS: dict[str, Any] = {
    "model": lambda v: isinstance(v, dict),
    "prior_task": lambda v: isinstance(v, str),
    "strategy": lambda v: isinstance(v, str),
    "metric": lambda v: isinstance(v, str),
    "drift_settings": lambda v: isinstance(v, dict),
    "ranking": lambda v: (
        isinstance(v, list)
        and all(
            isinstance(r, dict) and set(r) == {"pid", "score"} and isinstance(r["pid"], str) and _is_number(r["score"])
            for r in v
        )
    ),
    "trainable": _is_ids,
    "frozen": _is_ids,
    "trainable_params": _is_count,
    "trainable_fraction": lambda v: _is_number(v) and 0 <= v <= 1,
    "budget": lambda v: (
        isinstance(v, dict) and len(v) == 1 and ("count" in v or "fraction" in v) and _is_number(next(iter(v.values())))
    ),
    "stop_threshold": lambda v: v is None or (_is_number(v) and 0 < v < 1),
    "transferred_to": _is_ids,
    "seed": _is_count,
    "created": lambda v: isinstance(v, str),
    "normalization": lambda v: v in NORMALIZATIONS,
}


def param_counts(shapes: dict[str, list[int]]) -> dict[str, int]:
    """Parameters per projection id, from the shapes a card or snapshot records."""
    return {pid: int(np.prod(shape)) for pid, shape in shapes.items()}


def select_projections(
    scores: pd.Series,
    params: dict[str, int],
    total_params: int,
    *,
    descending: bool,
    count: int | None = None,
    fraction: float | None = None,
) -> tuple[list[str], list[str]]:
    """Rank ids by score and keep the first ``count`` or those fitting ``fraction`` of the parameters.

    Returns ``(ranked_ids, selected_ids)``. Ties keep the table order (stable sort).
    """
    if (count is None) == (fraction is None):
        raise ProfileError(
            "give exactly one of count (matrices) or budget fraction",
            "e.g. count=4, or fraction=0.01 for 1% of the model",
        )
    ranked = list(scores.sort_values(ascending=not descending, kind="stable").index)
    if count is not None:
        if not 1 <= count <= len(ranked):
            raise ProfileError(
                f"count={count} is outside 1..{len(ranked)} (the number of projections)",
                f"pick between 1 and {len(ranked)} matrices",
            )
        return ranked, ranked[:count]
    if not 0 < fraction <= 1:
        raise ProfileError(
            f"budget {fraction!r} is not a fraction in (0, 1] (above 100% or not positive)",
            "give the budget as a fraction: 0.01 for 1%, 0.02 for 2%",
        )
    limit = fraction * total_params
    smallest = min(params.values())
    if limit < smallest:
        raise ProfileError(
            f"budget {100 * fraction:.3g}% = {limit:,.0f} parameters is below the smallest projection "
            f"({smallest:,} parameters)",
            f"raise the budget to at least {100 * smallest / total_params:.3g}% or give a count",
        )
    chosen, used = [], 0
    for pid in ranked:  # greedy in rank order; skip matrices that no longer fit
        if used + params[pid] <= limit:
            chosen.append(pid)
            used += params[pid]
    return ranked, chosen


def normalized_scores(
    table: pd.DataFrame, metric: str, normalization: str = "raw", noise: Sequence[pd.DataFrame] = ()
) -> pd.Series:
    """``metric`` per projection id, normalized so that matrices of different sizes compare fairly.

    ``raw``: the column itself. ``per-point``: divided by the pretrained diagram's number of points (W sums over
    points, so bigger matrices drift more by size alone). ``relative``: divided by the pretrained diagram's total
    persistence. ``noise-z``: (drift - mean noise drift) / std of the noise drift, over ``noise`` tables of the same
    pretrained matrices against small random perturbations (at least two).
    """
    if normalization not in NORMALIZATIONS:
        raise ProfileError(f"unknown normalization {normalization!r}", f"use one of {', '.join(NORMALIZATIONS)}")
    indexed = table.set_index("pid")
    scores = indexed[metric].astype(float)
    if normalization == "raw":
        return scores
    dim = metric[:2] if metric[:2] in ("h0", "h1") and metric[2] == "_" else None
    if normalization in ("per-point", "relative"):
        column = f"n_{dim}_before" if normalization == "per-point" else f"{dim}_persistence_before"
        if dim is None or column not in indexed:
            raise ProfileError(
                f"normalization {normalization!r} needs a topological column (h0_*, h1_*) of a current drift table; "
                f"{metric!r} has no {column!r}",
                "rank by e.g. h0_w1, or recompute the table with `topotuner-lab drift`",
            )
        return scores / indexed[column].astype(float).clip(lower=np.finfo(float).tiny)
    if len(noise) < 2:
        raise ProfileError(
            f"normalization 'noise-z' needs at least two noise drift tables, got {len(noise)}",
            "compute drift of the pretrained snapshot against 2+ perturbed copies (`topotuner-lab perturb --seed N`)",
        )
    floor = pd.concat([n.set_index("pid")[metric].astype(float).reindex(scores.index) for n in noise], axis=1)
    if floor.isna().any().any():
        raise ProfileError(
            "a noise table lacks some projection ids of the drift table",
            "compute the noise tables from the same pretrained snapshot",
        )
    return (scores - floor.mean(axis=1)) / floor.std(axis=1, ddof=1).clip(lower=np.finfo(float).tiny)


def check_table_fits(table: pd.DataFrame, identity: ModelIdentity) -> None:
    """Refuse a drift table of another model: ids, shapes, and the pretrained weight hash it records."""
    unknown = sorted(set(table["pid"]) - set(identity.shapes))
    if unknown:
        raise ProfileError(
            f"drift table ids {unknown[:5]} are not projections of {identity.name}",
            "use a drift table computed for this model",
        )
    differing = [
        p for p, r, c in zip(table["pid"], table["rows"], table["cols"]) if identity.shapes[p] != [int(r), int(c)]
    ]
    if differing:
        raise ProfileError(
            f"drift table shapes differ from the pretrained snapshot at {differing[:5]} "
            f"({identity.shapes[differing[0]]} in the snapshot): the table is of another model",
            "use a drift table computed for this model",
        )
    recorded = table.attrs.get("before_hash")
    if recorded is None:
        warnings.warn(
            "the drift table records no pretrained weight hash (a CSV table, or one written by an older version): "
            "only its ids "
            "and shapes were checked against the pretrained snapshot; Parquet tables carry the hash",
            stacklevel=2,
        )
    elif recorded != identity.weights_hash:
        raise ProfileError(
            f"drift table was computed from weights {str(recorded)[:12]}, the pretrained snapshot has "
            f"{identity.weights_hash[:12]}",
            "build the card from the pretrained snapshot the table was computed from (or recompute the table)",
        )


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
    normalization: str = "raw",
    noise: Sequence[pd.DataFrame] = (),
) -> ProfileCard:
    """Build a profile card from a drift table (one row per projection id).

    Parameters
    ----------
    table : drift table (``drift_table`` / ``load_table``), one row per projection id.
    identity : the pretrained model (``ModelIdentity.from_snapshot``); the table must be of this model.
    strategy : ``high-drift``, ``low-drift``, or the controls ``random`` and ``magnitude``.
    metric : drift column to rank by (``magnitude`` always ranks by ``rel_frobenius``).
    count, fraction : the budget, exactly one: a number of matrices, or a fraction in (0, 1] of all model
        parameters (0.01 is 1%; the CLI's ``--budget`` takes percent).
    normalization : one of ``NORMALIZATIONS`` (see :func:`normalized_scores`); ``noise`` tables for ``noise-z``.
    """
    from topotuner_lab.drift.columns import rankable as numeric_columns

    if strategy not in STRATEGIES:
        raise ProfileError(f"unknown strategy {strategy!r}", f"use one of {', '.join(STRATEGIES)}")
    rank_col = "rel_frobenius" if strategy == "magnitude" else metric
    if rank_col not in numeric_columns(table):
        raise ProfileError(
            f"drift table has no measure column {rank_col!r}",
            "recompute the table with the magnitude baselines (without --no-magnitude)"
            if strategy == "magnitude"
            else f"rank by one of {numeric_columns(table)}",
        )
    check_table_fits(table, identity)
    scores = normalized_scores(table, rank_col, "raw" if strategy in ("random", "magnitude") else normalization, noise)
    if not np.isfinite(scores.to_numpy()).all():
        raise ProfileError(
            f"drift column {rank_col!r} holds NaN or infinite values",
            "recompute the drift table from healthy snapshots",
        )
    if strategy == "random":
        scores = pd.Series(np.random.default_rng(seed).permutation(len(scores)).astype(float), index=scores.index)
    params = param_counts(identity.shapes)
    ranked, chosen = select_projections(
        scores, params, identity.total_params, descending=strategy != "low-drift", count=count, fraction=fraction
    )
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
        normalization="raw" if strategy in ("random", "magnitude") else normalization,
    )


def check_card_fits(card: ProfileCard, model: torch.nn.Module) -> None:
    """Refuse a card built for another model (shapes or weight hash differ)."""
    identity = ModelIdentity.of(model, card.model.name)
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


def apply_profile(model: torch.nn.Module, card: ProfileCard, *, check: bool = True) -> list[str]:
    """Freeze everything but the card's trainable projections; return the trainable parameter names.

    Freezing is ``requires_grad`` alone for separate q/k/v/o parameters (LLaMA, Mistral, Qwen, Gemma...), so it works
    unchanged under DDP and under FSDP with ``use_orig_params=True``. A fused parameter (GPT-2 ``c_attn``) that is only
    partly trainable gets a gradient mask, so its frozen rows never change (train with weight decay 0, which the
    fine-tune entry point does); FSDP cannot run that hook, and the case is refused under it.

    Parameters
    ----------
    model : the pretrained model (not a copy already changed by training).
    card : the profile card; with ``check`` it must have been built for this model (shapes and weight hash).

    Returns
    -------
    The names of the parameters left trainable.
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
