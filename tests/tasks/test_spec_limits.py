"""Task specs that cannot hang or exhaust the machine, and whose every template is checked when the rows load.

Each case is one a red team found: mutual ``train_task`` references recursed until RecursionError; a failing
``doc_to_references`` or ``doc_to_program`` surfaced only when scoring, as an internal error; ``{{ 9**(9**9) }}`` hung
while the spec was checked (Jinja folds constants while compiling) and ``{{ sentence * 50000000 }}`` allocated without
bound; a YAML alias bomb hung while its error message was built; labels 0.5 / 1.7 became 0 / 1. A case that used to
hang runs in a forked process with a deadline, so the old code fails the test instead of stalling it.
"""

from __future__ import annotations

import json
import multiprocessing
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.tasks.test_sandbox import needs_bwrap
from topotuner_lab._io.errors import TaskError
from topotuner_lab.drift.settings import read_recipe
from topotuner_lab.study.presets import get_preset
from topotuner_lab.tasks.loading import has_validation_split, load_task
from topotuner_lab.tasks.registry import get_task
from topotuner_lab.tasks.schema import TaskSpec
from topotuner_lab.tasks.templates import MAX_CHARS, TIME_LIMIT_S, evaluate, fields_of, render
from topotuner_lab.training.config import FinetuneConfig
from topotuner_lab.training.finetune import run_finetune
from topotuner_lab.training.scoring import TaskScorer

ROW = {"sentence": "a fine film", "items": [1, 2, 3]}


