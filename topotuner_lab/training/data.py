"""The examples one fine-tune uses.

Training and validation rows are drawn by the data seed; test, out-of-domain and perplexity rows are fixed, so every
method and seed is scored on the same ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from topotuner_lab._io.errors import ParameterError, TaskError
from topotuner_lab.tasks.fewshot import with_fewshot
from topotuner_lab.tasks.loading import data_source_of, has_validation_split, load_task
from topotuner_lab.tasks.registry import get_task, training_spec
from topotuner_lab.tasks.schema import TaskSpec
from topotuner_lab.training.config import FinetuneConfig

#: the out-of-domain task each task's forgetting is measured on; any other task (a spec file, boolq): sst2
OOD_TASK = {"sst2": "agnews", "agnews": "sst2", "gsm8k": "sst2"}
#: the task whose held-out texts' NLL (perplexity) before and after measures forgetting with no answer format
PPL_TASK = "gsm8k"
EVAL_SEED = 0  # which test / out-of-domain / perplexity examples are drawn: fixed, so runs are paired
#: the config's example counts, each capped by the rows its split holds
COUNTS: tuple[str, ...] = ("n_train", "n_val", "n_test", "n_ood", "n_ppl")


@dataclass
class RunData:
    """The examples one fine-tune uses; validation is never drawn from test (see :func:`load_run_data`)."""

    train: Any
    val: Any | None
    test: Any
    ood_task: str
    ood: Any
    general_text: list[str]
    val_source: str = "none"
    #: the forgetting battery: task -> its test rows (the first is ``ood_task``'s ``ood``)
    battery: dict[str, Any] = field(default_factory=dict)
    #: where each split was read: ``task/split`` -> an offline file or the hub (:func:`data_source_of`)
    sources: dict[str, str] = field(default_factory=dict)


def ood_task_for(task: str) -> str:
    """The out-of-domain task of ``task`` (a built-in name or a spec file): :data:`OOD_TASK`'s, else ``"sst2"``."""
    return OOD_TASK.get(get_task(task).name, "sst2")


