"""``profile``: a card from a drift table (which projections train, and why), or from the authors' lists."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from topotuner_lab._io.errors import ParameterError
from topotuner_lab._io.outputs import check_writable, refuse_overwrite
from topotuner_lab.cli.options import add_config_options, config_from_args

if TYPE_CHECKING:
    from topotuner_lab.profiles.card import ProfileCard


def _pretrained_model(args: argparse.Namespace, pretrained: Any) -> Any:
    """--model loaded and checked to be the snapshot's model, or None without --model."""
    if args.model is None:
        return None
    from topotuner_lab.weights.extract import extract_snapshot
    from topotuner_lab.weights.models import load_model

    loaded = load_model(args.model)
    if extract_snapshot(loaded).weights_hash != pretrained.weights_hash:
        raise ParameterError(
            f"--model {args.model} is not the model of the pretrained snapshot {args.pretrained}",
            "pass the pretrained model the snapshot was extracted from, or omit --model to use the count the "
            "snapshot records",
        )
    return loaded


def _total_params(args: argparse.Namespace, loaded: Any) -> int | None:
    """The model's parameter count: --total-params, else counted from --model, else None (the snapshot's count)."""
    if args.total_params is not None:
        return args.total_params
    if loaded is None:
        return None
    from topotuner_lab.weights.projections import count_parameters

    return count_parameters(loaded.model)


def _with_gradient(args: argparse.Namespace, table: Any, strategy: str, loaded: Any) -> Any:
    """The table with --gradient-task's gradient magnitudes for a ``gradient`` card (as given without the option)."""
    if args.gradient_task is None:
        return table
    if strategy != "gradient":
        raise ParameterError(
            f"--gradient-task ranks a 'gradient' card, and the strategy is {strategy!r}",
            "add --strategy gradient, or leave --gradient-task out",
        )
    if loaded is None:
        raise ParameterError(
            "--gradient-task needs the pretrained model to take its gradients", "add --model MODEL (the pretrained one)"
        )
    from topotuner_lab.training.transfer import with_gradient_signal

    return with_gradient_signal(table, loaded, args.gradient_task)


def _cmd_profile(args: argparse.Namespace) -> None:
    from topotuner_lab.drift.signals import SIGNALS, with_signals
    from topotuner_lab.drift.tables import load_table
    from topotuner_lab.profiles.card import FIXED_RANKINGS, ModelIdentity
    from topotuner_lab.profiles.select import CardSettings, build_profile
    from topotuner_lab.weights.snapshot import load_snapshot

    output = check_writable(args.output, "card", suffixes=(".json",))
    outputs = {"card": output, "card's Markdown view": output.with_suffix(".md"), "Spectrum YAML": args.spectrum}
    refuse_overwrite(
        {"drift table": args.table, "pretrained snapshot": args.pretrained, "noise table": args.noise_table}, outputs
    )
    if args.spectrum:
        check_writable(args.spectrum, "Spectrum YAML", suffixes=(".yaml", ".yml"))
    if args.from_upstream is not None:
        return _save(args, _upstream_card(args))
    if args.table is None or args.pretrained is None or args.prior_task is None:
        raise ParameterError(
            "a card is built from a drift table with --pretrained and --prior-task, or from the authors' orderings",
            "give TABLE --pretrained SNAPSHOT --prior-task TASK, or --from-upstream MODEL",
        )
    table, pretrained = load_table(args.table), load_snapshot(args.pretrained)
    noise = [load_table(path) for path in args.noise_table or []]
    settings = config_from_args(CardSettings, args)
    needs_model = args.total_params is None or args.gradient_task is not None
    loaded = _pretrained_model(args, pretrained) if needs_model else None
    identity = ModelIdentity.from_snapshot(pretrained, _total_params(args, loaded))
    if FIXED_RANKINGS.get(settings.strategy, ("",))[0] in SIGNALS:  # a selector ranking the pretrained statistics
        table = with_signals(table, pretrained)
    table = _with_gradient(args, table, settings.strategy, loaded)
    card = build_profile(table, identity, settings, noise=noise)
    _save(args, card)
    _report_noise(args, table, noise, card)


def _report_noise(args: argparse.Namespace, table: Any, noise: list[Any], card: ProfileCard) -> None:
    """The noise check on stderr and at the top of the card's Markdown view (without noise tables: that none ran)."""
    from topotuner_lab._io import atomic
    from topotuner_lab.drift.noise import noise_check

    if not noise:
        print(
            "note: no noise check (no --noise-table): a card built from drift within the noise floor ranks noise; "
            "make noise tables with `topotuner-lab perturb` and `drift`, then pass each with --noise-table",
            file=sys.stderr,
        )
        return
    check = noise_check(table, noise, card.metric)
    title, rest = card.to_markdown().split("\n\n", 1)
    atomic.write_text(Path(args.output).with_suffix(".md"), f"{title}\n\n{check.markdown}\n{rest}")
    print(check.message, file=sys.stderr)


