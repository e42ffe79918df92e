"""A prior fine-tune kept by its ledger: its drift tables verified and reused without its weights.

Weights are not kept in git. A study resumed from a clone of its ledger (another machine, often another CPU, whose
float32 training is not bit-identical) would otherwise train its prior again, rebuild every drift table and card from
weights that differ in their last bits, and read every finished run as stale. The ledger holds a chain that can be
checked without the weights: the prior's ``results.json`` records its config, ``weights-facts.json`` the hash of the
weights it ended with, and each drift table the hashes of the weights it was computed from (the pretrained ones are
measured again here). Where every link holds, the tables are the prior's and the study goes on from them.

The authors' element-wise relative change (the ``relchange`` selector) is a statistic of the prior's weights, not of
its drift table; without the weights it is read from the ledger's ``relchange`` cards, whose rankings record every
projection's score. A card says which pretrained model and prior task it ranks but not which prior weights, so that
one link is checked only as far as the card records it (see :func:`ledger_relchange`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from topotuner_lab._io.errors import ParameterError, TopoTunerError
from topotuner_lab.drift.settings import DriftSettings
from topotuner_lab.drift.signals import ELTWISE_COLUMN, join_signal, with_relchange
from topotuner_lab.drift.tables import load_table
from topotuner_lab.profiles.card import FIXED_RANKINGS, ProfileCard
from topotuner_lab.study.weights_facts import read_facts
from topotuner_lab.study.workspace import WorkDir, recorded_config, table_made_from, task_tag, weights_kept
from topotuner_lab.training.config import FinetuneConfig
from topotuner_lab.training.results import RunResults
from topotuner_lab.weights.snapshot import Snapshot, load_snapshot

Log = Callable[[str], None]

#: the strategy name of the authors' element-wise relative-change selector
RELCHANGE = "relchange"


def kept_prior_tables(
    folder: WorkDir,
    prior_cfg: FinetuneConfig,
    pre: Snapshot,
    tables: Sequence[tuple[str, Path, DriftSettings, str]],
    log: Log,
    *,
    relchange_from: WorkDir | None = None,
) -> dict[str, pd.DataFrame] | None:
    """The prior's drift tables by recipe where its weights are gone and its ledger verifies; None otherwise.

    ``tables``: per recipe, its table's path, drift settings and aggregation (``final``, or one over epochs).
    ``relchange_from``: the folder whose relchange cards must be readable too (the first prior seed of a preset
    with that selector), else the prior is not kept. None means: train the prior (or reuse its weights) as usual;
    ``log`` says which link failed where the ledger has the prior's results but not its weights.
    """
    results = Path(prior_cfg.output_dir) / "results.json"
    done = recorded_config(results, prior_cfg) if results.is_file() else None
    if done is None or weights_kept(done, prior_cfg):
        return None  # nothing recorded for this config, or the weights are here and verify by their own hash
    problem, kept = _verified(folder, done, pre, tables, prior_cfg.task)
    if problem is None and relchange_from is not None:
        problem, _ = _ledger_scores(relchange_from, pre, prior_cfg.task)
    if problem is not None:
        log(f"train the prior again: its weights are not here and the ledger cannot stand in for them ({problem})")
        return None
    log(
        f"kept from the ledger: {results.parent} and its drift tables (its weights are not here; every table verifies "
        f"against the pretrained weights and the prior's weights hash recorded in {folder.weights_facts.name})"
    )
    return kept


def _verified(
    folder: WorkDir,
    done: RunResults,
    pre: Snapshot,
    tables: Sequence[tuple[str, Path, DriftSettings, str]],
    prior: str,
) -> tuple[str | None, dict[str, pd.DataFrame]]:
    """(what does not verify, or None; the tables by recipe) of a prior recorded without its weights."""
    try:
        facts = read_facts(folder) if folder.weights_facts.is_file() else None
    except TopoTunerError as exc:
        return f"{folder.weights_facts}: {exc.problem}", {}
    if facts is None or facts.identity.weights_hash != pre.weights_hash:
        return f"{folder.weights_facts} records no facts of these pretrained weights", {}
    if prior not in facts.finetuned:
        return f"{folder.weights_facts} records no hash of the prior's weights", {}
    final_hash = facts.finetuned[prior].weights_hash
    kept = {}
    for recipe, path, settings, aggregation in tables:
        try:
            table = load_table(path)
        except TopoTunerError as exc:
            return f"{path}: {exc.problem}", {}
        if not table_made_from(table, pre.weights_hash, settings, list(pre.matrices)):
            return f"{path} was made from other pretrained weights, settings or projections", {}
        if not _ends_with(table, aggregation, final_hash, int(done.get("epochs_run") or 0)):
            return f"{path} was not computed from the prior's recorded weights {final_hash[:12]}", {}
        kept[recipe] = table
    return None, kept


def _ends_with(table: pd.DataFrame, aggregation: str, final_hash: str, epochs: int) -> bool:
    """Whether ``table`` was computed from the weights ``final_hash`` (an epoch aggregate: one per epoch, ending so).

    An aggregate's earlier epochs are checked only as far as it records them (one hash per epoch run); the weights
    they came from are gone.
    """
    if aggregation == "final":
        return table.attrs.get("after_hash") == final_hash
    hashes = table.attrs.get("after_hashes") or []
    return table.attrs.get("aggregation") == aggregation and len(hashes) == epochs and hashes[-1] == final_hash


def _relchange_cards(work: WorkDir, prior: str) -> list[Path]:
    """The relchange cards of ``prior`` in ``work``'s cards folder (one per budget)."""
    return sorted(work.cards.glob(f"{task_tag(prior)}-{RELCHANGE}-*.json"))