def ood_battery(task: str, ood_tasks: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The forgetting battery of a run on ``task``: ``ood_tasks`` where given, else :func:`ood_task_for`'s task."""
    return ood_tasks or (ood_task_for(task),)


def load_run_data(cfg: FinetuneConfig) -> RunData:
    """Draw the training, validation, test, out-of-domain and perplexity examples of ``cfg``.

    Validation comes from the task's own validation split where it has one locally (the same rows for every seed and
    method, filtered to look like the test rows: SST-2's whole sentences); else it is carved from the training draw.
    Scored rows (validation, test, the battery) get few-shot examples
    (:func:`~topotuner_lab.tasks.fewshot.with_fewshot`: ``cfg.num_fewshot``, else each task's spec); training rows
    stay zero-shot.
    """
    own_val = bool(cfg.n_val) and has_validation_split(cfg.task, cfg.data_source)
    if own_val:
        val = load_task(cfg.task, "validation", cfg.n_val, EVAL_SEED, cfg.data_source)
        train = load_task(cfg.task, "train", cfg.n_train, cfg.data_seed, cfg.data_source)
        val_source = f"the task's validation split ({training_spec(cfg.task).validation_rows or 'all rows'})"
    else:
        drawn = load_task(cfg.task, "train", cfg.n_train + cfg.n_val, cfg.data_seed, cfg.data_source)
        if cfg.n_val and len(drawn) <= cfg.n_val:
            raise ParameterError(
                f"n_val={cfg.n_val} leaves no training examples ({len(drawn)} drawn)",
                "lower --n-val or raise --n-train",
            )
        val = drawn.select(range(cfg.n_val)) if cfg.n_val else None
        train = drawn.select(range(cfg.n_val, len(drawn))) if cfg.n_val else drawn
        val_source = "carved from the training draw" if cfg.n_val else "none"
    # evaluation draws do not depend on the seed: every method and seed is scored on the same examples (paired)
    test = load_task(cfg.task, "test", cfg.n_test, EVAL_SEED, cfg.data_source)
    tasks = ood_battery(cfg.task, cfg.ood_tasks)
    # n_ood / n_ppl 0 switch the forgetting battery / the perplexity probe off: nothing is drawn
    battery = {task: load_task(task, "test", cfg.n_ood, EVAL_SEED, cfg.data_source) for task in tasks if cfg.n_ood}
    source = cfg.data_source  # validation rows are the training task's, given the task's count of examples
    shots = get_task(cfg.task).num_fewshot if cfg.num_fewshot is None else cfg.num_fewshot
    val = with_fewshot(val, training_spec(cfg.task), shots, source)
    test = with_fewshot(test, cfg.task, shots, source)
    battery = {task: with_fewshot(rows, task, cfg.num_fewshot, source) for task, rows in battery.items()}
    general = load_task(PPL_TASK, "test", cfg.n_ppl, EVAL_SEED, cfg.data_source) if cfg.n_ppl else None
    general_text = [p + t for p, t in zip(general["prompt"], general["target"])] if general is not None else []
    read = [(cfg.task, s) for s in ("train", "validation", "test") if s != "validation" or own_val]
    read += [(task, "test") for task in battery] + ([(PPL_TASK, "test")] if cfg.n_ppl else [])
    sources = {f"{task}/{split}": data_source_of(task, split, cfg.data_source) for task, split in read}
    return RunData(train, val, test, tasks[0], battery.get(tasks[0]), general_text, val_source, battery, sources)


def chat_framed(rows: Any, task: str | TaskSpec, tokenizer: Any) -> Any:
    """``rows`` with each prompt wrapped in the model's chat template as one user turn, when ``task``'s spec asks.

    The template's text is tokenized like any prompt later, so a leading BOS it writes is dropped (the tokenizer adds
    its own). A model without a chat template is a :class:`TaskError` naming the spec field.
    """
    if rows is None or not get_task(task).chat_template:
        return rows
    if not getattr(tokenizer, "chat_template", None):
        raise TaskError(
            f"task {get_task(task).name!r} asks for the chat template (chat_template: true), and the model has none",
            "use an instruct model with a chat template, or set chat_template: false in the spec",
        )
    bos = (
        tokenizer.bos_token
        if tokenizer("x", add_special_tokens=True).input_ids[:1] == [tokenizer.bos_token_id]
        else None
    )

    def frame(row: dict[str, Any]) -> dict[str, Any]:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": row["prompt"]}], tokenize=False, add_generation_prompt=True
        )
        return {"prompt": text.removeprefix(bos) if bos else text}

    return rows.map(frame)


def chat_framed_data(data: RunData, task: str, tokenizer: Any) -> RunData:
    """Every row set of ``data`` framed by :func:`chat_framed` as its own task's spec asks.

    Training and validation rows follow the training task's spec (the last of a ``train_task`` chain), test rows the
    task's, each battery task its own.
    """
    trained = training_spec(task)
    battery = {name: chat_framed(rows, name, tokenizer) for name, rows in data.battery.items()}
    return replace(
        data,
        train=chat_framed(data.train, trained, tokenizer),
        val=chat_framed(data.val, trained, tokenizer),
        test=chat_framed(data.test, task, tokenizer),
        ood=battery.get(data.ood_task, data.ood),
        battery=battery,
    )


def used_counts(cfg: FinetuneConfig, data: RunData) -> FinetuneConfig:
    """``cfg`` with every example count set to the rows really drawn (a split may hold fewer than asked)."""
    return replace(
        cfg,
        n_train=len(data.train),
        n_val=len(data.val) if data.val is not None else 0,
        n_test=len(data.test),
        n_ood=max(len(rows) for rows in data.battery.values()) if data.battery else len(data.ood or ()),
        n_ppl=len(data.general_text),
    )


def capped_counts(asked: FinetuneConfig, used: FinetuneConfig) -> dict[str, int]:
    """The counts ``asked`` for that the data could not give in full: name -> the count asked for."""
    return {name: getattr(asked, name) for name in COUNTS if getattr(used, name) != getattr(asked, name)}
