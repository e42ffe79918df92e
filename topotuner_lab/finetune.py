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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import DataCollatorForSeq2Seq, Trainer, TrainerCallback, TrainingArguments

from . import atomic
from .early_stopping import TopologicalEarlyStopping
from .errors import ParameterError, ProfileError
from .evaluation import classification_accuracy, encode, gsm8k_exact_match, perplexity
from .models import LoadedModel
from .profiles import ProfileCard, apply_profile, trainable_parameter_count
from .projections import enumerate_projections
from .snapshot import extract_snapshot, save_snapshot
from .tasks import get_task, load_task

METHODS: tuple[str, ...] = ("full", "lora", "profile")
DEFAULT_LR = {"full": 3e-5, "lora": 3e-4, "profile": 2e-4}  # untuned defaults, recorded in results
OOD_TASK = {"sst2": "agnews", "agnews": "sst2", "gsm8k": "sst2"}


@dataclass
class FinetuneConfig:
    """What to train and how; recorded verbatim in the results."""

    method: str = "full"
    task: str = "sst2"
    output_dir: str = "runs/finetune"
    profile: str | None = None  # card path (method="profile")
    lora_rank: int | str = 8  # or "match": rank whose parameter count matches the profile card
    epochs: int = 3
    n_train: int = 128
    n_test: int = 128
    n_ood: int = 64
    n_ppl: int = 32
    batch_size: int = 8
    max_length: int = 64
    learning_rate: float | None = None  # None: DEFAULT_LR[method]
    lr_scheduler: str = "linear"  # decays to 0 over the epoch budget
    seed: int = 0  # training seed
    data_seed: int = 0  # which rows are drawn
    stop_threshold: float | str | None = None  # topological early stopping: a number, "card" (the card's own), None (off)
    observe_only: bool = False  # record the stop epoch but train the full budget
    eval_each_epoch: bool = False
    save_checkpoints: bool = True
    save_snapshot: bool = False  # write the fine-tuned attention matrices (after.safetensors)
    data_source: str | None = None  # None: offline copies; "hub": datasets hub

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ParameterError(f"unknown method {self.method!r}", f"use one of {', '.join(METHODS)}")
        if self.method == "profile" and not self.profile:
            raise ParameterError("method 'profile' needs a profile card", "pass --profile card.json")
        if self.stop_threshold == "card" and not self.profile:
            raise ParameterError("stop_threshold='card' needs a profile card to read it from", "pass --profile card.json or a number such as 0.5")
        if isinstance(self.stop_threshold, str) and self.stop_threshold != "card":
            raise ParameterError(f"stop_threshold={self.stop_threshold!r} is neither a number nor 'card'", "pass a number in (0, 1) such as 0.5, or 'card'")
        if self.lora_rank == "match" and not self.profile:
            raise ParameterError("lora_rank='match' needs a profile card to match", "pass --profile card.json or an integer rank")
        get_task(self.task)
        for name in ("epochs", "n_train", "n_test", "batch_size", "max_length"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ParameterError(f"{name}={getattr(self, name)!r} must be a positive integer", f"give {name} as a whole number >= 1")


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
        state.log_history.append({"epoch": _epoch(state), "test_accuracy": self.score(model)})
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


def prepare_model(loaded: LoadedModel, cfg: FinetuneConfig, card: ProfileCard | None) -> tuple[torch.nn.Module, dict[str, Any]]:
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
        model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=names, fan_in_fan_out=loaded.model.config.model_type == "gpt2"))
        info["lora_rank"] = rank
    return model, info


def _scorer(task: str, tokenizer: Any, max_length: int):
    spec = get_task(task)
    if spec.kind == "classification":
        return lambda model, ds: classification_accuracy(model, tokenizer, ds, spec.labels, max_length=max_length)
    return lambda model, ds: gsm8k_exact_match(model, tokenizer, ds, max_length=max_length)


def stop_threshold_for(cfg: FinetuneConfig, card: ProfileCard | None) -> float | None:
    """The early-stopping threshold to use: the config's number, or the card's when it says "card"."""
    if cfg.stop_threshold != "card":
        return cfg.stop_threshold
    if card is None or card.stop_threshold is None:
        raise ProfileError(f"profile card {cfg.profile} records no stopping threshold",
                           "rebuild it with `topotuner-lab profile ... --stop-threshold 0.5`, or pass a number instead of 'card'")
    return card.stop_threshold


