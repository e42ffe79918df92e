"""Greedy generation throughput on SmolLM2-135M: one row at a time against 16 rows at a time (continuous batching:
a finished row leaves the KV cache and the next prompts join it), on the same prompts, both in this process after a
warm-up. Target: >= 4x at batch 16.

Three workloads: GSM8K and DialogSum with their task's own stop strings and token budget, and GSM8K with no stop
string and at most 32 new tokens (rows end at 32 tokens or at the model's end-of-text token). Throughput counts the
answer tokens kept after the stop cut (useful tokens per second). The answers of both runs are compared: batching
must not change a greedy answer. The 1-minute load average before the runs is printed: other jobs on the machine
slow the one-row runs most and inflate the ratio.

python benchmarks/bench_generation.py
"""

from __future__ import annotations

import os
import statistics
import time

from common import publish, table

PROMPTS = 64  # as many test rows as the families preset scores per task
BATCH = 16
#: (label, task, whether the task's stop strings and token budget apply: else none and at most NO_STOP_TOKENS)
WORKLOADS = (("gsm8k", "gsm8k", True), ("dialogsum", "dialogsum", True), ("gsm8k, no stop string", "gsm8k", False))
NO_STOP_TOKENS = 32


def main() -> None:
    from topotuner_lab.tasks.loading import load_task
    from topotuner_lab.tasks.registry import get_task
    from topotuner_lab.training.generation import generate
    from topotuner_lab.weights.models import load_model

    loaded = load_model()
    tokens = lambda answer: len(loaded.tokenizer(answer, add_special_tokens=False)["input_ids"])  # noqa: E731
    generate(loaded.model, loaded.tokenizer, ["Warm up"] * 2, max_new_tokens=4, batch_size=2)
    load = os.getloadavg()[0]
    rows, notes = [], []
    for label, task, own_stops in WORKLOADS:
        spec, prompts = get_task(task), list(load_task(task, "test", PROMPTS, 0)["prompt"])
        stop, new = (spec.until, spec.max_gen_toks) if own_stops else ((), NO_STOP_TOKENS)
        answers = {}
        for batch in (1, BATCH):
            start = time.perf_counter()
            answers[batch] = generate(
                loaded.model,
                loaded.tokenizer,
                prompts,
                max_new_tokens=new,
                stop=stop,
                batch_size=batch,
                max_length=192 + new,
            )
            seconds = time.perf_counter() - start
            kept = sum(tokens(a) for a in answers[batch])
            rows.append(
                {
                    "workload": label,
                    "batch": batch,
                    "prompts": PROMPTS,
                    "seconds": seconds,
                    "answer tokens per s": kept / seconds,
                }
            )
        rows[-1]["speed-up"] = rows[-2]["seconds"] / rows[-1]["seconds"]
        lengths = [tokens(a) for a in answers[1]]
        same = sum(a == b for a, b in zip(answers[1], answers[BATCH]))
        notes.append(
            f"- {label}: stop at {list(stop)!r}, at most {new} new tokens; answer tokens median "
            f"{statistics.median(lengths):g}, max {max(lengths)}; batched answers equal to one-at-a-time answers: "
            f"{same} of {PROMPTS}."
        )
    markdown = (
        f"{PROMPTS} test prompts per task, greedy; SmolLM2-135M on the CPU; 1-minute load average before the runs "
        f"{load:.2f}. Prefill costs about 2x less per row in groups, decoding about 8x less per row at 16 rows; once "
        "the queue is empty the last long answers run with few rows beside them, which bounds the speed-up.\n\n"
        + table(rows)
        + "\n"
        + "\n".join(notes)
        + "\n"
    )
    publish("generation", markdown, {"rows": rows, "notes": notes})
    print(markdown)


if __name__ == "__main__":
    main()
