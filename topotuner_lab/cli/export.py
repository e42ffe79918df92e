"""``export``: a card in the format a trainer reads (axolotl, ms-swift, PEFT, names, Spectrum, LLaMA-Factory)."""

from __future__ import annotations

import argparse
import sys

from topotuner_lab._io.outputs import check_writable, refuse_overwrite


def _cmd_export(args: argparse.Namespace) -> None:
    from topotuner_lab._io import atomic
    from topotuner_lab.profiles.card import ProfileCard
    from topotuner_lab.profiles.export import export_text

    if args.output:
        check_writable(args.output, "export")
        refuse_overwrite({"card": args.card}, {"export": args.output})
    text = export_text(ProfileCard.load(args.card), args.to)
    if not args.output:
        sys.stdout.write(text)
        return
    atomic.write_text(args.output, text)
    print(f"wrote {args.output} ({args.to})", file=sys.stderr)


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``export``."""
    from topotuner_lab.profiles.export import FORMATS

    ex = sub.add_parser("export", help="write a card in the format a trainer reads")
    ex.add_argument("card", help="card .json (from `topotuner-lab profile`)")
    ex.add_argument(
        "--to",
        required=True,
        choices=FORMATS,
        help="axolotl (unfrozen_parameters YAML), swift (ms-swift arguments), peft (LoraConfig JSON), names (JSON "
        "list of the trainable parameter names), spectrum (snr_results JSON for axolotl's Spectrum "
        "plugin), llama-factory (the closest freeze setting, with a warning of what it loses)",
    )
    ex.add_argument("-o", "--output", default=None, help="file to write (default: standard output)")
    ex.set_defaults(func=_cmd_export)
