"""Presets and drift recipes as commented YAML files: each equals the Python definition it replaced, a user's file
is read with the same schema and checks, and `reproduce` lists them, names its own defaults and writes its report
into its own folder unless told otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from topotuner_lab._io.errors import ParameterError
from topotuner_lab._io.yaml_files import read_yaml, summary
from topotuner_lab.cli import main
from topotuner_lab.drift.settings import RECIPES, DriftSettings
from topotuner_lab.study.presets import PRESETS, Preset, get_preset
from topotuner_lab.training.config import FinetuneConfig

GOLDEN = Path(__file__).parents[1] / "golden"
#: ``{name: Preset.to_dict()}`` of every preset as the Python code defined it, and ``RECIPES`` likewise, dumped before
#: they became files
OLD_PRESETS = json.loads((GOLDEN / "presets.json").read_text())
OLD_RECIPES = json.loads((GOLDEN / "recipes.json").read_text())


def _given(value: object, old: object) -> object:
    """``value`` restricted to the keys ``old`` has (fields added later keep their defaults and are not compared)."""
    if isinstance(value, dict) and isinstance(old, dict):
        return {k: _given(value.get(k), v) for k, v in old.items()}
    return value


def test_the_files_are_the_presets_and_recipes_there_were() -> None:
    assert set(OLD_PRESETS) <= set(PRESETS) and sorted(RECIPES) == sorted(OLD_RECIPES)


@pytest.mark.parametrize("name", sorted(OLD_PRESETS))
def test_every_preset_file_equals_the_old_python_preset(name: str) -> None:
    loaded = _given(get_preset(name).to_dict(), OLD_PRESETS[name])
    # as JSON text: 1 and 1.0, or a list and a dict, would differ here
    assert json.dumps(loaded, sort_keys=True) == json.dumps(OLD_PRESETS[name], sort_keys=True)


@pytest.mark.parametrize("name", sorted(OLD_RECIPES))
def test_every_recipe_file_equals_the_old_dict(name: str) -> None:
    recipe = RECIPES[name]
    assert json.dumps(recipe, sort_keys=True) == json.dumps(OLD_RECIPES[name], sort_keys=True)
    assert DriftSettings(**recipe) == DriftSettings.from_dict(OLD_RECIPES[name])
    assert all(isinstance(v, tuple) for v in recipe.values() if isinstance(v, (list, tuple)))  # the declared types


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_file_loads_and_says_what_it_is_for_its_size_cost_and_command(name: str) -> None:
    assert isinstance(PRESETS[name], Preset)
    text = PRESETS.path(name).read_text()
    first = summary(PRESETS.path(name))
    assert text.startswith(f"# {first}\n") and 0 < len(first) <= 60  # one line of `reproduce --help` at 80 columns
    for part in ("# Purpose: ", "# Size: ", "# Cost: ", f"# Run: topotuner-lab reproduce --preset {name}\n"):
        assert part in text, part
    assert "issue" not in text.lower()


USER_PRESET = """\
# my comparison
seeds: [0]
lr_grid: {full: [1e-4], lora: [3e-4], profile: [2e-4]}   # 1e-4: a number, as YAML 1.2 reads it
target:
  n_val: 16
