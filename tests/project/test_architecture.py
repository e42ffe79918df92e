"""The package's shape: one config idiom, options generated from it, cards readable without torch and migrated from
older schemas, one drift column schema, a core that imports without the Jupyter stack."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import pkgutil
import subprocess
import sys
import typing
from dataclasses import replace
from pathlib import Path
from typing import Literal

import pytest

import topotuner_lab
from topotuner_lab._io.config import Config, opt
from topotuner_lab._io.errors import ParameterError, ProfileError
from topotuner_lab.cli import build_parser
from topotuner_lab.drift import columns
from topotuner_lab.drift.settings import DriftSettings
from topotuner_lab.lab.notebooks import NOTEBOOK_PRESETS, NotebookPreset
from topotuner_lab.profiles.card import SCHEMA_VERSION, ProfileCard, migrate
from topotuner_lab.profiles.select import CardSettings
from topotuner_lab.study.presets import PRESETS, Preset
from topotuner_lab.training.config import Method
from topotuner_lab.weights.snapshot import PerturbSettings


def _reraise(name: str) -> None:
    """``walk_packages``' error hook: a package that fails to import fails the collection (by default it is skipped)."""
    raise  # called inside walk_packages' ``except`` block: re-raises the import error itself


def _settings_classes() -> list[type[Config]]:
    """Every :class:`Config` subclass, at any depth, that a module of the package defines at its top level.

    Every module is imported, none skipped: a module that fails to import fails the collection. ``lab.plots``,
    ``lab.widgets`` and ``lab.explorer`` need the ``lab`` extra (plotly's widgets, ipywidgets), which the ``dev``
    install the tests run under holds. ``cli.__main__`` alone is not imported: importing it runs the CLI (it is
    ``python -m topotuner_lab.cli``), and it defines nothing. Classes defined elsewhere (in a test, in a doctest's
    namespace) are not the package's and are left out.
    """
    for module in pkgutil.walk_packages(topotuner_lab.__path__, "topotuner_lab.", onerror=_reraise):
        if module.name != "topotuner_lab.cli.__main__":
            importlib.import_module(module.name)
    found: set[type[Config]] = set()
    todo = [Config]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                todo.append(sub)
    own = [c for c in found if getattr(sys.modules.get(c.__module__), c.__qualname__, None) is c]
    return sorted((c for c in own if c.__module__.startswith("topotuner_lab.")), key=lambda c: c.__qualname__)


SETTINGS = _settings_classes()
#: the settings classes the package had when the list was made automatic: each must still be found
KNOWN = {
    "CardSettings", "DriftSettings", "FinetuneConfig", "ModelIdentity", "NotebookPreset", "PersistenceSettings",
    "PerturbSettings", "Preset", "ProfileCard", "SandboxLimits", "TaskSpec", "TransferCheckSettings",
}  # fmt: skip
_CARD = json.loads((Path(__file__).parents[1] / "golden" / "tiny" / "sst2-high-drift-0.05.json").read_text())
#: the fields of one valid instance of each settings class that has required fields (the others: their defaults)
EXAMPLES = {
    "CardSettings": {"prior_task": "sst2", "count": 2},
    "ModelIdentity": _CARD["model"],
    "ProfileCard": _CARD,
    "TaskSpec": {
        "task": "reviews",
        "output_type": "multiple_choice",
        "doc_to_text": "Review: {{text}}\nSentiment:",
        "doc_to_target": "label",
        "doc_to_choice": ["negative", "positive"],
        "data_files": {"train": "train.csv", "test": "test.csv"},
    },
}


def test_every_module_is_imported_and_every_settings_class_found() -> None:
    names = [c.__name__ for c in SETTINGS]
    assert len(SETTINGS) >= len(KNOWN) and KNOWN <= set(names), f"found only {sorted(names)}"
    assert len(set(names)) == len(names), "two settings classes of one name: keep their EXAMPLES apart"


