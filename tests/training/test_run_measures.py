"""What a run measures: validation log-loss, per-epoch accuracy at the stop epoch, per-text NLL for perplexity."""

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from datasets import Dataset
from transformers import TrainerControl, TrainerState

import topotuner_lab.training.finetune as ft
import topotuner_lab.training.recipe as recipe
import topotuner_lab.training.scoring as scoring
from topotuner_lab.tasks.registry import TASKS
from topotuner_lab.training.callbacks import EpochEvaluation, at_epoch, evaluation_entry, per_epoch
from topotuner_lab.training.config import FinetuneConfig
from topotuner_lab.training.evaluation import (
    classification_correct,
    classification_scores,
    label_logloss,
    mean_logloss,
    perplexity,
    perplexity_probe,
)
from topotuner_lab.training.results import load_results, write_results
from topotuner_lab.training.scoring import TaskScorer

TINY = dict(n_train=16, n_test=8, n_ood=8, n_ppl=3, batch_size=8, max_length=40, learning_rate=1e-3)
TWO_ROWS = {"prompt": ["Review: a fine film.\nSentiment:", "Review: dull\nSentiment:"], "label": [1, 0]}


# validation log-loss --------------------------------------------------------------------------------------------
@torch.no_grad()
def _hand_logprob(model, tokenizer, prompt, word):
    """log p(word | prompt): the word's tokens' log-probabilities summed, one unpadded forward."""
    prompt_ids = tokenizer(prompt, add_special_tokens=True).input_ids
    word_ids = tokenizer(word, add_special_tokens=False).input_ids
    logp = torch.log_softmax(model(input_ids=torch.tensor([prompt_ids + word_ids])).logits[0].double(), -1)
    return sum(float(logp[len(prompt_ids) - 1 + k, t]) for k, t in enumerate(word_ids))


@pytest.mark.parametrize(
    "labels",
    [
        pytest.param(["a", "b"], id="one-token-labels"),  # the last-token fast path
        pytest.param([" negative", " positive"], id="many-token-labels"),  # the byte tokenizer: one token per byte
    ],
)
def test_val_logloss_equals_a_hand_computation(tiny_llama, labels):
    model, tok = tiny_llama.model, tiny_llama.tokenizer
    rows = Dataset.from_dict(TWO_ROWS)
    losses = []
    for prompt, label in zip(rows["prompt"], rows["label"]):
        p = [math.exp(_hand_logprob(model, tok, prompt, word)) for word in labels]
        losses.append(-math.log(p[label] / sum(p)))  # normalized over the label words
    expected = sum(losses) / len(losses)
    assert mean_logloss(classification_scores(model, tok, rows, labels), rows["label"]) == pytest.approx(
        expected, rel=1e-5
    )
    # the run's validation scorer: the same accuracy as the plain scorer and this log-loss, from one scoring pass
    delimiter = " " if labels[0].startswith(" ") else ""
    spec = replace(TASKS["sst2"], doc_to_choice=tuple(w.strip() for w in labels), target_delimiter=delimiter)
    assert spec.labels == tuple(labels)
    correct, logloss = TaskScorer(spec, tok, 128).with_logloss(model, rows)
    assert logloss == pytest.approx(expected, rel=1e-5)
    np.testing.assert_array_equal(correct, classification_correct(model, tok, rows, labels))


def test_logloss_of_perfect_uniform_and_confidently_wrong_scores():
    perfect = np.array([[0.0, -np.inf, -np.inf], [-np.inf, -np.inf, 0.0]])
    np.testing.assert_array_equal(label_logloss(perfect, [0, 2]), [0.0, 0.0])
    assert mean_logloss(perfect, [0, 2]) == 0.0
    # unnormalized scores: only their differences count; no information -> log(number of labels)
    assert mean_logloss(np.full((2, 3), -7.5), [0, 1]) == pytest.approx(math.log(3))
    assert label_logloss(perfect, [1, 0]).tolist() == [math.inf, math.inf]
    assert label_logloss(np.array([[-1000.0, -1001.0]]), [1])[0] == pytest.approx(1 + math.log1p(math.exp(-1)))
    assert math.isnan(mean_logloss(np.zeros((0, 2)), []))


def test_val_scorer_of_a_perfectly_confident_model_gives_zero(monkeypatch):
    rows = Dataset.from_dict(TWO_ROWS)
    monkeypatch.setattr(scoring, "classification_scores", lambda *a, **k: np.array([[-np.inf, 0.0], [0.0, -np.inf]]))
    correct, logloss = TaskScorer("sst2", None, 64).with_logloss(None, rows)
    assert correct.tolist() == [True, True] and logloss == 0.0


