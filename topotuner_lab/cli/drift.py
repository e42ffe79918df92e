"""``drift``: the drift table between a pretrained and a fine-tuned snapshot, or aggregated over a run's epochs."""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

from topotuner_lab._io.errors import InputFileError, ParameterError
from topotuner_lab._io.outputs import check_writable, refuse_overwrite
from topotuner_lab.cli.options import add_config_options, config_from_args

#: a per-epoch snapshot's file name, as a fine-tune with --save-epoch-snapshots writes it
_EPOCH_FILE = re.compile(r"epoch-(\d+)\.safetensors")


def _epoch_files(folder: Path) -> list[Path]:
    """A run folder's per-epoch snapshots, in epoch order (``epoch-10`` after ``epoch-9``): every epoch of the run.

    The run's epochs are those its ``results.json`` records (``epochs_run``, read verified), else 1 to the last
    snapshot's; a folder missing one of them, or holding one beyond them, is refused: an aggregate over the others
    would not be the run's.
    """
    found = {int(m[1]): p for p in folder.iterdir() if (m := _EPOCH_FILE.fullmatch(p.name)) and p.is_file()}
    if not found:
        raise ParameterError(
            f"{folder} is a folder without per-epoch snapshots (epoch-N.safetensors)",
            "fine-tune with --save-epoch-snapshots, or give the snapshot files themselves",
        )
    epochs, recorded = max(found), "its snapshots go up to that epoch"
    if (folder / "results.json").is_file():
        from topotuner_lab.training.results import load_results

        epochs, recorded = int(load_results(folder / "results.json")["epochs_run"]), "as its results.json records"
    missing = [f"epoch-{epoch}.safetensors" for epoch in range(1, epochs + 1) if epoch not in found]
    beyond = [found[epoch].name for epoch in sorted(found) if not 1 <= epoch <= epochs]
    if missing or beyond:
        raise InputFileError(
            f"run folder {folder} ran {epochs} epoch(s) ({recorded}) but "
            + (f"lacks {', '.join(missing)}" if missing else f"also holds {', '.join(beyond)}"),
            "fine-tune again with --save-epoch-snapshots into an empty folder to aggregate every epoch, or give "
            "the snapshot files themselves to aggregate only those",
        )
    return [found[epoch] for epoch in range(1, epochs + 1)]


def after_snapshots(given: list[str], aggregate: str | None) -> list[Path]:
    """The fine-tuned snapshots named on the command line, in epoch order.

    A run folder stands for its ``epoch-N.safetensors`` files; files all named ``epoch-N.safetensors`` (a shell
    glob) are put in epoch order. Several snapshots need ``--aggregate``.
    """
    paths: list[Path] = []
    for name in given:
        path = Path(name)
        paths += _epoch_files(path) if path.is_dir() else [path]
    numbers = [m and int(m[1]) for m in (_EPOCH_FILE.fullmatch(p.name) for p in paths)]
    if len(paths) > 1 and all(numbers) and len({p.parent.resolve() for p in paths}) == 1:
        paths = [p for _, p in sorted(zip(numbers, paths))]  # a shell glob lists epoch-10 before epoch-2
    if len(set(map(Path.resolve, paths))) != len(paths):
        raise ParameterError("an after-snapshot is given twice", "give each epoch's snapshot once")
    if len(paths) > 1 and aggregate is None:
        raise ParameterError(
            f"{len(paths)} after-snapshots (one per epoch) need an aggregation",
            "add --aggregate mean (mean drift over the epochs) or --aggregate final (the last epoch's)",
        )
    return paths


def _cmd_drift(args: argparse.Namespace) -> None:
    from topotuner_lab.drift.cache import DriftCache
    from topotuner_lab.drift.compute import drift_table
    from topotuner_lab.drift.executors import check_jobs, check_scheduler
    from topotuner_lab.drift.settings import DriftSettings
    from topotuner_lab.drift.tables import TABLE_SUFFIXES, aggregate_epochs, save_table
    from topotuner_lab.weights.snapshot import load_snapshot

    check_writable(args.output, "output table", suffixes=TABLE_SUFFIXES)
    afters = after_snapshots(args.after, args.aggregate)
    refuse_overwrite(
        {"first snapshot": args.before, **{f"snapshot {p}": p for p in afters}}, {"output table": args.output}
    )
    settings = config_from_args(DriftSettings, args, base=DriftSettings.recipe(args.recipe))
    jobs = check_jobs(args.jobs)
    check_scheduler(args.scheduler)
    cache = DriftCache(None) if args.no_cache else DriftCache(args.cache) if args.cache else DriftCache()
    cache.check_writable()
    start = time.perf_counter()
    before = load_snapshot(args.before)
    tables = []
    for epoch, after in enumerate(afters, start=1):
        if len(afters) > 1:
            print(f"[{epoch}/{len(afters)}] drift against {after}", file=sys.stderr)
        tables.append(
            drift_table(
                before,
                load_snapshot(after),
                settings,
                n_jobs=jobs,
                cache=cache,
                progress=True,
                allow_other_base=args.allow_other_base,
                scheduler=args.scheduler,
            )
        )
    table = aggregate_epochs(tables, args.aggregate) if args.aggregate else tables[0]
    save_table(table, args.output)
    how = f", {args.aggregate} over {len(tables)} epochs" if args.aggregate else ""
    print(f"wrote {args.output}: {len(table)} projections{how} in {time.perf_counter() - start:.1f} s")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``drift``: the settings' options, then where and how to compute."""
    from topotuner_lab.drift.settings import RECIPES, DriftSettings
    from topotuner_lab.drift.tables import AGGREGATIONS

    dr = sub.add_parser("drift", help="drift table between two snapshots, or aggregated over a run's epochs")
    dr.add_argument("before", help="pretrained snapshot")
    dr.add_argument(
        "after",
        nargs="+",
        help="fine-tuned snapshot of the same model; or, with --aggregate, one per epoch in epoch order (a run "
        "folder of a fine-tune with --save-epoch-snapshots stands for its epoch-N.safetensors)",
    )
    dr.add_argument(
        "--aggregate",
        default=None,
        choices=AGGREGATIONS,
        help="combine the per-epoch tables: mean (of every drift column over the epochs) or final (the last "
        "epoch's); the table records it (needed for several after-snapshots)",
    )
    dr.add_argument("-o", "--output", required=True, help="table to write: .parquet or .csv")
    dr.add_argument(
        "--recipe",
        default="default",
        choices=tuple(RECIPES),
        help="named settings: default, or reference (the authors' scripts: cosine distance between rows, H0, W1, "
        "L-inf norm); options given beside it override its values (default: %(default)s)",
    )
    add_config_options(dr, DriftSettings, only_given=True)
    dr.add_argument(
        "-j", "--jobs", type=int, default=2, help="worker processes, capped at the core count (default: %(default)s)"
    )
    dr.add_argument("--cache", default=None, help="cache folder (default: ~/.cache/topotuner_lab/drift)")
    dr.add_argument("--no-cache", action="store_true", help="compute everything, store nothing")
    dr.add_argument("--allow-other-base", action="store_true", help="allow snapshots whose base models differ")
    dr.add_argument(
        "--scheduler",
        default=None,
        help="'local' for a Dask LocalCluster of --jobs workers, or a Dask scheduler address "
        "(tcp://host:8786) to spread the table over a cluster; the cache must be a path every worker sees",
    )
    dr.set_defaults(func=_cmd_drift)
