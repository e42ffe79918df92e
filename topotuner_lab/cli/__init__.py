"""``topotuner-lab`` command line: extract snapshots, compute drift tables, build cards, fine-tune, reproduce.

Every command checks its options and where it writes before it computes anything, never writes over
one of its inputs, and reports a user error as one line (what is wrong, how to fix it) without a
traceback. Ctrl-C and SIGTERM stop cleanly: finished work is kept and a rerun resumes.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from topotuner_lab._io.errors import TopoTunerError
from topotuner_lab.cli import check_task, drift, evaluate, export, finetune, profile, snapshots, study, transfer
from topotuner_lab.cli.options import Parser


def build_parser() -> argparse.ArgumentParser:
    """The ``topotuner-lab`` parser: one sub-command per module of this package."""
    parser = Parser(prog="topotuner-lab", description=__doc__.splitlines()[0].replace("``", ""))
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in (snapshots, drift, profile, export, finetune, evaluate, transfer, check_task, study):
        command.register(sub)
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
