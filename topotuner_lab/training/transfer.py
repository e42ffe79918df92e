"""The transfer check before training: whether two tasks' gradient fields are close at the pretrained weights.

The paper's transfer argument: a card built on a prior task transfers to a target task when the two tasks' gradients
near the pretrained weights point alike. On a few hundred rows of each task this computes every attention matrix's
gradient of the completion-only loss, the cosine between the two tasks' gradients per matrix, and how well the card's
picks agree with the target's own gradient ranking (its matrices by gradient norm per parameter, the "gradient
magnitude" selector). It trains nothing.

The same gradient magnitude is a card strategy of its own (``gradient``): :func:`with_gradient_signal` adds the target
task's ``grad_norm`` column to a drift table and records the task, which the card keeps.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from scipy.stats import spearmanr
from transformers import DataCollatorForSeq2Seq

from topotuner_lab._io.config import NON_NEGATIVE_INT, POSITIVE_INT, Config, opt
from topotuner_lab._io.errors import ProfileError
from topotuner_lab.drift.signals import join_signal
from topotuner_lab.profiles.card import FIXED_RANKINGS, ProfileCard
from topotuner_lab.profiles.prior import resolve_prior
from topotuner_lab.tasks.loading import load_task
from topotuner_lab.tasks.registry import get_task
from topotuner_lab.training.trainer import tokenize_for_training
from topotuner_lab.weights.extract import extract_snapshot
from topotuner_lab.weights.models import LoadedModel
from topotuner_lab.weights.projections import enumerate_projections

#: median cosine over the card's matrices above which the gradient fields read as close (a heuristic, not a test)
CLOSE = 0.5
#: the drift-table column of the gradient-magnitude selector (strategy ``gradient``)
GRADIENT_COLUMN = FIXED_RANKINGS["gradient"][0]


@dataclass(frozen=True)
class TransferCheckSettings(Config):
    """How many rows of each task, of what length, in what batches; which rows (seed)."""

    label = "transfer check"

    n_rows: int = opt(128, "rows of each task (the prior's and the target's training split)", check=POSITIVE_INT)
    max_length: int = opt(64, "tokens per example", check=POSITIVE_INT)
    batch_size: int = opt(8, "rows per forward/backward pass", check=POSITIVE_INT)
    seed: int = opt(0, "which rows are drawn", check=NON_NEGATIVE_INT)


@dataclass(frozen=True)
class TransferCheck:
    """Per-matrix gradient agreement of two tasks, and the card's agreement with the target's gradient ranking.

    ``table`` has one row per projection: ``cosine`` (prior vs target gradient), ``grad_prior`` and ``grad_target``
    (gradient norm per parameter, the RMS entry), ``in_card``. ``rank_agreement`` is the Spearman correlation of
    the card's pick order with the target's gradient ranking; ``overlap`` the share of the card's picks among the
    target's top matrices of the same count.
    """

    card_prior: str
    target: str
    table: pd.DataFrame
    median_cosine_card: float
    median_cosine_all: float
    rank_agreement: float
    overlap: float

    @property
    def close(self) -> bool:
        """Whether the gradient fields read as close over the card's matrices (median cosine above ``CLOSE``)."""
        return self.median_cosine_card > CLOSE

    @property
    def verdict(self) -> str:
        """A short verdict with the numbers."""
        head = "likely transfers" if self.close else "may not transfer"
        return (
            f"{self.card_prior} -> {self.target}: {head} (median gradient cosine {self.median_cosine_card:.2f} over "
            f"the card's matrices, {self.median_cosine_all:.2f} over all; the card's picks rank "
            f"{self.rank_agreement:+.2f} against the target's own gradient ranking, {100 * self.overlap:.0f}% of them "
            "among its top matrices)"
        )