# per-epoch evaluation -------------------------------------------------------------------------------------------
def test_epoch_evaluation_logs_test_and_validation_each_epoch():
    outcomes = iter([np.array([True, False, True]), np.array([True, True, True])])
    val = iter([(np.array([False, True]), 0.9), (np.array([True, True]), 0.4)])
    cb = EpochEvaluation(lambda m: next(outcomes), lambda m: next(val))
    state, control, model = TrainerState(max_steps=4), TrainerControl(), torch.nn.Linear(1, 1)
    for epoch in (1, 2):
        state.epoch, state.global_step = float(epoch), 2 * epoch
        model.eval()
        cb.on_epoch_end(None, state, control, model=model)
        assert model.training  # back to training after scoring
    history = state.log_history
    assert per_epoch(history, "test_accuracy") == [2 / 3, 1.0]
    assert per_epoch(history, "val_accuracy") == [0.5, 1.0] and per_epoch(history, "val_logloss") == [0.9, 0.4]
    assert at_epoch(history, "test_correct", 1) == [1, 0, 1] and at_epoch(history, "test_correct", None) is None
    assert len(per_epoch(history, "eval_seconds")) == 2


def test_a_graded_metric_is_logged_per_example_as_it_is():
    # ROUGE-L per summary: an epoch's per-example scores once read 0 for every row (cast to int)
    entry = evaluation_entry(1, np.array([0.25, 0.5, 1.0]))
    assert entry["test_correct"] == [0.25, 0.5, 1.0] and entry["test_accuracy"] == pytest.approx(0.5833, abs=1e-4)
    assert evaluation_entry(1, np.array([True, False]))["test_correct"] == [1, 0]


@pytest.mark.parametrize("stopped_by", ["budget", "rule"])
def test_a_deferred_last_epoch_is_left_to_the_finished_run(stopped_by):
    cb = EpochEvaluation(lambda m: np.array([True]), defer_final=True)
    state, control, model = TrainerState(max_steps=4, epoch=1.0, global_step=2), TrainerControl(), torch.nn.Linear(1, 1)
    cb.on_epoch_end(None, state, control, model=model)
    state.epoch = 2.0
    if stopped_by == "budget":
        state.global_step = 4
    else:
        control.should_training_stop = True  # the early-stopping rule, which runs first
    cb.on_epoch_end(None, state, control, model=model)
    assert per_epoch(state.log_history, "test_accuracy") == [1.0]  # epoch 1 only


@pytest.mark.parametrize("checkpoint_logged", [True, False])
def test_a_resumed_runs_clock_adds_the_time_its_checkpoint_logged(checkpoint_logged):
    import time

    from topotuner_lab.training.callbacks import RunClock

    earlier = [{"epoch": 1, "epoch_seconds": 50.0}] + ([{"epoch": 1, "run_seconds": 80.0}] if checkpoint_logged else [])
    state = TrainerState(epoch=2.0, global_step=4, log_history=list(earlier))  # as the checkpoint restores it
    clock = RunClock(time.perf_counter() - 5.0, resumed=True)  # this sitting began 5 s ago
    clock.on_epoch_end(None, state, TrainerControl())
    seconds, whole = clock.seconds(state.log_history)
    assert whole == checkpoint_logged
    if checkpoint_logged:  # 80 s before the checkpoint, then this sitting's
        assert per_epoch(state.log_history, "run_seconds")[-1] == pytest.approx(85.0, abs=1.0)
        assert 85.0 <= seconds < 90.0
    else:  # the earlier sittings' time is unknown: nothing is logged, and the run counts this sitting alone
        assert state.log_history == earlier and 5.0 <= seconds < 10.0
    fresh = RunClock(time.perf_counter() - 3.0, resumed=False)
    assert fresh.seconds([{"epoch": 1, "run_seconds": 80.0}])[1] and fresh.seconds([])[0] < 10.0  # history unread


def test_which_runs_are_timed_by_their_last_sitting_alone():
    from topotuner_lab.training.results import timed_last_sitting_only

    assert not timed_last_sitting_only({"resumed_from": None})
    assert timed_last_sitting_only({"resumed_from": "checkpoint-96"})  # a file written before the run's clock
    assert not timed_last_sitting_only({"resumed_from": "checkpoint-96", "wall_from_last_sitting": False})
    assert timed_last_sitting_only({"resumed_from": "checkpoint-96", "wall_from_last_sitting": True})


