"""The model and the HF ``Trainer`` of one fine-tune.

A trainable copy per method (full, LoRA, profile card), completion-only tokenization, checkpoints that hold only
what trains, and the precision and activation checkpointing a GPU run asks for.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, Literal, TypedDict

import torch
from transformers import DataCollatorForSeq2Seq, Trainer, TrainerCallback, TrainingArguments, set_seed

from topotuner_lab._io.errors import ParameterError
from topotuner_lab.profiles.apply import apply_profile, check_card_fits
from topotuner_lab.profiles.card import ProfileCard
from topotuner_lab.training.config import DEFAULT_LR, FinetuneConfig
from topotuner_lab.training.data import RunData
from topotuner_lab.training.evaluation import encode
from topotuner_lab.training.spectrum import SpectrumRecord, apply_spectrum
from topotuner_lab.weights.models import LoadedModel
from topotuner_lab.weights.projections import enumerate_projections, model_type


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


def max_lora_rank(model: torch.nn.Module) -> tuple[int, str]:
    """The largest useful LoRA rank on the model's projections: min(rows, cols) of the smallest, and that matrix.

    A rank above it adds parameters that cannot add to what the update can express (the update is at most that rank).
    """
    shapes = [(tuple(p.matrix(model).shape), p.pid) for p in enumerate_projections(model)]
    rank, pid, shape = min((min(shape), pid, shape) for shape, pid in shapes)
    return rank, f"{pid} is {shape[0]}x{shape[1]}"


def resolve_lora_rank(model: torch.nn.Module, cfg: FinetuneConfig, card: ProfileCard | None) -> int:
    """The LoRA rank of ``cfg`` on ``model`` (``"match"``: matched to the card), refused above the useful most."""
    if cfg.lora_rank == "match":
        assert card is not None, "FinetuneConfig.check: lora_rank='match' needs a card"
        rank = lora_rank_for(model, card.trainable_params)
    else:
        rank = int(cfg.lora_rank)
    most, smallest = max_lora_rank(model)
    if rank > most:
        asked = f"lora_rank={rank}" + (f" (matched to card {cfg.profile})" if cfg.lora_rank == "match" else "")
        raise ParameterError(
            f"{asked} exceeds the largest useful rank {most} of this model's attention projections ({smallest})",
            f"use --lora-rank {most} or less",
        )
    return rank


class ProfileRecord(TypedDict):
    """``results.json``'s ``profile``: the card a profile run trained, and what the card was checked by."""

    strategy: str
    prior_task: str
    trainable: list[str]
    checked_by: Literal["weights", "config"]


class MethodSetup(TypedDict, total=False):
    """What :func:`prepare_model` set up, as ``results.json`` records it: only the method's own fields are present.

    ``trainable_param_names`` for a profile card (with ``profile``) and Spectrum (with ``spectrum``), ``lora_rank``
    for LoRA; nothing for full fine-tuning.
    """

    trainable_param_names: list[str]
    profile: ProfileRecord
    spectrum: SpectrumRecord
    lora_rank: int


def prepare_model(
    loaded: LoadedModel, cfg: FinetuneConfig, card: ProfileCard | None
) -> tuple[torch.nn.Module, MethodSetup]:
    """A trainable copy of the model for the method, and what was set up.

    LoRA adapters are initialized right after seeding with ``cfg.seed``, so a resumed comparison rebuilds them
    bit-identically whatever ran earlier in the process.
    """
    model = copy.deepcopy(loaded.model)
    info: MethodSetup = {}
    if cfg.method == "full":
        for p in model.parameters():
            p.requires_grad_(True)
    elif cfg.method == "profile":
        assert card is not None, "FinetuneConfig.check: method 'profile' needs a card"
        checked = check_card_fits(card, model)  # its weight hash, or a config-only card's config shape
        info["trainable_param_names"] = apply_profile(model, card, check=False)
        info["profile"] = {
            "strategy": card.strategy,
            "prior_task": card.prior_task,
            "trainable": card.trainable,
            "checked_by": checked,
        }
    elif cfg.method == "spectrum-top5":
        info["trainable_param_names"], info["spectrum"] = apply_spectrum(model, loaded.model)
    else:
        from peft import LoraConfig, get_peft_model

        rank = resolve_lora_rank(model, cfg, card)
        names = sorted({p.param_name.rsplit(".", 2)[-2] for p in enumerate_projections(model)})
        set_seed(cfg.seed)  # the adapter's initialization follows the run's seed, not what ran before in the process
        model = get_peft_model(
            model,
            LoraConfig(
                r=rank,
                lora_alpha=2 * rank,
                lora_dropout=0.0,
                target_modules=names,
                fan_in_fan_out=model_type(loaded.model) == "gpt2",
            ),
        )
        info["lora_rank"] = rank
    return model, info


