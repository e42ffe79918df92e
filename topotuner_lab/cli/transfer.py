"""``transfer-check``: before training, whether a card's prior and a target task have close gradient fields."""

from __future__ import annotations

import argparse

from topotuner_lab._io.outputs import check_writable, refuse_overwrite
from topotuner_lab.cli.options import add_config_options, config_from_args


def _cmd_transfer_check(args: argparse.Namespace) -> None:
    from topotuner_lab.drift.tables import save_table
    from topotuner_lab.profiles.card import ProfileCard
    from topotuner_lab.training.transfer import TransferCheckSettings, transfer_check
    from topotuner_lab.weights.models import load_model

    if args.output:
        check_writable(args.output, "output table", suffixes=(".csv", ".parquet"))
        refuse_overwrite({"card": args.card}, {"output table": args.output})
    card = ProfileCard.load(args.card)
    settings = config_from_args(TransferCheckSettings, args)
    loaded = load_model(args.model)
    result = transfer_check(loaded, card, args.task, settings, data_source=args.data_source, card_path=args.card)
    print(result.table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(result.verdict)
    if args.output:
        save_table(result.table, args.output)


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``transfer-check``."""
    from topotuner_lab.training.transfer import TransferCheckSettings

    tc = sub.add_parser("transfer-check", help="before training: the card's prior vs a target task, gradient by matrix")
    tc.add_argument("card", help="card .json (its prior task is the prior)")
    tc.add_argument("--task", required=True, help="the target task the card would be transferred to")
    tc.add_argument("--model", default=None, help="the pretrained model the card was built for (default: embedded)")
    tc.add_argument("--data-source", default=None, help="'hub' or a data folder (default: the offline copies)")
    add_config_options(tc, TransferCheckSettings)
    tc.add_argument("-o", "--output", default=None, help="also write the per-matrix table (.csv or .parquet)")
    tc.set_defaults(func=_cmd_transfer_check)
