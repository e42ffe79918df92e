"""Scoring a causal LM: label likelihood and held-out perplexity (a task's own metrics: :mod:`.scoring`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


def encode(tokenizer: Any, prompt: str, target: str = "", max_length: int = 128) -> tuple[list[int], list[int]]:
    """Token ids of prompt and target; the prompt is cut from the left so the target always fits."""
    target_ids = tokenizer(target, add_special_tokens=False).input_ids if target else []
    prompt_ids = tokenizer(prompt, add_special_tokens=True).input_ids
    room = max(1, max_length - len(target_ids))
    return prompt_ids[-room:], target_ids[: max_length - 1]


def model_device(model: torch.nn.Module) -> torch.device:
    """Where ``model``'s weights are: its inputs go there (the Trainer moves a model to the GPU when there is one)."""
    return next(model.parameters()).device


def pad_rows(
    rows: Sequence[list[int]], pad_id: int, device: torch.device, *, left: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token id rows padded to one width, on the right (or the left: generation, scores at the end) with their mask."""
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        cols = slice(width - len(row), width) if left else slice(0, len(row))
        ids[i, cols] = torch.tensor(row, dtype=torch.long)
        mask[i, cols] = 1
    return ids.to(device), mask.to(device)


@torch.no_grad()
def continuation_logprobs(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: Sequence[str],
    continuations: Sequence[str],
    *,
    max_length: int = 128,
    batch_size: int = 16,
) -> np.ndarray:
    """The log-probabilities log p(continuation | prompt), an (n_prompts, n_continuations) array."""
    model.eval()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    label_ids = [tokenizer(c, add_special_tokens=False).input_ids for c in continuations]
    if all(len(ids) == 1 for ids in label_ids):  # one forward per prompt, read the next-token distribution
        return _next_token_logprobs(
            model, prompts, [ids[0] for ids in label_ids], tokenizer, pad, max_length, batch_size
        )
    pairs = [
        (i, j, *encode(tokenizer, p, c, max_length)) for i, p in enumerate(prompts) for j, c in enumerate(continuations)
    ]
    out = np.zeros((len(prompts), len(continuations)))
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        ids, mask = pad_rows([pr + tg for _, _, pr, tg in chunk], pad, model_device(model))
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), dim=-1)
        for row, (i, j, pr, tg) in enumerate(chunk):
            positions = torch.arange(len(pr) - 1, len(pr) + len(tg) - 1)
            out[i, j] = float(logp[row, positions.to(logp.device), torch.tensor(tg, device=logp.device)].sum())
    return out


def _next_token_logprobs(
    model: torch.nn.Module,
    prompts: Sequence[str],
    token_ids: list[int],
    tokenizer: Any,
    pad: int,
    max_length: int,
    batch_size: int,
) -> np.ndarray:
    """Next-token log-probabilities of ``token_ids`` after each prompt.

    Prompts are batched by length (less padding) and the LM head runs only at each row's last token
    (``logits_to_keep``): per row the same numbers as a full forward, without the (batch, length, 49k) logits.
    """
    encoded = [encode(tokenizer, p, "", max_length - 1)[0] for p in prompts]
    order = np.argsort([len(e) for e in encoded], kind="stable")
    out = np.zeros((len(prompts), len(token_ids)))
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        ids, mask = pad_rows([encoded[i] for i in rows], pad, model_device(model))
        last = (mask.sum(dim=1) - 1)[:, None]
        logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=last).logits[:, 0].float()
        out[rows] = torch.log_softmax(logits, dim=-1)[:, token_ids].cpu().numpy()
    return out


def classification_scores(
    model: torch.nn.Module, tokenizer: Any, dataset: Any, labels: Sequence[str], **kwargs: Any
) -> np.ndarray:
    """The log-probabilities log p(label word | prompt), an (n_rows, n_labels) array (not normalized over labels)."""
    if len(dataset) == 0:
        return np.zeros((0, len(labels)))
    return continuation_logprobs(model, tokenizer, dataset["prompt"], labels, **kwargs)


def correct_from_scores(scores: np.ndarray, true_labels: Any) -> np.ndarray:
    """Per row, whether the true label has the highest score (a boolean array; the first label wins a tie)."""
    if len(scores) == 0:
        return np.zeros(0, dtype=bool)
    return np.asarray(scores.argmax(axis=1) == np.asarray(true_labels))


def label_logloss(scores: np.ndarray, true_labels: Any) -> np.ndarray:
    """Per row, -log p(true label | prompt) in nats, p normalized over the task's label words.

    ``scores`` are the label words' log-probabilities (:func:`classification_scores`); the normalized probability is
    their softmax over the label words, so the loss is ``logsumexp(row) - row[true]``: 0 for a row that puts all the
    label words' mass on the true one, log(n_labels) for one that cannot tell them apart.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if len(scores) == 0:
        return np.zeros(0)
    top = scores.max(axis=1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)  # a row of -inf scores stays -inf, not nan, below
    logsumexp = top[:, 0] + np.log(np.exp(scores - top).sum(axis=1))
    return np.asarray(logsumexp - scores[np.arange(len(scores)), np.asarray(true_labels, dtype=int)])


def mean_logloss(scores: np.ndarray, true_labels: Any) -> float:
    """Mean over rows of :func:`label_logloss`: a smooth validation criterion beside accuracy; NaN for no rows."""
    losses = label_logloss(scores, true_labels)
    return float(losses.mean()) if losses.size else float("nan")


def classification_correct(
    model: torch.nn.Module, tokenizer: Any, dataset: Any, labels: Sequence[str], **kwargs: Any
) -> np.ndarray:
    """Per row, whether the true label word is the most likely continuation (a boolean array, for paired tests)."""
    if len(dataset) == 0:
        return np.zeros(0, dtype=bool)
    return correct_from_scores(classification_scores(model, tokenizer, dataset, labels, **kwargs), dataset["label"])


def classification_accuracy(
    model: torch.nn.Module, tokenizer: Any, dataset: Any, labels: Sequence[str], **kwargs: Any
) -> float:
    """Share of rows whose true label word is the most likely continuation."""
    correct = classification_correct(model, tokenizer, dataset, labels, **kwargs)
    return float(correct.mean()) if correct.size else float("nan")


@dataclass(frozen=True)
class PerplexityProbe:
    """The perplexity probe's result: the perplexity and, per text (in the texts' order), its own share of it.

    ``perplexity == exp(sum(text_nll * text_tokens) / sum(text_tokens))`` up to float32 rounding: the token-weighted
    mean of the per-text NLLs (the perplexity itself is summed batch by batch, exactly as :func:`perplexity` does).
    """

    perplexity: float
    #: mean token negative log-likelihood (nats) of each text; NaN for a text of one token (nothing predicted)
    text_nll: list[float]
    #: tokens predicted in each text (its tokens after truncation to ``max_length``, less the first)
    text_tokens: list[int]


@torch.no_grad()
def perplexity_probe(
    model: torch.nn.Module, tokenizer: Any, texts: Sequence[str], *, max_length: int = 128, batch_size: int = 8
) -> PerplexityProbe:
    """exp(mean token negative log-likelihood) over ``texts``, with each text's mean token NLL (for paired tests)."""
    model.eval()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    total_nll, total_tokens = 0.0, 0
    text_nll: list[float] = []
    text_tokens: list[int] = []
    encoded = [tokenizer(t, add_special_tokens=True).input_ids[:max_length] for t in texts]
    for start in range(0, len(encoded), batch_size):
        ids, mask = pad_rows(encoded[start : start + batch_size], pad, model_device(model))
        labels = ids.masked_fill(mask == 0, -100)
        logits = model(input_ids=ids, attention_mask=mask).logits.float()
        flat_logits, flat_labels = logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1)
        loss = torch.nn.functional.cross_entropy(flat_logits, flat_labels, ignore_index=-100, reduction="sum")
        total_nll += float(loss)
        total_tokens += int((labels[:, 1:] != -100).sum())
        per_token = torch.nn.functional.cross_entropy(flat_logits, flat_labels, ignore_index=-100, reduction="none")
        per_row = per_token.view(ids.size(0), ids.size(1) - 1).double().sum(dim=1)  # ignored: 0
        counts = (labels[:, 1:] != -100).sum(dim=1)
        text_tokens.extend(int(c) for c in counts)
        text_nll.extend(float(s) / int(c) if int(c) else float("nan") for s, c in zip(per_row, counts))
    return PerplexityProbe(math.exp(total_nll / max(1, total_tokens)), text_nll, text_tokens)


def perplexity(
    model: torch.nn.Module, tokenizer: Any, texts: Sequence[str], *, max_length: int = 128, batch_size: int = 8
) -> float:
    """exp(mean token negative log-likelihood) over ``texts``: the forgetting probe on general text."""
    return perplexity_probe(model, tokenizer, texts, max_length=max_length, batch_size=batch_size).perplexity


def accuracy(correct: Any) -> float:
    """Mean of per-example correctness; NaN for no examples."""
    return float(correct.mean()) if len(correct) else float("nan")
