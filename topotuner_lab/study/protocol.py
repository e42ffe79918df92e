"""The paper's comparison at a size this machine can run: one resumable command, one results table.

prior fine-tune -> drift table and its noise floor -> profile cards (high/low drift, random and magnitude
controls, at each budget) -> each card transferred to the target tasks, beside full fine-tuning and LoRA at
a matched budget. The protocol is a fair one:

- every arm (each card strategy and control, LoRA, full FT) gets its own learning rate, chosen from a
  small log grid by accuracy on a validation split carved from the training data, never the test set;
  the rate is chosen on the first seed and the other seeds run at it;
- every arm and seed is scored on the same test examples, so differences get paired bootstrap
  intervals (:mod:`topotuner_lab.study.stats`);
- optionally a constant-learning-rate run of each card, so early stopping is seen apart from a decaying schedule.

What runs is planned first (:func:`topotuner_lab.study.plan.plan`); every run keeps its own ``results.json``, so an
interrupted comparison resumes by skipping what is done.
The prior fine-tunes, their drift tables and the cards are made by :mod:`topotuner_lab.study.cards`; this module
orchestrates them, the grid of fine-tunes and its ledger.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pandas as pd

from topotuner_lab._io import atomic
from topotuner_lab._io.config import POSITIVE_INT
from topotuner_lab._io.errors import InputFileError, ParameterError, TopoTunerError
from topotuner_lab._io.json_files import read_json
from topotuner_lab.drift.noise import noise_check
from topotuner_lab.drift.tables import save_table
from topotuner_lab.profiles.card import ProfileCard
from topotuner_lab.study.cards import Cards, Log, card_for, cards_for_prior, prior_drift
from topotuner_lab.study.claims import ClaimRules, claim_results
from topotuner_lab.study.markdown import markdown_table
from topotuner_lab.study.plan import (
    DEFAULT_RECIPE,
    KEY_COLUMNS,
    PAPER_LORA,
    PAPER_LORA_RANK,
    RunKey,
    RunSpec,
    plan,
    run_owner,
    transfers,
)
from topotuner_lab.study.presets import Preset
from topotuner_lab.study.sequential import LOOKS_FILE, at_look, look_rows, looks, open_claims
from topotuner_lab.study.weights_facts import record_weights_facts
from topotuner_lab.study.workspace import (
    WorkDir,
    finetune_once,
    noise_tables_once,
    reuse_or_compute,
    snapshot_once,
)
from topotuner_lab.training.config import FinetuneConfig
from topotuner_lab.training.machine import machine
from topotuner_lab.training.results import RunResults
from topotuner_lab.training.transfer import TransferCheckSettings, transfer_check
from topotuner_lab.weights.models import PACKAGED_MODELS, LoadedModel, embedded_gguf_path, load_model

if TYPE_CHECKING:
    from topotuner_lab.study.distributed import Cluster


class Progress:
    """Runs done of planned, with an estimate of the time left from the runs computed so far.

    ``parallel`` fine-tunes run at once (Dask workers), so the time left is the runs left times their mean
    time, divided by it. The mean is over runs trained from the start: a run resumed from a checkpoint (a sitting
    cut off mid-run) did only its last epochs, and would make the estimate far too short.
    """

    def __init__(self, planned: int, log: Log, parallel: int = 1) -> None:
        self.planned, self.done, self.log, self.parallel = planned, 0, log, parallel
        self.computed_seconds: list[float] = []

    def record(self, label: str, result: RunResults, seconds: float) -> None:
        """Log a fine-tune that took ``seconds`` (here or on a worker): its accuracy and the time left."""
        if seconds > 0.25 and not result.get("resumed_from"):  # a skipped (finished) or resumed run is no measure
            self.computed_seconds.append(seconds)
        self.done += 1
        left = self.planned - self.done
        eta = ""
        if self.computed_seconds and left:
            mean = sum(self.computed_seconds) / len(self.computed_seconds)
            eta = f", about {left * mean / self.parallel / 60:.0f} min left"
        score = f"test {result.get('metric', 'acc')} {result['test_accuracy']:.3f}"
        self.log(f"[{self.done}/{self.planned}] {label}: {score}{eta}")


def config_for(preset: Preset, spec: RunSpec, cards: Cards, lr: float, run_dir: Path) -> FinetuneConfig:
    """The fine-tune config of one planned run at rate ``lr``.

    Cards train with their own stopping threshold; LoRA matches the parameter count of the budget's first card, or
    runs at the paper's rank 16 (``lora:r16``). Arms whose method is not in ``Preset.epoch_eval`` are scored once, at
    the end (the per-epoch scores serve the stopping claims of the cards).
    """
    key = spec.key
    target = replace(preset.target, **preset.target_overrides.get(spec.target, {}))
    base = replace(target, task=spec.target, seed=spec.seed, data_seed=spec.seed, learning_rate=lr)
    if key.method == "profile":
        card = card_for(
            cards, spec.prior, spec.target, str(key.strategy), float(key.budget or 0), key.recipe, spec.seed
        )
        cfg = replace(base, method="profile", profile=str(card), stop_threshold="card")
    elif key.method == "lora" and key.strategy == PAPER_LORA:
        cfg = replace(base, method="lora", lora_rank=PAPER_LORA_RANK, profile=None)
    elif key.method == "lora":
        card = card_for(cards, spec.prior, spec.target, preset.strategies[0], float(key.budget or 0), DEFAULT_RECIPE)
        cfg = replace(base, method="lora", lora_rank="match", profile=str(card))
    else:
        cfg = replace(base, method=key.method)
    if key.method not in preset.epoch_eval:  # per-epoch scores only where a claim reads them
        cfg = replace(cfg, eval_each_epoch=False)
    folder = f"constant-lr-{lr:g}" if key.schedule == "constant" else f"lr-{lr:g}"
    return replace(cfg, lr_scheduler=key.schedule, output_dir=str(run_dir / folder))


def select_rate(sweep: list[tuple[float, RunResults]], criterion: str = "logloss") -> float:
    """The rate with the lowest validation log-loss (a smooth criterion) or, by ``criterion``, the best accuracy.

    Each rate's criterion is its mean over the runs at that rate (one per sweep seed). Log-loss is used when asked and
    every run of the sweep records it (label-likelihood tasks), else validation accuracy (the task metric); ties go to
    the smaller rate. Log-loss also rewards a less confident model: after many epochs it can prefer a rate whose
    accuracy is lower, so a comparison judged on accuracy may choose on accuracy (``Preset.rate_criterion``).
    """
    by_rate: dict[float, list[RunResults]] = {}
    for lr, res in sweep:
        by_rate.setdefault(lr, []).append(res)

    def mean(lr: float, field: str) -> float:
        values: list[float] = [cast(float, res.get(field)) for res in by_rate[lr]]
        return sum(values) / len(values)

    if criterion == "logloss" and all(res.get("val_logloss") is not None for _, res in sweep):
        return min(by_rate, key=lambda lr: (mean(lr, "val_logloss"), lr))
    return max(by_rate, key=lambda lr: (mean(lr, "val_accuracy"), -lr))


def extension(
    sweep: list[tuple[float, RunResults]], grid: tuple[float, ...], cap: int, criterion: str = "logloss"
) -> float | None:
    """The next rate beyond the grid's edge when the sweep's best rate lies on that edge (extend-until-interior).

    The step is the geometric mean ratio of the planned ``grid``; at most ``cap`` rates are added beyond it, the same
    rule for every method. ``None`` when the best rate is interior, the cap is reached,
    the grid has a single rate, or the next rate would leave (0, 1).
    """
    rates = sorted({lr for lr, _ in sweep})
    if len(grid) < 2 or len(rates) - len(grid) >= cap:
        return None
    best = select_rate(sweep, criterion)
    step = (max(grid) / min(grid)) ** (1 / (len(grid) - 1))
    if best == rates[0]:
        beyond = best / step
    elif best == rates[-1]:
        beyond = best * step
    else:
        return None
    beyond = float(f"{beyond:.3g}")
    return beyond if 0 < beyond < 1 and beyond not in rates else None


def machines_so_far(recorded: dict[str, Any]) -> str:
    """The machines of the earlier sittings, then this one, in order, ``; ``-separated and each once.

    ``recorded`` is the folder's ``preset.json`` as :func:`check_same_preset` returns it. A comparison may take
    several sittings, not all on the same machine; its report names every one.
    """
    earlier = recorded.get("machine")
    seen = earlier.split("; ") if isinstance(earlier, str) and earlier else []
    here = machine()
    return "; ".join(seen if here in seen else [*seen, here])


#: what ``preset.json`` records beside the preset's fields
RECORD_ONLY: tuple[str, ...] = ("planned_runs", "machine")


def check_same_preset(preset: Preset, work: WorkDir, log: Log) -> dict[str, Any]:
    """Refuse a folder that holds the comparison of another preset (or another model), before anything is written.

    The preset is read from the folder's ``preset.json``; the same preset resumes, and its record is returned ({}
    where there is none). A damaged ``preset.json`` (not a JSON object) is rewritten, as every other damaged file is
    recomputed: each step verifies its own inputs.
    """
    if not work.preset.exists():
        return {}
    try:
        recorded = read_json(work.preset, "preset", "it is rewritten")
    except InputFileError as exc:
        log(f"rewrite (unreadable): {exc.problem}")
        return {}
    fix = (
        f"give this comparison its own folder with -o (the default is runs/reproduce-PRESET), or delete {work.root} "
        "to start over there"
    )
    try:
        there = Preset.from_dict({k: v for k, v in recorded.items() if k not in RECORD_ONLY})
    except TopoTunerError as exc:
        raise ParameterError(
            f"{work.root} holds a comparison whose preset.json this version cannot read: {exc.problem}", fix
        ) from exc
    if there == preset:
        return recorded
    differ = [f.name for f in dataclasses.fields(Preset) if getattr(there, f.name) != getattr(preset, f.name)]
    model = (
        f" (model {there.model or 'smollm2-135m'} there, {preset.model or 'smollm2-135m'} here)"
        if "model" in differ
        else ""
    )
    raise ParameterError(
        f"{work.root} holds the comparison of another preset{model}; they differ in {', '.join(differ)}", fix
    )


def prepare(preset: Preset, work: WorkDir, log: Log) -> tuple[LoadedModel, Cards]:
    """The model and its cards, with everything the long grid needs prepared before it runs.

    That is the pretrained snapshot and noise floor, each prior's drift table (first prior seed) and cards, and the
    further models' drift and noise tables (drift only); every step is reused when verified. The other prior seeds
    come after the fine-tunes (:func:`further_prior_seeds`). A folder of another preset is refused
    before anything is written.
    """
    recorded = check_same_preset(preset, work, log)
    for name in preset.other_models:  # fail now, not after the grid, when a second model is not installed
        if name in PACKAGED_MODELS:
            embedded_gguf_path(name)
    loaded = load_model(preset.model)
    pre = snapshot_once(loaded, work.pretrained)
    atomic.write_json(
        work.preset, {**preset.to_dict(), "planned_runs": len(plan(preset)), "machine": machines_so_far(recorded)}
    )
    noise = noise_tables_once(pre, work, preset.noise_seeds, preset.drift)
    cards: Cards = {}
    first = preset.prior_seeds[0]
    for prior in preset.prior_tasks:
        tables = prior_drift(preset, loaded, pre, prior, work, log, preset.recipes, seeds=(first,))
        log(noise_check(tables[first, DEFAULT_RECIPE], noise, preset.metric, warn=True).message)
        by_recipe = {recipe: tables[first, recipe] for recipe in preset.recipes}
        cards.update(cards_for_prior(preset, by_recipe, noise, pre, loaded, prior, work, log))
    record_weights_facts(work, preset.prior_tasks)  # what a report needs of the weights, which git does not keep
    _transfer_checks(preset, cards, loaded, work, log)
    for name in preset.other_models:
        other, folder = load_model(name), work.model(name)
        other_pre = snapshot_once(other, folder.pretrained)
        noise_tables_once(other_pre, folder, preset.noise_seeds, preset.drift)
        for prior in preset.prior_tasks:
            prior_drift(preset, other, other_pre, prior, folder, log, (DEFAULT_RECIPE,), builds_cards=False)
        record_weights_facts(folder, preset.prior_tasks)
        del other
    return loaded, cards


def further_prior_seeds(preset: Preset, loaded: LoadedModel, work: WorkDir, log: Log) -> None:
    """The prior fine-tunes and drift tables of every prior seed after the first, for the stability claims.

    The cards come from the first prior seed alone, so these run after the fine-tunes: a sitting spends its first
    hours on the runs the claims read, and a study cut short still has them.
    """
    if len(preset.prior_seeds) < 2:
        return
    pre = snapshot_once(loaded, work.pretrained)
    for prior in preset.prior_tasks:
        prior_drift(preset, loaded, pre, prior, work, log, preset.recipes, seeds=preset.prior_seeds[1:])


def _transfer_record(
    card: ProfileCard, loaded: LoadedModel, target: str, settings: TransferCheckSettings, path: Path
) -> dict[str, Any]:
    """Run the transfer check of ``card`` on ``target`` and write its numbers (with what it was made from)."""
    check = transfer_check(loaded, card, target, settings)
    record = {
        **_made_from(card, target, settings),
        "prior": card.prior_task,
        "strategy": card.strategy,
        "median_cosine_card": check.median_cosine_card,
        "median_cosine_all": check.median_cosine_all,
        "rank_agreement": check.rank_agreement,
        "overlap": check.overlap,
        "close": check.close,
        "verdict": check.verdict,
    }
    atomic.write_json(path, record)
    return record


def _made_from(card: ProfileCard, target: str, settings: TransferCheckSettings) -> dict[str, Any]:
    return {"trainable": list(card.trainable), "target": target, "settings": settings.to_dict()}


def _made_from_same(made_from: dict[str, Any], record: dict[str, Any]) -> bool:
    return all(record.get(k) == v for k, v in made_from.items())


def _transfer_checks(preset: Preset, cards: Cards, loaded: LoadedModel, work: WorkDir, log: Log) -> None:
    """The transfer check of the first strategy's card for every transfer and budget, recorded (``transfer/*.json``).

    A record is reused when it was made for the same card picks, target and settings.
    """
    if not preset.transfer_rows:
        return
    settings = TransferCheckSettings(n_rows=preset.transfer_rows)
    for prior, target in transfers(preset):
        for budget in preset.budgets:
            card = ProfileCard.load(card_for(cards, prior, target, preset.strategies[0], budget, DEFAULT_RECIPE))
            made_from = _made_from(card, target, settings)
            path = work.transfer_check(prior, target, budget)
            record = reuse_or_compute(
                path,
                lambda p: read_json(p, "transfer check record", "it is recomputed"),
                functools.partial(_transfer_record, card, loaded, target, settings, path),
                valid=functools.partial(_made_from_same, made_from),
                log=log,
            )
            log(str(record["verdict"]))


class Ledger:
    """The owner's record of a comparison's runs: which can start, what each gave, and ``results.csv``.

    Both ways of running the grid (one after another here, or as Dask tasks:
    :func:`topotuner_lab.study.distributed.run_on_dask`) go through it, so the rate choice and the table are one
    code. An arm's chosen and constant runs wait for its sweep: once every sweep run of the arm is recorded, its rate
    comes from :func:`select_rate`, unless :func:`extension` first adds sweep runs beyond the grid's edge (placed
    after the arm's sweep). Rows are kept in plan order, whatever order the runs finish in, and the table is written
    atomically after each run; only the owner process writes it.
    """

    def __init__(self, preset: Preset, work: WorkDir, cards: Cards, log: Log) -> None:
        self.preset, self.work, self.cards, self.log = preset, work, cards, log
        self.specs = plan(preset)
        self.progress = Progress(len(self.specs), log)
        self.started: set[RunSpec] = set()
        self.results: dict[RunSpec, RunResults] = {}
        self.rows: dict[RunSpec, dict[str, Any]] = {}
        self.chosen: dict[tuple[str, str, RunKey], float] = {}

    def take(self, limit: int | None = None) -> list[RunSpec]:
        """Up to ``limit`` runs (default all) not started yet whose rate is known, in plan order; marked started."""
        ready = [s for s in self.specs if s not in self.started and (s.role == "sweep" or s.arm in self.chosen)]
        ready = ready[:limit]
        self.started.update(ready)
        return ready

    def lr(self, spec: RunSpec) -> float:
        """The rate a run trains at: its own in a sweep, else the one chosen for its arm."""
        lr = spec.lr if spec.role == "sweep" else self.chosen[spec.arm]
        assert lr is not None
        return lr

    def config(self, spec: RunSpec) -> FinetuneConfig:
        """The fine-tune config of a run whose rate is known."""
        run_dir = self.work.target_run(run_owner(self.preset, spec), f"{spec.target}/seed{spec.seed}", spec.arm[2].name)
        return config_for(self.preset, spec, self.cards, self.lr(spec), run_dir)

    def label(self, spec: RunSpec) -> str:
        """How the progress log names a run."""
        return f"{spec.prior}->{spec.target} seed {spec.seed} {spec.key.name} lr {self.lr(spec):g}"

    def record(self, spec: RunSpec, res: RunResults, seconds: float) -> None:
        """Take a finished run's results (``seconds`` of fine-tuning), decide its arm's rate if due, write the table."""
        self.progress.record(self.label(spec), res, seconds)
        self.results[spec] = res
        run_dir = Path(self.config(spec).output_dir).relative_to(self.work.root)
        self.rows[spec] = summary_row(spec, res, spec.role == "chosen", run_dir)
        if spec.role == "sweep":
            self._after_sweep(spec.arm)
        save_table(self.table(), self.work.results)  # partial table after every run

    def _after_sweep(self, arm: tuple[str, str, RunKey]) -> None:
        """Once an arm's sweep runs are all recorded: extend the sweep beyond its grid's edge, or choose its rate."""
        runs = [s for s in self.specs if s.arm == arm and s.role == "sweep"]
        if any(s not in self.results for s in runs):
            return
        sweep = [(self.lr(s), self.results[s]) for s in runs]
        last, preset = runs[-1], self.preset
        beyond = extension(sweep, preset.lr_grid[last.key.family], preset.lr_extend, preset.rate_criterion)
        if beyond is not None:
            self.log(f"{last.key.name}: best rate at the edge of its grid; extending the sweep to {beyond:g}")
            more = [replace(last, lr=beyond, seed=seed) for seed in preset.sweep_seeds or (last.seed,)]
            at = self.specs.index(last) + 1
            self.specs[at:at] = more
            self.progress.planned += len(more)
            return
        self.chosen[arm] = select_rate(sweep, preset.rate_criterion)
        if not preset.sweep_seeds:  # the first seed's run at the chosen rate is its result
            for s in runs:
                self.rows[s]["selected"] = self.rows[s]["lr"] == self.chosen[arm]

    def table(self) -> pd.DataFrame:
        """The recorded runs' rows in plan order (a comparison without target tasks: an empty table with columns)."""
        rows = [self.rows[s] for s in self.specs if s in self.rows]
        if rows:
            return pd.DataFrame(rows)
        return pd.DataFrame(columns=["prior", "target", "seed", "run", *KEY_COLUMNS, "selected"])


