import json
from dataclasses import replace

import numpy as np
import pytest

from topotuner_lab._io.errors import ParameterError, ProfileError, TaskError
from topotuner_lab.profiles.card import ProfileCard
from topotuner_lab.training.callbacks import per_epoch
from topotuner_lab.training.config import FinetuneConfig
from topotuner_lab.training.evaluation import PerplexityProbe
from topotuner_lab.training.finetune import run_finetune
from topotuner_lab.training.recipe import stop_threshold_for
from topotuner_lab.training.trainer import lora_rank_for
from topotuner_lab.weights.extract import extract_snapshot
from topotuner_lab.weights.snapshot import load_snapshot

TINY = dict(n_train=16, n_test=8, n_ood=8, n_ppl=2, batch_size=8, max_length=40, learning_rate=1e-3)


@pytest.mark.slow
def test_full_finetune_writes_results_and_snapshot(tiny_llama, tmp_path):
    res = run_finetune(
        tiny_llama,
        FinetuneConfig(
            method="full", task="sst2", output_dir=str(tmp_path / "run"), epochs=2, save_snapshot=True, **TINY
        ),
    )
    on_disk = json.loads((tmp_path / "run" / "results.json").read_text())
    for key in (
        "train_accuracy",
        "test_accuracy",
        "train_test_gap",
        "ood_accuracy_before",
        "ood_accuracy_after",
        "perplexity_before",
        "perplexity_after",
        "trainable_params",
        "epoch_seconds",
        "train_seconds",
        "peak_rss_mib",
        "rss_increase_mib",
        "seeds",
    ):
        assert key in on_disk, key
    assert res.epochs_run == 2 and len(res.epoch_seconds) == 2
    assert res.trainable_fraction == 1.0
    assert on_disk["machine"].endswith(", no GPU") and "CPU cores" in on_disk["machine"]  # where it was timed
    after = load_snapshot(res.snapshot)
    assert after.base_model == "tiny-llama"
    assert after.weights_hash != extract_snapshot(tiny_llama).weights_hash
    # the caller's model is left untouched
    assert (
        extract_snapshot(tiny_llama).weights_hash == extract_snapshot(tiny_llama.model, name="tiny-llama").weights_hash
    )


@pytest.mark.slow
def test_profile_finetune_trains_only_the_card(tiny_llama, card_path, tmp_path):
    pre = extract_snapshot(tiny_llama)
    card_bytes = card_path.read_bytes()
    res = run_finetune(
        tiny_llama,
        FinetuneConfig(
            method="profile",
            profile=str(card_path),
            task="agnews",
            output_dir=str(tmp_path / "p"),
            epochs=1,
            save_snapshot=True,
            **TINY,
        ),
    )
    card = json.loads(card_path.read_text())
    assert res.trainable_params == card["trainable_params"]
    # the input card is never rewritten (two runs on one card must not race); the transfer is in the results
    assert card_path.read_bytes() == card_bytes
    assert res.transferred_to == {"card": str(card_path), "prior_task": "sst2", "task": "agnews"}
    after = load_snapshot(res.snapshot)
    changed = {pid for pid in pre.matrices if not (pre.matrices[pid] == after.matrices[pid]).all()}
    assert changed == set(card["trainable"])


@pytest.mark.slow
def test_lora_rank_matches_profile_budget(tiny_llama, card_path, tmp_path):
    res = run_finetune(
        tiny_llama,
        FinetuneConfig(
            method="lora",
            lora_rank="match",
            profile=str(card_path),
            task="sst2",
            output_dir=str(tmp_path / "l"),
            epochs=1,
            **TINY,
        ),
    )
    card = json.loads(card_path.read_text())
    assert res.lora_rank == lora_rank_for(tiny_llama.model, card["trainable_params"])
    per_rank = res.trainable_params / res.lora_rank
    assert abs(res.trainable_params - card["trainable_params"]) <= per_rank / 2


