"""``reproduce`` (the comparison at a preset size, resumable), ``report`` (render it again), ``run-notebooks``."""

from __future__ import annotations

import argparse
import shutil
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

from topotuner_lab._io.errors import ParameterError
from topotuner_lab._io.outputs import check_output_dir, check_writable
from topotuner_lab._io.yaml_files import summary
from topotuner_lab.cli.options import add_deprecated, percent_as_fraction

#: notebook parameters renamed, by earlier name: the new name and how an earlier value reads in its unit (one release)
RENAMED_PARAMETERS: dict[str, tuple[str, Callable[[str], object]]] = {
    "budget_pct": ("budget_fraction", percent_as_fraction),
    "metric_dim": ("homology_dim", str),
}


def _cmd_reproduce(args: argparse.Namespace) -> None:
    from topotuner_lab.lab.report import write_report
    from topotuner_lab.study.distributed import Cluster
    from topotuner_lab.study.presets import get_preset
    from topotuner_lab.study.protocol import run_study

    if args.gpu and not args.scheduler:
        raise ParameterError("--gpu asks Dask workers for a GPU, but no --scheduler was given", "add --scheduler local")
    cluster = Cluster(args.scheduler, args.jobs, args.gpu) if args.scheduler else None
    preset = get_preset(args.preset)
    output = args.output or f"runs/reproduce-{Path(args.preset).stem}"  # a preset file's name without .yaml
    check_output_dir(output, "output folder")
    report = args.report or f"{output}/RESULTS.md"
    check_writable(report, "report", suffixes=(".md",))
    results = run_study(preset, output, threads=args.threads_per_worker, cluster=cluster)
    write_report(output, report, f"topotuner-lab reproduce --preset {args.preset}")
    print(f"wrote {output}/results.csv ({len(results)} runs) and {report}")


def _cmd_report(args: argparse.Namespace) -> None:
    from topotuner_lab.lab.report import write_report

    report = args.report or f"{args.folder}/RESULTS.md"
    # a missing folder is made only inside the comparison or the current folder, never anywhere a typo points
    check_writable(report, "report", suffixes=(".md",), new_folders_under=(args.folder, "."))
    write_report(args.folder, report, f"topotuner-lab report {args.folder}")
    print(f"wrote {report}")


def notebook_overrides(pairs: list[tuple[str, str]]) -> dict[str, object]:
    """``-p KEY VALUE`` pairs as overrides; an earlier parameter name becomes its new one, with a deprecation line."""
    overrides: dict[str, object] = {}
    for key, text in pairs:
        if key not in RENAMED_PARAMETERS:
            overrides[key] = text
            continue
        new, read = RENAMED_PARAMETERS[key]
        value = read(text)
        shown = f"{value:g}" if isinstance(value, float) else value
        print(
            f"warning: -p {key} is deprecated and will be removed in the next release: use -p {new} {shown}",
            file=sys.stderr,
        )
        overrides[new] = value
    return overrides


def _cmd_run_notebooks(args: argparse.Namespace) -> None:
    from topotuner_lab.lab.notebooks import run_notebooks

    output = args.output or f"runs/notebooks-{args.preset}"
    check_output_dir(output, "output folder")
    executed = run_notebooks(args.preset, output, notebook_overrides(args.param or []))
    print(f"executed {len(executed)} notebooks into {output}/executed; figures in {output}/figures")


def _preset_list() -> str:
    """The shipped presets, one per line with the first line of its file, for ``reproduce --help``."""
    from topotuner_lab.study.presets import PRESETS

    width = max(map(len, PRESETS)) + 4
    columns = max(shutil.get_terminal_size().columns - 2, 60)
    listed = [
        textwrap.fill(
            summary(PRESETS.path(name)),
            columns,
            initial_indent=f"  {name:<{width - 2}}",
            subsequent_indent=" " * width,
        )
        for name in PRESETS
    ]
    own = (
        "A preset of your own: copy one of these files, change what you need and pass its path to --preset; fields "
        "left out take their defaults. Times are on 2 CPU cores."
    )
    return "\n".join([f"presets (commented YAML files in {PRESETS.folder}):", *listed, "", textwrap.fill(own, columns)])


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``reproduce``, ``report`` and ``run-notebooks``."""
    from topotuner_lab.lab.notebooks import NOTEBOOK_PRESETS

    rp = sub.add_parser(
        "reproduce",
        help="the paper's comparison at a preset size (resumable)",
        description="Run the comparison a preset describes, then write its Markdown report.\nResumable: run the same "
        "command again and finished runs are skipped.",
        epilog=_preset_list(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rp.add_argument(
        "--preset",
        default="compare",
        metavar="NAME_OR_FILE",
        help="a preset's name (listed below) or the path of a preset .yaml file (default: %(default)s)",
    )
    rp.add_argument("-o", "--output", default=None, help="output folder (default: runs/reproduce-PRESET)")
    rp.add_argument(
        "--report", default=None, help="where to write the Markdown report (default: RESULTS.md in the output folder)"
    )
    rp.add_argument(
        "--scheduler",
        default=None,
        help="run the fine-tunes as Dask tasks: 'local' for a cluster of --jobs worker processes here, or a Dask "
        "scheduler's address (tcp://host:8786) whose workers see this folder at the same path (docs/CLUSTER.md); "
        "default: one after another in this process",
    )
    rp.add_argument(
        "-j", "--jobs", type=int, default=2, help="workers of --scheduler local, capped at the core count (default: 2)"
    )
    rp.add_argument(
        "--threads-per-worker",
        type=int,
        default=None,
        metavar="N",
        help="torch threads of each fine-tune, here and on every Dask worker; the same N gives the same numbers "
        "either way (default: torch's own here, 1 on a worker)",
    )
    rp.add_argument(
        "--gpu",
        action="store_true",
        help="each fine-tune asks its Dask worker for one GPU (resource GPU=1); with --scheduler local, worker i "
        "sees only GPU i",
    )
    rp.set_defaults(func=_cmd_reproduce)

    rep = sub.add_parser("report", help="render a comparison folder's Markdown report again (computes nothing)")
    rep.add_argument("folder", help="a reproduce output folder")
    rep.add_argument("--report", default=None, help="where to write it (default: FOLDER/RESULTS.md)")
    rep.set_defaults(func=_cmd_report)

    nb = sub.add_parser("run-notebooks", help="execute the notebook series headlessly with papermill")
    add_deprecated(nb, "--profile", "--preset", "preset", choices=tuple(NOTEBOOK_PRESETS))
    nb.add_argument(
        "--preset",
        default="tiny",
        choices=tuple(NOTEBOOK_PRESETS),
        help="notebook parameters: tiny (in-memory model, CI) or default (SmolLM2-135M) (default: %(default)s; "
        "formerly --profile)",
    )
    nb.add_argument(
        "-p", "--param", nargs=2, action="append", metavar=("KEY", "VALUE"), help="override a notebook parameter"
    )
    nb.add_argument("-o", "--output", default=None, help="output folder (default: runs/notebooks-PRESET)")
    nb.set_defaults(func=_cmd_run_notebooks)