def projection_gradients(
    loaded: LoadedModel, task: str, settings: TransferCheckSettings, data_source: str | None = None
) -> dict[str, np.ndarray]:
    """The mean completion-only loss gradient of every attention matrix over ``settings.n_rows`` rows of ``task``."""
    get_task(task)
    model = copy.deepcopy(loaded.model)
    model.train(False)
    projections = enumerate_projections(model)
    names = {p.param_name for p in projections}
    for name, param in model.named_parameters():
        param.requires_grad_(name in names)
    tokenizer = loaded.tokenizer
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    rows = tokenize_for_training(
        tokenizer, load_task(task, "train", settings.n_rows, settings.seed, data_source), settings.max_length
    )
    collate = DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100)
    batches = range(0, len(rows), settings.batch_size)
    for start in batches:
        batch = collate([rows[i] for i in range(start, min(start + settings.batch_size, len(rows)))])
        loss = model(**batch).loss * (min(settings.batch_size, len(rows) - start) / len(rows))
        loss.backward()
    gradients = {}
    with torch.no_grad():
        for p in projections:
            grad = model.get_parameter(p.param_name).grad
            assert grad is not None  # every projection is in the loss's graph
            gradients[p.pid] = p.from_weight(grad).float().cpu().numpy().copy()
    return gradients


def _rms(gradient: np.ndarray) -> float:
    """The gradient magnitude of one matrix: its RMS entry (the gradient norm per parameter)."""
    return float(np.sqrt(np.mean(np.square(gradient, dtype=np.float64))))


def gradient_signal(
    loaded: LoadedModel, task: str, settings: TransferCheckSettings | None = None, data_source: str | None = None
) -> pd.DataFrame:
    """The gradient-magnitude selector's column for ``task``: one row per projection, ``pid`` and ``grad_norm``.

    ``grad_norm`` is the RMS entry of each attention matrix's mean completion-only loss gradient over
    ``settings.n_rows`` training rows of ``task`` at ``loaded``'s weights (:func:`projection_gradients`).
    """
    gradients = projection_gradients(loaded, task, settings or TransferCheckSettings(), data_source)
    return pd.DataFrame({"pid": list(gradients), GRADIENT_COLUMN: [_rms(g) for g in gradients.values()]})


def with_gradient_signal(
    table: pd.DataFrame,
    loaded: LoadedModel,
    task: str,
    settings: TransferCheckSettings | None = None,
    *,
    data_source: str | None = None,
) -> pd.DataFrame:
    """``table`` with the target task's ``grad_norm`` column (a ``gradient`` card's), the task in its attrs.

    Parameters
    ----------
    table : drift table of ``loaded``'s pretrained weights (a recorded ``before_hash`` must be theirs).
    loaded : the pretrained model (not changed: gradients are taken on a copy).
    task : the target task whose gradients rank the matrices (a column from another task is replaced).
    settings : rows, length, batch size and row seed (:class:`TransferCheckSettings`).

    Returns
    -------
    The table (its attrs kept) with :func:`gradient_signal`'s ``grad_norm`` joined by projection id and
    ``attrs["gradient_task"] = task``, which ``build_profile(strategy="gradient")`` records in the card.
    """
    recorded = table.attrs.get("before_hash")
    if recorded is not None and recorded != (weights := extract_snapshot(loaded).weights_hash):
        raise ProfileError(
            f"drift table was computed from weights {str(recorded)[:12]}, the model has {weights[:12]}",
            "take the gradients on the pretrained model the table was computed from",
        )
    joined = join_signal(table, gradient_signal(loaded, task, settings, data_source))
    joined.attrs["gradient_task"] = task
    return joined


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    denominator = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(np.vdot(a, b) / denominator) if denominator > 0 else float("nan")


def compare_gradients(
    card: ProfileCard, prior: dict[str, np.ndarray], target: dict[str, np.ndarray], target_task: str
) -> TransferCheck:
    """The per-matrix agreement of two tasks' gradients and the card's agreement with the target's ranking."""
    pids = list(prior)
    table = pd.DataFrame(
        {
            "pid": pids,
            "cosine": [_cosine(prior[p], target[p]) for p in pids],
            "grad_prior": [_rms(prior[p]) for p in pids],
            "grad_target": [_rms(target[p]) for p in pids],
            "in_card": [p in card.trainable for p in pids],
        }
    )
    by_target = table.sort_values("grad_target", ascending=False, kind="stable")["pid"].tolist()
    card_order = {r["pid"]: i for i, r in enumerate(card.ranking)}
    common = [p for p in by_target if p in card_order]
    agreement = spearmanr([card_order[p] for p in common], range(len(common))).statistic if len(common) > 2 else np.nan
    top = set(by_target[: len(card.trainable)])
    return TransferCheck(
        card.prior_task,
        target_task,
        table,
        float(table.loc[table["in_card"], "cosine"].median()),
        float(table["cosine"].median()),
        float(agreement),
        len(top & set(card.trainable)) / len(card.trainable),
    )


