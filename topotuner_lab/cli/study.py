"""``reproduce`` (the comparison at a preset size, resumable), ``report`` (render it again), ``run-notebooks``."""

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


def _cmd_report(args: argparse.Namespace) -> None:
    from topotuner_lab.lab.report import write_report

    report = args.report or f"{args.folder}/RESULTS.md"
    check_writable(report, "report", suffixes=(".md",))
    write_report(args.folder, report, f"topotuner-lab report {args.folder}")
    print(f"wrote {report}")


def _cmd_run_notebooks(args: argparse.Namespace) -> None:
    from topotuner_lab.lab.notebooks import run_notebooks

    check_output_dir(args.output, "output folder")
    executed = run_notebooks(args.preset, args.output, dict(args.param or []))
    print(f"executed {len(executed)} notebooks into {args.output}/executed; figures in {args.output}/figures")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``reproduce``, ``report`` and ``run-notebooks``."""
    from topotuner_lab.lab.notebooks import NOTEBOOK_PRESETS

    rp = sub.add_parser("reproduce", help="the paper's comparison at a preset size (resumable)")
    rp.add_argument(
        "--preset",
        default="compare",
        help="tiny, tiny-selectors, families-tiny (CI), compare, cpu-small (~1.5 h here), cpu-both (~7 h), selectors "
        "(~1 h), models (drift only, three model families), families (task families, ~2 h), cpu-decide (issue 19's "
        "pre-registered comparison, ~10 h over several sittings), gpu-paper (the paper's setting, a GPU machine) "
        "(default: %(default)s)",
    )
    rp.add_argument("-o", "--output", default=None, help="output folder (default: runs/reproduce-PRESET)")
    rp.add_argument("--report", default=None, help="where to write the Markdown report (cpu-small: docs/RESULTS.md)")
    rp.set_defaults(func=_cmd_reproduce)

    rep = sub.add_parser("report", help="render a comparison folder's Markdown report again (computes nothing)")
    rep.add_argument("folder", help="a reproduce output folder")
    rep.add_argument("--report", default=None, help="where to write it (default: FOLDER/RESULTS.md)")
    rep.set_defaults(func=_cmd_report)

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
