"""One place for the layout of a work folder and for "reuse a finished step, or compute it".

The notebooks, :mod:`workbench`, :mod:`experiments` and :mod:`report` all read and write the same
files (pretrained snapshot, prior fine-tunes, drift tables, cards, runs); their names live here only.
A finished step is reused only after it loads cleanly and passes its check (the same weights, the
same settings, the same config); anything else is computed again.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from topotuner_lab._io.errors import TopoTunerError
from topotuner_lab.tasks.registry import TASKS, get_task

if TYPE_CHECKING:
    import pandas as pd

    from topotuner_lab.drift.settings import DriftSettings
    from topotuner_lab.training.config import FinetuneConfig
    from topotuner_lab.training.results import RunResults
    from topotuner_lab.weights.models import LoadedModel
    from topotuner_lab.weights.snapshot import Snapshot

T = TypeVar("T")


def task_tag(task: str) -> str:
    """A task as file and folder names show it: a built-in task's name, a spec file's ``task`` field (not its path)."""
    if task in TASKS or not (task.lower().endswith((".yaml", ".yml")) or "/" in task or os.sep in task):
        return task
    return get_task(task).name


@dataclass(frozen=True)
class WorkDir:
    """Paths inside a work folder (``runs/workbench``, ``runs/reproduce-cpu-small``, ...)."""

    root: Path

    def __init__(self, root: str | os.PathLike[str]) -> None:
        object.__setattr__(self, "root", Path(root))

    @property
    def pretrained(self) -> Path:
        """The pretrained model's snapshot."""
        return self.root / "pretrained.safetensors"

    def prior_run(self, task: str) -> Path:
        """The full fine-tune on a prior task whose drift ranks the projections."""
        return self.root / f"prior-{task_tag(task)}"

    def finetuned(self, task: str) -> Path:
        """The snapshot after the full fine-tune on a prior task."""
        return self.prior_run(task) / "after.safetensors"

    @property
    def weights_facts(self) -> Path:
        """What a report reads of the weights (identity, grid shares), kept in git where the weights are not."""
        return self.root / "weights-facts.json"

    def drift_table(self, task: str) -> Path:
        """The drift table of a prior task (pretrained against its fine-tune)."""
        return self.root / f"drift-{task_tag(task)}.parquet"

    def epoch_drift_table(self, task: str, epoch: int) -> Path:
        """The drift table of a prior task's run after ``epoch`` (in a folder :meth:`drift_tables` does not list)."""
        return epoch_table_path(self.drift_table(task), epoch)

    def drift_tables(self) -> list[Path]:
        """The prior tasks' drift tables present, sorted."""
        return sorted(self.root.glob("drift-*.parquet"))

    @staticmethod
    def prior_task_of(table: Path) -> str:
        """The prior task a drift table file belongs to (its name less ``drift-``)."""
        return table.stem.removeprefix("drift-")

    def noise_table(self, seed: int) -> Path:
        """Drift of the pretrained snapshot against a perturbed copy (noise floor), one per seed."""
        return self.root / "noise" / f"noise-{seed}.parquet"

    @property
    def cards(self) -> Path:
        """The folder of profile cards."""
        return self.root / "cards"

    def card(self, name: str = "profile") -> Path:
        """A card file in the cards folder (``profile.json`` by default)."""
        return self.cards / f"{name}.json"

    def compare_folder(self, task: str) -> Path:
        """The side-by-side comparison of methods on ``task``: a folder per method."""
        return self.root / "compare" / task_tag(task)

    def compare_run(self, task: str, method: str) -> Path:
        """The run folder of ``method`` in the side-by-side comparison of methods on ``task``."""
        return self.compare_folder(task) / method

    def model(self, name: str) -> WorkDir:
        """The work folder of a further model (drift only) inside this one."""
        return WorkDir(self.root / "models" / name)

    def models(self) -> list[WorkDir]:
        """The work folders of the further models present, sorted."""
        return [WorkDir(p) for p in sorted((self.root / "models").glob("*")) if p.is_dir()]

    def recipe(self, name: str) -> WorkDir:
        """The folder of a drift recipe's tables: this one for ``default``, ``recipes/<name>/`` for another.

        Each recipe keeps its own drift and noise tables under the same file names, so this folder's
        ``drift-*.parquet`` stay the default recipe's.
        """
        return self if name == "default" else WorkDir(self.root / "recipes" / name)

    def prior_seed(self, seed: int) -> WorkDir:
        """The folder of a further prior seed's fine-tunes and drift tables (the first seed's live in this one)."""
        return WorkDir(self.root / "prior-seeds" / f"seed{seed}")

    def transfer_check(self, prior: str, target: str, budget: float) -> Path:
        """The transfer check recorded for a card's transfer from ``prior`` to ``target`` at ``budget``."""
        return self.root / "transfer" / f"{task_tag(prior)}-{task_tag(target)}-{budget:g}.json"

    def transfer_checks(self) -> list[Path]:
        """The transfer checks recorded, sorted."""
        return sorted((self.root / "transfer").glob("*.json"))

    def target_run(self, prior: str, tag: str, name: str) -> Path:
        """A comparison run's folder: by prior, then ``tag``, then the run's name (``:`` and ``@`` made path-safe)."""
        return self.root / "runs" / f"prior-{task_tag(prior)}" / tag / name.replace(":", "-").replace("@", "-")

    @property
    def results(self) -> Path:
        """The comparison's results table (one row per run)."""
        return self.root / "results.csv"

    @property
    def preset(self) -> Path:
        """The preset of the comparison, written beside its results."""
        return self.root / "preset.json"


