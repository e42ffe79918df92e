r"""Greedy generation with continuous batching: KV cache, stop strings, a progress bar.

``model.generate`` runs a batch until its longest answer stops, and answers are of very uneven length (GSM8K: median 12
tokens, some 128), so most of a batch's steps serve one or two rows; transformers' own continuous batching
(``generate_batch``) has no stop strings. This loop keeps the batch full instead: a row leaves as soon as it holds a
stop string (or the end-of-text token, or ``max_new_tokens``): it is dropped from the KV cache and the next prompts are
prefilled and joined to it (caches left-padded to a common width, positions counted per row), so every step advances
up to ``batch_size`` live answers. A model whose cache slides (a sliding-window layer) cannot be re-aligned: its rows
join only an empty batch, as with ``generate``.

A stop string made wholly of the answer's leading whitespace does not count (whitespace is not an answer; any other
stop acts as in lm-eval), so a model that opens with a newline (the pretrained SmolLM2 after "Summary:") is not cut to
an empty answer by a ``"\n"`` stop. Decoding is plain greedy (argmax of the logits; a model's own logits processors
such as a repetition penalty are not applied). The answers come back in the prompts' order; each is what one row at a
time gives (tested).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers.cache_utils import DynamicLayer

from topotuner_lab.training.evaluation import encode, model_device, pad_rows


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """``text`` up to its first stop string, skipping one that lies wholly in the leading whitespace (no answer yet)."""
    begun = len(text) - len(text.lstrip())
    ends = [i for i in (text.find(s, max(0, begun - len(s) + 1)) for s in stop if s) if i >= 0]
    return text[: min(ends)] if ends else text


def _pad_left(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """``tensor`` grown to ``width`` along ``dim`` by zeros on the left (masked cache positions)."""
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def _end_ids(model: torch.nn.Module, tokenizer: Any, stop: Sequence[str]) -> set[int]:
    """Token ids that end a row: end-of-text by the model's generation config and by the tokenizer, and stop specials.

    lm-eval stops on both end-of-text tokens; a stop string that is one special token is matched by id, since decoded
    answers drop special tokens and the text search would never see it.
    """
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = {tokenizer.eos_token_id, *(config_eos if isinstance(config_eos, list) else [config_eos])}
    special = set(getattr(tokenizer, "all_special_tokens", ()))
    ids |= {tokenizer.convert_tokens_to_ids(s) for s in stop if s in special}
    return {i for i in ids if isinstance(i, int)}


class _Slots:
    """The rows being generated: prompt index, tokens so far, whether finished; their KV cache and attention mask."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, stop: Sequence[str], max_new_tokens: int) -> None:
        self.model, self.tokenizer, self.stop, self.max_new_tokens = model, tokenizer, list(stop), max_new_tokens
        self.eos = _end_ids(model, tokenizer, stop)
        self.index: list[int] = []
        self.tokens: list[list[int]] = []
        self.done: list[bool] = []
        self.cache: Any = None
        self.mask = torch.zeros((0, 0), dtype=torch.long)

    @property
    def live(self) -> int:
        return self.done.count(False)

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, cache: Any) -> tuple[torch.Tensor, Any]:
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, -ids.shape[1] :]
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1
        )
        return out.logits[:, -1].argmax(-1), out.cache

    def _record(self, row: int, token: int) -> str | None:
        """Adds ``token`` to ``row``; its answer once the row is finished, else None."""
        if token in self.eos:
            self.done[row] = True
        else:
            self.tokens[row].append(token)
            self.done[row] = len(self.tokens[row]) >= self.max_new_tokens
        text = self.tokenizer.decode(self.tokens[row], skip_special_tokens=True)
        answer = cut_at_stop(text, self.stop)
        self.done[row] = self.done[row] or answer != text
        return answer if self.done[row] else None

    def mergeable(self) -> bool:
        """Whether new rows can join the cache (plain growing layers; sliding-window layers cannot be re-aligned)."""
        return self.cache is None or all(type(layer) is DynamicLayer for layer in self.cache.layers)

    def drop_finished(self) -> None:
        """Removes finished rows from the slots and the cache, and cache columns no live row attends to."""
        keep = [row for row, done in enumerate(self.done) if not done]
        if not keep:
            self.index, self.tokens, self.done, self.cache = [], [], [], None
            self.mask = torch.zeros((0, 0), dtype=torch.long)
            return
        self.index = [self.index[row] for row in keep]
        self.tokens = [self.tokens[row] for row in keep]
        self.done = [False] * len(keep)
        rows = torch.tensor(keep, device=self.mask.device)
        first = int(self.mask[rows].any(0).nonzero()[0])
        self.mask = self.mask[rows, first:]
        for layer in self.cache.layers:
            layer.keys, layer.values = layer.keys[rows, :, first:], layer.values[rows, :, first:]

    def add(self, indices: Sequence[int], prompts: Sequence[list[int]], pad_id: int) -> dict[int, str]:
        """Prefills ``prompts`` and joins them to the slots; the answers of rows finished at their first token."""
        ids, mask = pad_rows(prompts, pad_id, model_device(self.model), left=True)
        first, cache = self._forward(ids, mask, None)
        if self.cache is None:
            self.cache, self.mask = cache, mask
        else:
            width = max(self.mask.shape[1], mask.shape[1])
            self.mask = torch.cat([_pad_left(self.mask, width, 1), _pad_left(mask, width, 1)])
            for old, new in zip(self.cache.layers, cache.layers):
                old.keys = torch.cat([_pad_left(old.keys, width, 2), _pad_left(new.keys, width, 2)])
                old.values = torch.cat([_pad_left(old.values, width, 2), _pad_left(new.values, width, 2)])
        start = len(self.index)
        self.index += list(indices)
        self.tokens += [[] for _ in indices]
        self.done += [False] * len(indices)
        return self._finished(range(start, len(self.index)), first.tolist())

    def step(self) -> dict[int, str]:
        """One token for every row (finished rows run on until dropped); the answers of rows that finished."""
        last = torch.tensor([tokens[-1] if tokens else 0 for tokens in self.tokens], device=self.mask.device)[:, None]
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(self.index), 1))], 1)
        tokens, self.cache = self._forward(last, self.mask, self.cache)
        live = [row for row, done in enumerate(self.done) if not done]
        return self._finished(live, tokens[live].tolist())

    def _finished(self, rows: Sequence[int], tokens: Sequence[int]) -> dict[int, str]:
        answers = {}
        for row, token in zip(rows, tokens):
            answer = self._record(row, token)
            if answer is not None:
                answers[self.index[row]] = answer
        return answers


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
    stop : strings that end an answer (``"\\n\\n"``, ``"Question:"``...); a row leaves the batch once it holds one.
    batch_size : rows generated together at most (1 is one row at a time).
    max_length : prompt and answer tokens together at most: a prompt keeps its last ``max_length - max_new_tokens``.
    """
    if batch_size < 1 or max_new_tokens < 1:
        raise ValueError(f"batch_size ({batch_size}) and max_new_tokens ({max_new_tokens}) must be at least 1")
    model.eval()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    room = max(1, max_length - max_new_tokens)
    context = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    encoded = [encode(tokenizer, prompt, "", room)[0] or [context] for prompt in prompts]  # an empty prompt: BOS
    queue = deque(sorted(range(len(prompts)), key=lambda i: -len(encoded[i])))  # alike lengths prefill together
    answers: list[str] = [""] * len(prompts)
    slots = _Slots(model, tokenizer, stop, max_new_tokens)
    with tqdm(total=len(prompts), desc="generate", unit="answer", disable=not progress) as bar:
        while queue or slots.live:
            finished = {}
            refill_at = max(1, batch_size // 4) if queue else 1  # prefill a few rows at once: 2x cheaper per row
            if not slots.live or (slots.mergeable() and len(slots.index) - slots.live >= refill_at):
                slots.drop_finished()
                new = [queue.popleft() for _ in range(min(batch_size - slots.live, len(queue)))]
                finished = slots.add(new, [encoded[i] for i in new], pad_id) if new else {}
            if slots.live:
                finished.update(slots.step())
            for index, answer in finished.items():
                answers[index] = answer
            bar.update(len(finished))
    return answers