def _card_scores(path: Path, pre: Snapshot, prior: str) -> tuple[str | None, pd.Series]:
    """(what is wrong with the card as a record of the relative change, or None; its scores by projection id)."""
    try:
        card = ProfileCard.load(path)
    except TopoTunerError as exc:
        return f"{path}: {exc.problem}", pd.Series(dtype=float)
    scores = pd.Series({r["pid"]: float(r["score"]) for r in card.ranking})
    if card.model.weights_hash != pre.weights_hash or card.prior_task != prior:
        return f"{path} ranks another pretrained model or prior task", scores
    if (
        card.strategy != RELCHANGE
        or card.metric != FIXED_RANKINGS[RELCHANGE][0]
        or card.normalization != "raw"
        or card.aggregation != "final"
    ):
        return f"{path} does not record raw element-wise relative changes of the final weights", scores
    if sorted(scores.index) != sorted(pre.matrices):
        return f"{path} does not score every projection", scores
    return None, scores


def _ledger_scores(work: WorkDir, pre: Snapshot, prior: str) -> tuple[str | None, pd.Series]:
    """(why ``work``'s relchange cards cannot stand in for the prior's weights, or None; the scores they agree on)."""
    paths = _relchange_cards(work, prior)
    if not paths:
        return f"no {RELCHANGE} card of {prior} in {work.cards} records the element-wise relative change", pd.Series(
            dtype=float
        )
    found = [_card_scores(path, pre, prior) for path in paths]
    first = found[0][1].sort_index()
    problem = next((problem for problem, _ in found if problem is not None), None)
    if problem is None and not all(scores.sort_index().equals(first) for _, scores in found[1:]):
        problem = f"the {RELCHANGE} cards of {prior} record different scores"
    return problem, first


def ledger_relchange(table: pd.DataFrame, pre: Snapshot, prior: str, work: WorkDir, log: Log) -> pd.DataFrame:
    """``table`` with the prior fine-tune's element-wise relative change: from its weights, else from its cards.

    Without the weights (a ledger resumed elsewhere, see :func:`kept_prior_tables`) the scores are those the ledger's
    relchange cards ranked by; every card must name these pretrained weights and this prior and agree with the others.
    """
    if work.finetuned(prior).is_file():
        return with_relchange(table, pre, load_snapshot(work.finetuned(prior)))
    problem, scores = _ledger_scores(work, pre, prior)
    if problem is not None:
        raise ParameterError(
            f"the element-wise relative change of the {prior} prior needs its weights ({work.finetuned(prior)}), "
            f"which are not here, and the ledger cannot stand in: {problem}",
            f"restore {work.finetuned(prior)}, or remove {work.prior_run(prior)}/results.json to train the prior again",
        )
    log(f"element-wise relative change of the {prior} prior read from its {RELCHANGE} cards (its weights are not here)")
    return join_signal(table, scores.rename(ELTWISE_COLUMN).rename_axis("pid").reset_index())