def reuse_or_compute(
    path: Path,
    load: Callable[[Path], T],
    compute: Callable[[], T],
    *,
    valid: Callable[[T], bool] = lambda _: True,
    log: Callable[[str], None] = lambda _: None,
) -> T:
    """``load(path)`` when the file is there, loads cleanly and passes ``valid``; else ``compute()`` (writing it)."""
    if path.exists():
        try:
            found = load(path)
        except TopoTunerError as exc:
            log(f"recompute (unreadable): {path}: {exc.problem}")
        else:
            if valid(found):
                log(f"skip (done): {path}")
                return found
            log(f"recompute (stale: made from other inputs or settings): {path}")
    return compute()


def snapshot_once(loaded: LoadedModel, path: Path) -> Snapshot:
    """The model's snapshot at ``path``, reused only if its weights are this model's."""
    from topotuner_lab.weights.extract import extract_snapshot
    from topotuner_lab.weights.snapshot import load_snapshot, save_snapshot

    fresh = extract_snapshot(loaded)

    def write() -> Snapshot:
        save_snapshot(fresh, path)
        return fresh

    return reuse_or_compute(path, load_snapshot, write, valid=lambda snap: snap.weights_hash == fresh.weights_hash)


def same_config(done: RunResults, cfg: FinetuneConfig) -> bool:
    """Whether ``done`` ran ``cfg``: its recorded config, with the counts asked for where the data held fewer.

    A run that also wrote per-epoch snapshots serves a config that does not ask for them (the training is the same),
    and one recorded before a field existed ran as that field's default does (a field is only ever added with a
    default that keeps what ran before, e.g. ``save_epoch_snapshots`` False, ``ood_tasks`` empty).
    """
    ignore = ("output_dir", "keep_checkpoints", "profile")  # the card's content is checked: _same_card
    before = type(cfg)().to_dict()  # fields added later, as a run without them ran
    asked = {**before, **(done.get("config") or {}), **(done.get("requested_counts") or {})}
    if asked["save_epoch_snapshots"] and not cfg.save_epoch_snapshots:
        asked["save_epoch_snapshots"] = False
    recorded = {k: v for k, v in asked.items() if k not in ignore}
    return recorded == {k: v for k, v in cfg.to_dict().items() if k not in ignore}  # JSON values: tuples as lists


def run_snapshot(done: RunResults, folder: str | os.PathLike[str]) -> Path:
    """The final snapshot a run kept, in its folder as it is now (``folder``: the run's output folder).

    Results record the path the run wrote; a run folder copied or moved (a clone of a ledger) holds the file under
    its own path, and the recorded one could be another folder's weights.
    """
    return Path(folder) / Path(done["snapshot"]).name


def run_epoch_snapshots(done: RunResults, folder: str | os.PathLike[str]) -> list[Path]:
    """The per-epoch snapshots a run kept, in order, in its folder as it is now (see :func:`run_snapshot`)."""
    return [Path(folder) / Path(path).name for path in done.get("epoch_snapshots") or []]


def weights_kept(done: RunResults, cfg: FinetuneConfig) -> bool:
    """Whether the snapshots ``cfg`` asks a run to keep are in its folder.

    A run folder restored from its results alone (no weights) has to train again for later steps to read them.
    """
    if cfg.save_snapshot and not done.get("snapshot"):
        return False
    wanted = [run_snapshot(done, cfg.output_dir)] if cfg.save_snapshot else []
    wanted += run_epoch_snapshots(done, cfg.output_dir) if cfg.save_epoch_snapshots else []
    return all(path.is_file() for path in wanted)