def use_torch_threads(threads: int | None) -> None:
    """Have torch compute with ``threads`` threads in this process (None: leave its setting).

    float32 training is bit-identical only at the same thread count, so the serial path and each Dask task set it
    alike.
    """
    if threads is None:
        return
    if not POSITIVE_INT(threads):
        raise ParameterError(
            f"threads={threads!r} is not a positive number of torch threads", "use --threads-per-worker 1 or more"
        )
    import torch

    torch.set_num_threads(threads)


def run_study(
    preset: Preset,
    out_dir: str | Path,
    log: Log = print,
    *,
    threads: int | None = None,
    cluster: Cluster | None = None,
) -> pd.DataFrame:
    """Run (or resume) every planned fine-tune of ``preset`` under ``out_dir``; returns and writes the results table.

    A seed sets both the training seed and which training rows are drawn; the test rows are the same for every seed
    (paired comparisons). The priors, drift tables and cards are prepared here; the fine-tunes of the grid run here
    one after another, or as Dask tasks on ``cluster`` (:mod:`topotuner_lab.study.distributed`), with the same
    results. ``threads``: torch threads of each fine-tune, here and on the workers (None: torch's default here, 1
    on a worker).
    """
    use_torch_threads(threads)
    work = WorkDir(out_dir)
    loaded, cards = prepare(preset, work, log)
    records: list[dict[str, Any]] = []
    for seeds in looks(preset):  # one look at every seed, or seed blocks judged in turn (study.sequential)
        ledger = Ledger(at_look(preset, seeds), work, cards, log)
        if cluster is None:
            while ready := ledger.take(1):
                start = time.perf_counter()
                res = finetune_once(loaded, ledger.config(ready[0]), log)
                ledger.record(ready[0], res, time.perf_counter() - start)
        else:
            from topotuner_lab.study.distributed import run_on_dask

            run_on_dask(ledger, loaded, preset.model, cluster, threads or 1)
        if preset.seed_blocks and not _next_look(preset, ledger, seeds, records, log):
            break
    further_prior_seeds(preset, loaded, work, log)
    # a drift-only comparison (no target task) still writes a results table the report can read
    results = ledger.table()
    save_table(results, work.results)
    atomic.write_text(work.root / "results.md", markdown_table(results) + "\n")
    _record_transfers(cards, results)
    return results