def _children_cpu_seconds() -> float:
    """CPU seconds spent so far by this process's finished children (the forked renders)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _outcome(call: Callable[..., Any], *args: Any, seconds: float = 120.0) -> str:
    """What ``call(*args)`` raised (``Type: message``) or ``returned``, in a forked process given ``seconds``."""
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)

    def run() -> None:
        try:
            call(*args)
            send.send("returned")
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which asserts on it
            send.send(f"{type(exc).__name__}: {exc}")

    child = context.Process(target=run)
    child.start()
    child.join(seconds)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail(f"{call.__qualname__} still ran after {seconds:g} s")  # its arguments may be too big to show
    return receive.recv() if receive.poll() else f"the child died (exit code {child.exitcode})"


def _spec(folder: Path, name: str, extra: str, rows: list[dict[str, Any]] | None = None) -> Path:
    """A generate_until spec over a JSONL file beside it, with ``extra`` YAML lines."""
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows or [ROW]))
    spec = folder / f"{name}.yaml"
    spec.write_text(
        f"task: {name}\noutput_type: generate_until\ndoc_to_text: '{{{{ sentence }}}}'\ndoc_to_target: sentence\n"
        f"data_files: {{train: rows.jsonl, test: rows.jsonl}}\n{extra}"
    )
    return spec


# ------------------------------------------------------------------------- train_task chains


def test_train_task_cycles_are_refused_naming_the_chain(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    _spec(tmp_path, "a", f"train_task: {b}\n")
    _spec(tmp_path, "b", f"train_task: {a}\n")
    for check in (lambda: load_task(a, "train"), lambda: has_validation_split(a)):
        with pytest.raises(TaskError) as info:
            check()
        assert f"train_task goes round in a circle: a -> {b} -> {a}" in info.value.problem
        assert "remove its train_task" in info.value.fix
    assert len(load_task(a, "test")) == 1  # its own test rows are still read


def test_a_train_task_chain_without_a_cycle_reads_the_last_tasks_rows(tmp_path):
    folders = [tmp_path / name for name in ("start", "middle", "end")]
    for folder in folders:
        folder.mkdir()
    end = _spec(folders[2], "end", "", [{"sentence": "trained on this"}])
    middle = _spec(folders[1], "middle", f"train_task: {end}\n")
    start = _spec(folders[0], "start", f"train_task: {middle}\n")
    assert list(load_task(start, "train")["prompt"]) == ["trained on this"]


@pytest.mark.slow
def test_a_train_task_chain_is_validated_on_the_last_tasks_metric(tiny_llama, tmp_path):
    # start (multiple choice) trains on middle (generation), which trains on end (multiple choice): the validation
    # rows are end's, so they are scored on end's label words, with a log-loss a generation scorer never gives
    rows = [{"sentence": f"{w} film {i}", "label": int(w == "good")} for i in range(12) for w in ("bad", "good")]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    choice = "output_type: multiple_choice\ndoc_to_text: '{{ sentence }}'\ndoc_to_target: label\n"
    files = "data_files: {train: rows.jsonl, test: rows.jsonl}\n"
    (tmp_path / "end.yaml").write_text(f"task: end\n{choice}doc_to_choice: [bad, good]\n{files}")
    (tmp_path / "middle.yaml").write_text(
        "task: middle\noutput_type: generate_until\ndoc_to_text: '{{ sentence }}'\ndoc_to_target: sentence\n"
        f"generation_kwargs: {{max_gen_toks: 2}}\ntrain_task: {tmp_path / 'end.yaml'}\n{files}"
    )
    start = tmp_path / "start.yaml"
    start.write_text(f"task: start\n{choice}doc_to_choice: [nay, yea]\ntrain_task: {tmp_path / 'middle.yaml'}\n{files}")
    tiny = dict(epochs=1, n_train=8, n_val=8, n_test=4, n_ood=0, n_ppl=0, batch_size=8, max_length=24)
    res = run_finetune(tiny_llama, FinetuneConfig(method="full", task=str(start), output_dir=str(tmp_path), **tiny))
    assert res.val_accuracy is not None and isinstance(res.val_logloss, float)  # end's label words scored it
    assert res.metric == "acc"  # start's own test rows, on its own metric


# ------------------------------------------------------------------------- every template checked on load


@pytest.mark.parametrize(
    "extra, field",
    [
        pytest.param("doc_to_references: ['{{ sentence.nope }}']\n", "doc_to_references", id="references"),
        pytest.param(
            "doc_to_program: '{{ completion }}{{ items.nope }}'\nmetric_list: [{metric: pass@1}]\n",
            "doc_to_program",
            id="program",
        ),
    ],
)
def test_a_failing_scoring_template_is_a_spec_error_when_rows_load(tmp_path, extra, field):
    spec = _spec(tmp_path, "scored", extra)
    with pytest.raises(TaskError) as info:
        load_task(spec, "test")
    assert info.value.problem.startswith(f"{field} of task 'scored' fails on a row of ")
    assert "has no attribute 'nope'" in info.value.problem and info.value.fix.startswith(f"fix {field} in the spec")
    if field == "doc_to_program":
        assert "'completion'" in info.value.fix  # the answer it is given when scoring


# ------------------------------------------------------------------------- templates under size and time limits

BOUNDED = [
    pytest.param("{{ sentence * 50000000 }}", "* would make over", id="repeat"),
    pytest.param("{{ 9**(9**9) }}", "** would make an integer of over", id="power"),
    pytest.param("{{ sentence | center(999999999) }}", "the center filter would make over", id="filter-width"),
    pytest.param("{{ '%999999999d' % 1 }}", "% would make over", id="format-width"),
    pytest.param("{{ '{:>999999999}'.format(1) }}", "str.format would make over", id="str-format-width"),
    pytest.param("{{ sentence.zfill(999999999) }}", "str.zfill would make over", id="method-width"),
    pytest.param("{{ ([sentence * 100] * 100000) | join }}", "* would make over", id="shared-items"),
    pytest.param(
        "{% set ns = namespace(s=sentence) %}{% for i in range(24) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        "~ would make over",
        id="doubling-concat",
    ),
    pytest.param(
        "{% macro m() %}{% for i in range(100000) %}{{ sentence }}" + "." * 1000 + "{% endfor %}{% endmacro %}"
        "{{ m() }}",
        "the template produces over",
        id="macro-output",
    ),
    pytest.param(
        "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
        f"the template ran longer than {TIME_LIMIT_S:g} s of CPU time",
        id="nested-loops",
    ),
]


@pytest.mark.parametrize("source, message", BOUNDED)
def test_a_template_past_a_limit_fails_fast_with_the_limit_named(source, message):
    started = _children_cpu_seconds()
    assert _outcome(fields_of, source) == "returned"  # checking a spec computes nothing
    outcome = _outcome(render, source, ROW)
    assert outcome.startswith(f"SecurityError: {message}")
    assert _children_cpu_seconds() - started < 10 * TIME_LIMIT_S  # CPU time: the wall clock depends on the load


def test_the_time_limit_counts_the_renders_cpu_time_not_a_loaded_machines_wall_time():
    """A render that waits (a starved or paused process: nice 19 under load, SIGSTOP) is not a template that spins."""

    class Waiting:
        def __iter__(self):
            for word in ("slow", "but", "cheap"):
                time.sleep(0.6 * TIME_LIMIT_S)  # wall time passes, this thread computes nothing
                yield word

    started = time.monotonic()
    assert render("{% for w in words %}{{ w }} {% endfor %}", {"words": Waiting()}) == "slow but cheap "
    assert time.monotonic() - started > TIME_LIMIT_S  # the old wall-clock deadline refused this render


@needs_bwrap  # the programs run in the sandbox
def test_an_answer_that_takes_a_program_template_past_a_limit_scores_as_a_failed_program(tmp_path):
    # the target renders 1,000 times within the limits at load; a 20,000-character answer would be 20 million
    spec = _spec(tmp_path, "repeat", "doc_to_program: '{{ completion * 1000 }}'\nmetric_list: [{metric: pass@1}]\n")
    rows = load_task(spec, "test").select([0, 0])
    scorer = TaskScorer(spec, tokenizer=None)
    scorer.answers = lambda model, ds: ["pass\n", "x" * 20_000]  # type: ignore[method-assign]  # no model
    warned = f"doc_to_program of task 'repeat' could not render 1 of 2 answers .*{MAX_CHARS:,} characters"
    with pytest.warns(UserWarning, match=warned):
        scores = scorer.score_all(None, rows)
    assert scores["pass@1"].tolist() == [1.0, 0.0]


def test_a_spec_with_a_huge_power_reads_at_once_and_fails_on_load_naming_the_field(tmp_path):
    spec = _spec(tmp_path, "power", "")
    spec.write_text(spec.read_text().replace("'{{ sentence }}'", "'{{ sentence }}{{ 9**(9**9) }}'"))
    assert _outcome(get_task, spec) == "returned"
    outcome = _outcome(load_task, spec, "test")
    assert (
        outcome.startswith("TaskError: doc_to_text of task 'power' fails on a row of ") and "SecurityError" in outcome
    )


def test_the_limits_keep_ordinary_templates_and_the_immutable_sandbox():
    assert render("{% for x in items %}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}", ROW) == "1,2,3"
    assert render("{{ items | map('string') | join('-') }} {{ '%03d' % 7 }} {{ '{:>3}'.format(1) }}", ROW) == (
        "1-2-3 007   1"
    )
    assert render("{% macro m(x) %}<{{ x | upper }}>{% endmacro %}{{ m(sentence ~ '!') * 2 }}", ROW) == (
        "<A FINE FILM!><A FINE FILM!>"
    )
    assert render("{{ sentence * 3 }}", ROW) == "a fine filma fine filma fine film"
    assert len(render("{{ 'x' * limit }}", {"limit": MAX_CHARS // 2})) == MAX_CHARS // 2
    assert evaluate("2 <= items | length <= 3", ROW) is True
    with pytest.raises(Exception, match="unsafe|not safely callable|SecurityError|access to attribute"):
        render("{{ items.append(4) }}", ROW)  # the immutable sandbox: rows cannot change


# ------------------------------------------------------------------------- YAML aliases and long values in errors


def _laughs(levels: int = 9) -> list[str]:
    """The lines of a billion-laughs anchor chain: x0 holds 9 strings, each next level 9 aliases of the last."""
    lines = ["  x0: &x0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"  x{i}: &x{i} [{', '.join([f'*x{i - 1}'] * 9)}]" for i in range(1, levels)]
    return lines


def test_a_yaml_alias_bomb_in_a_checked_field_is_refused_at_once(tmp_path):
    spec = _spec(tmp_path, "laughs", "metadata:\n" + "\n".join(_laughs()) + "\ngeneration_kwargs: {until: *x8}\n")
    outcome = _outcome(get_task, spec)
    assert outcome.startswith(f"TaskError: task spec file {spec} holds over 10,000 values, its aliases (*name)")
    anchors = _spec(tmp_path, "anchors", "metadata: {a: &words [stop, end]}\ngeneration_kwargs: {until: *words}\n")
    assert get_task(anchors).until == ("stop", "end")  # a few aliases are fine


@pytest.mark.parametrize(
    "read, what, field",
    [
        pytest.param(lambda path: get_preset(str(path)), "preset", "seeds", id="preset"),
        pytest.param(read_recipe, "drift recipe", "orders", id="drift-recipe"),
    ],
)
def test_a_yaml_alias_bomb_in_a_preset_or_recipe_is_refused_at_once(tmp_path, read, what: str, field: str):
    # refused as the file is read, before a field is checked or shown (the field stands for 387 million values)
    path = tmp_path / "laughs.yaml"
    path.write_text(f"{field}:\n" + "".join(f"  - {line.split(': ', 1)[1]}\n" for line in _laughs()))
    outcome = _outcome(read, path, seconds=10.0)
    assert outcome.startswith(f"ParameterError: {what} file {path} holds over 10,000 values, its aliases (*name)")


def test_a_huge_shared_value_is_shown_cut_short_in_a_field_error():
    value: Any = ["lol"] * 9
    for _ in range(8):
        value = [value] * 9
    fields = {"task": "t", "output_type": "multiple_choice", "doc_to_text": "{{ q }}", "doc_to_target": "a"}
    outcome = _outcome(TaskSpec.from_dict, {**fields, "doc_to_choice": value, "data_files": {"test": "x.jsonl"}})
    assert outcome.startswith("TaskError: task spec: doc_to_choice=([[...], [...],") and len(outcome) < 2000


# ------------------------------------------------------------------------- labels


def test_labels_that_are_not_whole_numbers_are_refused(tmp_path):
    (tmp_path / "half.tsv").write_text("text\tlabel\nfoo bar\t0.5\nbaz qux\t1.7\n")
    (tmp_path / "whole.tsv").write_text("text\tlabel\nfoo bar\t0.0\nbaz qux\t1.0\n")
    for name in ("half", "whole"):
        (tmp_path / f"{name}.yaml").write_text(
            f"task: {name}\noutput_type: multiple_choice\ndoc_to_text: '{{{{ text }}}}'\ndoc_to_target: label\n"
            f"doc_to_choice: [bad, good]\ndata_files: {{train: {name}.tsv, test: {name}.tsv}}\n"
        )
    with pytest.raises(TaskError) as info:
        load_task(tmp_path / "half.yaml", "test")
    assert info.value.problem == "label 0.5 (doc_to_target) of task 'half' is not a whole number"
    assert "choice indices 0..1" in info.value.fix
    assert load_task(tmp_path / "whole.yaml", "test")["label"] == [0, 1]  # 0.0 / 1.0 are the indices 0 / 1