def _last_checkpoint(output_dir: Path) -> str | None:
    checkpoints = sorted(output_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    return str(checkpoints[-1]) if checkpoints else None


def run_finetune(loaded: LoadedModel, cfg: FinetuneConfig) -> dict[str, Any]:
    """Fine-tune with ``cfg`` and write ``results.json`` into ``cfg.output_dir``; returns the results."""
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = loaded.tokenizer
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    card = ProfileCard.load(cfg.profile) if cfg.profile else None
    if card is not None and cfg.task not in card.transferred_to and cfg.task != card.prior_task:
        card.transferred_to.append(cfg.task)
    wall_start = time.perf_counter()

    train = load_task(cfg.task, "train", cfg.n_train, cfg.data_seed, cfg.data_source)
    test = load_task(cfg.task, "test", cfg.n_test, cfg.data_seed, cfg.data_source)
    ood_task = OOD_TASK[cfg.task]
    ood = load_task(ood_task, "test", cfg.n_ood, cfg.data_seed, cfg.data_source)
    general = load_task("gsm8k", "test", cfg.n_ppl, cfg.data_seed, cfg.data_source)
    general_text = [p + t for p, t in zip(general["prompt"], general["target"])]
    score, score_ood = _scorer(cfg.task, tokenizer, cfg.max_length), _scorer(ood_task, tokenizer, cfg.max_length)

    before = {"ood_accuracy": score_ood(loaded.model, ood), "perplexity": perplexity(loaded.model, tokenizer, general_text, max_length=cfg.max_length)}
    model, info = prepare_model(loaded, cfg, card)
    trainable = trainable_parameter_count(model)
    total = int(sum(p.numel() for p in loaded.model.parameters()))

    callbacks: list[TrainerCallback] = [EpochClock()]
    stopper = None
    threshold = stop_threshold_for(cfg, card)
    if threshold is not None:
        stopper = TopologicalEarlyStopping(threshold, pids=card.trainable if cfg.method == "profile" else None, observe_only=cfg.observe_only)
        callbacks.append(stopper)
    if cfg.eval_each_epoch:
        callbacks.append(EpochEvaluation(lambda m: score(m, test)))

    args = TrainingArguments(
        output_dir=str(out),
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
        disable_tqdm=True,
        dataloader_num_workers=0,
        dataloader_pin_memory=torch.cuda.is_available(),
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=tokenize_for_training(tokenizer, train, cfg.max_length),
        data_collator=DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100),
        callbacks=callbacks,
    )
    resume = _last_checkpoint(out) if cfg.save_checkpoints else None
    with PeakMemory() as memory:
        trainer.train(resume_from_checkpoint=resume)
    stopper = next((c for c in trainer.callback_handler.callbacks if isinstance(c, TopologicalEarlyStopping)), stopper)

    model.eval()
    history = trainer.state.log_history
    epoch_seconds = per_epoch(history, "epoch_seconds")
    results: dict[str, Any] = {
        "config": asdict(cfg),
        "model": {"name": loaded.name, "revision": loaded.revision, "total_params": total},
        "method": cfg.method,
        "task": cfg.task,
        "learning_rate": args.learning_rate,
        "trainable_params": trainable,
        "trainable_fraction": trainable / total,
        **info,
        "epochs_run": len(epoch_seconds),
        "resumed_from": resume,
        "stop_threshold": threshold,
        "stop_epoch": stopper.stop_epoch if stopper else None,
        "drift_history": stopper.history if stopper else [],
        "log_history": [h for h in history if "loss" in h],
        "epoch_seconds": epoch_seconds,
        "train_seconds": sum(epoch_seconds),
        "seconds_per_epoch": sum(epoch_seconds) / max(1, len(epoch_seconds)),
        "peak_memory_mib": memory.peak_mib,
        "train_accuracy": score(model, train.select(range(min(len(train), cfg.n_test)))),
        "test_accuracy": score(model, test),
        "epoch_test_accuracy": per_epoch(history, "test_accuracy"),
        "ood_task": ood_task,
        "ood_accuracy_before": before["ood_accuracy"],
        "ood_accuracy_after": score_ood(model, ood),
        "perplexity_before": before["perplexity"],
        "perplexity_after": perplexity(model, tokenizer, general_text, max_length=cfg.max_length),
        "seeds": {"train": cfg.seed, "data": cfg.data_seed},
    }
    results["train_test_gap"] = results["train_accuracy"] - results["test_accuracy"]
    results["forgetting_ood"] = results["ood_accuracy_before"] - results["ood_accuracy_after"]
    results["perplexity_change"] = results["perplexity_after"] - results["perplexity_before"]
    if cfg.save_snapshot:
        merged = model.merge_and_unload() if cfg.method == "lora" else model
        snap = extract_snapshot(merged, name=f"{loaded.name}@{cfg.task}-{cfg.method}", base_model=loaded.name)
        results["snapshot"] = str(save_snapshot(snap, out / "after.safetensors"))
    if card is not None and cfg.profile:
        card.save(cfg.profile)  # records the task it was transferred to
    results["wall_seconds"] = time.perf_counter() - wall_start
    atomic.write_json(out / "results.json", results)
    return results


def load_results(path: str | os.PathLike[str]) -> dict[str, Any]:
    return json.loads(Path(path).read_text())
