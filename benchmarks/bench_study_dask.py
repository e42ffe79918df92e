"""Fine-tunes per hour of `topotuner-lab reproduce`: one process at 2 torch threads against 2 Dask workers of 1.

The priors, drift tables and cards are prepared once, and each variant runs the whole grid on its own copy of that
folder (so both time the same fine-tunes, plus the verified reuse of what was prepared), as the user runs it, each
command in a fresh process:

    topotuner-lab reproduce --preset P -o COPY --threads-per-worker 2
    topotuner-lab reproduce --preset P -o COPY --threads-per-worker 1 --scheduler local --jobs 2

python benchmarks/bench_study_dask.py [--preset tiny|NAME|FILE.yaml] [--repeats N]

`benchmarks/presets/smollm2-slice.yaml` is the slice of a real study on the embedded SmolLM2-135M.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, publish, table

VARIANTS = {
    "serial, 2 torch threads": ["--threads-per-worker", "2"],
    "Dask local, 2 workers x 1 thread": ["--threads-per-worker", "1", "--scheduler", "local", "--jobs", "2"],
}


def prepared(preset_name: str, folder: Path) -> int:
    """Prepare the comparison in ``folder`` (priors, drift tables, cards); returns its planned fine-tunes."""
    from topotuner_lab.study.plan import plan
    from topotuner_lab.study.presets import get_preset
    from topotuner_lab.study.protocol import prepare, use_torch_threads
    from topotuner_lab.study.workspace import WorkDir

    preset = get_preset(preset_name)
    use_torch_threads(2)
    prepare(preset, WorkDir(folder), lambda _: None)
    return len(plan(preset))


def timed(preset_name: str, folder: Path, options: list[str]) -> float:
    """Seconds of one ``reproduce`` command on ``folder``, in a fresh process."""
    cli = [sys.executable, "-m", "topotuner_lab.cli", "reproduce", "--preset", preset_name, "-o", str(folder)]
    start = time.perf_counter()
    subprocess.run([*cli, *options], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny", help="a preset's name or .yaml file (default: %(default)s)")
    parser.add_argument(
        "--repeats", type=int, default=2, help="runs of each variant, interleaved A B, B A, ... (default: %(default)s)"
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-study-dask-"))
    os.environ.setdefault("TOPOTUNER_CACHE", str(tmp / "cache"))
    names = list(VARIANTS)
    times: dict[str, list[float]] = {name: [] for name in names}
    loads: dict[str, list[float]] = {name: [] for name in names}
    counts: dict[str, int] = {}
    try:
        planned = prepared(args.preset, tmp / "prepared")
        for repeat in range(args.repeats):
            for name in names if repeat % 2 == 0 else names[::-1]:
                folder = tmp / f"run-{repeat}-{names.index(name)}"
                shutil.copytree(tmp / "prepared", folder)
                loads[name].append(os.getloadavg()[0])
                times[name].append(timed(args.preset, folder, VARIANTS[name]))
                counts[name] = sum(1 for _ in folder.glob("runs/**/results.json"))
                shutil.rmtree(folder, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = [
        {
            "variant": name,
            "fine-tunes": counts[name],
            "runs": args.repeats,
            "median wall s": statistics.median(times[name]),
            "wall s (each run)": " / ".join(f"{seconds:.0f}" for seconds in times[name]),
            "fine-tunes per hour": counts[name] * 3600 / statistics.median(times[name]),
            "median load before": statistics.median(loads[name]),
        }
        for name in names
    ]
    ratio = rows[1]["fine-tunes per hour"] / rows[0]["fine-tunes per hour"]
    markdown = (
        f"Preset `{args.preset}`: {planned} planned fine-tunes (run folders counted after the run: rows that share a "
        "run count once), grid only (priors, drift and cards prepared beforehand; each command re-verifies them), "
        f"each command timed whole in a fresh process.\n\n{table(rows)}\n"
        f"Dask / serial: **{ratio:.2f}x** fine-tunes per hour (medians of {args.repeats} interleaved runs each). A "
        "1-minute load average above the core count means other jobs shared the cores; where it differs between the "
        "two variants, so did their share of the cores, and the ratio says as much about the load as about the "
        "scheduler.\n"
    )
    tiny = args.preset == "tiny"  # run_all's section; another preset's numbers go to a file of their own
    command = "python benchmarks/bench_study_dask.py" + ("" if tiny else f" --preset {args.preset}")
    name = "study_dask" if tiny else f"study_dask_{Path(args.preset).stem}"
    publish(name, markdown, {"preset": args.preset, "rows": rows, "ratio": ratio}, command)
    print(markdown)


if __name__ == "__main__":
    main()