@pytest.mark.slow
def test_run_resumes_from_its_checkpoint(tiny_llama, tmp_path):
    out = tmp_path / "r"
    cfg = FinetuneConfig(method="full", task="sst2", output_dir=str(out), epochs=1, keep_checkpoints=True, **TINY)
    first = run_finetune(tiny_llama, cfg)
    assert len(list(out.glob("checkpoint-*"))) == 1

    def run_seconds(step: int) -> list[float]:
        """The run's wall seconds a checkpoint logged at each epoch's end (the run's clock)."""
        return per_epoch(
            json.loads((out / f"checkpoint-{step}" / "trainer_state.json").read_text())["log_history"], "run_seconds"
        )

    (up_to_checkpoint,) = run_seconds(2)
    assert 0 < up_to_checkpoint < first.wall_seconds
    more = run_finetune(tiny_llama, FinetuneConfig(**{**cfg.__dict__, "epochs": 2, "eval_each_epoch": True}))
    assert more.resumed_from.endswith("checkpoint-2")  # only the missing epoch ran ...
    assert (
        more.epochs_run == 2 and len(more.epoch_seconds) == 2
    )  # ... and the first one's time came back with the checkpoint
    assert len(more.epoch_test_accuracy) == 1  # evaluation was only asked for on the resumed run
    # the run's wall time counts the first sitting up to its checkpoint, as that sitting logged it there
    assert run_seconds(4)[0] == up_to_checkpoint and up_to_checkpoint < run_seconds(4)[1] < more.wall_seconds
    assert more.wall_seconds > up_to_checkpoint + more.epoch_seconds[1]


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        pytest.param({"method": "adapter"}, ParameterError, "method='adapter' is not one of full, lora", id="method"),
        pytest.param({"method": "profile"}, ParameterError, "method 'profile' needs a profile card", id="no-card"),
        pytest.param(
            {"lora_rank": "match", "method": "lora"}, ParameterError, "lora_rank='match' needs a profile", id="match"
        ),
        pytest.param({"task": "yelp"}, TaskError, "unknown task 'yelp'", id="task"),
        pytest.param({"epochs": 0}, ParameterError, r"epochs=0 is not a whole number >= 1", id="epochs-0"),
        pytest.param({"n_train": "10"}, ParameterError, "n_train='10' is not a whole number", id="n_train-text"),
        pytest.param(
            {"stop_threshold": "card"}, ParameterError, "stop_threshold='card' needs a profile card", id="card-no-card"
        ),
        pytest.param(
            {"stop_threshold": "soon", "method": "profile", "profile": "c.json"},
            ParameterError,
            r"stop_threshold='soon' is not a number in \(0, 1\), 'card' or None",
            id="threshold-text",
        ),
        pytest.param(
            {"stop_threshold": 1.5}, ParameterError, r"stop_threshold=1.5 is not a number in \(0, 1\)", id="1.5"
        ),
        pytest.param(
            {"lora_rank": "abc", "method": "lora"}, ParameterError, "lora_rank='abc' is not a whole number", id="rank"
        ),
        pytest.param({"lora_rank": 0}, ParameterError, "lora_rank=0 is not a whole number >= 1", id="rank-0"),
        pytest.param({"learning_rate": -1.0}, ParameterError, r"learning_rate=-1.0 is not a number in", id="lr"),
        pytest.param({"lr_scheduler": "cyclic"}, ParameterError, "lr_scheduler='cyclic' is not one of", id="schedule"),
        pytest.param({"seed": -1}, ParameterError, "seed=-1 is not a whole number >= 0", id="seed"),
        pytest.param({"data_source": "no/such/folder"}, ParameterError, "or an existing data folder", id="data-source"),
    ],
)
def test_config_errors(kwargs, error, message):
    with pytest.raises(error, match=message):
        FinetuneConfig(**kwargs)


def test_stop_threshold_card_reads_the_cards_own(card_path):
    card = ProfileCard.load(card_path)
    cfg = FinetuneConfig(method="profile", profile=str(card_path), stop_threshold="card")
    with pytest.raises(ProfileError, match="records no stopping threshold"):
        stop_threshold_for(cfg, card)
    card = replace(card, stop_threshold=0.4)
    assert stop_threshold_for(cfg, card) == 0.4
    assert stop_threshold_for(FinetuneConfig(method="profile", profile=str(card_path), stop_threshold=0.7), card) == 0.7


