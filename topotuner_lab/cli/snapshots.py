"""``extract`` (a model's attention matrices as a snapshot) and ``perturb`` (a noisy copy: the noise floor)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from topotuner_lab._io.errors import ParameterError
from topotuner_lab._io.outputs import check_writable, refuse_overwrite
from topotuner_lab.cli.options import add_config_options, config_from_args

SNAPSHOT_SUFFIX = (".safetensors",)


def _cmd_extract(args: argparse.Namespace) -> None:
    from topotuner_lab.weights.adapters import is_adapter, needs_base_error
    from topotuner_lab.weights.extract import extract_snapshot
    from topotuner_lab.weights.models import load_model
    from topotuner_lab.weights.snapshot import save_snapshot, snapshot_metadata
    from topotuner_lab.weights.streaming import is_streamable, stream_snapshot

    check_writable(args.output, "output snapshot", suffixes=SNAPSHOT_SUFFIX)
    refuse_overwrite(
        {"model": args.model if args.model and Path(args.model).exists() else None, "base checkpoint": args.base},
        {"output snapshot": args.output},
    )
    if args.model is not None and args.base is None and is_adapter(args.model):
        raise needs_base_error(Path(args.model))
    if args.base is not None or (args.model is not None and is_streamable(args.model)):
        if args.model is None:
            raise ParameterError(
                "--base needs the fine-tuned checkpoint, adapter or profile-run folder as MODEL",
                "topotuner-lab extract RUN_FOLDER --base PRETRAINED_FOLDER -o FILE",
            )
        print(f"streaming the attention tensors of {args.model} (no model is loaded) ...", file=sys.stderr)
        # verified before it was renamed into place; its header says what it holds (no page of it is read again)
        meta = snapshot_metadata(stream_snapshot(args.model, args.output, base=args.base, base_model=args.base_model))
        count = len(json.loads(meta["shapes"]))
        print(f"wrote {args.output}: {count} projections of {meta['model']} (weights {meta['weights_hash'][:12]})")
        return
    print(f"loading {args.model or 'the embedded default model'} ...", file=sys.stderr)
    snap = extract_snapshot(load_model(args.model), base_model=args.base_model)
    save_snapshot(snap, args.output)
    print(f"wrote {args.output}: {len(snap.matrices)} projections of {snap.model} (weights {snap.weights_hash[:12]})")


def _cmd_perturb(args: argparse.Namespace) -> None:
    from topotuner_lab.weights.snapshot import PerturbSettings, load_snapshot, perturb_snapshot, save_snapshot

    check_writable(args.output, "output snapshot", suffixes=SNAPSHOT_SUFFIX)
    refuse_overwrite({"input snapshot": args.snapshot}, {"output snapshot": args.output})
    settings = config_from_args(PerturbSettings, args)
    snap = perturb_snapshot(load_snapshot(args.snapshot), settings.scale, settings.seed)
    save_snapshot(snap, args.output)
    print(f"wrote {args.output}: {snap.note}")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``extract`` and ``perturb``."""
    from topotuner_lab.weights.snapshot import PerturbSettings

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
        help="pretrained checkpoint folder, when MODEL is a LoRA adapter, a profile run's checkpoint or a finished "
        "profile run (its tensors are merged on the fly, streamed; a finished run's after.safetensors is used)",
    )
    ext.set_defaults(func=_cmd_extract)

    per = sub.add_parser("perturb", help="add tiny Gaussian noise to a snapshot (drift noise floor)")
    per.add_argument("snapshot", help="snapshot to perturb (not changed)")
    per.add_argument("-o", "--output", required=True, help="perturbed snapshot to write (.safetensors)")
    add_config_options(per, PerturbSettings)
    per.set_defaults(func=_cmd_perturb)