@pytest.mark.parametrize("config", SETTINGS, ids=lambda c: c.__name__)
def test_every_settings_class_is_frozen_documented_and_round_trips(config: type[Config]) -> None:
    assert config.__doc__ and not config.__doc__.startswith(f"{config.__name__}("), "a docstring, not dataclass's"
    assert dataclasses.is_dataclass(config) and config.__dataclass_params__.frozen  # type: ignore[attr-defined]
    assert all(f.metadata.get("help") for f in dataclasses.fields(config)), "every field says what it is"
    try:
        instance = config.from_dict(EXAMPLES[config.__name__]) if config.__name__ in EXAMPLES else config()
    except TypeError as error:
        pytest.fail(f"{config.__name__} has required fields ({error}): add a valid instance's fields to EXAMPLES")
    again = config.from_dict(json.loads(json.dumps(instance.to_dict())))
    assert again == instance


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_and_notebook_presets_round_trip(name: str) -> None:
    assert Preset.from_dict(json.loads(json.dumps(PRESETS[name].to_dict()))) == PRESETS[name]
    for preset in NOTEBOOK_PRESETS.values():
        assert NotebookPreset.from_dict(preset.to_dict()) == preset


def test_unknown_and_bad_fields_name_the_field() -> None:
    with pytest.raises(ParameterError, match=r"has no field\(s\) \['colour'\]"):
        DriftSettings.from_dict({"colour": "red"})
    with pytest.raises(ParameterError, match=r"drift settings: orders=\(0.5,\) is not"):
        DriftSettings(orders=(0.5,))
    with pytest.raises(ParameterError, match="preset: lr_grid has no rates for"):
        Preset(lr_grid={"full": (1e-4,)})
    with pytest.raises(ProfileError, match="exactly one of count"):
        CardSettings(prior_task="sst2")
    assert DriftSettings(orders=[1, 2]).orders == (1, 2)  # lists from JSON become the declared tuple


def _options(command: str) -> dict[str, object]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {action.dest: action for action in sub.choices[command]._actions}


MINIMAL = {
    "drift": (["drift", "a", "b", "-o", "t.parquet"], DriftSettings()),
    "perturb": (["perturb", "s", "-o", "n.safetensors"], PerturbSettings()),
    "profile": (["profile", "t", "--pretrained", "p", "--prior-task", "x", "--count", "1", "-o", "c.json"], None),
}


@pytest.mark.parametrize(
    "command, config", [("drift", DriftSettings), ("perturb", PerturbSettings), ("profile", CardSettings)]
)
def test_cli_options_are_generated_from_the_settings(command: str, config: type[Config]) -> None:
    from topotuner_lab.cli.options import config_from_args

    options = _options(command)
    for f in dataclasses.fields(config):  # type: ignore[arg-type]
        action = options[f.name]
        assert action.help and f.metadata["help"] in action.help  # type: ignore[attr-defined]
    argv, expected = MINIMAL[command]
    expected = expected or CardSettings(prior_task="x", count=1)
    assert config_from_args(config, build_parser().parse_args(argv)) == expected  # no option: the class defaults


def test_cli_options_become_the_settings(tmp_path) -> None:
    from topotuner_lab.cli.options import config_from_args

    args = build_parser().parse_args(
        ["drift", "a", "b", "-o", "t.parquet", "--maxdim", "0", "-p", "1", "3", "--no-magnitude"]
    )
    assert config_from_args(DriftSettings, args) == DriftSettings(maxdim=0, orders=(1.0, 3.0), magnitude=False)
    args = build_parser().parse_args(["drift", "a", "b", "-o", "t.parquet", "--recipe", "reference", "--maxdim", "1"])
    recipe = config_from_args(DriftSettings, args, base=DriftSettings.recipe(args.recipe))
    assert recipe == replace(DriftSettings.recipe("reference"), maxdim=1)  # the recipe, less what was given
    args = build_parser().parse_args(
        ["profile", "t.parquet", "--pretrained", "p", "--prior-task", "sst2", "--budget", "2", "-o", "c.json"]
    )
    settings = config_from_args(CardSettings, args)
    assert settings.fraction == 0.02 and settings.normalization == "per-point" and settings.count is None


Size = Literal["small", "large"]


@dataclasses.dataclass(frozen=True)
class _Sized(Config):
    """A settings class whose one choice field names no choices: its ``Literal`` type gives them."""

    size: Size = opt("small", "how big")
    shape: Literal["round", "square"] | None = opt(None, "which shape, if any")


