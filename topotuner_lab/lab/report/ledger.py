"""A comparison folder's ledger, verified before a report renders a number of it.

``preset.json`` must be a preset (:class:`~topotuner_lab.study.presets.Preset`) whose plan holds every run of
``results.csv`` and whose run count is the one it recorded; each row must be where the plan puts that run, and must
summarize the ``results.json`` in its folder, which must verify its checksum and record the config the preset plans
for it; the rate each arm kept must be the one its sweep chooses; a transfer check must be a record of one of the
preset's transfers. Anything else is an :class:`~topotuner_lab._io.errors.InputFileError` that names the file and
how to restore it: a hand-edited ledger never reaches a report.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from topotuner_lab._io.config import Config
from topotuner_lab._io.errors import InputFileError, TopoTunerError
from topotuner_lab._io.json_files import read_json
from topotuner_lab.study.cards import CardKey
from topotuner_lab.study.plan import DEFAULT_RECIPE, RunKey, RunSpec, arms, plan, run_owner, transfers
from topotuner_lab.study.presets import PRESETS, Preset
from topotuner_lab.study.protocol import config_for, select_rate, summary_row
from topotuner_lab.study.workspace import WorkDir, same_config
from topotuner_lab.training.results import RunResults, load_results

#: what a transfer check record holds (``study.protocol`` writes them; the report's sections read these fields)
TRANSFER_FIELDS: tuple[str, ...] = (
    "prior",
    "target",
    "strategy",
    "median_cosine_card",
    "median_cosine_all",
    "rank_agreement",
    "overlap",
    "close",
    "verdict",
)


class Kept(typing.NamedTuple):
    """A results.csv row, verified: its line, the run it is, its results and whether it is marked selected."""

    line: int
    spec: RunSpec
    results: RunResults
    selected: bool


def _redo(root: Path) -> str:
    """The ``reproduce`` command that rewrites the comparison under ``root`` (named by its default folder name)."""
    name = root.name.removeprefix("reproduce-")
    return f"`topotuner-lab reproduce --preset {name if name in PRESETS else 'PRESET'} -o {root}`"


def _restore(path: Path, root: Path, what: str = "it") -> str:
    """The fix of a damaged or edited ledger file: restore it from git, or let ``reproduce`` write it again."""
    return f"restore {path} from git (`git checkout -- {path}`), or rerun {_redo(root)} to recompute {what}"


def read_preset_record(out: WorkDir) -> dict[str, Any]:
    """``preset.json`` as the JSON object it must be."""
    return dict(read_json(out.preset, "preset", _restore(out.preset, out.root)))


def read_results_table(out: WorkDir) -> pd.DataFrame:
    """``results.csv`` as a table, one row per run (a row given twice is refused)."""
    try:
        results = pd.read_csv(out.results)
    except (OSError, ValueError) as exc:  # pandas' EmptyDataError and ParserError are ValueErrors
        raise InputFileError(
            f"results table {out.results} cannot be read ({exc.__class__.__name__}: {str(exc)[:120]})",
            _restore(out.results, out.root),
        ) from exc
    if {"prior", "run_dir"} <= set(results.columns):
        twice = results.duplicated(["prior", "run_dir"], keep=False)
        if twice.any():
            lines = ", ".join(str(i + 2) for i in results.index[twice])
            raise InputFileError(
                f"results table {out.results} lists one run more than once (lines {lines})",
                _restore(out.results, out.root),
            )
    return results


def checked_preset(out: WorkDir, recorded: dict[str, Any]) -> Preset:
    """The :class:`Preset` of ``recorded`` (``preset.json`` less its notes): every field valid, nested ones too."""
    try:
        preset = Preset.from_dict(recorded)
    except (TopoTunerError, TypeError, ValueError, AttributeError) as exc:
        problem = exc.problem if isinstance(exc, TopoTunerError) else f"{exc.__class__.__name__}: {exc}"
        raise InputFileError(f"{out.preset} is not a valid preset ({problem})", _restore(out.preset, out.root)) from exc
    hints = typing.get_type_hints(Preset)
    for field in dataclasses.fields(Preset):
        kind = hints[field.name]
        if isinstance(kind, type) and issubclass(kind, Config) and not isinstance(getattr(preset, field.name), kind):
            raise InputFileError(
                f"{out.preset} is not a valid preset ({field.name} is not a {kind.label})",
                _restore(out.preset, out.root),
            )
    return preset


def _cell(value: Any) -> Any:
    """A results.csv cell as a plain value: an empty cell (NaN) and a NaN result both as None."""
    if isinstance(value, np.generic):
        value = value.item()
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def _same(given: Any, summarized: Any) -> bool:
    """Whether a results.csv cell holds the value its run's results give (floats as written: to 1e-12)."""
    a, b = _cell(given), _cell(summarized)
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
    return bool(np.isclose(a, b, rtol=1e-12, atol=0)) if numbers else a == b


