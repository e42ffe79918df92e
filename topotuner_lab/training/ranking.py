"""Reranking a first-stage candidate list by query likelihood, and its per-query nDCG@10 / MRR@10.

A causal LM scores each candidate document of a query by log p(target(query) | prompt(document))
(:func:`rerank_scores`); the documents are ranked by that score, and the ranking is scored against the query's full
judgements (:func:`ranking_example_scores`). Rows are those of :func:`topotuner_lab.tasks.retrieval.ranking_rows`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from topotuner_lab.tasks.metrics import ranking_scores
from topotuner_lab.training.evaluation import model_device, pad_rows

__all__ = ["ranking_example_scores", "rerank_scores"]


def _token_ids(tokenizer: Any, texts: Sequence[str], add_special_tokens: bool) -> list[list[int]]:
    """The token ids of each text (one batched tokenizer call per 1,024 texts)."""
    out: list[list[int]] = []
    for start in range(0, len(texts), 1024):
        chunk = list(texts[start : start + 1024])
        out.extend(list(ids) for ids in tokenizer(chunk, add_special_tokens=add_special_tokens).input_ids)
    return out


@torch.no_grad()
def rerank_scores(
    model: torch.nn.Module,
    tokenizer: Any,
    rows: Sequence[Mapping[str, Any]],
    doc_to_prompt: Callable[[Mapping[str, str]], str],
    query_to_target: Callable[[str], str],
    *,
    max_length: int = 256,
    batch_size: int = 16,
    progress: bool = False,
) -> list[dict[str, float]]:
    r"""Per row, candidate document id -> log p(query_to_target(query) | doc_to_prompt(document)) (query likelihood).

    Parameters
    ----------
    model, tokenizer : a causal LM and its tokenizer.
    rows : ranking rows (``query`` and ``candidates``, a list of ``{"id", "title", "text"}``).
    doc_to_prompt : a candidate's prompt, e.g. ``lambda d: f"Document: {d['title']}. {d['text']}\nQuery:"``.
    query_to_target : the scored continuation, e.g. ``lambda q: " " + q``.
    max_length : prompt and target tokens together at most; the prompt is cut from the left so the target always
        fits (as :func:`topotuner_lab.training.evaluation.encode` does), the target to ``max_length - 1`` tokens.
    batch_size : (document, query) pairs per forward pass.
    progress : show a tqdm bar over the batches.

    Every row's target is tokenized once and every distinct prompt once, whatever the number of rows naming it. The
    pairs of all rows are sorted by length and run in left-padded batches (explicit position ids, so a row's numbers
    are its unpadded forward's up to float rounding); the LM head runs only at the last ``target + 1`` positions
    (``logits_to_keep``), never over the whole document. The numbers equal
    :func:`~topotuner_lab.training.evaluation.continuation_logprobs` of each prompt and its row's target (tested).
    """
    model.eval()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    device = model_device(model)
    targets = [query_to_target(str(row["query"])) for row in rows]
    target_ids = [ids if text else [] for ids, text in zip(_token_ids(tokenizer, targets, False), targets)]
    prompts = [[doc_to_prompt(doc) for doc in row["candidates"]] for row in rows]
    distinct = list(dict.fromkeys(p for row_prompts in prompts for p in row_prompts))
    prompt_ids = dict(zip(distinct, _token_ids(tokenizer, distinct, True)))

    out: list[dict[str, float]] = [{} for _ in rows]
    pairs: list[tuple[int, str, list[int], list[int]]] = []  # (row, doc id, prompt ids, target ids)
    for r, (row, row_prompts) in enumerate(zip(rows, prompts)):
        full = target_ids[r]
        target = full[: max_length - 1]
        room = max(1, max_length - len(full))
        for doc, prompt in zip(row["candidates"], row_prompts):
            out[r][str(doc["id"])] = 0.0  # the candidates' order; an empty target scores log 1 = 0
            if target:
                pairs.append((r, str(doc["id"]), prompt_ids[prompt][-room:], target))
    pairs.sort(key=lambda pair: -(len(pair[2]) + len(pair[3])))  # long batches first: an OOM shows at once
    starts = range(0, len(pairs), batch_size)
    for start in tqdm(starts, desc="rerank", unit="batch", disable=not progress):
        chunk = pairs[start : start + batch_size]
        ids, mask = pad_rows([p + t for _, _, p, t in chunk], pad, device, left=True)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)  # counted from each row's first token
        longest = max(len(t) for _, _, _, t in chunk)
        logits = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            logits_to_keep=longest + 1,
        ).logits[:, -longest - 1 : -1]
        logp = torch.log_softmax(logits.float(), dim=-1)
        tokens = ids[:, -longest:]
        token_logp = logp.gather(-1, tokens[..., None])[..., 0]  # (batch, longest): every row ends in its target
        lengths = torch.tensor([len(t) for _, _, _, t in chunk], device=device)
        in_target = torch.arange(longest, device=device)[None, :] >= (longest - lengths)[:, None]
        sums = torch.where(in_target, token_logp, torch.zeros_like(token_logp)).sum(dim=1).double().cpu().numpy()
        for (r, doc_id, _, _), value in zip(chunk, sums):
            out[r][doc_id] = float(value)
    return out


def ranking_example_scores(
    rows: Sequence[Mapping[str, Any]],
    run: Sequence[Mapping[str, float]] | Mapping[str, Mapping[str, float]],
    cutoff: int = 10,
) -> dict[str, np.ndarray]:
    """Per row (in the rows' order), ``ndcg@{cutoff}`` and ``mrr@{cutoff}`` of ranking its documents by ``run``.

    ``run`` is, per row, document id -> score (higher ranks first), as :func:`rerank_scores` returns it, or a mapping
    query id -> document id -> score. The judgements are each row's ``qrels`` (all of them: a relevant document the
    first stage missed still counts in the ideal ranking). A row whose query has no relevant document in its qrels,
    and a row with no scored document, scores 0.0 on both (ir-measures leaves such queries out). Rows are scored
    under their position, so two rows of the same query id are scored each on its own.
    """
    per_row = [run.get(str(row["query_id"]), {}) for row in rows] if isinstance(run, Mapping) else list(run)
    if len(per_row) != len(rows):
        raise ValueError(f"{len(per_row)} scored rankings for {len(rows)} rows: give one per row")
    names = (f"ndcg@{cutoff}", f"mrr@{cutoff}")
    out = {name: np.zeros(len(rows)) for name in names}
    qrels = {str(i): {str(d): int(rel) for d, rel in row["qrels"].items()} for i, row in enumerate(rows)}
    ranked = {str(i): {str(d): float(s) for d, s in docs.items()} for i, docs in enumerate(per_row) if docs}
    if not ranked:
        return out
    table = ranking_scores(ranked, qrels, cutoff=cutoff)
    for _, record in table.iterrows():
        for name in names:
            out[name][int(record["query"])] = float(record[name])
    return out
