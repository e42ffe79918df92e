"""Greedy generation throughput on SmolLM2-135M: one row at a time against batches of 16 (left padding, KV cache),
on the same GSM8K test prompts, both in this process after a warm-up. Target (issue 20): >= 4x at batch 16.

The answers of both runs are compared: batching must not change a greedy answer.

python benchmarks/bench_generation.py
"""

from __future__ import annotations

import time

from common import publish, table

PROMPTS = 32
NEW_TOKENS = 64
STOP = ["\n\nQuestion:"]


def main() -> None:
    from topotuner_lab.tasks.specs import load_task
    from topotuner_lab.training.generation import generate
    from topotuner_lab.weights.models import load_model

    loaded = load_model()
    prompts = list(load_task("gsm8k", "test", PROMPTS, 0)["prompt"])
    run = lambda batch: generate(  # noqa: E731
        loaded.model, loaded.tokenizer, prompts, max_new_tokens=NEW_TOKENS, batch_size=batch, stop=STOP
    )
    generate(loaded.model, loaded.tokenizer, prompts[:2], max_new_tokens=4, batch_size=2)  # warm-up
    rows, answers = [], {}
    for batch in (1, 16):
        start = time.perf_counter()
        answers[batch] = run(batch)
        seconds = time.perf_counter() - start
        rows.append({"batch": batch, "prompts": PROMPTS, "seconds": seconds, "prompts per s": PROMPTS / seconds})
    rows[1]["speed-up"] = rows[0]["seconds"] / rows[1]["seconds"]
    same = sum(a == b for a, b in zip(answers[1], answers[16]))
    markdown = (
        f"{PROMPTS} GSM8K test prompts, greedy, at most {NEW_TOKENS} new tokens, stop at {STOP!r}; SmolLM2-135M on "
        "the CPU.\n\n" + table(rows) + f"\nBatched answers equal to one-at-a-time answers: {same} of {PROMPTS}.\n"
    )
    publish("generation", markdown, {"rows": rows, "same_answers": same})
    print(markdown)


if __name__ == "__main__":
    main()
