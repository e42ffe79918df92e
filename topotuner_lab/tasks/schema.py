"""Tasks as data: :class:`TaskSpec`, the keys of a task's YAML spec in lm-evaluation-harness's vocabulary, checked.

A spec says where the rows are (local ``data_files`` per split and/or a hub ``dataset_path``), how a row becomes a
prompt (``doc_to_text``, a Jinja2 template over the row's fields) and a target (``doc_to_target``), and how the task is
scored (``output_type``: ``multiple_choice`` by the likelihood of each ``doc_to_choice`` option, fixed words or each
row's own options, ``generate_until`` by greedy generation). Every field is validated when a spec is built: a bad spec
is one :class:`TaskError` line naming the field and the fix.

This module is the schema only: where specs come from (spec files, the built-in ones) is :mod:`.registry`, reading a
task's rows is :mod:`.loading`. Code that reads a spec's settings (scorers, the hub reader) needs nothing more.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from topotuner_lab._io.config import (
    NON_NEGATIVE_INT,
    POSITIVE_INT,
    REQUIRED,
    Check,
    Config,
    is_int,
    is_real,
    opt,
    optional,
    shown,
)
from topotuner_lab._io.errors import TaskError
from topotuner_lab.tasks.datafiles import FORMATS, file_format
from topotuner_lab.tasks.metrics import OUTPUT_TYPES, REGISTRY, metric_names
from topotuner_lab.tasks.templates import expression_error, fields_of, is_field, optional_fields, syntax_error

__all__ = ["SPLITS", "VALIDATION_FILTERS", "TaskSpec"]

#: the splits a fine-tune reads: its own names, whatever the hub calls them
SPLITS: tuple[str, ...] = ("train", "validation", "test")
#: ``generation_kwargs`` keys and their defaults (lm-evaluation-harness's); decoding is always greedy
GENERATION_DEFAULTS: dict[str, Any] = {"until": ("\n\n",), "max_gen_toks": 256, "do_sample": False}
#: a validation row filter's test of a row's text
VALIDATION_FILTERS: dict[str, Callable[[str], bool]] = {
    "whole-sentences": lambda text: text.rstrip()[-1:] in ".!?" and len(text.split()) >= 5
}

_NAME = Check(
    lambda v: isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", v), "a name of letters, digits, _ . -"
)
_TEXT = Check(lambda v: isinstance(v, str) and v.strip() != "", "a non-empty string")
_WORDS = Check(
    lambda v: isinstance(v, tuple) and all(isinstance(w, str) and w.strip() for w in v) and len(set(v)) == len(v),
    "a list of distinct non-empty strings (quote words YAML reads as other values: 'yes', 'no', 'on', numbers)",
)
_CHOICES = Check(lambda v: _WORDS(v) or _TEXT(v), f"{_WORDS.wanted}, or a field name or template (a string)")
_FILES = Check(
    lambda v: isinstance(v, dict) and all(isinstance(k, str) and isinstance(p, str) and p for k, p in v.items()),
    "a mapping of split (train, validation, test) to a data file path",
)
_MAPPING = Check(lambda v: isinstance(v, dict) and all(isinstance(k, str) for k in v), "a mapping")
_ALIASES = Check(
    lambda v: isinstance(v, dict) and all(isinstance(k, str) and is_int(i) for k, i in v.items()),
    "a mapping of label name to choice index (a whole number)",
)
_STRING = Check(lambda v: isinstance(v, str), "a string")

_TEMPLATES = Check(
    lambda v: isinstance(v, tuple) and all(isinstance(t, str) and t.strip() for t in v),
    "a field name, or a list of templates",
)
_LIST = Check(lambda v: isinstance(v, tuple), "a list of {metric: NAME}")
_FILTER = Check(
    lambda v: v == "" or v in VALIDATION_FILTERS, f"'' (all rows) or one of {', '.join(VALIDATION_FILTERS)}"
)


@dataclass(frozen=True)
class TaskSpec(Config):
    """How one task is read, framed and scored: the keys of its YAML spec file (lm-evaluation-harness's, mostly).

    A bare field name in ``doc_to_text`` / ``doc_to_target`` takes the field's value as it is; anything else is a
    Jinja2 template over the row's fields. Relative paths in ``data_files`` are looked up beside the spec file, then
    in the data folder (``$TOPOTUNER_DATA``, ``shared/data``, or the ``source`` folder given to
    :func:`~topotuner_lab.tasks.loading.load_task`).
    """

    label = "task spec"
    error = TaskError

    task: str = opt(REQUIRED, "the task's name (results and run names record it)", check=_NAME)
    output_type: str = opt(
        REQUIRED,
        "multiple_choice (scored by the likelihood of each doc_to_choice word), generate_until (greedy generation) "
        "or ranking (BM25 candidates of a BEIR folder reranked by the likelihood of the query)",
        choices=OUTPUT_TYPES,
    )
    doc_to_text: str = opt(
        REQUIRED,
        'the prompt: a Jinja2 template over the row\'s fields, e.g. "Review: {{sentence}}\\nSentiment:"',
        check=_TEXT,
    )
    doc_to_target: str = opt(
        REQUIRED,
        "the target: a field name or template giving the label (a choice index, a choice's text or a label_aliases "
        "name) for multiple_choice, the text to learn for generate_until",
        check=_TEXT,
    )
    doc_to_choice: tuple[str, ...] | str = opt(
        (),
        "multiple_choice only: the options, fixed label words in label order (e.g. [negative, positive]), or each "
        'row\'s own: a field holding a list, or a template rendering one (e.g. "{{[answer_a, answer_b]}}")',
        check=_CHOICES,
    )
    target_delimiter: str = opt(" ", "put between the prompt and the target or choice word", check=_STRING)
    num_fewshot: int = opt(
        0,
        "few-shot examples put before each scored prompt (test, validation, forgetting battery; training rows stay "
        "zero-shot), each a row of fewshot_split as prompt, target and fewshot_delimiter; 0: zero-shot",
        check=NON_NEGATIVE_INT,
    )
    fewshot_split: str | None = opt(
        None, "the split few-shot examples are drawn from (default: train)", check=optional(_TEXT)
    )
    fewshot_delimiter: str = opt("\n\n", "put after each few-shot example", check=_STRING)
    data_files: dict[str, str] = opt(
        {}, "the local data file of each split: {train: ..., validation: ..., test: ...}", check=_FILES
    )
    column_names: tuple[str, ...] = opt(
        (), "the columns of headerless .tsv / .csv data files (empty: the first line is the header)", check=_WORDS
    )
    dataset_path: str | None = opt(None, "the Hugging Face hub id (read with source='hub')", check=optional(_TEXT))
    dataset_name: str | None = opt(None, "the hub dataset's configuration name", check=optional(_TEXT))
    training_split: str | None = opt(None, "the hub split that is the training split", check=optional(_TEXT))
    validation_split: str | None = opt(None, "the hub split that is the validation split", check=optional(_TEXT))
    test_split: str | None = opt(None, "the hub split that is the test split", check=optional(_TEXT))
    label_aliases: dict[str, int] = opt(
        {}, "other names the data gives labels, by choice index, e.g. {Sci/Tech: 3}", check=_ALIASES
    )
    generation_kwargs: dict[str, Any] = opt(
        {}, "generate_until only: {until: [stop strings], max_gen_toks: N} (greedy decoding)", check=_MAPPING
    )
    metric_list: tuple[Any, ...] = opt(
        (),
        "[{metric: acc}] for multiple_choice, [{metric: exact_match}] for generate_until (the default)",
        check=_LIST,
    )
    validation_rows: str = opt(
        "",
        "which validation rows are kept so validation looks like the test set: '' (all) or whole-sentences",
        check=_FILTER,
    )
    validation_column: str = opt(
        "", "the field validation_rows tests (default: the one field doc_to_text names)", check=_STRING
    )
    doc_to_references: tuple[str, ...] = opt(
        (),
        "generate_until: what an answer is scored against: a field holding a list of texts, or templates giving one "
        "text each (empty ones dropped); default the target",
        check=_TEMPLATES,
    )
    doc_to_program: str = opt(
        "",
        "pass@1 only: the program run to test an answer, a template over the row's fields and `completion`, e.g. "
        "\"{{ completion }}\\n{{ test_list | join('\\n') }}\"",
        check=_STRING,
    )
    split_filter: dict[str, str] = opt(
        {},
        "rows kept per split, a Jinja2 expression over the row's fields and _index (its line in the file), e.g. "
        "{train: '601 <= task_id <= 974'}: several splits can share one file",
        check=_FILES,
    )
    split_carve: dict[str, Any] = opt(
        {},
        "the splits carved out of one local file: {by: FIELD, strata: FIELD, shares: {train: 60, validation: 10, "
        "test: 30}, seed: 0}: per stratum the distinct values of `by` in SHA-256 order of 'seed:value', cut in the "
        "shares (rows sharing a value share a split)",
        check=_MAPPING,
    )
    train_task: str | None = opt(
        None,
        "another task (built-in name or spec file) whose train and validation rows train this one, e.g. ifeval "
        "trains on alpaca: this spec's own rows are its test rows",
        check=optional(_TEXT),
    )
    chat_template: bool = opt(
        False,
        "wrap each prompt in the model's chat template as one user turn (instruct models), in training and scoring; "
        "give target_delimiter: '' with it (the answer starts the assistant's turn)",
        check=Check(lambda v: isinstance(v, bool), "true or false"),
    )
    candidates: int = opt(20, "ranking only: the BM25 candidates per query the model reranks", check=POSITIVE_INT)
    metadata: dict[str, Any] = opt({}, "free notes (version, source, license); recorded, not read", check=_MAPPING)

    def check(self) -> None:
        """The rules across fields: where the rows are, templates, choices, generation and metric settings."""
        self._check_sources()
        self._check_templates()
        multiple = self.output_type == "multiple_choice"
        if multiple and not self.per_row_choices and len(self.doc_to_choice) < 2:
            self.fail(
                f"output_type multiple_choice needs doc_to_choice with 2 or more label words, not {self.doc_to_choice}",
                "add doc_to_choice: [word0, word1, ...] (label 0's word first), or a field or template giving each "
                "row's options",
            )
        for names, owner in (
            (("doc_to_choice", "label_aliases"), "multiple_choice"),
            (("doc_to_references", "doc_to_program"), "generate_until"),
        ):
            for name in names:
                if getattr(self, name) and self.output_type != owner:
                    self.fail(f"{name} is for {owner}, and output_type is {self.output_type}", f"remove {name}")
        if self.fewshot_split is not None:
            self._check_split("fewshot_split", self.fewshot_split)
        if self.num_fewshot and self.output_type == "ranking":
            self.fail("num_fewshot is for multiple_choice and generate_until, not ranking", "remove num_fewshot")
        if self.train_task is not None and self.train_task == self.task:
            self.fail(f"train_task names the task itself ({self.task!r})", "remove train_task, or name another task")
        self._check_split_filter()
        self._check_split_carve()
        for alias, index in self.label_aliases.items():
            if not self.per_row_choices and not 0 <= index < len(self.doc_to_choice):
                self.fail(
                    f"label_aliases.{alias}={index} is not a choice index 0..{len(self.doc_to_choice) - 1}",
                    "map each name to the index of its doc_to_choice word",
                )
        self._check_generation()
        self._check_metrics()
        if self.validation_rows and not self.validation_column and len(fields_of(self.doc_to_text)) != 1:
            self.fail(
                f"validation_rows={self.validation_rows!r} needs validation_column: doc_to_text names "
                f"{list(fields_of(self.doc_to_text))}",
                "add validation_column: the field whose text the filter tests",
            )

    def _check_sources(self) -> None:
        if not self.data_files and self.dataset_path is None:
            self.fail(
                "gives neither data_files nor dataset_path",
                "add data_files: {train: FILE, test: FILE} (local files), or dataset_path: a hub id",
            )
        for split, path in self.data_files.items():
            self._check_split("data_files", split)
            if file_format(path) not in FORMATS:
                self.fail(
                    f"data_files.{split}={path!r} is not a file of a known format",
                    "give a " + "; a ".join(f"{s} file ({what})" for s, what in FORMATS.items()),
                )
        if self.data_files:
            needed = ("test",) if self.train_task else ("train", "test")
            lacking = [s for s in needed if s not in self.data_files]
            if lacking:
                self.fail(f"data_files lacks split(s) {lacking}", "a fine-tune reads train and test: give both files")
        if self.dataset_path is not None:
            needed = ("test",) if self.train_task else ("training", "test")
            lacking = [f"{s}_split" for s in needed if getattr(self, f"{s}_split") is None]
            if lacking:
                self.fail(
                    f"dataset_path needs {' and '.join(lacking)}", "name the hub splits, e.g. training_split: train"
                )
        if self.column_names and any(file_format(p) in (".json", ".jsonl") for p in self.data_files.values()):
            self.fail("column_names is for headerless .tsv / .csv files", "remove column_names: JSON rows name fields")

    def _templates(self) -> list[tuple[str, str]]:
        """Each template of the spec with its field's name (doc_to_references' one by one)."""
        named = [("doc_to_text", self.doc_to_text), ("doc_to_target", self.doc_to_target)]
        named += [("doc_to_choice", str(self.doc_to_choice))] if self.per_row_choices else []
        named += [("doc_to_references", source) for source in self.doc_to_references]
        return named + ([("doc_to_program", self.doc_to_program)] if self.doc_to_program else [])

    def _check_split(self, field: str, split: str) -> None:
        """A split named in ``field`` is one a fine-tune reads (with the closest name suggested)."""
        if split not in SPLITS:
            close = difflib.get_close_matches(split, SPLITS, n=1)
            self.fail(
                f"{field} has split {split!r}",
                f"name the splits {', '.join(SPLITS)}" + (f" (did you mean {close[0]!r}?)" if close else ""),
            )

    def _check_split_filter(self) -> None:
        for split, expression in self.split_filter.items():
            self._check_split("split_filter", split)
            problem = expression_error(expression)
            if problem:
                self.fail(
                    f"split_filter.{split}={expression!r} is not a valid Jinja2 expression: {problem}",
                    "write a test over the row's fields and _index, e.g. '601 <= task_id <= 974'",
                )

    def _check_split_carve(self) -> None:
        carved = self.split_carve
        if not carved:
            return
        fix = "give split_carve: {by: FIELD, strata: FIELD, shares: {train: 60, validation: 10, test: 30}, seed: 0}"
        unknown = sorted(set(carved) - {"by", "strata", "shares", "seed"})
        if unknown:
            self.fail(f"split_carve has key(s) {unknown}", fix)
        for key in ("by", "strata"):
            if (key == "by" or key in carved) and not (isinstance(carved.get(key), str) and is_field(carved[key])):
                self.fail(f"split_carve.{key}={carved.get(key)!r} is not a field name", fix)
        shares = carved.get("shares")
        if not (isinstance(shares, dict) and len(shares) >= 2 and all(is_real(v) and v > 0 for v in shares.values())):
            self.fail(f"split_carve.shares={shares!r} is not 2 or more splits with positive shares", fix)
        for split in shares:
            self._check_split("split_carve.shares", split)
        if not is_int(carved.get("seed", 0)):
            self.fail(f"split_carve.seed={carved['seed']!r} is not a whole number", "give seed: 0")
        if set(shares) != set(self.data_files):
            self.fail(
                f"split_carve.shares names splits {sorted(shares)}, and data_files {sorted(self.data_files)}",
                "give each split of data_files (the same file) its share",
            )

    def _check_templates(self) -> None:
        for name, source in self._templates():
            problem = syntax_error(source)
            if problem:
                self.fail(
                    f"{name} is not a valid Jinja2 template: {problem}",
                    f'write fields as {{{{field}}}} in {name}, e.g. "Question: {{{{question}}}}\\nAnswer:"',
                )
            fields = [f for f in fields_of(source) if not (name == "doc_to_program" and f == "completion")]
            # a train_task's own rows are only tested; a program may read only the completion
            if not fields and not (name == "doc_to_target" and self.train_task) and name != "doc_to_program":
                self.fail(f"{name}={source!r} names no field of the rows", f"name a field in {name}: {{{{field}}}}")
            missing = [f for f in fields if self.column_names and f not in self.column_names]
            if missing:
                self.fail(
                    f"{name} names field(s) {missing} not among column_names {list(self.column_names)}",
                    f"use the columns' names in {name}, or rename them in column_names",
                )

    def _check_generation(self) -> None:
        if self.generation_kwargs and self.output_type != "generate_until":
            self.fail("generation_kwargs is for generate_until", "remove generation_kwargs, or change output_type")
        unknown = sorted(set(self.generation_kwargs) - set(GENERATION_DEFAULTS))
        if unknown:
            self.fail(f"generation_kwargs has key(s) {unknown}", f"use {', '.join(GENERATION_DEFAULTS)}")
        until = self.generation_kwargs.get("until", ())
        if not (isinstance(until, str) and until) and not (
            isinstance(until, (list, tuple)) and all(isinstance(s, str) and s for s in until)
        ):
            self.fail(f"generation_kwargs.until={shown(until)} is not a list of stop strings", 'give until: ["\\n\\n"]')
        if self.doc_to_program and "completion" not in fields_of(self.doc_to_program):
            self.fail("doc_to_program does not use {{ completion }}", "put {{ completion }} where the answer goes")
        tokens = self.generation_kwargs.get("max_gen_toks", 1)
        if not (is_int(tokens) and tokens >= 1):
            self.fail(f"generation_kwargs.max_gen_toks={tokens!r} is not a whole number >= 1", "give max_gen_toks: 256")
        if self.generation_kwargs.get("do_sample", False) is not False:
            self.fail("generation_kwargs.do_sample must be false: answers are decoded greedily", "remove do_sample")

    def _check_metrics(self) -> None:
        """Each metric of ``metric_list`` is registered for the output type (``tasks.metrics.REGISTRY``)."""
        allowed = metric_names(self.output_type)
        for i, item in enumerate(self.metric_list):
            entry = {"metric": item} if isinstance(item, str) else item
            if not isinstance(entry, Mapping) or "metric" not in entry:
                self.fail(
                    f"metric_list[{i}]={shown(item)} is not a mapping with a metric", f"give - metric: {allowed[0]}"
                )
            metric = REGISTRY.get(entry["metric"]) if isinstance(entry["metric"], str) else None
            if metric is None:
                self.fail(
                    f"metric_list[{i}].metric={shown(entry['metric'])} is not a known metric",
                    f"use one of {', '.join(allowed)} (output_type {self.output_type}), or register the metric "
                    "(topotuner_lab.tasks.metrics.register_metric)",
                )
            if metric.output_type != self.output_type:
                self.fail(
                    f"metric_list[{i}].metric={metric.name!r} is not scored for output_type {self.output_type}",
                    f"use {', '.join(allowed)}",
                )
            if metric.requires and not getattr(self, metric.requires):
                self.fail(
                    f"metric_list[{i}]: {metric.name} needs {metric.requires}",
                    f"add {metric.requires}: {self.__dataclass_fields__[metric.requires].metadata['help']}",
                )
            extra = sorted(set(entry) - {"metric", "aggregation", "higher_is_better"})
            direction = entry.get("higher_is_better", metric.higher_is_better)
            if extra or entry.get("aggregation", "mean") != "mean" or direction is not metric.higher_is_better:
                better = "higher" if metric.higher_is_better else "lower"
                self.fail(
                    f"metric_list[{i}]={shown(dict(entry))} asks for what is not computed here",
                    f"give metric only (aggregation is mean, {better} is better)",
                )

    # ---- what the rest of the package reads

    @property
    def name(self) -> str:
        """The task's name."""
        return self.task

    @property
    def kind(self) -> str:
        """``"classification"`` (multiple_choice), ``"generation"`` (generate_until) or ``"ranking"``."""
        return {"multiple_choice": "classification", "generate_until": "generation"}.get(self.output_type, "ranking")

    @property
    def labels(self) -> tuple[str, ...]:
        """The scored continuations of a multiple-choice task: the delimiter, then each label word (none: per row)."""
        return () if self.per_row_choices else tuple(self.target_delimiter + word for word in self.doc_to_choice)

    @property
    def per_row_choices(self) -> bool:
        """Whether each row has its own options (``doc_to_choice`` a field or template, not fixed label words)."""
        return isinstance(self.doc_to_choice, str)

    @property
    def metric(self) -> str:
        """The metric the task is scored by."""
        if not self.metric_list:
            return metric_names(self.output_type)[0]
        first = self.metric_list[0]
        return str(first if isinstance(first, str) else first["metric"])

    @property
    def until(self) -> tuple[str, ...]:
        """Where a generated answer ends (``generation_kwargs.until``)."""
        until = self.generation_kwargs.get("until", GENERATION_DEFAULTS["until"])
        return (until,) if isinstance(until, str) else tuple(until)

    @property
    def max_gen_toks(self) -> int:
        """The most tokens generated for an answer (``generation_kwargs.max_gen_toks``)."""
        return int(self.generation_kwargs.get("max_gen_toks", GENERATION_DEFAULTS["max_gen_toks"]))

    @property
    def metric_label(self) -> str:
        """How reports name the primary metric: ``accuracy`` for ``acc``, else the metric's own name."""
        return "accuracy" if self.metric == "acc" else self.metric

    @property
    def metrics(self) -> tuple[str, ...]:
        """Every metric the task is scored by (``metric_list``'s), the primary one (:attr:`metric`) first."""
        if not self.metric_list:
            return (self.metric,)
        return tuple(str(m if isinstance(m, str) else m["metric"]) for m in self.metric_list)

    @property
    def fields(self) -> tuple[str, ...]:
        """The row fields the task reads (its templates', the validation column's), in that order."""
        read = [
            f
            for name, source in self._templates()
            for f in fields_of(source)
            if (name, f) != ("doc_to_program", "completion")
        ]
        return tuple(dict.fromkeys((*read, *self._vcol())))

    @property
    def required_fields(self) -> tuple[str, ...]:
        """The fields every row must have: :attr:`fields` less those a template tests with ``is defined``."""
        optional = {f for _, source in self._templates() for f in optional_fields(source)}
        return tuple(f for f in self.fields if f not in optional)

    def _vcol(self) -> tuple[str, ...]:
        return (self.validation_column,) if self.validation_column else ()

    def hub_split(self, split: str) -> str | None:
        """The hub's name of our ``split`` (train, validation, test), or None."""
        return {"train": self.training_split, "validation": self.validation_split, "test": self.test_split}.get(split)

    def label_index(self, value: Any, choices: Sequence[str] | None = None) -> int:
        """The choice index of a row's ``doc_to_target`` value: a label_aliases name, a choice's text, or an index.

        ``choices``: the row's own options (default: the fixed ``doc_to_choice`` words).
        """
        options = tuple(self.doc_to_choice if choices is None else choices)
        if isinstance(value, str):
            if value in self.label_aliases:
                return self.label_aliases[value]
            for text in (value, value.strip()):
                if text in options:
                    return options.index(text)
        if isinstance(value, float) and not value.is_integer():  # int() would cut 0.5 or 1.7 to a valid index
            raise TaskError(
                f"label {value!r} (doc_to_target) of task {self.task!r} is not a whole number",
                f"give labels as choice indices 0..{len(options) - 1}, a choice's text or a label_aliases name "
                "(check the data file's label column)",
            )
        try:
            label = int(value)
        except (TypeError, ValueError):
            label = -1
        if not 0 <= label < len(options):
            names = [*options, *self.label_aliases]
            raise TaskError(
                f"label {value!r} (doc_to_target) is not one of task {self.task!r}'s {len(options)} labels {names}",
                f"give labels 0..{len(options) - 1}, a choice's text or a label_aliases name",
            )
        return label