def _same_card(loaded: LoadedModel, done: RunResults, cfg: FinetuneConfig) -> bool:
    """Whether ``done`` trained with ``cfg``'s card as it is now: same matrices (LoRA: rank) and stopping threshold.

    A card file is rebuilt from its drift table, so a prior trained again can change it; where the card lives is
    not part of the question (a cloned ledger names it by another path).
    """
    from topotuner_lab.profiles.card import ProfileCard
    from topotuner_lab.training.recipe import stop_threshold_for
    from topotuner_lab.training.trainer import resolve_lora_rank

    if cfg.profile is None:
        return True
    card = ProfileCard.load(cfg.profile)
    if cfg.method == "profile":
        same = (done.get("profile") or {}).get("trainable") == card.trainable
    elif cfg.method == "lora":
        same = done.get("lora_rank") == resolve_lora_rank(loaded.model, cfg, card)
    else:  # full fine-tuning reads a card only for its stopping threshold
        same = True
    return same and done.get("stop_threshold") == stop_threshold_for(cfg, card)


def finetune_once(loaded: LoadedModel, cfg: FinetuneConfig, log: Callable[[str], None] = lambda _: None) -> RunResults:
    """``run_finetune(loaded, cfg)`` unless its folder already holds results of this very config (then those).

    "This very config" also means the card as it is now and, where the config keeps weights, those weights on disk.
    """
    from topotuner_lab.training.finetune import run_finetune
    from topotuner_lab.training.results import load_results

    out = Path(cfg.output_dir)

    def same_training(done: RunResults) -> bool:
        return same_config(done, cfg) and _same_card(loaded, done, cfg)

    def run() -> RunResults:
        # a stale run's checkpoints belong to another config or card; a run stale only for its missing weights keeps
        # them (they are an interrupted retrain's)
        if (out / "results.json").exists() and _recorded(out / "results.json", same_training) is None:
            for checkpoint in out.glob("checkpoint-*"):
                shutil.rmtree(checkpoint)
        log(f"run: {out}")
        return run_finetune(loaded, cfg).to_dict()

    return reuse_or_compute(out / "results.json", load_results, run, valid=_serves(loaded, cfg), log=log)


def _serves(loaded: LoadedModel, cfg: FinetuneConfig) -> Callable[[RunResults], bool]:
    """Whether a recorded run is ``cfg``'s: same config and card, and the weights ``cfg`` keeps are on disk."""
    return lambda done: same_config(done, cfg) and _same_card(loaded, done, cfg) and weights_kept(done, cfg)


def recorded_run(loaded: LoadedModel, cfg: FinetuneConfig) -> RunResults | None:
    """The results ``cfg``'s folder already holds for this very config (as :func:`finetune_once` would reuse them).

    Lets the owner of a resumed comparison record a finished run at once, without queueing it behind running ones.
    """
    path = Path(cfg.output_dir) / "results.json"
    return _recorded(path, _serves(loaded, cfg)) if path.exists() else None


def recorded_config(path: Path, cfg: FinetuneConfig) -> RunResults | None:
    """The results at ``path`` where they record ``cfg`` (weights or not: see :func:`weights_kept`), else None."""
    return _recorded(path, lambda done: same_config(done, cfg))


def _recorded(path: Path, check: Callable[[RunResults], bool]) -> RunResults | None:
    """The results file at ``path`` where it reads cleanly and passes ``check`` (read once), else None."""
    from topotuner_lab.training.results import load_results

    try:
        done = load_results(path)
    except TopoTunerError:
        return None
    return done if check(done) else None


def drift_table_once(
    before: Snapshot,
    after: Snapshot,
    path: Path,
    settings: DriftSettings | None = None,
    *,
    log: Callable[[str], None] = lambda _: None,
    **kwargs: Any,
) -> pd.DataFrame:
    """The drift table at ``path``, computed once.

    Reused only if it holds the projections asked for (``pids``, default all), computed from these weights with
    ``settings`` (``log`` says which, and why a table is computed again: a retrained prior whose weights differ);
    ``kwargs`` go to :func:`~topotuner_lab.drift.compute.drift_table`.
    """
    from topotuner_lab.drift.compute import drift_table
    from topotuner_lab.drift.settings import DriftSettings
    from topotuner_lab.drift.tables import load_table, save_table

    settings = settings or DriftSettings()
    kwargs.setdefault("progress", True)
    wanted = list(kwargs.get("pids") or before.matrices)

    def compute() -> pd.DataFrame:
        table = drift_table(before, after, settings, **kwargs)
        save_table(table, path)
        return table

    def valid(table: pd.DataFrame) -> bool:
        return table_made_from(table, before.weights_hash, settings, wanted) and (
            table.attrs.get("after_hash") == after.weights_hash
        )

    return reuse_or_compute(path, load_table, compute, valid=valid, log=log)


