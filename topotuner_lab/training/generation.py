r"""Batched greedy generation: left-padded batches with the KV cache, stop strings, a progress bar.

Prompts are sorted by length so each batch pads little, run through ``model.generate`` (greedy, cached), stopped early
once every row of a batch has produced a stop string and cut at the first one. A stop string made wholly of the
answer's leading whitespace does not count (whitespace is not an answer; any other stop acts as in lm-eval), so a
model that opens with a newline (the pretrained SmolLM2 after "Summary:") is not cut to an empty answer by a ``"\n"``
stop, as transformers' ``StopStringCriteria`` would cut it. The answers come back in the prompts' order; each is what
one-row-at-a-time generation gives (tested).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch
from tqdm.auto import tqdm
from transformers import StoppingCriteria, StoppingCriteriaList

from topotuner_lab.training.evaluation import encode


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """``text`` up to its first stop string, skipping one that lies wholly in the leading whitespace (no answer yet)."""
    begun = len(text) - len(text.lstrip())
    ends = [i for i in (text.find(s, max(0, begun - len(s) + 1)) for s in stop if s) if i >= 0]
    return text[: min(ends)] if ends else text


class _AnswerStopped(StoppingCriteria):
    """Per row: done once its generated text holds a stop string after the answer has begun (see ``cut_at_stop``)."""

    def __init__(self, tokenizer: Any, stop: Sequence[str], prompt_width: int) -> None:
        self.tokenizer, self.stop, self.prompt_width = tokenizer, list(stop), prompt_width

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        texts = self.tokenizer.batch_decode(input_ids[:, self.prompt_width :], skip_special_tokens=True)
        done = [cut_at_stop(text, self.stop) != text for text in texts]
        return cast(torch.BoolTensor, torch.tensor(done, dtype=torch.bool, device=input_ids.device))


def _left_padded(rows: Sequence[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = torch.tensor(row)
        mask[i, width - len(row) :] = 1
    return ids, mask


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    max_new_tokens: int = 64,
    stop: Sequence[str] = (),
    batch_size: int = 16,
    max_length: int = 256,
    progress: bool = False,
) -> list[str]:
    r"""Greedy continuations of ``prompts``, each cut at the first ``stop`` string.

    Parameters
    ----------
    model, tokenizer : a causal LM and its tokenizer.
    prompts : the prompts; answers come back in this order.
    max_new_tokens : generated tokens per prompt at most.
    stop : strings that end an answer (``"\\n\\n"``, ``"Question:"``...); generation of a batch stops once every row
        holds one.
    batch_size : prompts per ``generate`` call (1 is one-row-at-a-time).
    max_length : prompt and answer tokens together at most: a prompt keeps its last ``max_length - max_new_tokens``.
    """
    model.eval()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    room = max(1, max_length - max_new_tokens)
    encoded = [encode(tokenizer, prompt, "", room)[0] for prompt in prompts]
    order = sorted(range(len(prompts)), key=lambda i: -len(encoded[i]))
    answers: list[str] = [""] * len(prompts)
    starts = range(0, len(order), batch_size)
    for start in tqdm(starts, desc="generate", unit="batch", disable=not progress):
        batch = order[start : start + batch_size]
        ids, mask = _left_padded([encoded[i] for i in batch], pad_id)
        stopping = StoppingCriteriaList([_AnswerStopped(tokenizer, stop, ids.shape[1])] if stop else [])
        out = cast(Any, model).generate(  # a transformers model: generate is not on torch.nn.Module
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad_id,
            stopping_criteria=stopping,
        )
        for row, index in enumerate(batch):
            text = tokenizer.decode(out[row, ids.shape[1] :], skip_special_tokens=True)
            answers[index] = cut_at_stop(text, stop)
    return answers
