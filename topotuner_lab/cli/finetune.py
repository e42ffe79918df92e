"""``finetune``: full fine-tuning, LoRA, a card's matrices or Spectrum, with every option of :class:`FinetuneConfig`."""

from __future__ import annotations

import argparse

from topotuner_lab._io.outputs import check_output_dir, refuse_overwrite
from topotuner_lab.cli.options import add_config_options, config_from_args


def _cmd_finetune(args: argparse.Namespace) -> None:
    from topotuner_lab.training.config import FinetuneConfig
    from topotuner_lab.training.finetune import run_finetune
    from topotuner_lab.weights.models import load_model

    cfg = config_from_args(FinetuneConfig, args)
    check_output_dir(cfg.output_dir, "run folder")
    refuse_overwrite({"card": cfg.profile}, {"run folder": cfg.output_dir})
    res = run_finetune(load_model(args.model), cfg)
    print(
        f"{cfg.method} on {cfg.task}: test {res.metric} {res.test_accuracy_before:.3f} zero-shot -> "
        f"{res.test_accuracy:.3f} after, {res.epochs_run} epoch(s), {res.seconds_per_epoch:.1f} s/epoch; "
        f"results in {cfg.output_dir}/results.json, predictions in {cfg.output_dir}/predictions.jsonl"
    )


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``finetune``: one option per field of :class:`FinetuneConfig`."""
    from topotuner_lab.training.config import FinetuneConfig

    ft = sub.add_parser("finetune", help="fine-tune: full, LoRA, the matrices a card selects, or Spectrum's top 5%%")
    ft.add_argument("--model", default=None, help="model to fine-tune (default: embedded SmolLM2-135M)")
    add_config_options(ft, FinetuneConfig)
    ft.set_defaults(func=_cmd_finetune)