def _spec(row: dict[str, Any], line: int, out: WorkDir) -> RunSpec:
    """The planned run a results.csv row claims to be."""
    try:
        seed, lr, budget = float(row["seed"]), float(row["lr"]), _cell(row["budget"])
        if not seed.is_integer():
            raise ValueError(f"seed {row['seed']!r} is not a whole number")
        key = RunKey(
            row["method"],
            _cell(row["strategy"]),
            None if budget is None else float(budget),
            row["schedule"],
            row["recipe"],
        )
        return RunSpec(str(row["prior"]), str(row["target"]), int(seed), key, row["role"], lr)
    except (KeyError, TypeError, ValueError) as exc:
        raise InputFileError(
            f"results table {out.results} line {line} is not a run ({exc.__class__.__name__}: {exc})",
            _restore(out.results, out.root),
        ) from exc


def _unplanned(spec: RunSpec, preset: Preset) -> str:
    """What of ``spec`` the preset does not name, for the error."""
    if spec.seed not in (*preset.seeds, *preset.sweep_seeds):
        named = f"seeds {list(preset.seeds)}, sweep seeds {list(preset.sweep_seeds)}"
        return f"seed {spec.seed}, which preset.json does not name ({named})"
    if (spec.prior, spec.target) not in transfers(preset):
        return f"the transfer {spec.prior} -> {spec.target}, which preset.json does not run"
    if spec.arm[2] not in arms(preset):
        return f"the arm {spec.key.name}, which preset.json does not run"
    return f"{spec.key.name} at seed {spec.seed} as a {spec.role} run, which preset.json does not plan"


def _position(specs: list[RunSpec], spec: RunSpec) -> float:
    """Where ``spec`` runs in the plan ``specs``; a sweep rate beyond the grid right after its arm's planned sweep."""
    for index, planned in enumerate(specs):
        if planned == spec or (spec.role != "sweep" and planned == dataclasses.replace(spec, lr=None)):
            return float(index)
    return max(i for i, s in enumerate(specs) if s.role == "sweep" and s.arm == spec.arm) + 0.5


def _card_paths(preset: Preset) -> dict[CardKey, Path]:
    """A card path for every card an arm can train with (the paths are placeholders: configs are compared without)."""
    recipes = dict.fromkeys((DEFAULT_RECIPE, *preset.recipes))
    return {
        CardKey(prior, strategy, budget, recipe): Path("card.json")
        for prior in preset.prior_tasks
        for strategy in preset.strategies
        for budget in preset.budgets
        for recipe in recipes
    }


def verified_runs(out: WorkDir, results: pd.DataFrame, preset: Preset, planned: int | None) -> dict[str, RunResults]:
    """Every run of ``results`` checked against its ``results.json`` and the preset; run folder -> verified results."""
    specs = plan(preset)
    if planned is not None and planned != len(specs):
        raise InputFileError(
            f"{out.preset} plans {len(specs)} runs but records planned_runs {planned}: it was edited after the "
            "comparison wrote it",
            _restore(out.preset, out.root),
        )
    fix = _restore(out.results, out.root, "it from the runs")
    names = {(s.prior, s.target, s.seed, s.key, s.role) for s in specs}
    cards, runs = _card_paths(preset), {}
    kept: dict[tuple[str, str, RunKey], list[Kept]] = {}
    last = (0.0, 0)  # the plan position of the row before, and its line
    for index, row in zip(results.index, results.to_dict("records")):
        line = int(index) + 2  # the header is line 1
        spec = _spec(row, line, out)
        if (spec.prior, spec.target, spec.seed, spec.key, spec.role) not in names:
            raise InputFileError(f"results table {out.results} line {line} holds {_unplanned(spec, preset)}", fix)
        position = _position(specs, spec)
        if position < last[0]:  # rows are written in plan order: a reordered preset plans another order
            raise InputFileError(
                f"results table {out.results} line {line} ({spec.key.name}, seed {spec.seed}) comes after line "
                f"{last[1]}, yet {out.preset} plans it before (its seeds, tasks or strategies were reordered?)",
                fix,
            )
        last = (position, line)
        home = out.target_run(run_owner(preset, spec), f"{spec.target}/seed{spec.seed}", spec.arm[2].name)
        cfg = config_for(preset, spec, cards, float(spec.lr or 0), home)
        if Path(cfg.output_dir) != out.root / str(row["run_dir"]):
            raise InputFileError(
                f"results table {out.results} line {line} names folder {row['run_dir']}; run {spec.key.name} at seed "
                f"{spec.seed} and rate {spec.lr:g} lives in {Path(cfg.output_dir).relative_to(out.root)}",
                fix,
            )
        path = Path(cfg.output_dir) / "results.json"
        if str(row["run_dir"]) not in runs:
            try:
                runs[str(row["run_dir"])] = load_results(path)
            except InputFileError as exc:
                raise InputFileError(exc.problem, _restore(path, out.root, "that fine-tune")) from exc
        res = runs[str(row["run_dir"])]
        try:
            _check_row(out, row, line, spec, res, cfg, fix)
        except (KeyError, TypeError, ValueError, IndexError) as exc:  # verified, yet not every field a run writes
            raise InputFileError(
                f"results file {path} lacks what a finished run records ({exc.__class__.__name__}: {exc})",
                _restore(path, out.root, "that fine-tune"),
            ) from exc
        kept.setdefault(spec.arm, []).append(Kept(line, spec, res, bool(row.get("selected"))))
    for arm_runs in kept.values():
        _check_rate(out, preset, arm_runs, fix)
    return runs


