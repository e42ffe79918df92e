"""The examples one fine-tune uses.

Training and validation rows are drawn by the data seed; test, out-of-domain and perplexity rows are fixed, so every
method and seed is scored on the same ones.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from topotuner_lab._io.errors import ParameterError
from topotuner_lab.tasks.specs import load_task
from topotuner_lab.training.config import FinetuneConfig

OOD_TASK = {"sst2": "agnews", "agnews": "sst2", "gsm8k": "sst2"}
EVAL_SEED = 0  # which test / out-of-domain / perplexity examples are drawn: fixed, so runs are paired
#: the config's example counts, each capped by the rows its split holds
COUNTS: tuple[str, ...] = ("n_train", "n_val", "n_test", "n_ood", "n_ppl")


@dataclass
class RunData:
    """The examples one fine-tune uses; validation is carved from the training split, never from test."""

    train: Any
    val: Any | None
    test: Any
    ood_task: str
    ood: Any
    general_text: list[str]


def load_run_data(cfg: FinetuneConfig) -> RunData:
    """Draw the training, validation, test, out-of-domain and perplexity examples of ``cfg``."""
    drawn = load_task(cfg.task, "train", cfg.n_train + cfg.n_val, cfg.data_seed, cfg.data_source)
    if cfg.n_val and len(drawn) <= cfg.n_val:
        raise ParameterError(
            f"n_val={cfg.n_val} leaves no training examples ({len(drawn)} drawn)", "lower --n-val or raise --n-train"
        )
    val = drawn.select(range(cfg.n_val)) if cfg.n_val else None
    train = drawn.select(range(cfg.n_val, len(drawn))) if cfg.n_val else drawn
    # evaluation draws do not depend on the seed: every method and seed is scored on the same examples (paired)
    test = load_task(cfg.task, "test", cfg.n_test, EVAL_SEED, cfg.data_source)
    ood_task = OOD_TASK[cfg.task]
    ood = load_task(ood_task, "test", cfg.n_ood, EVAL_SEED, cfg.data_source)
    general = load_task("gsm8k", "test", cfg.n_ppl, EVAL_SEED, cfg.data_source)
    return RunData(train, val, test, ood_task, ood, [p + t for p, t in zip(general["prompt"], general["target"])])


def used_counts(cfg: FinetuneConfig, data: RunData) -> FinetuneConfig:
    """``cfg`` with every example count set to the rows really drawn (a split may hold fewer than asked)."""
    return replace(
        cfg,
        n_train=len(data.train),
        n_val=len(data.val) if data.val is not None else 0,
        n_test=len(data.test),
        n_ood=len(data.ood),
        n_ppl=len(data.general_text),
    )


def capped_counts(asked: FinetuneConfig, used: FinetuneConfig) -> dict[str, int]:
    """The counts ``asked`` for that the data could not give in full: name -> the count asked for."""
    return {name: getattr(asked, name) for name in COUNTS if getattr(used, name) != getattr(asked, name)}