@pytest.mark.parametrize(
    "extra, evaluates",
    [
        ({}, False),
        ({"stop_threshold": 0.5}, False),  # the rule stops the run: its last epoch is the stop epoch
        ({"stop_threshold": 0.5, "observe_only": True}, True),
        ({"eval_each_epoch": True}, True),
    ],
)
def test_which_runs_evaluate_each_epoch(extra, evaluates):
    cfg = FinetuneConfig(**extra)
    assert recipe.evaluates_each_epoch(cfg, cfg.stop_threshold) is evaluates


@pytest.fixture(scope="module")
def observed_and_plain(tmp_path_factory):
    """A tiny run observing the stopping rule (3 epochs, validation rows), the same run without the rule, and the
    observed run again with its last epoch scored by the callback too (not left to the finished run's scores)."""
    from topotuner_lab.weights.models import build_tiny_model

    out = tmp_path_factory.mktemp("measures")
    observe = {"stop_threshold": 0.99, "observe_only": True}
    runs = {}
    for name, extra in {"observed": observe, "plain": {}, "undeferred": observe}.items():
        cfg = FinetuneConfig(
            task="sst2", output_dir=str(out / name), epochs=3, n_val=4, **{**TINY, "learning_rate": 3e-3}, **extra
        )
        with pytest.MonkeyPatch.context() as mp:
            if name == "undeferred":

                class Undeferred(EpochEvaluation):  # scores the last epoch too, not left to the finished run
                    def __init__(self, *args, **kwargs):
                        super().__init__(*args, **{**kwargs, "defer_final": False})

                mp.setattr(recipe, "EpochEvaluation", Undeferred)
            runs[name] = ft.run_finetune(build_tiny_model("tiny-llama", seed=0), cfg).to_dict()  # as results.json
    return runs


@pytest.mark.slow
def test_an_observed_stop_records_per_epoch_test_and_validation(observed_and_plain):
    res = observed_and_plain["observed"]
    on_disk = load_results(res["config"]["output_dir"] + "/results.json")
    assert res["stop_epoch"] is not None and res["epochs_run"] == 3  # the rule fired, the run went on (observe mode)
    for key in ("epoch_test_accuracy", "epoch_val_accuracy", "epoch_val_logloss", "epoch_eval_seconds"):
        assert len(res[key]) == 3 and on_disk[key] == res[key], key
    stop = res["stop_epoch"]
    assert stop < 3 and len(set(res["epoch_test_accuracy"])) == 3, "the check below needs epochs that differ"
    correct = res["stop_epoch_test_correct"]
    assert len(correct) == len(res["test_correct"]) == 8 and set(correct) <= {0, 1}
    assert np.mean(correct) == res["epoch_test_accuracy"][stop - 1]
    # the last epoch's scores are the finished run's, at no cost of their own
    assert (
        res["epoch_test_accuracy"][-1] == res["test_accuracy"] and res["epoch_val_accuracy"][-1] == res["val_accuracy"]
    )
    assert res["epoch_val_logloss"][-1] == res["val_logloss"] and res["epoch_eval_seconds"][-1] == 0.0
    assert 0 < res["val_logloss"] < 10


@pytest.mark.slow
def test_the_last_epochs_scores_equal_the_finished_runs(observed_and_plain):
    # what justifies leaving the last epoch to the finished run: scored at its epoch end, the numbers are the same
    observed, undeferred = observed_and_plain["observed"], observed_and_plain["undeferred"]
    assert undeferred["epoch_eval_seconds"][-1] > 0  # the callback did score the last epoch here
    for key in ("epoch_test_accuracy", "epoch_val_accuracy", "epoch_val_logloss", "stop_epoch_test_correct"):
        assert undeferred[key] == observed[key], key


@pytest.mark.slow
def test_per_epoch_evaluation_leaves_the_run_unchanged(observed_and_plain):
    observed, plain = observed_and_plain["observed"], observed_and_plain["plain"]
    for key in ("test_correct", "val_accuracy", "val_logloss", "train_accuracy", "ood_correct_after"):
        assert observed[key] == plain[key], key
    for key in ("perplexity_after", "ppl_nll_after"):
        assert observed[key] == plain[key], key
    assert plain["epoch_test_accuracy"] == plain["epoch_val_accuracy"] == []
    assert plain["stop_epoch_test_correct"] is None and plain["stop_epoch"] is None


