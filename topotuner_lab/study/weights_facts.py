"""What a report reads of a comparison's weights, kept beside its ledger so the report renders without them.

Weights are not kept in git, yet a report needs a few facts of them: the pretrained model's identity (its name,
architecture, weight hash, parameter count in all and the shape of every attention projection, which the cards'
budgets and the normalization section rebuild cards from) and the share of 32-weight blocks on a 4-bit grid before and
after each prior fine-tune (the noise-floor section). A comparison records them in ``weights-facts.json`` when it
runs (:func:`record_weights_facts`); a report takes them from there where the weights are absent, and measures them
again and checks them against the record where the weights are present (:func:`weights_facts`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from topotuner_lab._io import atomic
from topotuner_lab._io.errors import InputFileError, TopoTunerError
from topotuner_lab._io.json_files import read_json
from topotuner_lab.profiles.card import ModelIdentity
from topotuner_lab.study.workspace import WorkDir
from topotuner_lab.weights.snapshot import Snapshot, load_snapshot

#: what the file says it is, first in it
ABOUT = (
    "facts of this folder's weights a report needs (weights are not kept in git); `topotuner-lab reproduce` writes "
    "them and `topotuner-lab report` checks them against the weights where those are present"
)


def grid_share(snapshot: Snapshot, block: int = 32, levels: int = 16) -> float:
    """Share of 32-weight blocks holding at most 16 distinct values: 1.0 for Q4_1-dequantized weights."""
    on_grid = total = 0
    for m in snapshot.matrices.values():
        blocks = m.reshape(-1, block)
        distinct = (np.diff(np.sort(blocks, axis=1), axis=1) != 0).sum(axis=1) + 1
        on_grid += int((distinct <= levels).sum())
        total += len(blocks)
    return on_grid / total


@dataclass(frozen=True)
class FinetunedFacts:
    """A prior fine-tune's weights: their hash and their share of blocks on the 4-bit grid."""

    weights_hash: str
    grid_share: float


@dataclass(frozen=True)
class WeightsFacts:
    """The facts of one model folder's weights that a report shows or rebuilds cards from."""

    #: the model's name as its snapshot records it (the report's section titles)
    model: str
    identity: ModelIdentity
    grid_share: float
    #: prior task -> its fine-tune's facts, for the priors whose weights were measured
    finetuned: dict[str, FinetunedFacts] = field(default_factory=dict)

    @property
    def architecture(self) -> str:
        """The model's ``model_type``."""
        return self.identity.architecture

    def record(self, work: WorkDir) -> dict[str, Any]:
        """The facts as ``weights-facts.json`` holds them (file paths relative to ``work``)."""
        return {
            "about": ABOUT,
            "model": self.model,
            "pretrained": {
                "file": work.pretrained.name,
                "grid_share": self.grid_share,
                "identity": self.identity.to_dict(),
            },
            "finetuned": {
                prior: {
                    "file": str(work.finetuned(prior).relative_to(work.root)),
                    "weights_hash": facts.weights_hash,
                    "grid_share": facts.grid_share,
                }
                for prior, facts in sorted(self.finetuned.items())
            },
        }


def _fix(work: WorkDir) -> str:
    """How to restore a damaged or stale facts file."""
    return (
        f"restore {work.weights_facts} from git (`git checkout -- {work.weights_facts}`), or rerun the same "
        f"`topotuner-lab reproduce --preset ... -o {work.root}`, which records the facts of the weights it holds"
    )


def read_facts(work: WorkDir) -> WeightsFacts:
    """The facts ``work`` recorded, checked field by field (a damaged file is an :class:`InputFileError`)."""
    path = work.weights_facts
    record = read_json(path, "weights facts", _fix(work))
    try:
        pretrained = record["pretrained"]
        return WeightsFacts(
            str(record["model"]),
            ModelIdentity.from_dict(pretrained["identity"]),
            float(pretrained["grid_share"]),
            {
                str(prior): FinetunedFacts(str(item["weights_hash"]), float(item["grid_share"]))
                for prior, item in dict(record["finetuned"]).items()
            },
        )
    except (KeyError, TypeError, ValueError, TopoTunerError) as exc:
        problem = exc.problem if isinstance(exc, TopoTunerError) else f"{exc.__class__.__name__}: {exc}"
        raise InputFileError(f"weights facts {path} are not a facts record ({problem})", _fix(work)) from exc