"""


def test_a_users_file_is_a_preset_with_the_defaults_for_what_it_leaves_out(tmp_path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(USER_PRESET)
    expected = Preset(
        seeds=(0,), lr_grid={"full": (1e-4,), "lora": (3e-4,), "profile": (2e-4,)}, target=FinetuneConfig(n_val=16)
    )
    assert get_preset(str(path)) == expected


@pytest.mark.parametrize(
    "text, problem",
    [
        pytest.param("colour: red\n", "mine.yaml: preset has no field(s) ['colour']", id="unknown-field"),
        pytest.param("prior: {epoch: 2}\n", "mine.yaml: fine-tune config has no field(s) ['epoch']", id="nested"),
        pytest.param("seeds: [-1]\n", "mine.yaml: preset: seeds=(-1,) is not seeds >= 0", id="bad-value"),
        pytest.param("rationale: ['']\n", "rationale=('',) is not non-empty sentences", id="empty-reason"),
        pytest.param("seeds: [0\n", "is not valid YAML", id="malformed"),
        pytest.param("- seeds\n", "is not a mapping of key: value", id="a-list"),
    ],
)
def test_a_bad_preset_file_is_one_error_naming_the_file_and_the_field(tmp_path, text: str, problem: str) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    with pytest.raises(ParameterError) as info:
        get_preset(str(path))
    assert problem in info.value.problem and str(path) in info.value.problem and info.value.fix


def test_a_missing_file_or_unknown_name_lists_the_presets(tmp_path) -> None:
    with pytest.raises(ParameterError, match="does not exist") as info:
        get_preset(str(tmp_path / "absent.yaml"))
    assert "cpu-decide" in info.value.fix
    with pytest.raises(ParameterError, match="unknown preset 'cpu-tiny'") as info:
        get_preset("cpu-tiny")
    assert "tiny-selectors" in info.value.fix and ".yaml" in info.value.fix
    (tmp_path / "p.json").write_text("{}")
    with pytest.raises(ParameterError, match="is not a .yaml file"):
        get_preset(str(tmp_path / "p.json"))


def test_exponents_read_as_numbers_and_the_loader_stays_safe(tmp_path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("a: 1e-4\nb: 3E5\nc: 2.5e-3\nd: 12\ne: '1e-4'\nf: 1e\n")
    assert read_yaml(path, "x", "-") == {"a": 1e-4, "b": 3e5, "c": 2.5e-3, "d": 12, "e": "1e-4", "f": "1e"}
    path.write_text("a: !!python/object/apply:os.getcwd []\n")
    with pytest.raises(ParameterError, match="is not valid YAML"):
        read_yaml(path, "x", "-")


def test_reproduce_help_lists_every_preset_with_its_first_line(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["reproduce", "--help"])
    out = capsys.readouterr().out
    for name in PRESETS:
        assert f"  {name} " in out and summary(PRESETS.path(name)) in " ".join(out.split())
    assert "``" not in out and ":class:" not in out and "issue" not in out.lower()


@pytest.fixture
def recorded(monkeypatch) -> dict[str, object]:
    """The comparison and its report, replaced by a record of where they would write."""
    import topotuner_lab.lab.report as report
    import topotuner_lab.study.protocol as protocol

    calls: dict[str, object] = {}
    monkeypatch.setattr(
        protocol, "run_study", lambda preset, output, **_: calls.update(preset=preset, output=output) or []
    )
    monkeypatch.setattr(report, "write_report", lambda folder, path, command: calls.update(report=path, cmd=command))
    return calls


def test_reproduce_writes_its_report_into_its_own_folder_unless_told(tmp_path, monkeypatch, recorded) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["reproduce", "--preset", "cpu-small"]) == 0  # once wrote docs/RESULTS.md for every cpu-* preset
    assert (
        recorded["output"] == "runs/reproduce-cpu-small" and recorded["report"] == "runs/reproduce-cpu-small/RESULTS.md"
    )
    assert main(["reproduce", "--preset", "cpu-small", "--report", "docs/R.md"]) == 0
    assert recorded["report"] == "docs/R.md"


def test_reproduce_runs_a_preset_file_into_a_folder_named_after_it(tmp_path, monkeypatch, recorded) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text(USER_PRESET)
    assert main(["reproduce", "--preset", "mine.yaml"]) == 0
    assert recorded["preset"] == get_preset("mine.yaml") and recorded["output"] == "runs/reproduce-mine"
    assert recorded["cmd"] == "topotuner-lab reproduce --preset mine.yaml"


def test_reproduce_refuses_a_bad_preset_file_before_writing_anything(tmp_path, monkeypatch, recorded, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text("seeds: [0]\nsweeps: [1]\n")
    assert main(["reproduce", "--preset", "mine.yaml"]) == 2
    err = capsys.readouterr().err
    assert "mine.yaml: preset has no field(s) ['sweeps']" in err and "How to fix" in err and "Traceback" not in err
    assert not recorded and not (tmp_path / "runs").exists()


def test_run_notebooks_computes_its_default_output_itself(tmp_path, monkeypatch) -> None:
    import topotuner_lab.lab.notebooks as notebooks

    calls = []
    monkeypatch.setattr(notebooks, "run_notebooks", lambda preset, output, params: calls.append(output) or [])
    monkeypatch.chdir(tmp_path)
    assert main(["run-notebooks", "--preset", "tiny"]) == 0 and calls == ["runs/notebooks-tiny"]
