"""``reproduce`` (the paper's comparison at a preset size, resumable) and ``run-notebooks`` (the series, headless)."""

from __future__ import annotations

import argparse

from topotuner_lab._io.outputs import check_output_dir, check_writable


def _cmd_reproduce(args: argparse.Namespace) -> None:
    from topotuner_lab.lab.report import write_report
    from topotuner_lab.study.presets import get_preset
    from topotuner_lab.study.protocol import run_study

    preset = get_preset(args.preset)
    check_output_dir(args.output, "output folder")
    report = args.report or ("docs/RESULTS.md" if args.preset.startswith("cpu-") else f"{args.output}/RESULTS.md")
    check_writable(report, "report", suffixes=(".md",))
    results = run_study(preset, args.output)
    write_report(args.output, report, f"topotuner-lab reproduce --preset {args.preset}")
    print(f"wrote {args.output}/results.csv ({len(results)} runs) and {report}")


def _cmd_run_notebooks(args: argparse.Namespace) -> None:
    from topotuner_lab.lab.notebooks import run_notebooks

    check_output_dir(args.output, "output folder")
    executed = run_notebooks(args.preset, args.output, dict(args.param or []))
    print(f"executed {len(executed)} notebooks into {args.output}/executed; figures in {args.output}/figures")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``reproduce`` and ``run-notebooks``."""
    from topotuner_lab.lab.notebooks import NOTEBOOK_PRESETS

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
        "--preset",
        "--profile",  # the spelling of earlier versions
        dest="preset",
        default="tiny",
        choices=tuple(NOTEBOOK_PRESETS),
        help="notebook parameters: tiny (in-memory model, CI) or default (SmolLM2-135M) (default: %(default)s)",
    )
    nb.add_argument(
        "-p", "--param", nargs=2, action="append", metavar=("KEY", "VALUE"), help="override a notebook parameter"
    )
    nb.add_argument("-o", "--output", default=None, help="output folder (default: runs/notebooks-PRESET)")
    nb.set_defaults(func=_cmd_run_notebooks)
