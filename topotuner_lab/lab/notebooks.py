"""Headless execution of the notebook series with papermill, in order, with a named preset of parameters.

The notebooks share a work folder (snapshots, drift tables, cards, runs) and a figures folder;
each executed copy is kept. Overrides are checked against the type of each notebook's parameter.
"""

from __future__ import annotations

import ast
import functools
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from topotuner_lab._io.config import OPEN_UNIT, POSITIVE_INT, Check, Config, opt
from topotuner_lab._io.errors import InputFileError, ParameterError, TopoTunerError
from topotuner_lab.drift.settings import RECIPES
from topotuner_lab.training.early_stopping import DEFAULT_STOP_THRESHOLD
from topotuner_lab.training.transfer import TransferCheckSettings

NOTEBOOKS: tuple[str, ...] = (
    "01_extract.ipynb",
    "02_persistence_diagrams.ipynb",
    "03_drift_heatmaps.ipynb",
    "04_build_profile.ipynb",
    "05_finetune_compare.ipynb",
    "06_early_stopping.ipynb",
    "07_compare_cards.ipynb",
    "08_explore_study.ipynb",
)


#: further prior seeds: distinct, and not 0 (the first prior run's, kept in the work folder itself)
FURTHER_SEEDS = Check(
    lambda v: isinstance(v, tuple) and len(set(v)) == len(v) and all(POSITIVE_INT(s) for s in v),
    "distinct seeds >= 1 (seed 0 is the first prior run's)",
)


@dataclass(frozen=True)
class NotebookPreset(Config):
    """Parameters the notebook series runs with (each notebook takes the ones its parameters cell declares)."""

    label = "notebook preset"

    model: str = opt("smollm2-135m", "model: a folder, .gguf, hub id, tiny-llama or an embedded alias")
    n_train: int = opt(32, "training examples of each target fine-tune", check=POSITIVE_INT)
    n_test: int = opt(64, "test examples", check=POSITIVE_INT)
    n_val: int = opt(32, "validation examples notebook 5's learning rates are chosen on", check=POSITIVE_INT)
    epochs: int = opt(4, "epochs of each target fine-tune", check=POSITIVE_INT)
    prior_epochs: int = opt(2, "epochs of the prior fine-tune", check=POSITIVE_INT)
    prior_n_train: int = opt(128, "training examples of the prior fine-tune", check=POSITIVE_INT)
    prior_lr: float = opt(2e-4, "learning rate of the prior fine-tune", check=OPEN_UNIT)
    extra_prior_seeds: tuple[int, ...] = opt(
        (1, 2), "further prior fine-tunes (seeds) notebook 4 checks the card's picks against", check=FURTHER_SEEDS
    )
    max_length: int = opt(64, "tokens per example", check=POSITIVE_INT)
    batch_size: int = opt(8, "training batch size", check=POSITIVE_INT)
    budget_fraction: float = opt(
        0.01, "card budget as a fraction of the model's parameters (0.01 is 1%)", check=OPEN_UNIT
    )
    stop_threshold: float = opt(DEFAULT_STOP_THRESHOLD, "early-stopping threshold", check=OPEN_UNIT)
    transfer_rows: int = opt(
        TransferCheckSettings().n_rows, "rows of each task in the transfer check before training", check=POSITIVE_INT
    )
    recipe: str = opt("default", "drift recipe of the profile (default or reference)", choices=tuple(RECIPES))


NOTEBOOK_PRESETS: dict[str, NotebookPreset] = {
    # CI: an in-memory model, a handful of rows
    "tiny": NotebookPreset(
        model="tiny-llama",
        n_train=16,
        n_test=8,
        n_val=8,
        epochs=2,
        prior_epochs=1,
        prior_n_train=16,
        prior_lr=1e-3,
        max_length=48,
        batch_size=8,
        budget_fraction=0.05,
        stop_threshold=0.9,
        transfer_rows=8,
    ),
    # sized for `make run` to stay near 15 min here: the prior fine-tune (128 examples x 2 epochs at 2e-4) still
    # moves the weights well past the noise floor (notebook 3 prints the check); notebook 5's six fine-tunes (two
    # rates per method) train on 32 rows x 4 epochs: room for the early-stopping rule (it fires from epoch 2) to
    # save an epoch
    "default": NotebookPreset(),
}
#: figures each notebook exports (stems under the figures folder)
EXPECTED_FIGURES: dict[str, tuple[str, ...]] = {
    "02_persistence_diagrams.ipynb": ("persistence_diagram", "barcode"),
    "03_drift_heatmaps.ipynb": ("drift_heatmaps", "rank_correlation"),
    "04_build_profile.ipynb": ("profile_selection",),
    "05_finetune_compare.ipynb": ("transfer_check", "training_curves", "cost_bars"),
    "06_early_stopping.ipynb": ("early_stopping",),
    "07_compare_cards.ipynb": ("card_comparison", "selector_agreement"),
    "08_explore_study.ipynb": (
        "explore_claims",
        "explore_rates",
        "explore_epochs",
        "explore_stopping",
        "explore_stability",
    ),
}