@pytest.mark.slow
def test_profile_checkpoints_hold_only_the_trainable_tensors_and_resume(tiny_llama, card_path, tmp_path):
    from safetensors import safe_open

    out = tmp_path / "p"
    cfg = FinetuneConfig(
        method="profile",
        profile=str(card_path),
        task="sst2",
        output_dir=str(out),
        epochs=1,
        keep_checkpoints=True,
        **TINY,
    )
    first = run_finetune(tiny_llama, cfg)
    (checkpoint,) = out.glob("checkpoint-*")
    assert not (checkpoint / "model.safetensors").exists()  # not the whole model ...
    with safe_open(str(checkpoint / "trainable.safetensors"), framework="pt") as handle:
        assert sorted(handle.keys()) == sorted(first.trainable_param_names)  # ... only what trains
    more = run_finetune(
        tiny_llama, FinetuneConfig(**{**cfg.__dict__, "epochs": 2, "keep_checkpoints": False, "save_snapshot": True})
    )
    assert more.resumed_from == str(checkpoint) and more.epochs_run == 2
    assert not list(out.glob("checkpoint-*"))  # a finished run keeps none unless asked
    pre, after = extract_snapshot(tiny_llama), load_snapshot(more.snapshot)
    changed = {pid for pid in pre.matrices if not (pre.matrices[pid] == after.matrices[pid]).all()}
    assert changed == set(json.loads(card_path.read_text())["trainable"])


def test_pretrained_scores_are_computed_once_per_model_and_rows(tiny_llama, monkeypatch):
    import topotuner_lab.training.baseline as baseline
    from topotuner_lab.training.data import load_run_data

    calls = []

    class Scorer:
        metric = "acc"

        def score_all(self, model, rows):
            calls.append(len(rows))
            return {"acc": np.ones(len(rows), dtype=bool)}

    probe = PerplexityProbe(42.0, [3.5, 4.0], [10, 20])
    monkeypatch.setattr(baseline, "perplexity_probe", lambda *a, **k: probe)
    monkeypatch.setenv("TOPOTUNER_SCORE_CACHE", "off")  # the in-process reuse alone (the disk's: test_score_cache)
    cfg = FinetuneConfig(n_ood=3)
    data = load_run_data(cfg)
    scorers = {data.ood_task: Scorer()}
    first = baseline.pretrained_scores(tiny_llama, cfg, data, scorers)
    again = baseline.pretrained_scores(tiny_llama, FinetuneConfig(n_ood=3, seed=5, learning_rate=0.5), data, scorers)
    assert again is first and again.ood_accuracy == 1.0 and again.probe == probe
    assert again.battery[data.ood_task]["acc"].tolist() == [True] * 3
    assert calls == [3]
    other_rows = FinetuneConfig(n_ood=2)
    baseline.pretrained_scores(tiny_llama, other_rows, load_run_data(other_rows), scorers)
    assert calls == [3, 2]
    without = FinetuneConfig(n_ood=0, n_ppl=0)  # nothing to score: no battery, no probe
    none = baseline.pretrained_scores(tiny_llama, without, load_run_data(without), scorers)
    assert none.battery == {} and none.ood_accuracy is None and none.probe is None and calls == [3, 2]


def test_a_result_holds_every_results_field_and_writes_them_in_its_order():
    """``FinetuneResult`` and ``RunResults`` name the same fields; ``to_dict`` leaves out only what a run lacks."""
    from dataclasses import fields

    from topotuner_lab.training.results import ABSENT_WHEN_NONE, FinetuneResult, RunResults

    names = [f.name for f in fields(FinetuneResult)]
    assert set(names) == set(RunResults.__annotations__) and ABSENT_WHEN_NONE <= set(names)
    required = {f.name: None for f in fields(FinetuneResult) if f.name not in ABSENT_WHEN_NONE}
    result = FinetuneResult(**required, lora_rank=4)
    written = result.to_dict()
    assert list(written) == [name for name in names if name in required or name == "lora_rank"]
    assert written["lora_rank"] == 4 and written["stop_epoch"] is None  # None stays where a run has the field
