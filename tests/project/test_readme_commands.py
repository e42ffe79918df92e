"""Single README commands as a new user runs them: the card with two noise tables, the noise warning, the rates' help.

Fast: the drift tables come from perturbed copies of the tiny model's snapshot, no training.
"""

from __future__ import annotations

import pytest

from topotuner_lab.cli import build_parser, main
from topotuner_lab.training.config import DEFAULT_LR
from topotuner_lab.weights.snapshot import perturb_snapshot, save_snapshot


@pytest.fixture
def tables(tmp_path, tiny_snapshot, monkeypatch):
    """The README pipeline's inputs to ``profile``: pre.safetensors and the drift of a clear fine-tune stand-in
    (``drift.parquet``), of two noise-floor copies (``noise-0/1.parquet``) and of a third one (``within.parquet``).
    """
    monkeypatch.chdir(tmp_path)
    save_snapshot(tiny_snapshot, "pre.safetensors")
    copies = {"after": (0.05, 9), "noise-0": (1e-3, 0), "noise-1": (1e-3, 1), "within": (1e-3, 2)}
    for name, (scale, seed) in copies.items():
        save_snapshot(perturb_snapshot(tiny_snapshot, scale, seed), f"{name}.safetensors")
        table = "drift.parquet" if name == "after" else f"{name}.parquet"
        assert main(["drift", "pre.safetensors", f"{name}.safetensors", "-o", table, "-j", "1"]) == 0
    return tmp_path


def _profile(table: str) -> list[str]:
    """The README's ``profile`` command on ``table`` (its 1% budget is less than one matrix of the tiny model)."""
    return (
        f"profile {table} --pretrained pre.safetensors --prior-task sst2 --strategy high-drift --budget 5 "
        "--normalization per-point --noise-table noise-0.parquet --noise-table noise-1.parquet --stop-threshold 0.5 "
        "-o card.json --spectrum card.spectrum.yaml"
    ).split()


def test_profile_takes_several_noise_tables(tables, capsys):
    """Repeating --noise-table used to end in 'internal error: TypeError: expected str, bytes or os.PathLike object,
    not list' (the output checks took the list for one path)."""
    assert main(_profile("drift.parquet")) == 0
    out, err = capsys.readouterr()
    assert "internal error" not in err and "wrote card.json" in out
    assert "noise check on h0_w1" in err and "WARNING" not in err  # well above the floor: said, not warned
    card_md = (tables / "card.md").read_text()
    assert "## Noise check" in card_md and "WARNING" not in card_md
    assert (tables / "card.spectrum.yaml").is_file()


def test_output_checks_name_the_noise_table_an_output_would_destroy(tables):
    from topotuner_lab._io.errors import ParameterError
    from topotuner_lab._io.outputs import refuse_overwrite

    with pytest.raises(ParameterError, match=r"the card .*noise-1\.parquet is the noise table noise-1\.parquet"):
        refuse_overwrite({"noise table": ["noise-0.parquet", "noise-1.parquet"]}, {"card": "noise-1.parquet"})
    refuse_overwrite({"noise table": ["noise-0.parquet"], "none": None}, {"card": "card.json"})  # no clash: fine


def test_a_card_within_the_noise_floor_warns_on_stderr_and_in_its_text(tables, capsys):
    """Drift no larger than the noise floor: a WARNING line at profile time and at the top of card.md."""
    assert main(_profile("within.parquet")) == 0
    err = capsys.readouterr().err
    assert "WARNING: noise check on h0_w1" in err and "ranks noise" in err
    title, section = (tables / "card.md").read_text().split("\n\n")[:2]
    assert title.startswith("# TopoTuner profile card") and section == "## Noise check"
    assert "> **WARNING: this card ranks noise.** noise check on h0_w1" in (tables / "card.md").read_text()


def test_a_card_without_noise_tables_says_no_noise_check_ran(tables, capsys):
    argv = [a for a in _profile("drift.parquet") if not a.startswith("noise-")]
    argv = [a for a in argv if a != "--noise-table"]
    assert main(argv) == 0
    assert "no noise check (no --noise-table)" in capsys.readouterr().err


def test_finetune_help_states_each_methods_default_rate():
    """`finetune --help` renders (a bare % in a help text broke argparse's formatting) and names every default rate."""
    finetune = build_parser()._subparsers._group_actions[0].choices["finetune"]
    shown = " ".join(finetune.format_help().split())
    for method, value in DEFAULT_LR.items():
        assert f"{method} {value:g}" in shown
