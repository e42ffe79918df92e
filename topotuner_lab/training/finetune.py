"""One entry point for full fine-tuning, LoRA (peft) and TopoTuner profile fine-tuning, on HF ``Trainer``.

Every run writes ``results.json`` (atomically) with accuracy, the train-test gap, forgetting
(out-of-domain accuracy and held-out perplexity before/after), trainable parameters, time per
epoch, peak memory and the seeds. Checkpoints are saved each epoch, so a stopped run resumes.
"""

from __future__ import annotations

import copy
import json
import os
import threading
import time
import weakref
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import DataCollatorForSeq2Seq, Trainer, TrainerCallback, TrainingArguments

from topotuner_lab._io import atomic
from topotuner_lab._io.errors import InputFileError, ParameterError, ProfileError
from topotuner_lab.profiles.apply import apply_profile
from topotuner_lab.profiles.card import ProfileCard
from topotuner_lab.tasks.specs import TASKS, get_task, load_task
from topotuner_lab.training.early_stopping import TopologicalEarlyStopping
from topotuner_lab.training.evaluation import classification_correct, encode, gsm8k_correct, perplexity
from topotuner_lab.weights.extract import extract_snapshot
from topotuner_lab.weights.models import LoadedModel
from topotuner_lab.weights.projections import count_parameters, enumerate_projections
from topotuner_lab.weights.snapshot import save_snapshot

METHODS: tuple[str, ...] = ("full", "lora", "profile")
DEFAULT_LR = {"full": 3e-5, "lora": 3e-4, "profile": 2e-4}  # untuned defaults, recorded in results
OOD_TASK = {"sst2": "agnews", "agnews": "sst2", "gsm8k": "sst2"}
EVAL_SEED = 0  # which test / out-of-domain / perplexity examples are drawn: fixed, so runs are paired


def _opt(default: Any, help: str, **extra: Any) -> Any:
    """A config field with the help text the CLI shows for it (``metadata["help"]``)."""
    return field(default=default, metadata={"help": help, **extra})


LR_SCHEDULERS: tuple[str, ...] = ("linear", "constant", "cosine")