def _next_look(preset: Preset, ledger: Ledger, seeds: int, records: list[dict[str, Any]], log: Log) -> bool:
    """Judge a look's sequential claims at its level; record it in ``looks.json``; True where seeds are to be added."""
    rules = ClaimRules.of(preset, seeds_run=seeds)
    by_dir: dict[str, Any] = {str(ledger.rows[s]["run_dir"]): res for s, res in ledger.results.items()}
    table = look_rows(preset, ledger.table())
    claims = claim_results(table, lambda run_dir, key: by_dir[run_dir][key], rules) if len(table) else []
    open_ = open_claims(claims)
    below_floor = seeds < preset.seed_floor  # the preset runs this many seeds whatever a look decides
    more = seeds < len(preset.seeds) and (open_ != [] or below_floor)
    records.append(
        {
            "seeds": seeds,
            "level": rules.level,
            "undecided": None if open_ is None else [f"{c.setting}: {c.measure}" for c in open_],
            "adds_seeds": more,
            "seed_floor": preset.seed_floor,
        }
    )
    atomic.write_json(ledger.work.root / LOOKS_FILE, records)
    if seeds < len(preset.seeds):
        why = (
            "it judges no thesis or control claim"
            if open_ is None
            else f"{len(open_)} thesis or control claims undecided"
            if open_
            else "the thesis and control claims are decided"
        )
        floor = f" up to the preset's floor of {preset.seed_floor}" if more and below_floor and not open_ else ""
        log(
            f"look at {seeds} seeds (intervals at {rules.level:.2%}): {why}; "
            + (f"adding seeds{floor}" if more else "stopping")
        )
    return more


