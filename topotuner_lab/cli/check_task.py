"""``check-task``: a task's rows, labels, lengths and problems before any model loads (its tokenizer only)."""

from __future__ import annotations

import argparse

from topotuner_lab._io.errors import ParameterError, TaskError
from topotuner_lab.cli.options import require_at_least


def _cmd_check_task(args: argparse.Namespace) -> None:
    import datasets

    from topotuner_lab.training.task_check import check_task

    if args.max_length < 2:
        raise ParameterError(f"--max-length {args.max_length} leaves no room for a prompt", "give 2 or more tokens")
    if args.rows is not None and args.rows < 1:
        raise ParameterError(f"--rows {args.rows} reads no rows", "give 1 or more, or leave --rows out for all")
    require_at_least(("--num-fewshot", args.num_fewshot, 0))
    shown = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # one report, not a bar per split
    try:
        check = check_task(
            args.task,
            model=args.model,
            max_length=args.max_length,
            source=args.data_source,
            rows=args.rows,
            num_fewshot=args.num_fewshot,
        )
    finally:
        if shown:
            datasets.enable_progress_bars()
    print(check.text())
    if check.problems:
        raise TaskError(
            f"task {check.task} has {len(check.problems)} problem(s) a fine-tune would stop at (listed above)",
            "fix the spec or its data files as each problem line says, then check again",
        )


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``check-task``: the task, the tokenizer's model and the sizes a fine-tune would use."""
    from topotuner_lab.training.config import FinetuneConfig
    from topotuner_lab.training.task_check import DEFAULT_MAX_LENGTH

    fields = FinetuneConfig.__dataclass_fields__
    ct = sub.add_parser(
        "check-task",
        help="check a task spec before training: rows, labels, token lengths, problems (loads no model)",
    )
    ct.add_argument("task", help=fields["task"].metadata["help"])
    ct.add_argument(
        "--model",
        default=None,
        help="whose tokenizer counts the tokens; only the tokenizer is loaded (default: the embedded SmolLM2-135M)",
    )
    ct.add_argument(
        "--max-length",
        type=int,
        default=DEFAULT_MAX_LENGTH,
        help=f"{fields['max_length'].metadata['help']}, as finetune's --max-length (default: {DEFAULT_MAX_LENGTH})",
    )
    ct.add_argument("--data-source", default=None, help=fields["data_source"].metadata["help"])
    ct.add_argument(
        "--num-fewshot",
        type=int,
        default=None,
        metavar="N",
        help="solved examples before each scored prompt, as finetune's --num-fewshot; their tokens count in the "
        "lengths (default: the task spec's)",
    )
    ct.add_argument(
        "--rows",
        type=int,
        default=None,
        help="rows read per split, drawn at random (default: all, for exact counts; a large split takes a minute)",
    )
    ct.set_defaults(func=_cmd_check_task)
