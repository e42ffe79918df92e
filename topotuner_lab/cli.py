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


def _cmd_profile(args: argparse.Namespace) -> None:
    from .drift import load_table
    from .profiles import ModelIdentity, build_profile
    from .snapshot import load_snapshot

    if args.total_params is None:
        from .models import load_model

        total = sum(p.numel() for p in load_model(args.model).model.parameters())
    else:
        total = args.total_params
    identity = ModelIdentity.from_snapshot(load_snapshot(args.pretrained), total)
    card = build_profile(load_table(args.table), identity, prior_task=args.prior_task, strategy=args.strategy, metric=args.metric,
                         count=args.count, fraction=None if args.budget is None else args.budget / 100, seed=args.seed, stop_threshold=args.stop_threshold)
    card.save(args.output)
    if args.spectrum:
        from . import atomic

        atomic.write_text(args.spectrum, card.to_spectrum_yaml())
    print(f"wrote {args.output}: {len(card.trainable)} trainable projections, {card.trainable_params:,} parameters ({100 * card.trainable_fraction:.2f}%)")


def _cmd_finetune(args: argparse.Namespace) -> None:
    from .finetune import FinetuneConfig, run_finetune
    from .models import load_model

    cfg = FinetuneConfig(method=args.method, task=args.task, output_dir=args.output, profile=args.profile,
                         lora_rank=args.lora_rank if args.lora_rank == "match" else int(args.lora_rank), epochs=args.epochs,
                         n_train=args.n_train, n_test=args.n_test, batch_size=args.batch_size, max_length=args.max_length,
                         learning_rate=args.lr, seed=args.seed, data_seed=args.data_seed, stop_threshold=args.stop_threshold,
                         observe_only=args.observe_only, eval_each_epoch=args.eval_each_epoch, save_snapshot=args.save_snapshot,
                         data_source=args.data_source)
    res = run_finetune(load_model(args.model), cfg)
    print(f"{cfg.method} on {cfg.task}: test accuracy {res['test_accuracy']:.3f}, {res['epochs_run']} epoch(s), "
          f"{res['seconds_per_epoch']:.1f} s/epoch; results in {args.output}/results.json")


def _cmd_reproduce(args: argparse.Namespace) -> None:
    from .experiments import get_preset, run_comparison

    from .report import write_report

    results = run_comparison(get_preset(args.preset), args.output)
    report = args.report or ("docs/RESULTS.md" if args.preset == "cpu-small" else f"{args.output}/RESULTS.md")
    write_report(args.output, report, f"topotuner-lab reproduce --preset {args.preset}")
    print(f"wrote {args.output}/results.csv ({len(results)} runs) and {report}")


def _cmd_run_notebooks(args: argparse.Namespace) -> None:
    from .notebooks import run_notebooks

    overrides = dict(args.param or [])
    executed = run_notebooks(args.profile, args.output, overrides)
    print(f"executed {len(executed)} notebooks into {args.output}/executed; figures in {args.output}/figures")


def _threshold(text: str) -> float | str:
    """A stopping threshold on the command line: a number, or 'card'."""
    if text == "card":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a number nor 'card'") from None


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

    pr = sub.add_parser("profile", help="build a profile card from a drift table")
    pr.add_argument("table", help="drift table (.parquet/.csv)")
    pr.add_argument("--pretrained", required=True, help="snapshot of the pretrained model the table was computed from")
    pr.add_argument("--prior-task", required=True)
    pr.add_argument("--strategy", default="high-drift", choices=["high-drift", "low-drift", "random", "magnitude"])
    pr.add_argument("--metric", default="h0_w1", help="drift-table column to rank by")
    group = pr.add_mutually_exclusive_group(required=True)
    group.add_argument("--count", type=int, help="number of trainable matrices")
    group.add_argument("--budget", type=float, help="trainable-parameter budget in percent of the model, e.g. 1")
    pr.add_argument("--model", default=None, help="the model, to count its parameters (default: embedded)")
    pr.add_argument("--total-params", type=int, default=None, help="the model's parameter count (skips loading it)")
    pr.add_argument("--stop-threshold", type=float, default=None)
    pr.add_argument("--seed", type=int, default=0)
    pr.add_argument("-o", "--output", required=True, help="card .json (a .md view is written beside it)")
    pr.add_argument("--spectrum", default=None, help="also write the unfrozen_parameters YAML (Spectrum/axolotl)")
    pr.set_defaults(func=_cmd_profile)

    ft = sub.add_parser("finetune", help="fine-tune with full FT, LoRA or a profile card")
    ft.add_argument("--method", default="full", choices=["full", "lora", "profile"])
    ft.add_argument("--task", default="sst2", choices=["sst2", "agnews", "gsm8k"])
    ft.add_argument("--model", default=None)
    ft.add_argument("--profile", default=None)
    ft.add_argument("--lora-rank", default="8", help="an integer, or 'match' to match the profile card's budget")
    ft.add_argument("--epochs", type=int, default=3)
    ft.add_argument("--n-train", type=int, default=128)
    ft.add_argument("--n-test", type=int, default=128)
    ft.add_argument("--batch-size", type=int, default=8)
    ft.add_argument("--max-length", type=int, default=64)
    ft.add_argument("--lr", type=float, default=None)
    ft.add_argument("--seed", type=int, default=0)
    ft.add_argument("--data-seed", type=int, default=0)
    ft.add_argument("--stop-threshold", type=_threshold, default=None, help="topological early stopping: normalized drift in (0, 1), or 'card' for the card's own")
    ft.add_argument("--observe-only", action="store_true", help="record the stop epoch but train the full budget")
    ft.add_argument("--eval-each-epoch", action="store_true")
    ft.add_argument("--save-snapshot", action="store_true")
    ft.add_argument("--data-source", default=None, help="'hub' to load from the Hugging Face hub, or a data file")
    ft.add_argument("-o", "--output", required=True)
    ft.set_defaults(func=_cmd_finetune)

    rp = sub.add_parser("reproduce", help="the paper's comparison at a preset size (resumable)")
    rp.add_argument("--preset", default="compare", help="tiny, compare or cpu-small")
    rp.add_argument("-o", "--output", default=None)
    rp.add_argument("--report", default=None, help="where to write the Markdown report (cpu-small: docs/RESULTS.md)")
    rp.set_defaults(func=_cmd_reproduce)

    nb = sub.add_parser("run-notebooks", help="execute the notebook series headlessly with papermill")
    nb.add_argument("--profile", default="tiny", choices=["tiny", "default"], help="tiny: in-memory model (CI); default: SmolLM2-135M")
    nb.add_argument("-p", "--param", nargs=2, action="append", metavar=("KEY", "VALUE"), help="override a notebook parameter")
    nb.add_argument("-o", "--output", default=None)
    nb.set_defaults(func=_cmd_run_notebooks)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "command", None) == "reproduce" and args.output is None:
        args.output = f"runs/reproduce-{args.preset}"
    if getattr(args, "command", None) == "run-notebooks" and args.output is None:
        args.output = f"runs/notebooks-{args.profile}"
    func: Callable[[argparse.Namespace], None] = args.func
    try:
        func(args)
    except TopoTunerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