def _record_transfers(cards: Cards, results: pd.DataFrame) -> None:
    """The comparison's own cards (its outputs, never a user's input) list the tasks they were transferred to."""
    for key, path in cards.items():
        targets = [key.target] if key.target else sorted(set(results.loc[results["prior"] == key.prior, "target"]))
        card = ProfileCard.load(path)
        if card.transferred_to != targets:  # a resumed study that ran nothing new leaves its cards' files alone
            replace(card, transferred_to=targets).save(path)


def drift_minus_lr_ratio(res: RunResults) -> float | None:
    """Mean over epochs 2.. of (normalized epoch drift - the epoch's mean learning rate over the first epoch's).

    Under a linear decay over E epochs that ratio is (E - k + 0.5) / (E - 0.5) for epoch k; a value near 0
    says the drift only followed the schedule, a negative one that the weights settled faster than it.
    """
    history, cfg = res.get("drift_history") or [], res.get("config", {})
    epochs = cfg.get("epochs")
    if cfg.get("lr_scheduler") != "linear" or len(history) < 2 or not epochs:
        return None
    gaps = [h["normalized"] - (epochs - h["epoch"] + 0.5) / (epochs - 0.5) for h in history[1:]]
    return sum(gaps) / len(gaps)


def summary_row(spec: RunSpec, res: RunResults, selected: bool, run_dir: Path) -> dict[str, Any]:
    """One ``results.csv`` row: the run's identity (key columns), accuracy, forgetting, stopping and cost."""
    epoch_acc = res.get("epoch_test_accuracy") or []
    stop_epoch = res.get("stop_epoch")
    # the stopping rule's own cost per epoch
    topo_sec = [float(h.get("seconds") or 0.0) for h in res.get("drift_history", [])]
    return {
        "prior": spec.prior,
        "target": spec.target,
        "seed": spec.seed,
        "run": spec.key.name,
        "method": spec.key.method,
        "strategy": spec.key.strategy,
        "budget": spec.key.budget,
        "recipe": spec.key.recipe,
        "lr": res["learning_rate"],
        "schedule": res.get("config", {}).get("lr_scheduler"),
        "selected": selected,
        "role": spec.role,
        "val_acc": res.get("val_accuracy"),
        "val_logloss": res.get("val_logloss"),
        "test_acc_before": res.get("test_accuracy_before"),  # the pretrained model's, on the same test rows
        "test_acc": res["test_accuracy"],  # the target's primary metric (named in "metric"), accuracy or another
        "metric": res.get("metric", "acc"),
        "train_acc": res["train_accuracy"],
        "gap": res["train_test_gap"],
        "ood_acc_before": res["ood_accuracy_before"],
        "ood_acc_after": res["ood_accuracy_after"],
        "ppl_before": res["perplexity_before"],
        "ppl_after": res["perplexity_after"],
        "trainable_pct": 100 * res["trainable_fraction"],
        "epochs_run": res["epochs_run"],
        "stop_epoch": stop_epoch,
        "acc_at_stop": epoch_acc[stop_epoch - 1] if stop_epoch and len(epoch_acc) >= stop_epoch else None,
        "train_sec_to_stop": sum(res["epoch_seconds"][:stop_epoch]) + sum(topo_sec[:stop_epoch])
        if stop_epoch
        else None,
        "topo_sec_per_epoch": sum(topo_sec) / len(topo_sec) if topo_sec else None,
        "drift_minus_lr_ratio": drift_minus_lr_ratio(res),
        "sec_per_epoch": res["seconds_per_epoch"],
        "train_sec": res["train_seconds"],
        "wall_sec": res.get("wall_seconds"),
        "peak_rss_mib": res.get("peak_rss_mib"),
        "rss_increase_mib": res.get("rss_increase_mib"),
        "machine": res.get("machine"),  # where it was timed (runs of earlier versions: not recorded)
        "run_dir": str(run_dir),
    }
