"""``evaluate``: a model zero-shot, or a finished run's fine-tuned weights, on a task's test rows (no training)."""

from __future__ import annotations

import argparse
from pathlib import Path

from topotuner_lab._io.errors import ParameterError
from topotuner_lab._io.outputs import check_output_dir, refuse_overwrite
from topotuner_lab.cli.options import require_at_least


def _cmd_evaluate(args: argparse.Namespace) -> None:
    from topotuner_lab.training.evaluate import EVALUATION, PREDICTIONS, evaluate

    if args.run is not None and args.model is not None:
        raise ParameterError(
            f"both --model {args.model} and the run folder {args.run} were given",
            "give --model to score a model zero-shot, or RUN_FOLDER to score a run (its base: --base)",
        )
    if args.base is not None and args.run is None:
        raise ParameterError("--base applies to a run folder only", "give RUN_FOLDER, or --model for a model")
    require_at_least(
        ("--n-test", args.n_test, 1), ("--max-length", args.max_length, 2), ("--num-fewshot", args.num_fewshot, 0)
    )
    check_output_dir(args.output, "evaluation folder")
    if args.run is not None:
        run = Path(args.run)
        refuse_overwrite(
            {"run's predictions": run / PREDICTIONS, "run's results": run / "results.json"},
            {"predictions file": Path(args.output) / PREDICTIONS, "evaluation file": Path(args.output) / EVALUATION},
        )
    res = evaluate(
        args.task,
        model=args.model,
        run=args.run,
        base=args.base,
        n_test=args.n_test,
        max_length=args.max_length,
        data_source=args.data_source,
        num_fewshot=args.num_fewshot,
        output_dir=args.output,
        confirm_run_unsafe_code=args.confirm_run_unsafe_code,
    )
    scored = ", ".join(
        f"{name} {m['mean']:.3f} [{m['low']:.3f}, {m['high']:.3f}]" for name, m in res["metrics"].items()
    )
    shots = f", {res['num_fewshot']}-shot" if res["num_fewshot"] else ""
    print(
        f"{res['task']} on {res['model']['name']} ({res['source']}, {res['n_test']} test rows{shots}): {scored} "
        f"({res['level']:.0%} bootstrap intervals over examples); evaluation in {args.output}/{EVALUATION}, "
        f"predictions in {args.output}/{PREDICTIONS}"
    )


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``evaluate``: the task, a model or a run folder, the test rows and where to write."""
    from topotuner_lab.training.config import FinetuneConfig

    fields = FinetuneConfig.__dataclass_fields__
    ev = sub.add_parser(
        "evaluate",
        help="score a model zero-shot, or a finished run's weights, on a task's test rows (95%% intervals, "
        "per-row predictions)",
    )
    ev.add_argument(
        "run",
        nargs="?",
        default=None,
        metavar="RUN_FOLDER",
        help="a finished fine-tune's folder: its base model with the weights it kept (--keep-checkpoints, or "
        "--save-snapshot for profile and LoRA runs); task, test rows and length default to the run's",
    )
    ev.add_argument("--task", default=None, help=f"{fields['task'].metadata['help']} (default: the run's, else sst2)")
    ev.add_argument("--model", default=None, help="model to score zero-shot (default: the embedded SmolLM2-135M)")
    ev.add_argument("--base", default=None, help="a run's base model, where its results name one not loadable here")
    ev.add_argument("--n-test", type=int, default=None, help="test examples drawn (default: the run's, else 128)")
    ev.add_argument("--max-length", type=int, default=None, help="tokens a prompt keeps (default: the run's, else 64)")
    ev.add_argument(
        "--num-fewshot",
        type=int,
        default=None,
        help="solved examples of the task's fewshot_split (default train) before each prompt, drawn with a fixed "
        "seed (default: the run's, else the task spec's num_fewshot, 0 unless it says)",
    )
    ev.add_argument("--data-source", default=None, help=fields["data_source"].metadata["help"])
    ev.add_argument(
        "--confirm-run-unsafe-code", action="store_true", help=fields["confirm_run_unsafe_code"].metadata["help"]
    )
    ev.add_argument(
        "-o",
        "--output",
        default="runs/evaluate",
        help="folder for evaluation.json (with a checksum) and predictions.jsonl (default: runs/evaluate)",
    )
    ev.set_defaults(func=_cmd_evaluate)
