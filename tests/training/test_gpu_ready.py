"""GPU-ready fine-tunes, checked on the CPU: mixed precision as asked or refused, and activation checkpointing that
leaves a run with frozen embeddings and matrices (profile cards, LoRA) as it was."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from transformers import TrainerCallback

from topotuner_lab._io.errors import ParameterError
from topotuner_lab.cli import main
from topotuner_lab.drift.cache import DriftCache
from topotuner_lab.drift.compute import drift_table
from topotuner_lab.profiles.apply import identity_of
from topotuner_lab.profiles.card import ProfileCard
from topotuner_lab.profiles.select import CardSettings, build_profile
from topotuner_lab.training.config import FinetuneConfig
from topotuner_lab.training.data import load_run_data
from topotuner_lab.training.finetune import run_finetune
from topotuner_lab.training.trainer import build_trainer, check_precision, prepare_model
from topotuner_lab.weights.projections import enumerate_projections
from topotuner_lab.weights.snapshot import perturb_snapshot

TINY = dict(n_train=16, n_test=8, n_ood=8, n_ppl=2, batch_size=8, max_length=40, learning_rate=1e-3)
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a machine without CUDA refuses")


@pytest.fixture
def card(tiny_llama, tiny_snapshot, tmp_path) -> tuple[ProfileCard, str]:
    """A two-matrix card of tiny-llama (from a perturbed copy's drift) and its file."""
    table = drift_table(tiny_snapshot, perturb_snapshot(tiny_snapshot, 0.05), n_jobs=1, cache=DriftCache(None))
    built = build_profile(table, identity_of(tiny_llama.model, "tiny-llama"), CardSettings(prior_task="sst2", count=2))
    return built, str(built.save(tmp_path / "card.json"))


@NO_CUDA
def test_fp16_without_cuda_is_refused_naming_the_fix() -> None:
    # accelerate would train in float32 and the results would say fp16 (measured: same loss, float32 products)
    with pytest.raises(ParameterError, match="fp16 needs a CUDA GPU") as info:
        check_precision(FinetuneConfig(precision="fp16"))
    assert "--precision bf16" in info.value.fix
    check_precision(FinetuneConfig(precision="bf16"))  # bfloat16 autocast runs on a CPU


@NO_CUDA
def test_the_command_line_refuses_fp16_without_cuda_in_one_line(tmp_path, capsys) -> None:
    args = ["finetune", "--model", "tiny-llama", "--precision", "fp16", "-o", str(tmp_path / "run")]
    sizes = ["--n-train", "8", "--n-test", "4", "--n-ood", "4", "--n-ppl", "2", "--max-length", "32", "--epochs", "1"]
    assert main(args + sizes) == 2
    err = capsys.readouterr().err
    assert "fp16 needs a CUDA GPU" in err and "How to fix" in err and "Traceback" not in err
    assert not (tmp_path / "run" / "results.json").exists()


def test_a_launcher_precision_other_than_the_runs_is_refused(monkeypatch) -> None:
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")  # accelerate launch --mixed_precision bf16
    with pytest.raises(ParameterError, match="accelerate launch asks for mixed precision bf16") as info:
        check_precision(FinetuneConfig())  # fp32: the launcher would set bf16, unrecorded
    assert "--mixed_precision no" in info.value.fix
    check_precision(FinetuneConfig(precision="bf16"))
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")  # what accelerate launch sets by default
    check_precision(FinetuneConfig(precision="bf16"))


def _products(model: torch.nn.Module) -> set[torch.dtype]:
    """The dtypes the first query projection's outputs come out in, recorded from now on (copies record too)."""
    seen: set[torch.dtype] = set()
    model.model.layers[0].self_attn.q_proj.register_forward_hook(lambda m, i, out: seen.add(out.dtype))
    return seen


@pytest.mark.slow
def test_a_bf16_finetune_runs_on_cpu_and_records_its_precision(card, tmp_path) -> None:
    from topotuner_lab.weights.models import build_tiny_model

    _, card_file = card
    losses, products = {}, {}
    for precision in ("fp32", "bf16"):
        loaded = build_tiny_model("tiny-llama", seed=0)  # its own model: the hook below counts this run only
        products[precision] = _products(loaded.model)  # the trained copy (deepcopy) keeps the hook
        cfg = FinetuneConfig(
            method="profile",
            profile=card_file,
            task="sst2",
            precision=precision,
            output_dir=str(tmp_path / precision),
            epochs=1,
            save_checkpoints=False,
            **TINY,
        )
        res = run_finetune(loaded, cfg)
        on_disk = json.loads((tmp_path / precision / "results.json").read_text())
        assert on_disk["config"]["precision"] == precision and on_disk["epochs_run"] == 1
        losses[precision] = res.log_history[0]["loss"]
    assert products["fp32"] == {torch.float32}
    assert products["bf16"] == {torch.float32, torch.bfloat16}  # scored in float32, trained under bf16 autocast
    assert losses["bf16"] != losses["fp32"] and losses["bf16"] == pytest.approx(losses["fp32"], rel=0.02)


class FirstGradients(TrainerCallback):
    """The trainable parameters' gradients just before the first optimizer step."""

    def __init__(self) -> None:
        self.grads: dict[str, torch.Tensor] = {}

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if not self.grads:
            self.grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _train(loaded, cfg: FinetuneConfig, card: ProfileCard | None):
    model, _ = prepare_model(loaded, cfg, card)
    grads = FirstGradients()
    trainer = build_trainer(model, loaded.tokenizer, cfg, load_run_data(cfg), [grads])
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return model, grads.grads, losses


@pytest.mark.slow
@pytest.mark.parametrize("method", ["profile", "lora"])
def test_checkpointing_with_frozen_matrices_gives_the_same_loss_grads_and_weights(
    tiny_llama, card, tmp_path, method
) -> None:
    built, card_file = card
    runs = {}
    for checkpointing in (False, True):
        cfg = FinetuneConfig(
            method=method,
            profile=card_file,
            task="sst2",
            gradient_checkpointing=checkpointing,
            output_dir=str(tmp_path / str(checkpointing)),
            epochs=1,  # two steps of 8 rows
            save_checkpoints=False,
            **TINY,
        )
        runs[checkpointing] = _train(tiny_llama, cfg, built)
    (plain, plain_grads, plain_losses), (ckpt, ckpt_grads, ckpt_losses) = runs[False], runs[True]

    layers = [m for m in ckpt.modules() if type(m).__name__ == "LlamaDecoderLayer"]
    assert layers and all(m.gradient_checkpointing for m in layers)  # checkpointing was on, non-reentrant
    assert all(m._gradient_checkpointing_func.keywords == {"use_reentrant": False} for m in layers)
    assert not any(m.gradient_checkpointing for m in plain.modules() if type(m).__name__ == "LlamaDecoderLayer")
    assert not ckpt.get_input_embeddings().weight.requires_grad  # the embeddings stayed frozen

    assert sorted(ckpt_grads) == sorted(plain_grads)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(ckpt_grads[name], grad, rtol=1e-5, atol=1e-7)
    # every card matrix gets a gradient; LoRA's B (A's gradient is 0 while B starts at 0)
    moved = {name for name, grad in plain_grads.items() if grad.abs().sum() > 0}
    assert moved == {n for n in plain_grads if method == "profile" or "lora_B" in n} and moved
    assert len(ckpt_losses) == len(plain_losses) == 1
    assert ckpt_losses == pytest.approx(plain_losses, rel=1e-5)

    pretrained = dict(tiny_llama.model.named_parameters())
    after = dict(ckpt.named_parameters())
    for name, param in plain.named_parameters():
        torch.testing.assert_close(after[name], param, rtol=1e-5, atol=1e-6)
    if method == "profile":  # only the card's matrices moved
        changed = {n for n, p in after.items() if not torch.equal(p, pretrained[n])}
        card_params = {p.param_name for p in enumerate_projections(tiny_llama.model) if p.pid in built.trainable}
        assert changed == card_params and len(card_params) == len(built.trainable)
