"""The pretrained model's per-example scores on disk, keyed by everything that determines them.

Every fine-tune scores the pretrained model on its test rows and forgetting battery (zero-shot, and forgetting's
reference point). Within a process that is done once (:mod:`topotuner_lab.training.baseline`); across processes
(a study's Dask workers, its later sittings) this cache shares it. On a slow CPU that is a large share of a run:
zero-shot MMLU (1,000 questions, four options each) took 45 minutes at one thread on a 2.0 GHz EPYC.

An entry is keyed by a digest of the model's weights, the task's spec, the prompt length, the tokenizer, the rows'
content and :data:`SCORES_VERSION`; it stores that key and a checksum of its scores, and one that does not verify
(another key, a damaged or truncated file, another row count) is recomputed and rewritten, never trusted. The folder
is ``scores`` under ``$TOPOTUNER_CACHE`` (default ``~/.cache/topotuner_lab``); ``TOPOTUNER_SCORE_CACHE=off`` keeps
nothing.
"""

from __future__ import annotations

import hashlib
import os
import warnings
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import torch

from topotuner_lab._io import atomic
from topotuner_lab._io.errors import InputFileError
from topotuner_lab._io.json_files import json_digest, read_json
from topotuner_lab._io.paths import cache_dir
from topotuner_lab.tasks.metrics import ExampleScores
from topotuner_lab.training.scoring import TaskScorer

#: bump when the scoring code changes what it returns for the same model, task and rows
SCORES_VERSION = 1
#: ``$TOPOTUNER_SCORE_CACHE`` set to this turns the cache off
OFF = "off"

_MODEL_DIGESTS: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()


def model_digest(model: torch.nn.Module) -> str:
    """A blake2b-128 digest of every parameter and buffer (name, dtype, shape, bytes), once per model object.

    The pretrained model is never changed in place (runs train a copy), so its digest is computed once.
    """
    if model not in _MODEL_DIGESTS:
        digest = hashlib.blake2b(digest_size=16)
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            data = tensor.detach().cpu().contiguous()
            digest.update(f"{name}:{data.dtype}:{tuple(data.shape)}".encode())
            digest.update(data.reshape(-1).view(torch.uint8).numpy().tobytes())  # reshape: 0-dim buffers view too
        _MODEL_DIGESTS[model] = digest.hexdigest()
    return _MODEL_DIGESTS[model]


def scores_key(model: torch.nn.Module, scorer: TaskScorer, rows: Any) -> str:
    """The key of ``scorer``'s scores of ``model`` on ``rows`` (a dataset or list of row dicts)."""
    tokenizer = scorer.tokenizer
    return json_digest(
        {
            "version": SCORES_VERSION,
            "model": model_digest(model),
            "spec": scorer.spec.to_dict(),
            "max_length": scorer.max_length,
            "limits": scorer.limits.to_dict(),
            "tokenizer": [getattr(tokenizer, "name_or_path", ""), len(tokenizer)],
            "rows": json_digest(list(rows)),
        }
    )


def cache_folder() -> Path | None:
    """Where entries live, or None when ``$TOPOTUNER_SCORE_CACHE`` is ``off``."""
    setting = os.environ.get("TOPOTUNER_SCORE_CACHE", "")
    if setting == OFF:
        return None
    return Path(setting) if setting else cache_dir() / "scores"


def _checksum(scores: dict[str, list[float]], dtypes: dict[str, str]) -> str:
    return json_digest([dtypes, {name: [float(v).hex() for v in values] for name, values in scores.items()}])


def _read(path: Path, key: str, rows: int) -> ExampleScores | None:
    """The entry's scores if it holds ``key``'s, every metric with ``rows`` values and a matching checksum."""
    try:
        entry = read_json(path, "score cache entry", "it is recomputed")
    except InputFileError:
        return None
    scores, dtypes = entry.get("scores"), entry.get("dtypes")
    if entry.get("key") != key or not isinstance(scores, dict) or not isinstance(dtypes, dict):
        return None
    if set(dtypes) != set(scores) or any(not isinstance(v, list) or len(v) != rows for v in scores.values()):
        return None
    if entry.get("checksum") != _checksum(scores, dtypes):
        return None
    return {name: np.asarray(values, dtype=dtypes[name]) for name, values in scores.items()}


def cached_scores(model: torch.nn.Module, scorer: TaskScorer, rows: Any) -> ExampleScores:
    """``scorer.score_all(model, rows)``, or the verified entry an earlier process stored of it.

    Scores of another kind than numbers are computed, not kept; a folder that cannot be written only means the
    scores are not kept (with a warning): they are still returned.
    """
    folder = cache_folder()
    if folder is None or len(rows) == 0:
        return scorer.score_all(model, rows)
    key = scores_key(model, scorer, rows)
    path = folder / key[:2] / f"{key}.json"
    if path.is_file() and (stored := _read(path, key, len(rows))) is not None:
        return stored
    scores = scorer.score_all(model, rows)
    arrays = {name: np.asarray(values) for name, values in scores.items()}
    if any(a.dtype.kind not in "biuf" for a in arrays.values()):  # only numbers round-trip exactly
        return scores
    plain = {name: [float(v) for v in a] for name, a in arrays.items()}
    dtypes = {name: a.dtype.str for name, a in arrays.items()}
    try:
        atomic.write_json(path, {"key": key, "dtypes": dtypes, "checksum": _checksum(plain, dtypes), "scores": plain})
    except OSError as exc:
        warnings.warn(
            f"the score cache {folder} cannot be written ({exc}): the scores are not kept for other processes; "
            "set TOPOTUNER_SCORE_CACHE to a writable folder, or to off",
            stacklevel=2,
        )
    return scores
