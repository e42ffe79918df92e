import pandas as pd

from topotuner_lab.cli import main


def test_extract_perturb_drift_end_to_end(tmp_path, capsys):
    pre, post, out = tmp_path / "pre.safetensors", tmp_path / "post.safetensors", tmp_path / "drift.parquet"
    assert main(["extract", "tiny-llama", "-o", str(pre)]) == 0
    assert main(["perturb", str(pre), "-o", str(post), "--scale", "0.01"]) == 0
    assert main(["drift", str(pre), str(post), "-o", str(out), "--cache", str(tmp_path / "c"), "-j", "1"]) == 0
    table = pd.read_parquet(out)
    assert len(table) == 8 and (table["h0_w1"] > 0).all()
    assert "8 projections" in capsys.readouterr().out


def test_cli_errors_are_one_clear_message(tmp_path, capsys):
    code = main(
        ["drift", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), "-o", str(tmp_path / "d.parquet")]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "does not exist" in err and "How to fix" in err and "Traceback" not in err


def test_every_option_has_help_and_finetune_options_are_the_config_fields():
    import argparse
    import dataclasses

    from topotuner_lab.cli import build_parser
    from topotuner_lab.topology.distances import SOLVERS
    from topotuner_lab.training.config import FinetuneConfig

    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subparsers.choices.items():
        for action in sub._actions:
            if not isinstance(action, argparse._HelpAction):
                assert action.help, f"{name} {action.option_strings or action.dest} has no help"
    finetune = {a.dest: a for a in subparsers.choices["finetune"]._actions}
    for field in dataclasses.fields(FinetuneConfig):
        wanted = list(field.default) if isinstance(field.default, tuple) else field.default  # nargs: a list
        assert field.name in finetune and finetune[field.name].default == wanted, field.name
    drift = {a.dest: a for a in subparsers.choices["drift"]._actions}
    assert tuple(drift["solver"].choices) == SOLVERS
