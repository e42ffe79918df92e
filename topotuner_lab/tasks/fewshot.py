"""Few-shot prompts (lm-evaluation-harness's ``num_fewshot``): solved examples put before each scored prompt.

Each scored row gets ``k`` examples of the spec's ``fewshot_split`` (default ``train``; the training task's rows for
a ``train_task`` spec), each its prompt, its target (``target_delimiter`` and the answer: the gold option's text for
multiple choice) and ``fewshot_delimiter``, as lm-eval's ``fewshot_context`` writes them. The examples are drawn as
lm-eval's default sampler draws them: one ``random.Random(FEWSHOT_SEED)`` (lm-eval's default few-shot seed), and
``k`` distinct examples sampled from the pool per scored row, in the rows' order. The pool is the split in file order
when it holds at most :data:`FEWSHOT_POOL` rows (then the prompts are lm-eval's), else a fixed draw of that many rows
(so a large split is never rendered whole); a pool row that is also a scored row (same prompt and target: a
``fewshot_split`` that is the scored split, validation carved from the training rows) is left out, so no row is
shown its own answer. ``k`` 0 leaves the rows as they are.
"""

from __future__ import annotations

import os
import random
from typing import Any

from topotuner_lab._io.config import is_int
from topotuner_lab._io.errors import TaskError
from topotuner_lab.tasks.loading import load_task
from topotuner_lab.tasks.registry import get_task
from topotuner_lab.tasks.schema import TaskSpec

__all__ = ["FEWSHOT_POOL", "FEWSHOT_SEED", "fewshot_count", "fewshot_split", "with_fewshot"]

#: the seed of the few-shot draw: lm-evaluation-harness's default ``fewshot_random_seed``
FEWSHOT_SEED = 1234
#: the most rows of the few-shot split examples are drawn from (a larger split: a fixed draw of this many)
FEWSHOT_POOL = 1024


def fewshot_count(task: str | os.PathLike[str] | TaskSpec, num_fewshot: int | None = None) -> int:
    """The examples per prompt: ``num_fewshot`` where given (``--num-fewshot``), else the spec's ``num_fewshot``.

    A value that is not a whole number >= 0, or few-shot on a ranking task, is a :class:`TaskError`.
    """
    spec = get_task(task)
    k = spec.num_fewshot if num_fewshot is None else num_fewshot
    if not is_int(k) or k < 0:
        raise TaskError(
            f"num_fewshot={k!r} for task {spec.task!r} is not a whole number >= 0",
            "give --num-fewshot 0 (zero-shot) or more",
        )
    if k and spec.output_type == "ranking":
        raise TaskError(
            f"num_fewshot={k} for ranking task {spec.task!r}: a ranking prompt is each candidate document",
            "give --num-fewshot 0 for a ranking task",
        )
    return int(k)


def fewshot_split(task: str | os.PathLike[str] | TaskSpec) -> str:
    """The split ``task``'s few-shot examples come from: its ``fewshot_split``, else ``train``."""
    return get_task(task).fewshot_split or "train"


def _pool(spec: TaskSpec, source: str | os.PathLike[str] | None) -> list[tuple[str, str]]:
    """The (prompt, target) pairs of the few-shot split: all of them in file order, or a fixed draw of the pool size."""
    rows = load_task(spec, fewshot_split(spec), FEWSHOT_POOL, FEWSHOT_SEED, source)
    return list(zip(rows["prompt"], rows["target"]))


def with_fewshot(
    rows: Any,
    task: str | os.PathLike[str] | TaskSpec,
    num_fewshot: int | None = None,
    source: str | os.PathLike[str] | None = None,
) -> Any:
    """``rows`` (``load_task``'s) with ``k`` solved examples before each prompt; ``rows`` itself when ``k`` is 0.

    ``k`` is :func:`fewshot_count`'s; ``source`` is where ``load_task`` reads rows. More examples than the split holds
    (less the scored rows) is a :class:`TaskError` naming the split and the most that can be given.
    """
    spec = get_task(task)
    k = fewshot_count(spec, num_fewshot)
    if rows is None or k == 0:
        return rows
    scored = set(zip(rows["prompt"], rows["target"]))
    pool = [example for example in _pool(spec, source) if example not in scored]
    if k > len(pool):
        split = fewshot_split(spec)
        raise TaskError(
            f"num_fewshot={k} for task {spec.task!r}, and its {split} split holds {len(pool)} example(s) that are "
            "not scored rows",
            f"give --num-fewshot {len(pool)} or fewer (num_fewshot in the spec), or point fewshot_split at a split "
            "with more rows",
        )
    draw = random.Random(FEWSHOT_SEED)
    contexts = [
        "".join(prompt + target + spec.fewshot_delimiter for prompt, target in draw.sample(pool, k))
        for _ in range(len(rows))
    ]
    return rows.map(lambda row, i: {"prompt": contexts[i] + row["prompt"]}, with_indices=True)
