"""Batched greedy generation gives what one row at a time gives, in the prompts' order, cut at stop strings."""

from __future__ import annotations

import pytest

from topotuner_lab.tasks.specs import load_task
from topotuner_lab.training.generation import cut_at_stop, generate
from topotuner_lab.weights.models import build_tiny_model


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-gpt2"])
def test_batched_generation_equals_one_row_at_a_time(name):
    loaded = build_tiny_model(name)
    prompts = list(load_task("gsm8k", "test", 7, 0)["prompt"]) + ["Short?"]
    single = generate(loaded.model, loaded.tokenizer, prompts, max_new_tokens=8, batch_size=1, max_length=96)
    batched = generate(loaded.model, loaded.tokenizer, prompts, max_new_tokens=8, batch_size=3, max_length=96)
    assert batched == single and len(batched) == len(prompts)


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
