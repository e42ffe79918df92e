"""Scoring a causal LM: option likelihood and held-out perplexity (a task's own metrics: :mod:`.scoring`).

Multiple choice follows lm-evaluation-harness (0.4.13): each option is scored by the summed log-probability of its
tokens after the prompt (:func:`option_logprobs`; the prompt and option split as lm-eval splits them,
:func:`encode_pair`), and :func:`choice_metrics` gives its ``acc``, ``acc_norm`` and ``acc_bytes``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from tqdm.auto import tqdm


def _fit(prompt_ids: list[int], target_ids: list[int], max_length: int) -> tuple[list[int], list[int]]:
    """Prompt and target ids within ``max_length`` tokens: the prompt cut from the left so the target always fits."""
    room = max(1, max_length - len(target_ids))
    return prompt_ids[-room:], target_ids[: max_length - 1]


def encode(tokenizer: Any, prompt: str, target: str = "", max_length: int = 128) -> tuple[list[int], list[int]]:
    """Token ids of prompt and target; the prompt is cut from the left so the target always fits."""
    target_ids = tokenizer(target, add_special_tokens=False).input_ids if target else []
    return _fit(tokenizer(prompt, add_special_tokens=True).input_ids, target_ids, max_length)


def encode_pair(tokenizer: Any, prompt: str, continuation: str) -> tuple[list[int], list[int]]:
    """Token ids of a prompt and a scored continuation, split as lm-evaluation-harness splits them.

    The prompt's trailing whitespace moves to the continuation; prompt + continuation is tokenized whole and the
    continuation is what follows the prompt's own tokens, so a token that would merge across the boundary is scored
    as the text really tokenizes. An empty prompt is the BOS (else EOS) token, as lm-eval's prefix token.
    """
    spaces = len(prompt) - len(prompt.rstrip())
    if spaces:
        prompt, continuation = prompt[:-spaces], prompt[-spaces:] + continuation
    prompt_ids = tokenizer(prompt, add_special_tokens=True).input_ids if prompt else []
    if not prompt_ids:
        prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        return [prefix], tokenizer(continuation, add_special_tokens=False).input_ids
    whole = tokenizer(prompt + continuation, add_special_tokens=True).input_ids
    return prompt_ids, whole[len(prompt_ids) :]


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


def _pad_id(tokenizer: Any) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


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
    return option_logprobs(
        model, tokenizer, prompts, [continuations] * len(prompts), max_length=max_length, batch_size=batch_size
    )


@torch.no_grad()
def option_logprobs(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: Sequence[str],
    options: Sequence[Sequence[str]],
    *,
    max_length: int = 128,
    batch_size: int = 16,
    progress: bool = False,
) -> np.ndarray:
    """Per row, log p(option | prompt) of each of the row's own options: an (n_rows, most options) array.

    ``options`` are the scored continuations (the target delimiter included), one sequence per prompt; a row with
    fewer options than the most is padded with ``-inf``. When every option is one token, one forward per prompt reads
    the next-token distribution; otherwise each (prompt, option) pair, split by :func:`encode_pair` and cut to
    ``max_length`` tokens from the left, is scored by :func:`pair_logprobs`.
    """
    model.eval()
    pad = _pad_id(tokenizer)
    out = np.full((len(prompts), max((len(row) for row in options), default=0)), -np.inf)
    distinct = list(dict.fromkeys(c for row in options for c in row))
    alone = dict(zip(distinct, tokenizer(distinct, add_special_tokens=False).input_ids)) if distinct else {}
    if alone and all(len(ids) == 1 for ids in alone.values()):
        ids = [[alone[c][0] for c in row] for row in options]
        _next_token_logprobs(model, prompts, ids, tokenizer, pad, max_length, batch_size, out)
        return out
    cells = [(i, j) for i, row in enumerate(options) for j in range(len(row))]
    pairs = [_fit(*encode_pair(tokenizer, prompts[i], options[i][j]), max_length) for i, j in cells]
    if cells:
        rows, cols = zip(*cells)
        out[list(rows), list(cols)] = pair_logprobs(model, pairs, pad, batch_size=batch_size, progress=progress)
    return out


@torch.no_grad()
def pair_logprobs(
    model: torch.nn.Module,
    pairs: Sequence[tuple[list[int], list[int]]],
    pad: int,
    *,
    batch_size: int = 16,
    progress: bool = False,
) -> np.ndarray:
    """Per (prompt ids, target ids) pair, the summed log p(target | prompt) (float64; an empty target scores 0).

    Pairs run longest first in left-padded batches with position ids counted from each row's first token, so a row's
    numbers are its unpadded forward's up to float rounding; the LM head runs only at the target positions
    (``logits_to_keep``), never over the whole prompt.
    """
    out = np.zeros(len(pairs))
    device = model_device(model)
    order = sorted((i for i, (_, t) in enumerate(pairs) if t), key=lambda i: -sum(map(len, pairs[i])))
    for start in tqdm(range(0, len(order), batch_size), desc="options", unit="batch", disable=not progress):
        chunk = order[start : start + batch_size]
        ids, mask = pad_rows([pairs[i][0] + pairs[i][1] for i in chunk], pad, device, left=True)
        lengths = torch.tensor([len(pairs[i][1]) for i in chunk], device=device)
        longest = int(lengths.max())
        logits = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=(mask.cumsum(dim=1) - 1).clamp(min=0),
            logits_to_keep=longest + 1,
        ).logits[:, -longest - 1 : -1]
        token_logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, -longest:, None])[..., 0]
        in_target = torch.arange(longest, device=device)[None, :] >= (longest - lengths)[:, None]
        out[chunk] = torch.where(in_target, token_logp, 0.0).double().sum(dim=1).cpu().numpy()
    return out


def _next_token_logprobs(
    model: torch.nn.Module,
    prompts: Sequence[str],
    token_ids: Sequence[Sequence[int]],
    tokenizer: Any,
    pad: int,
    max_length: int,
    batch_size: int,
    out: np.ndarray,
) -> None:
    """Into ``out``, each row's next-token log-probabilities of its ``token_ids`` after its prompt.

    Prompts are batched by length (less padding) and the LM head runs only at each row's last token
    (``logits_to_keep``): per row the same numbers as a full forward, without the (batch, length, 49k) logits.
    """
    encoded = [encode(tokenizer, p, "", max_length - 1)[0] for p in prompts]
    order = np.argsort([len(e) for e in encoded], kind="stable")
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        ids, mask = pad_rows([encoded[i] for i in rows], pad, model_device(model))
        last = (mask.sum(dim=1) - 1)[:, None]
        logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=last).logits[:, 0].float()
        logp = torch.log_softmax(logits, dim=-1).cpu().numpy()
        for k, i in enumerate(rows):
            out[i, : len(token_ids[i])] = logp[k, list(token_ids[i])]


def classification_scores(
    model: torch.nn.Module, tokenizer: Any, dataset: Any, labels: Sequence[str] | Sequence[Sequence[str]], **kwargs: Any
) -> np.ndarray:
    """The log-probabilities log p(label | prompt), an (n_rows, n_labels) array (not normalized over labels).

    ``labels``: the continuations scored after every row's prompt, or one sequence per row (each row's own options,
    padded with ``-inf`` to the most); ``kwargs`` go to :func:`option_logprobs`.
    """
    fixed = not labels or isinstance(labels[0], str)
    if len(dataset) == 0:
        return np.zeros((0, len(labels) if fixed else 0))
    per_row = [cast("Sequence[str]", labels)] * len(dataset) if fixed else labels
    return option_logprobs(model, tokenizer, dataset["prompt"], per_row, **kwargs)


def correct_from_scores(scores: np.ndarray, true_labels: Any) -> np.ndarray:
    """Per row, whether the true label has the highest score (a boolean array; the first label wins a tie)."""
    if len(scores) == 0:
        return np.zeros(0, dtype=bool)
    return np.asarray(scores.argmax(axis=1) == np.asarray(true_labels))


def choice_metrics(scores: np.ndarray, options: Sequence[Sequence[str]], true_labels: Any) -> dict[str, np.ndarray]:
    """Per row, lm-evaluation-harness's multiple-choice metrics from the options' scores.

    ``scores`` are the options' log-probabilities (:func:`option_logprobs`), ``options`` their texts without the
    target delimiter. ``acc``: the true option scores highest; ``acc_norm``: highest per character of its text (lm-eval
    0.4.13's ``len(text)``, though its docs say bytes); ``acc_bytes``: highest per UTF-8 byte. The first option wins a
    tie, as numpy's (and lm-eval's) argmax.
    """
    chars, size = np.ones(scores.shape), np.ones(scores.shape)  # padding cells score -inf whatever their length
    for i, row in enumerate(options):
        chars[i, : len(row)] = [len(text) for text in row]
        size[i, : len(row)] = [len(text.encode("utf-8")) for text in row]
    return {
        "acc": correct_from_scores(scores, true_labels),
        "acc_norm": correct_from_scores(scores / chars, true_labels),
        "acc_bytes": correct_from_scores(scores / size, true_labels),
    }


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
    pad = _pad_id(tokenizer)
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