# per-text NLL of the perplexity probe ---------------------------------------------------------------------------
@torch.no_grad()
def test_per_text_nll_is_each_texts_own_and_weights_to_the_perplexity(tiny_llama):
    model, tok = tiny_llama.model, tiny_llama.tokenizer
    texts = ["hello world", "a much longer text, so that the batch is padded on the right", "xy", "q"]
    probe = perplexity_probe(model, tok, texts, max_length=32, batch_size=3)  # two batches, padding, a cut text
    assert probe.perplexity == perplexity(model, tok, texts, max_length=32, batch_size=3)  # the same number
    for text, nll, n in zip(texts, probe.text_nll, probe.text_tokens):
        ids = tok(text, add_special_tokens=True).input_ids[:32]
        assert n == len(ids) - 1
        if n == 0:
            assert math.isnan(nll)  # nothing predicted in a one-token text
            continue
        logits = model(input_ids=torch.tensor([ids])).logits[0].double()
        own = float(torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:])))
        assert nll == pytest.approx(own, rel=1e-5)  # unpadded and alone: padding never leaks in
    nll, n = np.array(probe.text_nll), np.array(probe.text_tokens)
    keep = n > 0
    assert probe.perplexity == pytest.approx(math.exp((nll[keep] * n[keep]).sum() / n.sum()), rel=1e-6)


@pytest.mark.slow
def test_run_records_per_text_nll_before_and_after(observed_and_plain):
    res = observed_and_plain["observed"]
    n = np.array(res["ppl_text_tokens"])
    assert len(n) == len(res["ppl_nll_before"]) == len(res["ppl_nll_after"]) == 3 and (n > 0).all()
    for when in ("before", "after"):
        weighted = np.dot(res[f"ppl_nll_{when}"], n) / n.sum()
        assert res[f"perplexity_{when}"] == pytest.approx(math.exp(weighted), rel=1e-6), when
    assert res["ppl_nll_before"] != res["ppl_nll_after"]


# results files written before these fields ----------------------------------------------------------------------
NEW_KEYS = (
    "val_logloss",
    "epoch_val_accuracy",
    "epoch_val_logloss",
    "epoch_eval_seconds",
    "stop_epoch_test_correct",
    "ppl_nll_before",
    "ppl_nll_after",
    "ppl_text_tokens",
)


def test_results_without_the_new_fields_still_load(tmp_path):
    old = {
        "method": "full",
        "task": "sst2",
        "learning_rate": 1e-4,
        "val_accuracy": 0.5,
        "test_accuracy": 0.5,
        "test_correct": [1, 0],
        "epoch_test_accuracy": [],
        "stop_epoch": None,
        "perplexity_before": 500.0,
        "perplexity_after": 400.0,
    }
    path = write_results(tmp_path / "results.json", old)
    assert not set(NEW_KEYS) & set(json.loads(path.read_text()))
    loaded = load_results(path)
    assert loaded == old
    assert all(loaded.get(key) is None for key in NEW_KEYS)


@pytest.mark.slow
def test_a_forgetting_battery_scores_each_task_on_its_own_metric_before_and_after(tiny_llama, tmp_path):
    cfg = FinetuneConfig(
        task="sst2", method="full", epochs=1, n_train=8, n_test=4, n_ood=3, n_ppl=2, max_length=48,
        ood_tasks=("boolq", "squad"), save_checkpoints=False, output_dir=str(tmp_path / "run"),
    )  # fmt: skip
    res = ft.run_finetune(tiny_llama, cfg)
    battery = res.ood_battery
    assert list(battery) == ["boolq", "squad"] and res.ood_task == "boolq"
    assert battery["boolq"]["metric"] == "acc" and battery["squad"]["metric"] == "f1"
    assert battery["boolq"]["correct_after"] == res.ood_correct_after  # the first task is the legacy ood fields
    assert battery["boolq"]["after"] == pytest.approx(res.ood_accuracy_after)
    assert battery["boolq"]["before"] == pytest.approx(res.ood_accuracy_before)
    assert all(len(b["correct_before"]) == len(b["correct_after"]) == 3 for b in battery.values())
    assert load_results(tmp_path / "run" / "results.json")["ood_battery"] == battery
    assert len(res.test_correct_before) == len(res.test_correct) == 4  # zero-shot on the same test rows
    assert res.test_accuracy_before == pytest.approx(sum(res.test_correct_before) / 4)
    before = res.test_example_metrics_before  # every metric zero-shot, the log-loss a logprob claim's gain needs
    assert set(before) == set(res.test_example_metrics) == {"acc", "logloss"}
    assert before["acc"] == res.test_correct_before and len(before["logloss"]) == 4
    assert all(x > 0 for x in before["logloss"])
