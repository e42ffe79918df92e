"""The pretrained model's scores: scored (cold, written to the cache) against read back from the disk cache.

Every fine-tune of a study scores the pretrained model on its test rows and on the forgetting battery; with
``training.score_cache`` a later worker or sitting reads those scores instead. Cold = ``cached_scores`` with an empty
cache folder (scoring plus the write); cached = the same call once the entry exists (digest of the weights, then the
verified read; median of 5, the weights digest computed again each time, as in a new process). The per-row values of
both must be identical. SmolLM2-135M at one torch thread, as a study's worker runs. The 1-minute load average before
the runs is printed: other jobs on the machine slow the cold scoring.

python benchmarks/bench_score_cache.py
"""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np
from common import median_time, publish, table

#: (task, test rows, prompt length): the two label-likelihood targets of the grid presets
WORKLOADS = (("sst2", 200, 64), ("mmlu-text", 40, 160))


def main() -> None:
    import torch

    from topotuner_lab.tasks.loading import load_task
    from topotuner_lab.training import score_cache
    from topotuner_lab.training.scoring import TaskScorer
    from topotuner_lab.weights.models import load_model

    torch.set_num_threads(1)
    loaded = load_model()
    load = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        os.environ["TOPOTUNER_CACHE"] = folder
        for task, n, length in WORKLOADS:
            scorer, data = TaskScorer(task, loaded.tokenizer, length), load_task(task, "test", n, 0)
            start = time.perf_counter()
            cold = score_cache.cached_scores(loaded.model, scorer, data)
            cold_s = time.perf_counter() - start

            def cached() -> score_cache.ExampleScores:
                score_cache._MODEL_DIGESTS.clear()  # as a new process: the weights are digested again
                return score_cache.cached_scores(loaded.model, scorer, data)

            cached_s, again = median_time(cached, repeats=5)
            same = all(np.array_equal(np.asarray(cold[k]), np.asarray(again[k])) for k in cold)
            rows.append(
                {
                    "task": task,
                    "rows": len(data),
                    "tokens": length,
                    "cold_s": cold_s,
                    "cached_s": cached_s,
                    "cold/cached": cold_s / cached_s,
                    "identical": same,
                }
            )
            print(rows[-1], flush=True)
    markdown = (
        "### Pretrained scores: scored and cached against read from the cache\n\n"
        f"SmolLM2-135M, one torch thread; load average before the runs {load:.2f}. `cached_s` is the median of 5 "
        "reads, each digesting the weights again (a new process's cost); `identical`: every per-row value read back "
        "equals the scored one.\n\n" + table(rows)
    )
    publish("score_cache", markdown, {"load_average": load, "rows": rows})


if __name__ == "__main__":
    main()