def table_made_from(table: pd.DataFrame, before_hash: str, settings: DriftSettings, pids: Sequence[str]) -> bool:
    """Whether a drift table records these pretrained weights and drift settings and holds exactly ``pids``.

    The check of its fine-tuned side (one ``after_hash``, or ``after_hashes`` per epoch) is the caller's.
    """
    import json

    return (
        table.attrs.get("before_hash") == before_hash
        and table.attrs.get("settings") == json.dumps(settings.key())
        and list(table["pid"]) == list(pids)
    )


def noise_tables_once(
    pre: Snapshot, work: WorkDir, seeds: Sequence[int], settings: DriftSettings | None = None
) -> list[pd.DataFrame]:
    """Drift of ``pre`` against a perturbed copy of itself per seed (the noise floor), each table computed once."""
    from topotuner_lab.weights.snapshot import NOISE_SCALE, perturb_snapshot

    return [
        drift_table_once(pre, perturb_snapshot(pre, NOISE_SCALE, seed), work.noise_table(seed), settings)
        for seed in seeds
    ]


def epoch_table_path(path: Path, epoch: int) -> Path:
    """Where :func:`epoch_drift_once` keeps the per-epoch table ``epoch`` of the aggregate at ``path``.

    ``drift-sst2.parquet`` -> ``drift-sst2-epochs/epoch-3.parquet``: a folder of its own, so the per-epoch tables are
    never listed as prior tasks' tables.
    """
    return path.parent / f"{path.stem}-epochs" / f"epoch-{epoch}{path.suffix}"


def epoch_drift_once(
    before: Snapshot,
    afters: Sequence[Snapshot],
    path: Path,
    aggregation: str = "mean",
    settings: DriftSettings | None = None,
    *,
    log: Callable[[str], None] = lambda _: None,
    **kwargs: Any,
) -> pd.DataFrame:
    """The drift of a run aggregated over its epochs (``aggregation``: ``mean`` or ``final``) at ``path``.

    ``afters`` are the snapshots after each epoch, in order (a run with ``save_epoch_snapshots``: its results'
    ``epoch_snapshots``). The aggregate is reused only when it records this aggregation of these very epochs
    (``after_hashes``) against ``before`` with ``settings`` and holds the projections asked for; else each epoch's
    table is taken from :func:`drift_table_once` (reused when verified, computed when missing, stale or damaged; kept
    at :func:`epoch_table_path`), then aggregated (:func:`~topotuner_lab.drift.tables.aggregate_epochs`) and written.
    ``kwargs`` go to :func:`~topotuner_lab.drift.compute.drift_table`.
    """
    from topotuner_lab._io.errors import ParameterError
    from topotuner_lab.drift.settings import DriftSettings
    from topotuner_lab.drift.tables import AGGREGATIONS, aggregate_epochs, load_table, save_table

    if aggregation not in AGGREGATIONS:
        raise ParameterError(f"unknown aggregation {aggregation!r}", f"use one of {', '.join(AGGREGATIONS)}")
    if not afters:
        raise ParameterError(
            "no per-epoch snapshots to aggregate drift over",
            "fine-tune with save_epoch_snapshots=True (--save-epoch-snapshots) and pass its results' epoch_snapshots",
        )
    settings = settings or DriftSettings()
    wanted = list(kwargs.get("pids") or before.matrices)
    hashes = [after.weights_hash for after in afters]

    def compute() -> pd.DataFrame:
        tables = []
        for epoch, after in enumerate(afters, start=1):
            log(f"drift after epoch {epoch}/{len(afters)}: {epoch_table_path(path, epoch)}")
            tables.append(drift_table_once(before, after, epoch_table_path(path, epoch), settings, log=log, **kwargs))
        table = aggregate_epochs(tables, aggregation)
        save_table(table, path)
        return table

    def valid(table: pd.DataFrame) -> bool:
        return (
            table.attrs.get("aggregation") == aggregation
            and table.attrs.get("after_hashes") == hashes
            and table_made_from(table, before.weights_hash, settings, wanted)
        )

    return reuse_or_compute(path, load_table, compute, valid=valid, log=log)
