"""``drift``: the drift table between a pretrained and a fine-tuned snapshot."""

from __future__ import annotations

import argparse
import time

from topotuner_lab._io.outputs import check_writable, refuse_overwrite
from topotuner_lab.cli.options import add_config_options, config_from_args


def _cmd_drift(args: argparse.Namespace) -> None:
    from topotuner_lab.drift.cache import DriftCache
    from topotuner_lab.drift.compute import drift_table
    from topotuner_lab.drift.executors import check_jobs, check_scheduler
    from topotuner_lab.drift.settings import DriftSettings
    from topotuner_lab.drift.tables import TABLE_SUFFIXES, save_table
    from topotuner_lab.weights.snapshot import load_snapshot

    check_writable(args.output, "output table", suffixes=TABLE_SUFFIXES)
    refuse_overwrite({"first snapshot": args.before, "second snapshot": args.after}, {"output table": args.output})
    settings = config_from_args(DriftSettings, args, base=DriftSettings.recipe(args.recipe))
    jobs = check_jobs(args.jobs)
    check_scheduler(args.scheduler)
    cache = DriftCache(None) if args.no_cache else DriftCache(args.cache) if args.cache else DriftCache()
    cache.check_writable()
    start = time.perf_counter()
    table = drift_table(
        load_snapshot(args.before),
        load_snapshot(args.after),
        settings,
        n_jobs=jobs,
        cache=cache,
        progress=True,
        allow_other_base=args.allow_other_base,
        scheduler=args.scheduler,
    )
    save_table(table, args.output)
    print(f"wrote {args.output}: {len(table)} projections in {time.perf_counter() - start:.1f} s")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``drift``: the settings' options, then where and how to compute."""
    from topotuner_lab.drift.settings import RECIPES, DriftSettings

    dr = sub.add_parser("drift", help="drift table between two snapshots")
    dr.add_argument("before", help="pretrained snapshot")
    dr.add_argument("after", help="fine-tuned snapshot of the same model")
    dr.add_argument("-o", "--output", required=True, help="table to write: .parquet or .csv")
    dr.add_argument(
        "--recipe",
        default="default",
        choices=tuple(RECIPES),
        help="named settings: default, or reference (the authors' scripts: cosine rows, H0, W1, internal_p = inf); "
        "options given beside it override its values (default: %(default)s)",
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