def test_a_literal_field_gives_its_choices_to_the_cli_and_to_validation() -> None:
    from topotuner_lab.cli.options import Parser, add_config_options, config_from_args

    parser = Parser(prog="example")
    add_config_options(parser, _Sized)
    actions = {action.dest: action for action in parser._actions}
    assert tuple(actions["size"].choices) == typing.get_args(Size) == ("small", "large")
    assert tuple(actions["shape"].choices) == ("round", "square", None)
    assert config_from_args(_Sized, parser.parse_args(["--size", "large"])) == _Sized(size="large")
    with pytest.raises(SystemExit):
        parser.parse_args(["--size", "huge"])
    with pytest.raises(ParameterError, match="size='huge' is not one of small, large"):
        _Sized(size="huge")  # type: ignore[arg-type]
    method = _options("finetune")["method"]
    assert tuple(method.choices) == typing.get_args(Method)  # the real CLI: FinetuneConfig.method's Literal


def test_the_method_choice_is_defined_once() -> None:
    from topotuner_lab.study import plan

    assert plan.Method is Method and plan.RunKey.__annotations__["method"] == "Method"


def test_usage_errors_are_one_line_with_the_fix(capsys) -> None:
    from topotuner_lab.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["finetune", "--epochs", "1.5"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "invalid int value: '1.5'" in err and "How to fix" in err
    assert len(err.strip().splitlines()) == 2  # not argparse's usage block


def _v1_card(card: ProfileCard) -> dict:
    data = card.to_dict()
    data["schema_version"] = 1
    del data["normalization"]  # v1 cards could omit it: it meant raw
    return data


def test_a_v1_card_is_read_through_its_migration(tmp_path) -> None:
    card = _card()
    migrated = ProfileCard.from_dict(_v1_card(card))
    assert migrated.schema_version == SCHEMA_VERSION and migrated.normalization == "raw"
    assert migrated.trainable == card.trainable and migrated.ranking == card.ranking
    with pytest.raises(ProfileError, match="schema_version 99"):
        migrate({**card.to_dict(), "schema_version": 99})


def test_a_card_reads_without_torch(tmp_path) -> None:
    path = _card().save(tmp_path / "card.json")
    code = (
        "import sys; from topotuner_lab.profiles.card import ProfileCard; "
        f"c = ProfileCard.load({str(path)!r}); c.to_markdown(); print(len(c.trainable), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["2", "False"]


def test_the_core_imports_without_the_jupyter_stack() -> None:
    blocked = ["ipywidgets", "papermill", "nbformat", "IPython", "jupyterlab", "ipykernel"]
    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        f"    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {blocked!r}: raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import topotuner_lab.study.protocol, topotuner_lab.lab.report, topotuner_lab.cli\n"
        "topotuner_lab.cli.build_parser()\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "ok", result.stderr[-2000:]


@pytest.mark.parametrize("dim, p", [(0, 1.0), (1, 2.0), (1, 1.5)])
def test_drift_column_names_are_built_and_parsed_in_one_place(dim: int, p: float) -> None:
    name = columns.wasserstein(dim, p)
    measure = columns.topological(name)
    assert measure is not None and (measure.dim, measure.order, measure.name) == (dim, p, name)
    assert columns.topological(columns.bottleneck(dim)).order is None  # type: ignore[union-attr]
    for other in ("rel_frobenius", columns.diagram_size(dim, "before"), columns.total_persistence(dim), "pid"):
        assert columns.topological(other) is None
    assert name in DriftSettings(maxdim=1, orders=(p,)).columns()


def _card() -> ProfileCard:
    from topotuner_lab.drift.cache import DriftCache
    from topotuner_lab.drift.compute import drift_table
    from topotuner_lab.profiles.card import ModelIdentity
    from topotuner_lab.profiles.select import build_profile
    from topotuner_lab.weights.extract import extract_snapshot
    from topotuner_lab.weights.models import build_tiny_model
    from topotuner_lab.weights.snapshot import perturb_snapshot

    pre = extract_snapshot(build_tiny_model("tiny-llama"))
    table = drift_table(pre, perturb_snapshot(pre, 0.05), DriftSettings(maxdim=0), n_jobs=1, cache=DriftCache(None))
    return build_profile(table, ModelIdentity.from_snapshot(pre), CardSettings(prior_task="sst2", count=2))