@dataclass
class FinetuneConfig:
    """What to train and how; recorded verbatim in the results. The CLI's ``finetune`` options are these fields."""

    method: str = _opt("full", "full fine-tuning, LoRA (peft) or a profile card", choices=METHODS)
    task: str = _opt("sst2", "task to train and test on", choices=tuple(TASKS))
    output_dir: str = _opt("runs/finetune", "run folder: results.json, checkpoints while training")
    profile: str | None = _opt(
        None, "profile card .json (method 'profile'; LoRA 'match' and 'card' thresholds read it)"
    )
    lora_rank: int | str = _opt(
        8, "LoRA rank: an integer >= 1, or 'match' for the rank whose parameter count matches the card"
    )
    epochs: int = _opt(3, "epoch budget")
    n_train: int = _opt(128, "training examples drawn")
    n_val: int = _opt(0, "validation examples carved from the training data (never the test set); 0: none")
    n_test: int = _opt(128, "test examples drawn")
    n_ood: int = _opt(64, "out-of-domain examples (the other task) for forgetting")
    n_ppl: int = _opt(32, "held-out GSM8K texts for perplexity before/after")
    batch_size: int = _opt(8, "training batch size")
    max_length: int = _opt(64, "tokens per example (prompt + target)")
    learning_rate: float | None = _opt(None, "peak learning rate (default per method, see DEFAULT_LR)")
    lr_scheduler: str = _opt("linear", "learning-rate schedule over the epoch budget", choices=LR_SCHEDULERS)
    seed: int = _opt(0, "training seed")
    data_seed: int = _opt(0, "which rows are drawn and their order")
    stop_threshold: float | str | None = _opt(
        None, "topological early stopping: normalized drift in (0, 1), or 'card' for the card's own"
    )
    observe_only: bool = _opt(False, "record the stop epoch but train the full budget")
    eval_each_epoch: bool = _opt(False, "test accuracy after every epoch")
    save_checkpoints: bool = _opt(True, "checkpoint each epoch (only the last is kept), so a stopped run resumes")
    keep_checkpoints: bool = _opt(False, "keep the last checkpoint after a finished run (default: removed)")
    save_snapshot: bool = _opt(False, "write the fine-tuned attention matrices (after.safetensors)")
    data_source: str | None = _opt(
        None, "'hub' for the Hugging Face hub, or a data folder laid out like shared/data (default: offline copies)"
    )

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ParameterError(f"unknown method {self.method!r}", f"use one of {', '.join(METHODS)}")
        if self.method == "profile" and not self.profile:
            raise ParameterError("method 'profile' needs a profile card", "pass --profile card.json")
        if self.stop_threshold == "card" and not self.profile:
            raise ParameterError(
                "stop_threshold='card' needs a profile card to read it from",
                "pass --profile card.json or a number such as 0.5",
            )
        if isinstance(self.stop_threshold, str) and self.stop_threshold != "card":
            raise ParameterError(
                f"stop_threshold={self.stop_threshold!r} is neither a number nor 'card'",
                "pass a number in (0, 1) such as 0.5, or 'card'",
            )
        if self.lora_rank == "match" and not self.profile:
            raise ParameterError(
                "lora_rank='match' needs a profile card to match", "pass --profile card.json or an integer rank"
            )
        get_task(self.task)
        for name in ("epochs", "n_train", "n_test", "n_ood", "n_ppl", "batch_size", "max_length"):
            if (
                not isinstance(getattr(self, name), int)
                or isinstance(getattr(self, name), bool)
                or getattr(self, name) < 1
            ):
                raise ParameterError(
                    f"{name}={getattr(self, name)!r} must be a positive integer", f"give {name} as a whole number >= 1"
                )
        for name in ("seed", "data_seed", "n_val"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ParameterError(
                    f"{name}={getattr(self, name)!r} must be a non-negative integer",
                    f"give {name} as a whole number >= 0",
                )
        if self.lora_rank != "match" and (
            not isinstance(self.lora_rank, int) or isinstance(self.lora_rank, bool) or self.lora_rank < 1
        ):
            raise ParameterError(
                f"lora_rank={self.lora_rank!r} is neither a positive integer nor 'match'",
                "pass e.g. --lora-rank 8 or --lora-rank match",
            )
        if self.learning_rate is not None and not (
            isinstance(self.learning_rate, (int, float)) and 0 < self.learning_rate < 1
        ):
            raise ParameterError(
                f"learning_rate={self.learning_rate!r} is not a number in (0, 1)", "pass e.g. --lr 1e-4"
            )
        if self.lr_scheduler not in LR_SCHEDULERS:
            raise ParameterError(
                f"unknown lr_scheduler {self.lr_scheduler!r}", f"use one of {', '.join(LR_SCHEDULERS)}"
            )
        if isinstance(self.stop_threshold, (int, float)) and not 0 < self.stop_threshold < 1:
            raise ParameterError(
                f"stop_threshold={self.stop_threshold!r} is not in (0, 1)",
                "normalized drift starts at 1.0; use e.g. 0.5",
            )
        if self.data_source not in (None, "hub") and not Path(self.data_source).is_dir():
            raise ParameterError(
                f"data_source {self.data_source!r} is neither 'hub' nor a data folder",
                "pass --data-source hub, or a folder holding sst2/, agnews/, gsm8k/ like shared/data",
            )


class PeakMemory:
    """Peak resident memory above the starting level, sampled every 20 ms in a thread (CPU);
    on CUDA, torch's own peak counter."""

    def __init__(self) -> None:
        import psutil

        self._proc = psutil.Process()
        self._stop = threading.Event()
        self.base = self._proc.memory_info().rss
        self.peak = self.base
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __enter__(self) -> PeakMemory:
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak_mib(self) -> float:
        if torch.cuda.is_available():
            return torch.cuda.max_memory_allocated() / 2**20
        return (self.peak - self.base) / 2**20


def _epoch(state: Any) -> int:
    return int(round(state.epoch or 0))


class EpochClock(TrainerCallback):
    """Seconds per epoch (checkpoint saving, which happens after the epoch ends, excluded).

    Logged into ``state.log_history``, which checkpoints carry, so a resumed run keeps earlier epochs.
    """

    def on_epoch_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_epoch_end(self, args, state, control, **kwargs):
        state.log_history.append({"epoch": _epoch(state), "epoch_seconds": time.perf_counter() - self._start})


class EpochEvaluation(TrainerCallback):
    """Test accuracy after every epoch (to see what a longer or shorter budget gives), logged like EpochClock."""

    def __init__(self, score) -> None:
        self.score = score

    def on_epoch_end(self, args, state, control, model=None, **kwargs):
        state.log_history.append({"epoch": _epoch(state), "test_accuracy": _accuracy(self.score(model))})
        model.train()


def per_epoch(log_history: list[dict[str, Any]], key: str) -> list[float]:
    """The values of ``key`` logged once per epoch, in epoch order."""
    return [h[key] for h in sorted((h for h in log_history if key in h), key=lambda h: h["epoch"])]


def tokenize_for_training(tokenizer: Any, dataset: Any, max_length: int) -> Any:
    """input_ids = prompt + target (+ eos); loss only on the target tokens."""

    def one(row: dict[str, Any]) -> dict[str, Any]:
        prompt, target = encode(tokenizer, row["prompt"], row["target"], max_length - 1)
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        ids = prompt + target + eos
        return {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": [-100] * len(prompt) + target + eos}

    return dataset.map(one, remove_columns=dataset.column_names)


def lora_rank_for(model: torch.nn.Module, n_params: int) -> int:
    """LoRA rank on all q/k/v/o whose trainable parameter count is closest to ``n_params``."""
    per_rank = sum(sum(p.matrix(model).shape) for p in enumerate_projections(model))
    return max(1, round(n_params / per_rank))


def prepare_model(
    loaded: LoadedModel, cfg: FinetuneConfig, card: ProfileCard | None
) -> tuple[torch.nn.Module, dict[str, Any]]:
    """A trainable copy of the model for the method, and what was set up."""
    model = copy.deepcopy(loaded.model)
    info: dict[str, Any] = {}
    if cfg.method == "full":
        for p in model.parameters():
            p.requires_grad_(True)
    elif cfg.method == "profile":
        info["trainable_param_names"] = apply_profile(model, card)
        info["profile"] = {"strategy": card.strategy, "prior_task": card.prior_task, "trainable": card.trainable}
    else:
        from peft import LoraConfig, get_peft_model

        rank = lora_rank_for(model, card.trainable_params) if cfg.lora_rank == "match" else int(cfg.lora_rank)
        names = sorted({p.param_name.rsplit(".", 2)[-2] for p in enumerate_projections(model)})
        model = get_peft_model(
            model,
            LoraConfig(
                r=rank,
                lora_alpha=2 * rank,
                lora_dropout=0.0,
                target_modules=names,
                fan_in_fan_out=loaded.model.config.model_type == "gpt2",
            ),
        )
        info["lora_rank"] = rank
    return model, info


def _scorer(task: str, tokenizer: Any, max_length: int):
    """``score(model, dataset)`` -> per-example correctness (a boolean array)."""
    spec = get_task(task)
    if spec.kind == "classification":
        return lambda model, ds: classification_correct(model, tokenizer, ds, spec.labels, max_length=max_length)
    return lambda model, ds: gsm8k_correct(model, tokenizer, ds, max_length=max_length)


def _accuracy(correct: Any) -> float:
    return float(correct.mean()) if len(correct) else float("nan")


def stop_threshold_for(cfg: FinetuneConfig, card: ProfileCard | None) -> float | None:
    """The early-stopping threshold to use: the config's number, or the card's when it says "card"."""
    if cfg.stop_threshold != "card":
        return cfg.stop_threshold
    if card is None or card.stop_threshold is None:
        raise ProfileError(
            f"profile card {cfg.profile} records no stopping threshold",
            "rebuild it with `topotuner-lab profile ... --stop-threshold 0.5`, or pass a number instead of 'card'",
        )
    return card.stop_threshold


def _last_checkpoint(output_dir: Path) -> str | None:
    checkpoints = sorted(output_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    return str(checkpoints[-1]) if checkpoints else None


TRAINABLE_WEIGHTS = "trainable.safetensors"


class TrainableOnlyTrainer(Trainer):
    """A ``Trainer`` whose checkpoints hold only the parameters that train (and their optimizer state).

    A profile run trains ~1% of the model; saving the whole model every epoch would cost the full
    model's size per checkpoint. Resuming loads the trainable tensors onto the same pretrained model.
    """

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        from safetensors.torch import save_file

        if not self.args.should_save:  # one writer under DDP
            return
        out = Path(output_dir or self.args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        trainable = {n: p.detach().contiguous().cpu() for n, p in self.model.named_parameters() if p.requires_grad}
        save_file(trainable, str(out / TRAINABLE_WEIGHTS), metadata={"format": "pt"})

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: torch.nn.Module | None = None) -> None:
        from safetensors.torch import load_file

        path = Path(resume_from_checkpoint) / TRAINABLE_WEIGHTS
        if not path.is_file():
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        target = model or self.model
        missing = set(load_file(str(path))) - {n for n, _ in target.named_parameters()}
        if missing:
            raise ParameterError(
                f"checkpoint {resume_from_checkpoint} holds parameters {sorted(missing)[:3]} this model lacks",
                "resume with the same model and card, or delete the run folder to start over",
            )
        target.load_state_dict(load_file(str(path)), strict=False)


@dataclass
class RunData:
    """The examples one fine-tune uses; validation is carved from the training split, never from test."""

    train: Any
    val: Any | None
    test: Any
    ood_task: str
    ood: Any
    general_text: list[str]


def load_run_data(cfg: FinetuneConfig) -> RunData:
    """Draw the training, validation, test, out-of-domain and perplexity examples of ``cfg``."""
    drawn = load_task(cfg.task, "train", cfg.n_train + cfg.n_val, cfg.data_seed, cfg.data_source)
    if cfg.n_val and len(drawn) <= cfg.n_val:
        raise ParameterError(
            f"n_val={cfg.n_val} leaves no training examples ({len(drawn)} drawn)", "lower --n-val or raise --n-train"
        )
    val = drawn.select(range(cfg.n_val)) if cfg.n_val else None
    train = drawn.select(range(cfg.n_val, len(drawn))) if cfg.n_val else drawn
    # evaluation draws do not depend on the seed: every method and seed is scored on the same examples (paired)
    test = load_task(cfg.task, "test", cfg.n_test, EVAL_SEED, cfg.data_source)
    ood_task = OOD_TASK[cfg.task]
    ood = load_task(ood_task, "test", cfg.n_ood, EVAL_SEED, cfg.data_source)
    general = load_task("gsm8k", "test", cfg.n_ppl, EVAL_SEED, cfg.data_source)
    return RunData(train, val, test, ood_task, ood, [p + t for p, t in zip(general["prompt"], general["target"])])


def build_trainer(
    model: torch.nn.Module, tokenizer: Any, cfg: FinetuneConfig, data: RunData, callbacks: list[TrainerCallback]
) -> Trainer:
    """An HF ``Trainer`` for ``cfg``: weight decay 0 (frozen rows of fused matrices never move), one kept checkpoint
    per epoch, the terminal progress bar HF shows; profile runs checkpoint only their trainable tensors."""
    args = TrainingArguments(
        output_dir=cfg.output_dir,
        num_train_epochs=cfg.epochs,
        per_device_train_batch_size=cfg.batch_size,
        learning_rate=cfg.learning_rate or DEFAULT_LR[cfg.method],
        weight_decay=0.0,
        lr_scheduler_type=cfg.lr_scheduler,
        logging_strategy="epoch",
        save_strategy="epoch" if cfg.save_checkpoints else "no",
        save_total_limit=1,
        save_only_model=False,
        restore_callback_states_from_checkpoint=True,
        report_to=[],
        seed=cfg.seed,
        data_seed=cfg.data_seed,
        disable_tqdm=False,
        dataloader_num_workers=0,
        dataloader_pin_memory=torch.cuda.is_available(),
        ddp_find_unused_parameters=False,
        use_cpu=not (
            torch.cuda.is_available() or torch.backends.mps.is_available()
        ),  # CPU-only: several processes run DDP over gloo
    )
    trainer_class = TrainableOnlyTrainer if cfg.method == "profile" else Trainer
    return trainer_class(
        model=model,
        args=args,
        train_dataset=tokenize_for_training(tokenizer, data.train, cfg.max_length),
        data_collator=DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100),
        callbacks=callbacks,
    )


def _callbacks(
    cfg: FinetuneConfig, card: ProfileCard | None, score: Any, test: Any
) -> tuple[list[TrainerCallback], float | None]:
    callbacks: list[TrainerCallback] = [EpochClock()]
    threshold = stop_threshold_for(cfg, card)
    if threshold is not None:
        callbacks.append(
            TopologicalEarlyStopping(
                threshold, pids=card.trainable if cfg.method == "profile" else None, observe_only=cfg.observe_only
            )
        )
    if cfg.eval_each_epoch:
        callbacks.append(EpochEvaluation(lambda m: score(m, test)))
    return callbacks, threshold


def collect_results(
    trainer: Trainer,
    cfg: FinetuneConfig,
    loaded: LoadedModel,
    data: RunData,
    score: Any,
    score_ood: Any,
    before: dict[str, float],
) -> dict[str, Any]:
    """Accuracy (train, validation, test), forgetting, time and the early-stopping record of a finished run."""
    model, tokenizer = trainer.model, loaded.tokenizer
    model.eval()
    history = trainer.state.log_history
    epoch_seconds = per_epoch(history, "epoch_seconds")
    test_correct, ood_correct = score(model, data.test), score_ood(model, data.ood)
    stopper = next((c for c in trainer.callback_handler.callbacks if isinstance(c, TopologicalEarlyStopping)), None)
    total = count_parameters(loaded.model)
    trainable = count_parameters(model, trainable_only=True)
    results: dict[str, Any] = {
        "config": asdict(cfg),
        "model": {"name": loaded.name, "revision": loaded.revision, "total_params": total},
        "method": cfg.method,
        "task": cfg.task,
        "learning_rate": trainer.args.learning_rate,
        "trainable_params": trainable,
        "trainable_fraction": trainable / total,
        "epochs_run": len(epoch_seconds),
        "stop_epoch": stopper.stop_epoch if stopper else None,
        "drift_history": stopper.history if stopper else [],
        "log_history": [h for h in history if "loss" in h],
        "epoch_seconds": epoch_seconds,
        "train_seconds": sum(epoch_seconds),
        "seconds_per_epoch": sum(epoch_seconds) / max(1, len(epoch_seconds)),
        "train_accuracy": _accuracy(score(model, data.train.select(range(min(len(data.train), cfg.n_test))))),
        "val_accuracy": _accuracy(score(model, data.val)) if data.val is not None else None,
        "test_accuracy": _accuracy(test_correct),
        "test_correct": test_correct.astype(int).tolist(),  # per test example, for paired bootstrap intervals
        "epoch_test_accuracy": per_epoch(history, "test_accuracy"),
        "ood_task": data.ood_task,
        "ood_accuracy_before": before["ood_accuracy"],
        "ood_accuracy_after": _accuracy(ood_correct),
        "ood_correct_after": ood_correct.astype(int).tolist(),
        "perplexity_before": before["perplexity"],
        "perplexity_after": perplexity(model, tokenizer, data.general_text, max_length=cfg.max_length),
        "seeds": {"train": cfg.seed, "data": cfg.data_seed},
    }
    results["train_test_gap"] = results["train_accuracy"] - results["test_accuracy"]
    results["forgetting_ood"] = results["ood_accuracy_before"] - results["ood_accuracy_after"]
    results["perplexity_change"] = results["perplexity_after"] - results["perplexity_before"]
    return results


def _tidy_checkpoints(out: Path) -> None:
    import shutil

    for checkpoint in out.glob("checkpoint-*"):
        shutil.rmtree(checkpoint, ignore_errors=True)


#: the pretrained model's out-of-domain accuracy and perplexity, per model object and evaluation rows
_PRETRAINED_SCORES: weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple[Any, ...], dict[str, float]]] = (
    weakref.WeakKeyDictionary()
)


