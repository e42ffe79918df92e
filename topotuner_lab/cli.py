"""``topotuner-lab`` command line: extract snapshots, compute drift tables, and more."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence

from .errors import TopoTunerError


def _cmd_extract(args: argparse.Namespace) -> None:
    from .models import load_model
    from .snapshot import extract_snapshot, save_snapshot

    loaded = load_model(args.model)
    snap = extract_snapshot(loaded, base_model=args.base_model)
    save_snapshot(snap, args.output)
    print(f"wrote {args.output}: {len(snap.matrices)} projections of {snap.model} (weights {snap.weights_hash[:12]})")


def _cmd_perturb(args: argparse.Namespace) -> None:
    from .snapshot import load_snapshot, perturb_snapshot, save_snapshot

    snap = perturb_snapshot(load_snapshot(args.snapshot), args.scale, args.seed)
    save_snapshot(snap, args.output)
    print(f"wrote {args.output}: {snap.note}")


def _cmd_drift(args: argparse.Namespace) -> None:
    from .drift import DriftCache, DriftSettings, drift_table, save_table
    from .snapshot import load_snapshot

    settings = DriftSettings(maxdim=args.maxdim, metric=args.metric, orders=tuple(args.p), solver=args.solver, n_perm=args.n_perm, seed=args.seed)
    cache = DriftCache(None) if args.no_cache else DriftCache(args.cache) if args.cache else DriftCache()
    start = time.perf_counter()
    table = drift_table(load_snapshot(args.before), load_snapshot(args.after), settings, n_jobs=args.jobs, cache=cache, progress=True, allow_other_base=args.allow_other_base)
    save_table(table, args.output)
    print(f"wrote {args.output}: {len(table)} projections in {time.perf_counter() - start:.1f} s")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="topotuner-lab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    ext = sub.add_parser("extract", help="save a model's attention matrices as a snapshot")
    ext.add_argument("model", nargs="?", default=None, help="model folder, .gguf file, hub id or tiny-* (default: embedded SmolLM2-135M)")
    ext.add_argument("-o", "--output", required=True)
    ext.add_argument("--base-model", default=None, help="the pretrained model this one was fine-tuned from")
    ext.set_defaults(func=_cmd_extract)

    per = sub.add_parser("perturb", help="add tiny Gaussian noise to a snapshot (drift noise floor)")
    per.add_argument("snapshot")
    per.add_argument("-o", "--output", required=True)
    per.add_argument("--scale", type=float, default=1e-3, help="noise std as a fraction of each matrix's std")
    per.add_argument("--seed", type=int, default=0)
    per.set_defaults(func=_cmd_perturb)

    dr = sub.add_parser("drift", help="drift table between two snapshots")
    dr.add_argument("before")
    dr.add_argument("after")
    dr.add_argument("-o", "--output", required=True, help=".parquet or .csv")
    dr.add_argument("--maxdim", type=int, default=1, choices=[0, 1])
    dr.add_argument("--metric", default="euclidean", choices=["euclidean", "cosine"])
    dr.add_argument("-p", type=float, nargs="+", default=[1.0, 2.0], help="Wasserstein orders")
    dr.add_argument("--solver", default="auto", choices=["auto", "pot", "hera"])
    dr.add_argument("--n-perm", type=int, default=None, help="greedy subsample size for H1")
    dr.add_argument("--seed", type=int, default=0)
    dr.add_argument("-j", "--jobs", type=int, default=2)
    dr.add_argument("--cache", default=None, help="cache folder (default: ~/.cache/topotuner_lab/drift)")
    dr.add_argument("--no-cache", action="store_true")
    dr.add_argument("--allow-other-base", action="store_true")
    dr.set_defaults(func=_cmd_drift)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], None] = args.func
    try:
        func(args)
    except TopoTunerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