def transfer_check(
    loaded: LoadedModel,
    card: ProfileCard,
    target_task: str,
    settings: TransferCheckSettings | None = None,
    *,
    data_source: str | None = None,
    card_path: str | os.PathLike[str] | None = None,
) -> TransferCheck:
    r"""Check before training whether ``card`` (built on its prior task) suits ``target_task`` on ``loaded``.

    On a few rows of each task, every attention matrix's gradient of the completion-only loss at the pretrained
    weights; the cosine between the two tasks' gradients per matrix, and how the card's picks agree with the target's
    own gradient ranking. It trains nothing.

    Parameters
    ----------
    loaded : LoadedModel
        The pretrained model the card was built for (not changed: gradients are taken on a copy).
    card : ProfileCard
        The profile card; its ``prior_task`` names the prior, found from any folder as
        :func:`~topotuner_lab.profiles.prior.resolve_prior` finds it.
    target_task : str
        The task the card would be transferred to (a built-in name or a task spec ``.yaml``).
    settings : TransferCheckSettings, optional
        Rows per task (128), tokens per example, batch size and row seed.
    data_source : str, optional
        Where the tasks' rows come from: None for the offline copies, ``"hub"``, or a data folder laid out like
        ``shared/data``.
    card_path : str or os.PathLike, optional
        Where the card was read from: its folder is searched for the prior task's spec when it moved.

    Returns
    -------
    TransferCheck
        Per-matrix gradient cosines and norms (``table``), the medians over the card's matrices and over all, the
        card's rank agreement and overlap with the target's gradient ranking, ``close`` and a one-line ``verdict``.

    Raises
    ------
    ProfileError
        The card does not fit the model, or its prior task's spec cannot be found.
    TaskError
        An unknown task, or rows that cannot be read.

    Examples
    --------
    A card checked against its own prior task on four offline rows (a data folder laid out like ``shared/data``):

    >>> import tempfile
    >>> from pathlib import Path
    >>> import pandas as pd
    >>> from topotuner_lab import (CardSettings, DriftCache, DriftSettings, ModelIdentity, build_profile,
    ...                            drift_table, extract_snapshot, load_model, perturb_snapshot, transfer_check)
    >>> from topotuner_lab.training.transfer import TransferCheckSettings
    >>> loaded = load_model("tiny-llama")
    >>> pre = extract_snapshot(loaded)
    >>> table = drift_table(pre, perturb_snapshot(pre, 0.1), DriftSettings(maxdim=0), n_jobs=1, cache=DriftCache(None))
    >>> card = build_profile(table, ModelIdentity.from_snapshot(pre), CardSettings(prior_task="sst2", count=2))
    >>> rows = pd.DataFrame({"sentence": ["a fine film", "a dull mess", "warm", "flat"], "label": [1, 0, 1, 0]})
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     (Path(folder) / "sst2").mkdir()
    ...     rows.to_csv(Path(folder) / "sst2" / "train.tsv", sep="\t", index=False)
    ...     settings = TransferCheckSettings(n_rows=4, batch_size=4, max_length=16)
    ...     result = transfer_check(loaded, card, "sst2", settings, data_source=folder)
    >>> result.close, list(result.table.columns)
    (True, ['pid', 'cosine', 'grad_prior', 'grad_target', 'in_card'])
    >>> print(result.verdict)
    sst2 -> sst2: likely transfers (median gradient cosine 1.00 over the card's matrices, 1.00 over all; ...)
    """
    from topotuner_lab.profiles.apply import check_card_fits

    settings = settings or TransferCheckSettings()
    check_card_fits(card, loaded.model)
    prior = projection_gradients(loaded, resolve_prior(card, card_path), settings, data_source)
    target = projection_gradients(loaded, target_task, settings, data_source)
    return compare_gradients(card, prior, target, target_task)