def last_checkpoint(output_dir: Path) -> str | None:
    """The highest-numbered ``checkpoint-N`` folder in ``output_dir``, or None (a run then starts afresh)."""
    checkpoints = sorted(output_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    return str(checkpoints[-1]) if checkpoints else None


TRAINABLE_WEIGHTS = "trainable.safetensors"
#: each training precision as accelerate names its mixed-precision mode
MIXED_PRECISION: dict[str, str] = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}


def check_precision(cfg: FinetuneConfig) -> None:
    """Refuse a precision this process would not train in, so a run never records one precision and trains in another.

    fp16 without CUDA: accelerate then trains in float32 without a word (measured on CPU with torch 2.13 and
    accelerate 1.16: the matrix products stay float32 and the loss equals fp32's). bf16 on a CUDA GPU without bfloat16
    (before Ampere). An ``accelerate launch --mixed_precision`` other than ``--precision``: under fp32 it would set the
    precision unrecorded.
    """
    cuda = torch.cuda.is_available()
    if cfg.precision == "fp16" and not cuda:
        raise ParameterError(
            "precision fp16 needs a CUDA GPU: without one, training would run in float32 while recording fp16",
            "use --precision bf16 (bfloat16 autocast runs on CPU) or --precision fp32, or run on a CUDA GPU",
        )
    if cfg.precision == "bf16" and cuda and not torch.cuda.is_bf16_supported():
        raise ParameterError(
            f"precision bf16 needs a GPU with bfloat16 (Ampere or newer); {torch.cuda.get_device_name(0)} has none",
            "use --precision fp16 (float16 with loss scaling) or --precision fp32",
        )
    launcher = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    if launcher not in ("no", MIXED_PRECISION[cfg.precision]):
        raise ParameterError(
            f"accelerate launch asks for mixed precision {launcher}, the fine-tune for --precision {cfg.precision}",
            f"give both the same (accelerate launch --mixed_precision {MIXED_PRECISION[cfg.precision]}), or launch "
            "with --mixed_precision no and choose with --precision",
        )


class TrainableOnlyTrainer(Trainer):
    """A ``Trainer`` whose checkpoints hold only the parameters that train (and their optimizer state).

    A profile run trains ~1% of the model; saving the whole model every epoch would cost the full
    model's size per checkpoint. Resuming loads the trainable tensors onto the same pretrained model.
    """

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        from safetensors.torch import save_file

        if not self.args.should_save:  # one writer under DDP
            return
        folder = output_dir or self.args.output_dir
        # TrainingArguments fills in a default output_dir; a Trainer is built with its model
        assert folder is not None and self.model is not None
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        trainable = {n: p.detach().contiguous().cpu() for n, p in self.model.named_parameters() if p.requires_grad}
        save_file(trainable, str(out / TRAINABLE_WEIGHTS), metadata={"format": "pt"})

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: torch.nn.Module | None = None) -> None:
        from safetensors.torch import load_file

        path = Path(resume_from_checkpoint) / TRAINABLE_WEIGHTS
        if not path.is_file():
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        target = model or self.model
        assert target is not None  # a Trainer is built with its model
        missing = set(load_file(str(path))) - {n for n, _ in target.named_parameters()}
        if missing:
            raise ParameterError(
                f"checkpoint {resume_from_checkpoint} holds parameters {sorted(missing)[:3]} this model lacks",
                "resume with the same model and card, or delete the run folder to start over",
            )
        target.load_state_dict(load_file(str(path)), strict=False)


def build_trainer(
    model: torch.nn.Module, tokenizer: Any, cfg: FinetuneConfig, data: RunData, callbacks: list[TrainerCallback]
) -> Trainer:
    """An HF ``Trainer`` for ``cfg``.

    Weight decay 0 (frozen rows of fused matrices never move), one kept checkpoint per epoch, the terminal progress
    bar HF shows; profile runs checkpoint only their trainable tensors. Mixed precision as ``cfg.precision`` says
    (refused where it would not run as asked: :func:`check_precision`). Activation checkpointing, when asked, is
    non-reentrant: a checkpointed layer then passes gradients to its trainable weights whether or not its inputs
    require grad (frozen embeddings: profile runs, LoRA); reentrant checkpointing passes none unless the input
    embeddings' output is made to require grad, which transformers (5.x) also does when it turns checkpointing on.
    """
    check_precision(cfg)
    args = TrainingArguments(
        output_dir=cfg.output_dir,
        num_train_epochs=cfg.epochs,
        per_device_train_batch_size=cfg.batch_size,
        learning_rate=cfg.learning_rate or DEFAULT_LR[cfg.method],
        weight_decay=0.0,
        lr_scheduler_type=cfg.lr_scheduler,
        bf16=cfg.precision == "bf16",
        fp16=cfg.precision == "fp16",
        activation_checkpointing=cfg.gradient_checkpointing,  # transformers 5's name for gradient checkpointing
        activation_checkpointing_kwargs={"use_reentrant": False} if cfg.gradient_checkpointing else None,
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