def _pretrained_scores(loaded: LoadedModel, cfg: FinetuneConfig, data: RunData, score_ood: Any) -> dict[str, float]:
    """Forgetting's reference point. The evaluation rows are fixed (``EVAL_SEED``) and ``loaded`` is never changed,
    so every run of a comparison shares it: computed once per process, not once per fine-tune."""
    key = (data.ood_task, cfg.n_ood, cfg.n_ppl, cfg.max_length, cfg.data_source)
    per_model = _PRETRAINED_SCORES.setdefault(loaded.model, {})
    if key not in per_model:
        per_model[key] = {
            "ood_accuracy": _accuracy(score_ood(loaded.model, data.ood)),
            "perplexity": perplexity(loaded.model, loaded.tokenizer, data.general_text, max_length=cfg.max_length),
        }
    return dict(per_model[key])


def run_finetune(loaded: LoadedModel, cfg: FinetuneConfig) -> dict[str, Any]:
    """Fine-tune ``loaded`` as ``cfg`` says and write ``results.json`` into ``cfg.output_dir``; returns the results.

    The input card is read, never rewritten: the task it was transferred to is recorded in the results
    (``transferred_to``), so several runs can share one card. A stopped run resumes from its last epoch
    checkpoint; a finished one removes its checkpoints unless ``keep_checkpoints``. Under ``accelerate launch``
    every process trains and scores, the first writes.

    Parameters
    ----------
    loaded : the pretrained model (``load_model``); it is copied, never changed.
    cfg : what to train; see :class:`FinetuneConfig` (``epochs``, example counts, ``learning_rate``...).

    Returns
    -------
    The results dict written to ``results.json``: accuracies (train, validation, test and per-example
    ``test_correct``), forgetting (out-of-domain accuracy and perplexity before/after), trainable parameters and
    fraction, seconds per epoch, peak memory, the early-stopping record, the config and seeds.
    """
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = loaded.tokenizer
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    card = ProfileCard.load(cfg.profile) if cfg.profile else None
    wall_start = time.perf_counter()
    data = load_run_data(cfg)
    score, score_ood = _scorer(cfg.task, tokenizer, cfg.max_length), _scorer(data.ood_task, tokenizer, cfg.max_length)
    before = _pretrained_scores(loaded, cfg, data, score_ood)
    model, info = prepare_model(loaded, cfg, card)
    callbacks, threshold = _callbacks(cfg, card, score, data.test)
    trainer = build_trainer(model, tokenizer, cfg, data, callbacks)
    resume = _last_checkpoint(out) if cfg.save_checkpoints else None
    with PeakMemory() as memory:
        trainer.train(resume_from_checkpoint=resume)
    results = collect_results(trainer, cfg, loaded, data, score, score_ood, before)
    results.update(
        info,
        resumed_from=resume,
        stop_threshold=threshold,
        peak_memory_mib=memory.peak_mib,
        transferred_to={"card": cfg.profile, "prior_task": card.prior_task, "task": cfg.task}
        if card is not None
        else None,
    )
    results["world_size"] = trainer.args.world_size
    if not trainer.is_world_process_zero():  # under DDP (accelerate launch) every rank trains and scores; one writes
        return results
    if cfg.save_snapshot:
        merged = model.merge_and_unload() if cfg.method == "lora" else model
        snap = extract_snapshot(merged, name=f"{loaded.name}@{cfg.task}-{cfg.method}", base_model=loaded.name)
        results["snapshot"] = str(save_snapshot(snap, out / "after.safetensors"))
    results["wall_seconds"] = time.perf_counter() - wall_start
    atomic.write_json(out / "results.json", results)
    if not cfg.keep_checkpoints:
        _tidy_checkpoints(out)
    return results


def load_results(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A run's ``results.json``; a missing or damaged file is a clear error (rerun the step)."""
    path = Path(path)
    try:
        results = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise InputFileError(
            f"results file {path} is missing or damaged ({exc.__class__.__name__})",
            f"delete {path.parent} and run the fine-tune again",
        ) from exc
    if not isinstance(results, dict) or "test_accuracy" not in results:
        raise InputFileError(
            f"results file {path} is not a fine-tune's results", f"delete {path.parent} and run the fine-tune again"
        )
    return results
