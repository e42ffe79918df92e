import pytest
import torch
from transformers import TrainerControl, TrainerState

from topotuner_lab._io.errors import ParameterError
from topotuner_lab.training.early_stopping import TopologicalEarlyStopping, projection_matrices


def _drive(model, scales, **kwargs):
    """Run the callback over fake epochs that move the weights by the given amounts."""
    cb = TopologicalEarlyStopping(**kwargs)
    state, control = TrainerState(), TrainerControl()
    cb.on_train_begin(None, state, control, model=model)
    rng = torch.Generator().manual_seed(0)
    stopped_at = None
    for epoch, scale in enumerate(scales, start=1):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=rng) * scale)
        state.epoch = float(epoch)
        cb.on_epoch_end(None, state, control, model=model)
        if control.should_training_stop and stopped_at is None:
            stopped_at = epoch
    return cb, stopped_at


def test_stops_when_drift_falls_below_threshold_and_not_before(tiny_llama):
    cb, stopped = _drive(tiny_llama.model, [0.05, 0.04, 0.01, 0.005], threshold=0.3)
    normalized = [h["normalized"] for h in cb.history]
    assert normalized[0] == 1.0
    assert normalized[1] > 0.3 > normalized[2]
    assert stopped == 3 == cb.stop_epoch
    assert all(h["seconds"] > 0 for h in cb.history)  # the rule's own cost, counted in a stopped run's time


def test_does_not_stop_while_drift_stays_high(tiny_llama):
    # H0 drift tracks changes in the cloud's scale, so keep the moves growing
    cb, stopped = _drive(tiny_llama.model, [0.05, 0.1, 0.2], threshold=0.3)
    assert stopped is None and cb.stop_epoch is None
    assert all(h["normalized"] > 0.5 for h in cb.history)


def test_observe_only_records_but_never_stops(tiny_llama):
    cb, stopped = _drive(tiny_llama.model, [0.05, 0.005, 0.005], threshold=0.3, observe_only=True)
    assert stopped is None and cb.stop_epoch == 2


def test_min_epochs_and_monitored_subset(tiny_llama):
    cb, _ = _drive(tiny_llama.model, [0.05, 0.001], threshold=0.3, min_epochs=3, pids=["L0.q", "L1.v"])
    assert cb.stop_epoch is None
    assert set(projection_matrices(tiny_llama.model, ["L0.q", "L1.v"])) == {"L0.q", "L1.v"}


def test_state_round_trip_for_checkpoints():
    cb = TopologicalEarlyStopping(0.4, pids=["L0.q"], min_epochs=2)
    cb.history, cb.reference, cb.stop_epoch = [{"epoch": 1, "drift": 2.0, "normalized": 1.0}], 2.0, None
    data = cb.state()
    clone = TopologicalEarlyStopping(**data["args"])
    for key, value in data["attributes"].items():
        setattr(clone, key, value)
    assert clone.state() == data


@pytest.mark.parametrize("threshold", [0, 1.5, "0.3"])
def test_bad_thresholds(threshold):
    with pytest.raises(ParameterError, match="threshold"):
        TopologicalEarlyStopping(threshold)


def test_each_epoch_records_the_mean_drift_from_the_starting_weights(tiny_llama):
    import copy

    from topotuner_lab.drift.cache import DriftCache
    from topotuner_lab.drift.compute import drift_between

    model = copy.deepcopy(tiny_llama.model)
    start = projection_matrices(model, ["L0.q", "L1.v"])
    cb, _ = _drive(model, [0.05, 0.05], threshold=0.3, pids=["L0.q", "L1.v"], observe_only=True)
    table = drift_between(
        start, projection_matrices(model, ["L0.q", "L1.v"]), cb.settings, n_jobs=1, cache=DriftCache(None)
    )
    assert cb.history[-1]["from_pretrained"] == pytest.approx(float(table["h0_w1"].mean()))
    assert 0 < cb.history[0]["from_pretrained"] < cb.history[1]["from_pretrained"]  # the moves add up

    resumed = TopologicalEarlyStopping(0.3, pids=["L0.q"])
    state = TrainerState()
    state.epoch = 2.0  # a run resumed from a checkpoint does not start at the pretrained weights
    resumed.on_train_begin(None, state, TrainerControl(), model=model)
    state.epoch = 3.0
    resumed.on_epoch_end(None, state, TrainerControl(), model=model)
    assert resumed.history[0]["from_pretrained"] is None