def _check_row(
    out: WorkDir, row: dict[str, Any], line: int, spec: RunSpec, res: RunResults, cfg: Any, fix: str
) -> None:
    """A row's run recorded this run's folder and config, and the row holds what its results give."""
    path = out.root / str(row["run_dir"]) / "results.json"
    folder = Path(row["run_dir"]).parts
    if Path(str((res.get("config") or {}).get("output_dir"))).parts[-len(folder) :] != folder:
        raise InputFileError(f"{path} was written by another run (its config names another folder)", fix)
    if not same_config(res, dataclasses.replace(cfg, learning_rate=res.get("learning_rate"))):
        raise InputFileError(
            f"{path} records another config than {out.preset} plans for {spec.key.name} at seed {spec.seed} "
            "(preset.json was edited, or the folder holds runs of another comparison)",
            fix,
        )
    summary = summary_row(spec, res, bool(row.get("selected")), Path(str(row["run_dir"])))
    for column, value in row.items():
        if column not in summary:
            raise InputFileError(f"results table {out.results} has a column {column!r} no run summary holds", fix)
        if not _same(value, summary[column]):
            raise InputFileError(
                f"results table {out.results} line {line} says {column} = {_cell(value)!r}; the run's "
                f"{path.relative_to(out.root)} gives {_cell(summary[column])!r}",
                fix,
            )


def _check_rate(out: WorkDir, preset: Preset, arm_runs: list[Kept], fix: str) -> None:
    """The rate an arm kept is the one its sweep chooses, and the rows marked selected are the runs at that rate."""
    arm = arm_runs[0].spec.key
    sweep = [(float(run.spec.lr or 0), run.results) for run in arm_runs if run.spec.role == "sweep"]
    beyond = {lr for lr, _ in sweep if not np.isclose(lr, preset.lr_grid[arm.family]).any()}
    if len(beyond) > preset.lr_extend:
        raise InputFileError(
            f"results table {out.results} sweeps {arm.name} at {len(beyond)} rates beyond its grid; "
            f"{out.preset} extends a sweep by at most {preset.lr_extend}",
            fix,
        )
    # a sweep marks its choice (and later seeds run at it) only once it is complete
    finished = any(run.spec.role != "sweep" or run.selected for run in arm_runs)
    chosen = select_rate(sweep, preset.rate_criterion) if sweep else None
    for run in arm_runs:
        spec = run.spec
        at_chosen = chosen is not None and bool(np.isclose(float(spec.lr or 0), chosen))
        selected = spec.role == "chosen" or (spec.role == "sweep" and not preset.sweep_seeds and finished and at_chosen)
        if (spec.role != "sweep" and not at_chosen) or run.selected != selected:
            raise InputFileError(
                f"results table {out.results} line {run.line} ({spec.key.name}, seed {spec.seed}, rate {spec.lr:g}, "
                f"selected {run.selected}) disagrees with the rate its sweep chooses "
                f"({'none' if chosen is None else f'{chosen:g}'}, by {preset.rate_criterion})",
                fix,
            )


def transfer_records(out: WorkDir, preset: Preset) -> list[dict[str, Any]]:
    """The transfer checks the comparison recorded, one per transfer and budget, each of the preset's transfers."""
    records = []
    for path in sorted(out.transfer_checks()):
        fix = _restore(path, out.root, "the transfer check")
        record = dict(read_json(path, "transfer check record", fix))
        missing = [name for name in TRANSFER_FIELDS if name not in record]
        if missing:
            raise InputFileError(f"transfer check record {path} lacks field(s) {missing}", fix)
        if (record["prior"], record["target"]) not in transfers(preset):
            raise InputFileError(
                f"transfer check record {path} is of {record['prior']} -> {record['target']}, a transfer "
                f"{out.preset} does not run",
                fix,
            )
        records.append(record)
    return records
