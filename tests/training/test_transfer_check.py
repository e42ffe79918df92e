"""The transfer check: per-matrix gradient agreement of a card's prior and a target task at the pretrained weights."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from topotuner_lab._io.errors import ProfileError
from topotuner_lab.cli import main
from topotuner_lab.drift.cache import DriftCache
from topotuner_lab.drift.compute import drift_table
from topotuner_lab.drift.settings import DriftSettings
from topotuner_lab.profiles.card import ModelIdentity
from topotuner_lab.profiles.select import CardSettings, build_profile
from topotuner_lab.tasks.loading import load_task
from topotuner_lab.training.transfer import (
    TransferCheckSettings,
    compare_gradients,
    projection_gradients,
    transfer_check,
)
from topotuner_lab.weights.extract import extract_snapshot
from topotuner_lab.weights.models import build_tiny_model
from topotuner_lab.weights.snapshot import perturb_snapshot

SMALL = TransferCheckSettings(n_rows=8, max_length=32, batch_size=4)


@pytest.fixture
def card(tiny_llama):
    pre = extract_snapshot(tiny_llama)
    table = drift_table(pre, perturb_snapshot(pre, 0.05), DriftSettings(maxdim=0), n_jobs=1, cache=DriftCache(None))
    return build_profile(table, ModelIdentity.from_snapshot(pre), CardSettings(prior_task="sst2", count=3))


def test_a_task_against_itself_agrees_fully_and_another_task_less(tiny_llama, card):
    same = transfer_check(tiny_llama, card, "sst2", SMALL)
    assert np.allclose(same.table["cosine"], 1.0) and same.close and "likely transfers" in same.verdict
    other = transfer_check(tiny_llama, card, "agnews", SMALL)
    assert (other.table["cosine"] < 0.999).all() and other.median_cosine_all < 0.999
    assert set(other.table.loc[other.table["in_card"], "pid"]) == set(card.trainable)
    assert 0 <= other.overlap <= 1 and -1 <= other.rank_agreement <= 1


def test_gradients_equal_one_backward_pass_over_all_rows(tiny_llama):
    from transformers import DataCollatorForSeq2Seq

    from topotuner_lab.training.trainer import tokenize_for_training

    batched = projection_gradients(tiny_llama, "sst2", SMALL)
    rows = tokenize_for_training(tiny_llama.tokenizer, load_task("sst2", "train", 8, 0), 32)
    batch = DataCollatorForSeq2Seq(tiny_llama.tokenizer, padding=True, label_pad_token_id=-100)(list(rows))
    model = build_tiny_model("tiny-llama").model  # the same weights, fresh
    model(**batch).loss.backward()
    direct = model.get_parameter("model.layers.1.self_attn.v_proj.weight").grad.numpy()
    # batches of 4 weighted by rows, against one pass over 8 padded rows: equal up to how padding splits tokens
    assert np.corrcoef(batched["L1.v"].ravel(), direct.ravel())[0, 1] > 0.99


def test_the_model_is_not_changed(tiny_llama, card):
    before = {n: p.detach().clone() for n, p in tiny_llama.model.named_parameters()}
    transfer_check(tiny_llama, card, "agnews", SMALL)
    after = dict(tiny_llama.model.named_parameters())
    assert all(torch.equal(before[n], after[n]) and after[n].grad is None for n in before)


def test_a_card_of_another_model_is_refused(card):
    with pytest.raises(ProfileError, match="projections differ|built for weights"):
        transfer_check(build_tiny_model("tiny-qwen2"), card, "agnews", SMALL)


def test_transfer_check_from_the_command_line(tmp_path, card, capsys, monkeypatch):
    import topotuner_lab.weights.models as models

    monkeypatch.setattr(models, "load_model", lambda spec=None, **kw: build_tiny_model("tiny-llama"))
    card.save(tmp_path / "card.json")
    argv = ["transfer-check", str(tmp_path / "card.json"), "--task", "agnews", "--n-rows", "8", "--max-length", "32"]
    assert main([*argv, "-o", str(tmp_path / "check.csv")]) == 0
    out = capsys.readouterr().out
    assert "sst2 -> agnews:" in out and "L1.v" in out and (tmp_path / "check.csv").is_file()
    assert main([*argv[:2], "--task", "yelp"]) == 2 and "unknown task 'yelp'" in capsys.readouterr().err


def test_the_gradient_selector_ranks_by_the_target_tasks_gradient_magnitude(tiny_llama):
    from topotuner_lab.training.transfer import gradient_signal, with_gradient_signal

    pre = extract_snapshot(tiny_llama)
    table = drift_table(pre, perturb_snapshot(pre, 0.05), DriftSettings(maxdim=0), n_jobs=1, cache=DriftCache(None))
    joined = with_gradient_signal(table, tiny_llama, "agnews", SMALL)
    gradients = projection_gradients(tiny_llama, "agnews", SMALL)
    rms = {pid: float(np.sqrt(np.mean(np.square(g, dtype=np.float64)))) for pid, g in gradients.items()}
    assert np.allclose(joined.set_index("pid")["grad_norm"], pd.Series(rms)[table["pid"]])
    assert joined.attrs == {**table.attrs, "gradient_task": "agnews"} and "gradient_task" not in table.attrs
    card = build_profile(
        joined, ModelIdentity.from_snapshot(pre), CardSettings(prior_task="sst2", strategy="gradient", count=3)
    )
    by_gradient = sorted(rms, key=rms.__getitem__, reverse=True)
    assert [r["pid"] for r in card.ranking] == by_gradient and set(card.trainable) == set(by_gradient[:3])
    assert card.gradient_task == "agnews" and card.prior_task == "sst2" and card.metric == "grad_norm"
    # the transfer check's target gradient magnitude is the same column
    check = compare_gradients(card, gradients, gradients, "agnews")
    assert np.allclose(check.table.set_index("pid")["grad_target"], pd.Series(rms))
    again = with_gradient_signal(joined, tiny_llama, "sst2", SMALL)  # another task replaces the column and the task
    assert again.attrs["gradient_task"] == "sst2" and list(again.columns) == list(joined.columns)
    assert np.allclose(
        again["grad_norm"], gradient_signal(tiny_llama, "sst2", SMALL).set_index("pid")["grad_norm"][joined["pid"]]
    )
    other = table.copy()
    other.attrs["before_hash"] = "0" * 64
    with pytest.raises(ProfileError, match="computed from weights 000000000000"):
        with_gradient_signal(other, tiny_llama, "agnews", SMALL)


def test_a_gradient_card_from_the_command_line(tmp_path, tiny_llama, monkeypatch, capsys):
    import topotuner_lab.weights.models as models
    from topotuner_lab.drift.tables import save_table
    from topotuner_lab.profiles.card import ProfileCard
    from topotuner_lab.weights.snapshot import save_snapshot

    monkeypatch.setattr(models, "load_model", lambda spec=None, **kw: build_tiny_model("tiny-llama"))
    pre = extract_snapshot(tiny_llama)
    save_table(drift_table(pre, perturb_snapshot(pre, 0.05), n_jobs=1, cache=DriftCache(None)), tmp_path / "t.parquet")
    save_snapshot(pre, tmp_path / "pre.safetensors")
    argv = ["profile", str(tmp_path / "t.parquet"), "--pretrained", str(tmp_path / "pre.safetensors")]
    argv += ["--prior-task", "sst2", "--count", "2", "-o", str(tmp_path / "g.json"), "--gradient-task", "agnews"]
    assert main([*argv, "--strategy", "gradient", "--model", "tiny-llama"]) == 0
    card = ProfileCard.load(tmp_path / "g.json")
    assert card.strategy == "gradient" and card.gradient_task == "agnews" and len(card.trainable) == 2
    assert main([*argv, "--strategy", "gradient"]) == 2 and "add --model" in capsys.readouterr().err
    assert main([*argv, "--model", "tiny-llama"]) == 2 and "add --strategy gradient" in capsys.readouterr().err
