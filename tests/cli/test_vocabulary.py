"""One meaning per option name: the renamed options, their earlier spellings (one release, a warning) and clean help."""

from __future__ import annotations

import argparse
import re

import pytest

from topotuner_lab.cli import build_parser, main
from topotuner_lab.cli.options import SPELLINGS, config_from_args
from topotuner_lab.drift.settings import DriftSettings
from topotuner_lab.profiles.select import CardSettings

PROFILE = ["profile", "t.parquet", "--pretrained", "p", "--prior-task", "sst2", "-o", "c.json"]
DRIFT = ["drift", "a", "b", "-o", "t.parquet"]

#: (argv with the new spelling, argv with the earlier one, the field both set, its value)
RENAMED = [
    pytest.param([*DRIFT, "--distance", "cosine"], [*DRIFT, "--metric", "cosine"], "metric", "cosine", id="drift"),
    pytest.param([*PROFILE, "--rank-by", "h1_w1"], [*PROFILE, "--metric", "h1_w1"], "metric", "h1_w1", id="rank-by"),
    pytest.param(
        [*PROFILE, "--budget-fraction", "0.02"], [*PROFILE, "--budget", "2"], "fraction", 0.02, id="budget-fraction"
    ),
    pytest.param(["finetune", "--card", "c.json"], ["finetune", "--profile", "c.json"], "profile", "c.json", id="card"),
    pytest.param(
        ["run-notebooks", "--preset", "default"],
        ["run-notebooks", "--profile", "default"],
        "preset",
        "default",
        id="nb",
    ),
]


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("new, old, field, value", RENAMED)
def test_the_new_spelling_sets_the_field_silently(capsys, new, old, field, value) -> None:
    assert getattr(build_parser().parse_args(new), field) == value
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("new, old, field, value", RENAMED)
def test_the_earlier_spelling_still_works_and_says_what_to_type_now(capsys, new, old, field, value) -> None:
    assert getattr(build_parser().parse_args(old), field) == value
    lines = capsys.readouterr().err.splitlines()
    old_flag, new_flag = old[-2], new[-2]
    assert lines == [
        f"warning: {old_flag} is deprecated and will be removed in the next release: use {new_flag} {new[-1]}"
    ]


def test_the_earlier_budget_keeps_its_percent() -> None:
    """``--budget 1`` was 1%, as ``--budget-fraction 0.01`` is: an old command line builds the same card."""
    parse = build_parser().parse_args
    old = config_from_args(CardSettings, parse([*PROFILE, "--budget", "1", "--metric", "h0_w2"]))
    new = config_from_args(CardSettings, parse([*PROFILE, "--budget-fraction", "0.01", "--rank-by", "h0_w2"]))
    assert old == new == CardSettings(prior_task="sst2", fraction=0.01, metric="h0_w2")


def test_the_stored_names_stay() -> None:
    """Cards, tables, cache keys and recipes keep ``metric`` and ``fraction``: only the options are renamed."""
    parse = build_parser().parse_args
    assert config_from_args(DriftSettings, parse([*DRIFT, "--distance", "cosine"])).key()["metric"] == "cosine"
    assert set(SPELLINGS) == {
        ("DriftSettings", "metric"),
        ("CardSettings", "metric"),
        ("CardSettings", "fraction"),
        ("FinetuneConfig", "profile"),
    }


def test_an_earlier_spelling_in_a_failing_command_is_one_warning_and_one_error(capsys, tmp_path) -> None:
    """The warning comes before the command runs; the error then names the new spelling, with no traceback."""
    code = main(["profile", "--from-upstream", "x", "--budget", "1", "-o", str(tmp_path / "c.json")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err.splitlines()[0].startswith("warning: --budget is deprecated") and "--budget-fraction was given" in err


@pytest.mark.parametrize("command", sorted(_subparsers()))
def test_help_is_plain_words(command: str) -> None:
    """No RST markup, no "(default: None)", no default said twice, no code names: every option of every command."""
    sub = _subparsers()[command]
    for action in sub._actions:
        text = action.help or ""
        if text == argparse.SUPPRESS:
            continue
        where = f"{command} {action.option_strings or action.dest}: {text!r}"
        assert "``" not in text and not re.search(r":(func|class|data|meth|mod):", text), where
        assert "(default: None)" not in text and text.count("default:") <= 1, where
        assert not re.search(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b|\b[a-z_]+\.[a-z_]+\.[A-Z_]+\b", text), where
    assert "``" not in (sub.description or "")
    usage = sub.format_usage()
    assert not re.search(r"--(metric|budget|profile)\b(?!-)", usage), usage  # the earlier spellings are hidden
    sub.format_help()  # a "%" in a help text would break argparse's formatting


def test_the_top_level_help_is_plain_words() -> None:
    assert "``" not in build_parser().format_help()


WARNING = "warning: -p {} is deprecated and will be removed in the next release: use -p {}"


@pytest.mark.parametrize(
    "pairs, expected, line",
    [
        ([("budget_pct", "5")], {"budget_fraction": 0.05}, WARNING.format("budget_pct", "budget_fraction 0.05")),
        ([("metric_dim", "1")], {"homology_dim": "1"}, WARNING.format("metric_dim", "homology_dim 1")),
    ],
)
def test_renamed_notebook_parameters_still_work_for_one_release(capsys, pairs, expected, line) -> None:
    """``run-notebooks -p budget_pct 5`` (percent) is ``-p budget_fraction 0.05``; the warning names the new key."""
    from topotuner_lab.cli.study import notebook_overrides

    assert notebook_overrides(pairs) == expected
    assert capsys.readouterr().err.splitlines() == [line]
    assert notebook_overrides([("budget_fraction", "0.05")]) == {"budget_fraction": "0.05"}
    assert capsys.readouterr().err == ""
