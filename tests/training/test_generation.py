"""Batched greedy generation gives what one row at a time gives, in the prompts' order, cut at stop strings."""

from __future__ import annotations

import pytest
import torch

from topotuner_lab.tasks.loading import load_task
from topotuner_lab.training import generation
from topotuner_lab.training.evaluation import model_device, pad_rows
from topotuner_lab.training.generation import cut_at_stop, generate
from topotuner_lab.weights.models import TINY_DECODERS, build_tiny_model


def _single_and_batched(name: str, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[str], list[int]]:
    """Answers one row at a time and four at a time, and how many live rows each batched prefill joined.

    The stop string is a character the free answers hold here and there, so rows end at different steps.
    """
    loaded = build_tiny_model(name)
    prompts = list(load_task("gsm8k", "test", 9, 0)["prompt"]) + ["Short?"]
    free = generate(loaded.model, loaded.tokenizer, prompts, max_new_tokens=12, batch_size=1, max_length=96)
    kw = dict(max_new_tokens=12, stop=[free[0][3:4]], max_length=96)
    single = generate(loaded.model, loaded.tokenizer, prompts, batch_size=1, **kw)
    joins: list[int] = []
    add = generation._Slots.add
    monkeypatch.setattr(generation._Slots, "add", lambda self, *a: joins.append(self.live) or add(self, *a))
    return single, generate(loaded.model, loaded.tokenizer, prompts, batch_size=4, **kw), joins


@pytest.mark.parametrize("name", [*TINY_DECODERS, "tiny-gpt2"])
def test_batched_generation_equals_one_row_at_a_time(name, monkeypatch):
    single, batched, _ = _single_and_batched(name, monkeypatch)
    assert batched == single and len(batched) == 10


@pytest.mark.parametrize("name, joins_running", [("tiny-llama", True), ("tiny-gemma3", False)])
def test_prompts_join_a_running_batch_unless_the_cache_slides(name, joins_running, monkeypatch):
    """A freed slot is refilled while other rows run; a sliding-window cache cannot be re-aligned, so it waits."""
    single, batched, joins = _single_and_batched(name, monkeypatch)
    assert len({len(answer) for answer in single}) > 2, "rows should end at different steps"
    assert batched == single and (max(joins) > 0) == joins_running, joins


def test_stop_strings_cut_the_answer_and_end_the_batch():
    loaded = build_tiny_model("tiny-llama")
    prompts = list(load_task("gsm8k", "test", 4, 0)["prompt"])
    free = generate(loaded.model, loaded.tokenizer, prompts, max_new_tokens=16, batch_size=4)
    stop = [free[0][2:4]]  # a string the first answer is known to hold
    cut = generate(loaded.model, loaded.tokenizer, prompts, max_new_tokens=16, batch_size=4, stop=stop)
    assert cut[0] == free[0][: free[0].find(stop[0])] and all(stop[0] not in answer for answer in cut)


@pytest.mark.parametrize(
    "text, stop, expected",
    [
        pytest.param("42\n\nQuestion: next", ["\n\n", "Question:"], "42", id="earliest-of-two"),
        pytest.param("no stop here", ["###"], "no stop here", id="none-found"),
        pytest.param("x", [], "x", id="no-stops"),
        pytest.param("\nA summary.\nMore", ["\n"], "\nA summary.", id="leading-newline-is-not-an-answer"),
        pytest.param("\n    return x\ndef g", ["\ndef"], "\n    return x", id="indent-kept"),
        pytest.param("  \n", ["\n"], "  \n", id="only-whitespace"),
        pytest.param("\n# note", ["\n#"], "", id="stop-reaching-into-the-answer-counts"),
    ],
)
def test_cut_at_stop(text, stop, expected):
    assert cut_at_stop(text, stop) == expected


@pytest.mark.parametrize("left", [False, True])
def test_padded_rows_go_where_the_model_is(left):
    """Inputs follow the weights (the Trainer moves a model to the GPU when there is one); here the meta device."""
    model = torch.nn.Linear(2, 2, device="meta")
    ids, mask = pad_rows([[5, 6, 7], [8]], 0, model_device(model), left=left)
    assert ids.device.type == mask.device.type == "meta"
    ids, mask = pad_rows([[5, 6, 7], [8]], 0, torch.device("cpu"), left=left)
    assert ids.tolist() == ([[5, 6, 7], [0, 0, 8]] if left else [[5, 6, 7], [8, 0, 0]])
    assert mask.tolist() == ([[1, 1, 1], [0, 0, 1]] if left else [[1, 1, 1], [1, 0, 0]])


@pytest.mark.parametrize("settings", [{"batch_size": 0}, {"max_new_tokens": 0}])
def test_no_room_to_generate_is_refused(settings):
    loaded = build_tiny_model("tiny-llama")
    with pytest.raises(ValueError, match="must be at least 1"):
        generate(loaded.model, loaded.tokenizer, ["Hi"], **settings)


def test_rows_end_at_either_end_of_text_and_at_special_token_stops():
    """lm-eval stops at the tokenizer's end-of-text as well as the model's; a special-token stop never shows in text."""
    loaded = build_tiny_model("tiny-llama")  # generation config: eos 2; tokenizer: <eos> 257, <pad> 256
    assert generation._end_ids(loaded.model, loaded.tokenizer, ()) == {2, 257}
    assert generation._end_ids(loaded.model, loaded.tokenizer, ["<pad>", "\n"]) == {2, 256, 257}


def test_an_empty_prompt_is_answered_from_the_start_token():
    loaded = build_tiny_model("tiny-gpt2")  # adds no start token of its own: "" encodes to nothing
    prompts = ["", "Hi", ""]
    single = generate(loaded.model, loaded.tokenizer, prompts, max_new_tokens=4, batch_size=1)
    assert generate(loaded.model, loaded.tokenizer, prompts, max_new_tokens=4, batch_size=3) == single
    assert single[0] == single[2]