def measure_facts(work: WorkDir, priors: Sequence[str], pre: Snapshot | None = None) -> WeightsFacts | None:
    """The facts of the weights present in ``work`` (None without its pretrained snapshot).

    ``pre``: the pretrained snapshot where ``work`` keeps none of its own (a further prior seed's folder).
    """
    if pre is None and not work.pretrained.is_file():
        return None
    pre = pre or load_snapshot(work.pretrained)
    finetuned = {}
    for prior in priors:
        if work.finetuned(prior).is_file():
            after = load_snapshot(work.finetuned(prior))
            finetuned[prior] = FinetunedFacts(after.weights_hash, grid_share(after))
    return WeightsFacts(pre.model, ModelIdentity.from_snapshot(pre), grid_share(pre), finetuned)


def _merged(measured: WeightsFacts, recorded: WeightsFacts | None) -> WeightsFacts:
    """``measured`` plus what ``recorded`` holds of the priors whose weights are gone (same pretrained weights)."""
    if recorded is None or recorded.identity != measured.identity:
        return measured
    kept: Mapping[str, FinetunedFacts] = {p: f for p, f in recorded.finetuned.items() if p not in measured.finetuned}
    return WeightsFacts(measured.model, measured.identity, measured.grid_share, {**kept, **measured.finetuned})


def record_weights_facts(work: WorkDir, priors: Sequence[str], pre: Snapshot | None = None) -> WeightsFacts:
    """Measure the facts of the weights in ``work`` and write them to its ``weights-facts.json``.

    A prior whose weights are gone keeps what an earlier sitting recorded for it, when the pretrained weights are the
    same; a damaged record is rewritten, as every other damaged step is recomputed. ``pre``: as in
    :func:`measure_facts`.
    """
    measured = measure_facts(work, priors, pre)
    if measured is None:
        raise InputFileError(
            f"{work.pretrained} does not exist, so the facts of its weights cannot be recorded",
            "run `topotuner-lab reproduce` into this folder: it writes the pretrained snapshot first",
        )
    try:
        recorded = read_facts(work) if work.weights_facts.is_file() else None
    except InputFileError:
        recorded = None
    facts = _merged(measured, recorded)
    atomic.write_json(work.weights_facts, facts.record(work))
    return facts


def _check(work: WorkDir, recorded: WeightsFacts, measured: WeightsFacts) -> None:
    """The recorded facts are the measured ones wherever both exist."""
    stale = []
    if recorded.identity != measured.identity or recorded.model != measured.model:
        stale.append(
            f"the pretrained model {recorded.identity.name} ({recorded.identity.weights_hash}), but "
            f"{work.pretrained.name} holds {measured.identity.name} ({measured.identity.weights_hash})"
        )
    elif recorded.grid_share != measured.grid_share:
        stale.append(
            f"a grid share of {recorded.grid_share!r}, but {work.pretrained.name} gives {measured.grid_share!r}"
        )
    for prior, facts in measured.finetuned.items():
        if prior in recorded.finetuned and recorded.finetuned[prior] != facts:
            stale.append(
                f"the {prior} prior fine-tune as {recorded.finetuned[prior]}, but its weights give {facts} (trained "
                "again, or on another CPU?)"
            )
    if stale:
        raise InputFileError(f"weights facts {work.weights_facts} record {'; '.join(stale)}", _fix(work))


def weights_facts(work: WorkDir, priors: Sequence[str]) -> WeightsFacts | None:
    """The facts a report uses: measured where the weights are present (checked against the record), else recorded.

    None where ``work`` holds neither its pretrained snapshot nor a record of it (a ledger of an earlier version,
    restored without weights).
    """
    recorded = read_facts(work) if work.weights_facts.is_file() else None
    measured = measure_facts(work, priors)
    if measured is None:
        return recorded
    if recorded is not None:
        _check(work, recorded, measured)
    return _merged(measured, recorded)
