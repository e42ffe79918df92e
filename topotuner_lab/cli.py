"""``topotuner-lab`` command line: extract snapshots, compute drift tables, build cards, fine-tune, reproduce.

Every command checks its options and where it writes before it computes anything, never writes over
one of its inputs, and reports a user error as one line (what is wrong, how to fix it) without a
traceback. Ctrl-C and SIGTERM stop cleanly: finished work is kept and a rerun resumes.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from topotuner_lab._io.errors import ParameterError, TopoTunerError
from topotuner_lab._io.outputs import check_output_dir, check_writable, refuse_overwrite

SNAPSHOT_SUFFIX = (".safetensors",)


def _cmd_extract(args: argparse.Namespace) -> None:
    from topotuner_lab.weights.extract import extract_snapshot
    from topotuner_lab.weights.models import load_model
    from topotuner_lab.weights.snapshot import load_snapshot, save_snapshot
    from topotuner_lab.weights.streaming import is_streamable, stream_snapshot

    check_writable(args.output, "output snapshot", suffixes=SNAPSHOT_SUFFIX)
    refuse_overwrite(
        {"model": args.model if args.model and Path(args.model).exists() else None, "base checkpoint": args.base},
        {"output snapshot": args.output},
    )
    if args.base is not None or (args.model is not None and is_streamable(args.model)):
        if args.model is None:
            raise ParameterError(
                "--base needs the fine-tuned checkpoint, adapter or profile-run folder as MODEL",
                "topotuner-lab extract RUN_FOLDER --base PRETRAINED_FOLDER -o FILE",
            )
        print(f"streaming the attention tensors of {args.model} (no model is loaded) ...", file=sys.stderr)
        snap = load_snapshot(stream_snapshot(args.model, args.output, base=args.base, base_model=args.base_model))
        print(
            f"wrote {args.output}: {len(snap.matrices)} projections of {snap.model} (weights {snap.weights_hash[:12]})"
        )
        return
    print(f"loading {args.model or 'the embedded default model'} ...", file=sys.stderr)
    snap = extract_snapshot(load_model(args.model), base_model=args.base_model)
    save_snapshot(snap, args.output)
    print(f"wrote {args.output}: {len(snap.matrices)} projections of {snap.model} (weights {snap.weights_hash[:12]})")


def _cmd_perturb(args: argparse.Namespace) -> None:
    from topotuner_lab.weights.snapshot import load_snapshot, perturb_snapshot, save_snapshot

    check_writable(args.output, "output snapshot", suffixes=SNAPSHOT_SUFFIX)
    refuse_overwrite({"input snapshot": args.snapshot}, {"output snapshot": args.output})
    snap = perturb_snapshot(load_snapshot(args.snapshot), args.scale, args.seed)
    save_snapshot(snap, args.output)
    print(f"wrote {args.output}: {snap.note}")


def _cmd_drift(args: argparse.Namespace) -> None:
    from topotuner_lab.drift.cache import DriftCache
    from topotuner_lab.drift.compute import drift_table
    from topotuner_lab.drift.executors import check_jobs
    from topotuner_lab.drift.settings import DriftSettings
    from topotuner_lab.drift.tables import TABLE_SUFFIXES, save_table
    from topotuner_lab.weights.snapshot import load_snapshot

    check_writable(args.output, "output table", suffixes=TABLE_SUFFIXES)
    refuse_overwrite({"first snapshot": args.before, "second snapshot": args.after}, {"output table": args.output})
    settings = DriftSettings(
        maxdim=args.maxdim,
        metric=args.metric,
        orders=tuple(args.p),
        solver=args.solver,
        n_perm=args.n_perm,
        seed=args.seed,
        magnitude=not args.no_magnitude,
    )
    jobs = check_jobs(args.jobs)
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


def _total_params(args: argparse.Namespace, pretrained: Any) -> int | None:
    """The model's parameter count: --total-params, else counted from --model (checked to be the snapshot's
    model), else None (the count the snapshot records)."""
    if args.total_params is not None:
        return args.total_params
    if args.model is None:
        return None
    from topotuner_lab.weights.extract import extract_snapshot
    from topotuner_lab.weights.models import load_model
    from topotuner_lab.weights.projections import count_parameters

    loaded = load_model(args.model)
    if extract_snapshot(loaded).weights_hash != pretrained.weights_hash:
        raise ParameterError(
            f"--model {args.model} is not the model of the pretrained snapshot {args.pretrained}",
            "pass the pretrained model the snapshot was extracted from, or omit --model to use the count the "
            "snapshot records",
        )
    return count_parameters(loaded.model)


def _cmd_profile(args: argparse.Namespace) -> None:
    from topotuner_lab.drift.noise import noise_check
    from topotuner_lab.drift.tables import load_table
    from topotuner_lab.profiles.card import ModelIdentity
    from topotuner_lab.profiles.select import build_profile
    from topotuner_lab.weights.snapshot import load_snapshot

    output = check_writable(args.output, "card", suffixes=(".json",))
    outputs = {"card": output, "card's Markdown view": output.with_suffix(".md"), "Spectrum YAML": args.spectrum}
    refuse_overwrite(
        {"drift table": args.table, "pretrained snapshot": args.pretrained, "noise table": args.noise_table}, outputs
    )
    if args.spectrum:
        check_writable(args.spectrum, "Spectrum YAML", suffixes=(".yaml", ".yml"))
    table, pretrained = load_table(args.table), load_snapshot(args.pretrained)
    identity = ModelIdentity.from_snapshot(pretrained, _total_params(args, pretrained))
    noise = [load_table(path) for path in args.noise_table or []]
    card = build_profile(
        table,
        identity,
        prior_task=args.prior_task,
        strategy=args.strategy,
        metric=args.metric,
        count=args.count,
        fraction=None if args.budget is None else args.budget / 100,
        seed=args.seed,
        stop_threshold=args.stop_threshold,
        normalization=args.normalization,
        noise=noise,
    )
    if noise:
        print(noise_check(table, noise, card.metric).message, file=sys.stderr)
    card.save(args.output)
    if args.spectrum:
        from topotuner_lab._io import atomic

        atomic.write_text(args.spectrum, card.to_spectrum_yaml())
    print(
        f"wrote {args.output}: {len(card.trainable)} trainable projections, {card.trainable_params:,} parameters "
        f"({100 * card.trainable_fraction:.2f}%)"
    )


def _cmd_finetune(args: argparse.Namespace) -> None:
    from topotuner_lab.training.finetune import FinetuneConfig, run_finetune
    from topotuner_lab.weights.models import load_model

    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(FinetuneConfig)}
    cfg = FinetuneConfig(**values)
    check_output_dir(cfg.output_dir, "run folder")
    refuse_overwrite({"profile card": cfg.profile}, {"run folder": cfg.output_dir})
    res = run_finetune(load_model(args.model), cfg)
    print(
        f"{cfg.method} on {cfg.task}: test accuracy {res['test_accuracy']:.3f}, {res['epochs_run']} epoch(s), "
        f"{res['seconds_per_epoch']:.1f} s/epoch; results in {cfg.output_dir}/results.json"
    )


def _cmd_reproduce(args: argparse.Namespace) -> None:
    from topotuner_lab.lab.report import write_report
    from topotuner_lab.study.protocol import get_preset, run_comparison

    preset = get_preset(args.preset)
    check_output_dir(args.output, "output folder")
    report = args.report or ("docs/RESULTS.md" if args.preset.startswith("cpu-") else f"{args.output}/RESULTS.md")
    check_writable(report, "report", suffixes=(".md",))
    results = run_comparison(preset, args.output)
    write_report(args.output, report, f"topotuner-lab reproduce --preset {args.preset}")
    print(f"wrote {args.output}/results.csv ({len(results)} runs) and {report}")


def _cmd_run_notebooks(args: argparse.Namespace) -> None:
    from topotuner_lab.lab.notebooks import run_notebooks

    check_output_dir(args.output, "output folder")
    executed = run_notebooks(args.profile, args.output, dict(args.param or []))
    print(f"executed {len(executed)} notebooks into {args.output}/executed; figures in {args.output}/figures")


def _threshold(text: str) -> float | str:
    """A stopping threshold on the command line: a number, or 'card'."""
    if text == "card":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a number nor 'card'") from None


def _rank(text: str) -> int | str:
    """A LoRA rank on the command line: a positive integer, or 'match'."""
    if text == "match":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither an integer nor 'match'") from None


def _flag(name: str) -> list[str]:
    return ["--" + name.replace("_", "-")]


#: CLI spellings kept from earlier versions, and option types that are not the field default's type
_FINETUNE_ALIASES = {"output_dir": ["-o", "--output", "--output-dir"], "learning_rate": ["--lr", "--learning-rate"]}
_FINETUNE_TYPES: dict[str, Callable[[str], Any]] = {
    "lora_rank": _rank,
    "stop_threshold": _threshold,
    "learning_rate": float,
}


def add_config_options(parser: argparse.ArgumentParser, config: type) -> None:
    """One option per dataclass field of ``config``: default, choices and help from the field itself."""
    for f in dataclasses.fields(config):
        flags = _FINETUNE_ALIASES.get(f.name, _flag(f.name))
        help_text = f.metadata.get("help", "")
        if f.default is False:
            parser.add_argument(*flags, dest=f.name, action="store_true", help=help_text)
        elif f.default is True:
            parser.add_argument(
                *flags, dest=f.name, action=argparse.BooleanOptionalAction, default=True, help=help_text
            )
        else:
            kind = _FINETUNE_TYPES.get(f.name) or (type(f.default) if f.default is not None else str)
            parser.add_argument(
                *flags,
                dest=f.name,
                type=kind,
                default=f.default,
                choices=f.metadata.get("choices"),
                help=f"{help_text} (default: %(default)s)",
            )


def build_parser() -> argparse.ArgumentParser:
    from topotuner_lab.lab.notebooks import PROFILES
    from topotuner_lab.profiles.card import NORMALIZATIONS, STRATEGIES
    from topotuner_lab.topology.distances import SOLVERS
    from topotuner_lab.topology.persistence import METRICS
    from topotuner_lab.training.finetune import FinetuneConfig

    parser = argparse.ArgumentParser(prog="topotuner-lab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    ext = sub.add_parser("extract", help="save a model's attention matrices as a snapshot")
    ext.add_argument(
        "model",
        nargs="?",
        default=None,
        help="model folder, .gguf file, hub id or tiny-* (default: embedded SmolLM2-135M)",
    )
    ext.add_argument("-o", "--output", required=True, help="snapshot file to write (.safetensors)")
    ext.add_argument(
        "--base-model", default=None, help="the name of the pretrained model this one was fine-tuned from (recorded)"
    )
    ext.add_argument(
        "--base",
        default=None,
        help="pretrained checkpoint folder, when MODEL is a LoRA adapter or a profile run's checkpoint "
        "(its tensors are merged on the fly, streamed)",
    )
    ext.set_defaults(func=_cmd_extract)

    per = sub.add_parser("perturb", help="add tiny Gaussian noise to a snapshot (drift noise floor)")
    per.add_argument("snapshot", help="snapshot to perturb (not changed)")
    per.add_argument("-o", "--output", required=True, help="perturbed snapshot to write (.safetensors)")
    per.add_argument(
        "--scale", type=float, default=1e-3, help="noise std as a fraction of each matrix's std (default: %(default)s)"
    )
    per.add_argument("--seed", type=int, default=0, help="noise seed, >= 0 (default: %(default)s)")
    per.set_defaults(func=_cmd_perturb)

    dr = sub.add_parser("drift", help="drift table between two snapshots")
    dr.add_argument("before", help="pretrained snapshot")
    dr.add_argument("after", help="fine-tuned snapshot of the same model")
    dr.add_argument("-o", "--output", required=True, help="table to write: .parquet or .csv")
    dr.add_argument(
        "--maxdim", type=int, default=1, choices=[0, 1], help="highest homology dimension (default: %(default)s)"
    )
    dr.add_argument(
        "--metric", default="euclidean", choices=METRICS, help="distance between rows (default: %(default)s)"
    )
    dr.add_argument(
        "-p", type=float, nargs="+", default=[1.0, 2.0], help="Wasserstein orders, each >= 1 (default: 1 2)"
    )
    dr.add_argument("--solver", default="auto", choices=SOLVERS, help="Wasserstein solver (default: %(default)s)")
    dr.add_argument(
        "--n-perm", type=int, default=None, help="greedy subsample size for H1 (approximate; default: all rows)"
    )
    dr.add_argument("--seed", type=int, default=0, help="start point of the greedy subsample (default: %(default)s)")
    dr.add_argument(
        "-j", "--jobs", type=int, default=2, help="worker processes, capped at the core count (default: %(default)s)"
    )
    dr.add_argument(
        "--no-magnitude",
        action="store_true",
        help="topology only: skip the magnitude baselines (the magnitude control card needs them)",
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

    pr = sub.add_parser("profile", help="build a profile card from a drift table")
    pr.add_argument("table", help="drift table (.parquet/.csv)")
    pr.add_argument("--pretrained", required=True, help="snapshot of the pretrained model the table was computed from")
    pr.add_argument("--prior-task", required=True, help="the task the drift came from (recorded in the card)")
    pr.add_argument(
        "--strategy", default="high-drift", choices=STRATEGIES, help="which matrices train (default: %(default)s)"
    )
    pr.add_argument("--metric", default="h0_w1", help="drift-table column to rank by (default: %(default)s)")
    pr.add_argument(
        "--normalization",
        default="raw",
        choices=NORMALIZATIONS,
        help="make matrices of different sizes comparable (default: %(default)s)",
    )
    pr.add_argument(
        "--noise-table",
        action="append",
        default=None,
        help="drift table of the pretrained snapshot against a perturbed copy; repeat for several seeds (noise "
        "check, 'noise-z')",
    )
    group = pr.add_mutually_exclusive_group(required=True)
    group.add_argument("--count", type=int, help="number of trainable matrices")
    group.add_argument("--budget", type=float, help="trainable-parameter budget in percent of the model, e.g. 1")
    pr.add_argument(
        "--model",
        default=None,
        help="the pretrained model, to count its parameters (default: the count the snapshot records)",
    )
    pr.add_argument(
        "--total-params",
        type=int,
        default=None,
        help="the model's parameter count (default: the count the snapshot records)",
    )
    pr.add_argument(
        "--stop-threshold", type=float, default=None, help="early-stopping threshold recorded in the card, in (0, 1)"
    )
    pr.add_argument("--seed", type=int, default=0, help="seed of the random control (default: %(default)s)")
    pr.add_argument("-o", "--output", required=True, help="card .json (a .md view is written beside it)")
    pr.add_argument("--spectrum", default=None, help="also write the unfrozen_parameters YAML (Spectrum/axolotl)")
    pr.set_defaults(func=_cmd_profile)

    ft = sub.add_parser("finetune", help="fine-tune with full FT, LoRA or a profile card")
    ft.add_argument("--model", default=None, help="model to fine-tune (default: embedded SmolLM2-135M)")
    add_config_options(ft, FinetuneConfig)
    ft.set_defaults(func=_cmd_finetune)

    rp = sub.add_parser("reproduce", help="the paper's comparison at a preset size (resumable)")
    rp.add_argument(
        "--preset",
        default="compare",
        help="tiny, compare, cpu-small (~1.5 h here) or cpu-both (~7 h) (default: %(default)s)",
    )
    rp.add_argument("-o", "--output", default=None, help="output folder (default: runs/reproduce-PRESET)")
    rp.add_argument("--report", default=None, help="where to write the Markdown report (cpu-small: docs/RESULTS.md)")
    rp.set_defaults(func=_cmd_reproduce)

    nb = sub.add_parser("run-notebooks", help="execute the notebook series headlessly with papermill")
    nb.add_argument(
        "--profile", default="tiny", choices=tuple(PROFILES), help="tiny: in-memory model (CI); default: SmolLM2-135M"
    )
    nb.add_argument(
        "-p", "--param", nargs=2, action="append", metavar=("KEY", "VALUE"), help="override a notebook parameter"
    )
    nb.add_argument("-o", "--output", default=None, help="output folder (default: runs/notebooks-PROFILE)")
    nb.set_defaults(func=_cmd_run_notebooks)
    return parser


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _stop_workers() -> None:
    """End idle joblib (loky) worker processes at once instead of leaving them for minutes."""
    if "joblib" in sys.modules:
        from joblib.externals.loky import get_reusable_executor

        get_reusable_executor().shutdown(wait=False, kill_workers=True)


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    """Warnings as one line on stderr (no source line, no file position)."""
    print(f"warning: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code (0 ok, 2 user error, 130 interrupted, 1 internal error)."""
    args = build_parser().parse_args(argv)
    import warnings

    shown = warnings.showwarning
    warnings.showwarning = _show_warning
    if getattr(args, "command", None) == "reproduce" and args.output is None:
        args.output = f"runs/reproduce-{args.preset}"
    if getattr(args, "command", None) == "run-notebooks" and args.output is None:
        args.output = f"runs/notebooks-{args.profile}"
    func: Callable[[argparse.Namespace], None] = args.func
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        func(args)
    except TopoTunerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "interrupted: finished work is kept (files are written atomically); run the same command again to resume",
            file=sys.stderr,
        )
        return 130
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        print(
            f"error: {exc.strerror or exc}{where}\n  How to fix: check the path exists, is of the right kind and "
            "can be written",
            file=sys.stderr,
        )
        return 2
    except Exception as exc:  # noqa: BLE001 - the last guard: one line, the traceback only on request
        if os.environ.get("TOPOTUNER_DEBUG"):
            raise
        print(
            f"internal error: {exc.__class__.__name__}: {exc}\n  How to fix: this is a bug; rerun with "
            "TOPOTUNER_DEBUG=1 for the traceback "
            "and report it",
            file=sys.stderr,
        )
        return 1
    finally:
        warnings.showwarning = shown
        signal.signal(signal.SIGTERM, previous)
        _stop_workers()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