def _upstream_card(args: argparse.Namespace) -> ProfileCard:
    """--from-upstream: the card of the authors' released lists; no table, snapshot, model or budget goes with it."""
    from topotuner_lab.profiles.upstream import upstream_card

    inputs = {
        "a drift table": args.table,
        "--pretrained": args.pretrained,
        "--prior-task": args.prior_task,
        "--noise-table": args.noise_table,
        "--model": args.model,
        "--gradient-task": args.gradient_task,
        "--total-params": args.total_params,
        "--count": args.count,
        "--budget-fraction": args.fraction,
        "--per-kind": args.per_kind,
    }
    given = [name for name, value in inputs.items() if value is not None]
    if given:
        raise ParameterError(
            f"--from-upstream builds the card from the authors' lists alone, and {', '.join(given)} "
            f"{'was' if len(given) == 1 else 'were'} given too",
            "leave them out (--size N sets the matrices per kind, --strategy which end trains), or --from-upstream",
        )
    return upstream_card(
        args.from_upstream,
        selector=args.selector,
        size=args.size,
        strategy=args.strategy,
        source=args.upstream_source,
    )


def _save(args: argparse.Namespace, card: ProfileCard) -> None:
    """Write the card (and its Spectrum YAML with --spectrum) and say what it trains."""
    card.save(args.output)
    if args.spectrum:
        from topotuner_lab._io import atomic

        atomic.write_text(args.spectrum, card.to_spectrum_yaml())
    print(
        f"wrote {args.output}: {len(card.trainable)} trainable projections, {card.trainable_params:,} parameters "
        f"({100 * card.trainable_fraction:.2f}%)"
    )


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``profile``: the card settings' options, then the inputs it is checked against."""
    from topotuner_lab.profiles.select import CardSettings
    from topotuner_lab.profiles.upstream import SELECTORS, SOURCES, upstream_models

    pr = sub.add_parser("profile", help="build a card (the matrices to train) from a drift table or the authors' lists")
    pr.add_argument("table", nargs="?", default=None, help="drift table (.parquet/.csv); none with --from-upstream")
    pr.add_argument(
        "--pretrained",
        default=None,
        help="snapshot of the pretrained model the table was computed from (required with a drift table)",
    )
    add_config_options(pr, CardSettings, skip=("prior_task",))
    prior = CardSettings.__dataclass_fields__["prior_task"].metadata["help"]
    pr.add_argument("--prior-task", default=None, help=f"{prior}; required with a drift table")
    pr.add_argument(
        "--noise-table",
        action="append",
        default=None,
        help="drift table of the pretrained snapshot against a perturbed copy; repeat for several seeds (noise "
        "check, 'noise-z')",
    )
    pr.add_argument(
        "--model",
        default=None,
        help="the pretrained model, to count its parameters (default: the count the snapshot records) and to take "
        "the gradients of --gradient-task",
    )
    pr.add_argument(
        "--gradient-task",
        default=None,
        help="with --strategy gradient: the target task whose gradient magnitudes at the pretrained weights rank the "
        "matrices (needs --model; default: the table's own grad_norm column)",
    )
    pr.add_argument(
        "--total-params",
        type=int,
        default=None,
        help="the model's parameter count (default: the count the snapshot records)",
    )
    pr.add_argument(
        "--from-upstream",
        metavar="MODEL",
        default=None,
        help="build the card from the authors' released layer orderings (FDataLab/TopoTuner) for MODEL, from its "
        f"config shape alone: {', '.join(upstream_models().values())}; the listed matrices train",
    )
    pr.add_argument(
        "--selector",
        choices=SELECTORS,
        default="wasserstein",
        help="with --from-upstream: the authors' drift ordering, or their norm lists (Qwen3-8B-Base V/O only)",
    )
    pr.add_argument(
        "--size",
        type=int,
        default=3,
        help="with --from-upstream: matrices per kind (the orderings: any number of layers; the V/O lists: 3, 6, 9 "
        "or 15), from the end --strategy high-drift / low-drift names (default: 3)",
    )
    pr.add_argument(
        "--upstream-source",
        choices=SOURCES,
        default=None,
        help="with --from-upstream: the Q/K/V orderings (every model) or the V/O lists (Qwen3-8B-Base) (default: "
        "orderings for wasserstein, vo-lists for norm)",
    )
    pr.add_argument("-o", "--output", required=True, help="card .json (a .md view is written beside it)")
    pr.add_argument("--spectrum", default=None, help="also write the unfrozen_parameters YAML (Spectrum/axolotl)")
    pr.set_defaults(func=_cmd_profile)
