"""Shared helpers for the benchmark scripts: repeated timing (median), Markdown tables, results files."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def median_time(fn: Callable[[], Any], repeats: int = 3) -> tuple[float, Any]:
    """Median wall time of ``repeats`` calls, and the last result."""
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def table(rows: list[dict[str, Any]], digits: int = 3) -> str:
    """A Markdown table of ``rows``: every key that any row has, in first-seen order (blank where a row lacks it)."""
    if not rows:
        return "(no rows)\n"
    keys = list(dict.fromkeys(k for row in rows for k in row))

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.{digits}g}"
        return "" if v is None else str(v)

    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(fmt(r.get(k)) for k in keys) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def publish(name: str, markdown: str, data: Any, command: str | None = None) -> Path:
    """Write one benchmark's raw numbers (JSON) and its Markdown section (command, date, machine) for run_all."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=1, default=str))
    command = command or f"python benchmarks/bench_{name}.py"
    header = (
        f"_Command_: `{command}`  \n_Run_: {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} on "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}\n\n"
    )
    path = RESULTS / f"{name}.md"
    path.write_text(header + markdown)
    return path