def setup(figures_dir: str | os.PathLike[str]) -> Path:
    """Prepare a notebook of the series; returns its figures folder (created).

    Figures render through JupyterLab's plotly extension (:data:`~topotuner_lab.lab.plots.OFFLINE_RENDERER`).
    Progress bars (:func:`quiet_progress`) and the libraries' FutureWarnings are switched off: in a saved notebook
    they are stuck lines that say nothing about the experiment.
    """
    from topotuner_lab.lab.plots import use_offline_renderer

    use_offline_renderer()
    quiet_progress()
    warnings.filterwarnings("ignore", category=FutureWarning)
    folder = Path(figures_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def quiet_progress() -> None:
    """No progress bars in this process: transformers', huggingface_hub's, datasets' and every tqdm bar.

    In a notebook each bar is a widget whose saved text reads "0%" forever; the Trainer's notebook callback draws an
    HTML table per run, its terminal one prints every log line. The Trainer gets a callback that does nothing (the
    losses stay in each run's results, which the notebooks plot).
    """
    import datasets
    import huggingface_hub.utils
    import transformers.trainer
    import transformers.utils.logging
    from tqdm import tqdm

    transformers.utils.logging.disable_progress_bar()
    huggingface_hub.utils.disable_progress_bars()
    datasets.disable_progress_bars()
    transformers.trainer.DEFAULT_PROGRESS_CALLBACK = transformers.trainer.TrainerCallback  # type: ignore[assignment]
    shown = tqdm.__init__
    if getattr(shown, "quiet", False):
        return

    @functools.wraps(shown)
    def quiet(self: tqdm, *args: Any, **kwargs: Any) -> None:
        shown(self, *args, **{**kwargs, "disable": True})

    quiet.quiet = True  # type: ignore[attr-defined]
    tqdm.__init__ = quiet


def export(figure: Any, stem: str | os.PathLike[str]) -> Any:
    """Write ``figure`` (HTML, and PNG with Chromium: :func:`~topotuner_lab.lab.plots.save_figure`); return it."""
    from topotuner_lab.lab.plots import save_figure

    save_figure(figure, stem)
    return figure


class NotebookError(TopoTunerError):
    """A notebook cell failed under papermill."""


def notebooks_dir() -> Path:
    """The source checkout's ``notebooks/`` folder (a clear error when the package is installed without it)."""
    folder = Path(__file__).resolve().parents[2] / "notebooks"
    if not folder.is_dir():
        raise InputFileError(
            f"notebook folder {folder} not found", "run from a source checkout of topotuner-lab (pip install -e .)"
        )
    return folder


def check_notebook_output(out_dir: str | Path) -> Path:
    """The resolved output folder, refused when it is the project root or lies in the notebooks folder.

    The series writes ``executed/``, ``work/`` and ``figures/`` under it: in either place they would land in the
    source tree (and rewrite the project's own figures).
    """
    out, source = Path(out_dir).expanduser().resolve(), notebooks_dir()
    fix = "write the series outside the source tree's notebooks, e.g. -o runs/notebooks-tiny (the default)"
    if out == source or source in out.parents:
        raise ParameterError(f"output folder {out_dir} lies in the notebooks folder {source}", fix)
    if out == source.parent:
        raise ParameterError(
            f"output folder {out_dir} is the project root {source.parent}: executed/, work/ and figures/ would be "
            "written into the source tree",
            fix,
        )
    return out


def check_overrides(preset: NotebookPreset, values: dict[str, Any]) -> NotebookPreset:
    """``preset`` with the parameters ``values`` set, checked as the preset's own fields are (before any notebook)."""
    fields = {k: v for k, v in values.items() if k in preset.__dataclass_fields__}
    return NotebookPreset.from_dict({**preset.to_dict(), **fields})


def _coerce(name: str, value: Any, type_name: str, notebook: str) -> Any:
    """Turn a CLI string into the parameter's declared type, or raise a clear error."""
    expected = {"int": int, "float": float, "str": str, "bool": bool, "list": list}.get(type_name)
    if expected is None or isinstance(value, expected) and not (expected is int and isinstance(value, bool)):
        return value
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            parsed = value if expected is str else ast.literal_eval(value)
        except (ValueError, SyntaxError):
            parsed = None
        if expected is float and isinstance(parsed, int) and not isinstance(parsed, bool):
            parsed = float(parsed)
        if isinstance(parsed, expected) and not (expected is int and isinstance(parsed, bool)):
            return parsed
    raise ParameterError(
        f"parameter {name!r} of {notebook} expects {type_name}, got {value!r}",
        f"pass a {type_name} value, e.g. -p {name} <{type_name}>",
    )


def notebook_parameters(path: Path) -> dict[str, dict[str, Any]]:
    """The parameters cell of a notebook; a parameter's type is taken from its default literal."""
    import papermill

    params = papermill.inspect_notebook(str(path))
    for info in params.values():
        if info["inferred_type_name"] == "None":
            try:
                info["inferred_type_name"] = type(ast.literal_eval(info["default"])).__name__
            except (ValueError, SyntaxError):
                pass
    return params


def _failed_cell(executed: Path) -> str:
    """``cell N: Ename: value`` of the first failed cell of an executed notebook."""
    import nbformat

    if not executed.is_file():
        return "the notebook did not start"
    book = nbformat.read(executed, as_version=4)
    for index, cell in enumerate(book.cells):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                return f"cell {index} ({cell.source.splitlines()[0][:60]!r}...): {output['ename']}: {output['evalue']}"
    return "no failed cell recorded (kernel died or timed out)"


#: papermill in a child process, its arguments as JSON; ``store_widget_state=False``: a saved notebook keeps no widget
#: models (each plotly FigureWidget's state carries a 4.9 MB plotly.js); the static figures beside the widgets show
_PAPERMILL = "import json, sys, papermill; papermill.execute_notebook(**json.loads(sys.argv[1]))"


def _execute_one(source: Path, target: Path, params: dict[str, Any], kernel: str, cell_timeout: int, cwd: Path) -> None:
    """Run one notebook with papermill in a fresh process (isolates memory and kernel clients)."""
    import json
    import subprocess
    import sys

    target.parent.mkdir(parents=True, exist_ok=True)
    arguments = dict(
        input_path=str(source),
        output_path=str(target),
        parameters=params,
        kernel_name=kernel,
        cwd=str(cwd),
        execution_timeout=cell_timeout,
        progress_bar=False,
        store_widget_state=False,
    )
    proc = subprocess.run([sys.executable, "-c", _PAPERMILL, json.dumps(arguments)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise NotebookError(
            f"{source.name} failed: {_failed_cell(target)}",
            f"open the executed copy {target} for the traceback; change parameters with -p KEY VALUE",
        )


def run_notebooks(
    preset: str = "tiny",
    out_dir: str | Path = "runs/notebooks",
    overrides: dict[str, Any] | None = None,
    *,
    names: tuple[str, ...] = NOTEBOOKS,
    kernel: str = "python3",
    cell_timeout: int = 3600,
    progress: bool = True,
) -> list[Path]:
    """Execute the notebooks in order; returns the executed copies. A failing cell raises NotebookError.

    Checked before any notebook runs: the output folder (not the project root, not in the notebooks folder) and every
    override (the parameter's type, and the preset's check of its value: ``-p n_train -5`` is refused).

    With ``progress`` a bar runs over the series and each finished notebook prints its time and the running total.
    """
    if preset not in NOTEBOOK_PRESETS:
        raise ParameterError(f"unknown notebook preset {preset!r}", f"use one of {', '.join(NOTEBOOK_PRESETS)}")
    out = check_notebook_output(out_dir)
    base = {**NOTEBOOK_PRESETS[preset].to_dict(), "work_dir": str(out / "work"), "figures_dir": str(out / "figures")}
    overrides = dict(overrides or {})
    source = notebooks_dir()
    declared_anywhere: set[str] = set()
    plans = []
    for name in names:
        declared = notebook_parameters(source / name)
        declared_anywhere |= set(declared)
        params = {}
        for key, info in declared.items():
            if key in overrides:
                params[key] = _coerce(key, overrides[key], info["inferred_type_name"], name)
            elif key in base:
                params[key] = _coerce(key, base[key], info["inferred_type_name"], name)
        plans.append((name, params))
    unknown = sorted(set(overrides) - declared_anywhere)
    if unknown:
        raise ParameterError(
            f"no notebook has parameter(s) {unknown}", f"known parameters: {sorted(declared_anywhere)}"
        )
    check_overrides(
        NOTEBOOK_PRESETS[preset], {k: v for _, params in plans for k, v in params.items() if k in overrides}
    )
    executed = []
    start = time.perf_counter()
    with tqdm(total=len(plans), desc="notebooks", unit="notebook", disable=not progress) as bar:
        for name, params in plans:
            target = out / "executed" / name
            bar.set_postfix_str(f"running {name}")
            began = time.perf_counter()
            _execute_one(source / name, target, params, kernel, cell_timeout, cwd=source.parent)
            executed.append(target)
            bar.update()
            if progress:
                bar.write(f"{name}: {time.perf_counter() - began:.0f} s (total {time.perf_counter() - start:.0f} s)")
    return executed
