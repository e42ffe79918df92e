"""Tasks as data: YAML task specs in lm-evaluation-harness's vocabulary.

The built-in specs must read exactly the rows, prompts and targets the hard-coded ``TaskSpec``s read before them: the
digests below were recorded from that code (sha256 of the JSON list of (prompt, target, label) rows) before it was
removed. A spec for a data set the package does not ship works through ``load_task`` and the CLI; a bad spec is one
error line naming the field.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from topotuner_lab._io.errors import TaskError
from topotuner_lab.tasks.loading import data_dir, has_validation_split, load_task
from topotuner_lab.tasks.registry import BUILTIN_DIR, TASKS, get_task, read_spec
from topotuner_lab.tasks.schema import TaskSpec
from topotuner_lab.tasks.templates import fields_of, render


def _digest(ds) -> str:
    return hashlib.sha256(json.dumps(list(zip(ds["prompt"], ds["target"], ds["label"]))).encode()).hexdigest()


# ------------------------------------------------------------------------- built-in tasks: the same rows as before

#: (task/split/draw, rows, sha256 prefix), recorded from the hard-coded specs before the YAML ones replaced them;
#: draw "all" = n=None, "300/7" = n=300 with seed 7, "file/40/2" = that split's file given as ``source``
BEFORE = [
    ("sst2/train/all", 60614, "ffae6466d3891714"),
    ("sst2/train/300/7", 300, "2aa3559afe69c858"),
    ("sst2/train/file/40/2", 40, "f2b11668f4952702"),
    ("sst2/validation/all", 1225, "4e3c64aa9b90135a"),
    ("sst2/validation/300/7", 300, "591b361efb1c45a9"),
    ("sst2/validation/file/40/2", 40, "3ecc0c9611104496"),
    ("sst2/test/all", 872, "df7f3aec7b124090"),
    ("sst2/test/300/7", 300, "1627d1f4dae98c99"),
    ("sst2/test/file/40/2", 40, "9be4d94e6fba751b"),
    ("agnews/train/all", 10001, "712349b23343bd52"),
    ("agnews/train/300/7", 300, "aed315255f12f1bc"),
    ("agnews/train/file/40/2", 40, "b9ac89651cf854d9"),
    ("agnews/test/all", 7600, "69ecb02ed31c4e15"),
    ("agnews/test/300/7", 300, "d902d8f0c4f52b09"),
    ("agnews/test/file/40/2", 40, "aa85e0ba775df6ed"),
    ("gsm8k/train/all", 7473, "49744d87b614b54e"),
    ("gsm8k/train/300/7", 300, "f4cf4cd06e75b522"),
    ("gsm8k/train/file/40/2", 40, "d91ab8638eb13081"),
    ("gsm8k/test/all", 1319, "de34a341a92b25e7"),
    ("gsm8k/test/300/7", 300, "9f260aadbfcf9174"),
    ("gsm8k/test/file/40/2", 40, "b5f3594dc447be0f"),
]


@pytest.mark.parametrize("draw, rows, sha", BEFORE, ids=[b[0] for b in BEFORE])
def test_builtin_specs_read_exactly_the_rows_the_hard_coded_specs_read(draw, rows, sha):
    task, split, *how = draw.split("/")
    if how == ["all"]:
        ds = load_task(task, split)
    elif how[0] == "file":
        ds = load_task(task, split, int(how[1]), int(how[2]), str(data_dir() / TASKS[task].data_files[split]))
    else:
        ds = load_task(task, split, int(how[0]), int(how[1]))
    assert len(ds) == rows and _digest(ds).startswith(sha)


def test_builtin_prompts_and_targets_read_as_before():
    sst2, agnews, gsm8k = (load_task(t, "test", 5, 1)[0] for t in ("sst2", "agnews", "gsm8k"))
    assert sst2 == {
        "prompt": "Review: add yet another hat to a talented head , clooney 's a good director .\nSentiment:",
        "target": " positive",
        "label": 1,
    }
    assert agnews["prompt"].startswith("News: American Express is suing Visa and MasterCard plus eight US banks")
    assert agnews["prompt"].endswith("last month\nTopic:") and (agnews["target"], agnews["label"]) == (" Business", 2)
    assert gsm8k["prompt"].startswith("Question: It's April, and Mrs. Rylan") and gsm8k["prompt"].endswith("\nAnswer:")
    assert gsm8k["target"].startswith(" The total amount of money she used") and gsm8k["label"] == -1


def test_builtin_specs_are_the_shipped_yaml_files_and_keep_the_old_interface():
    assert sorted(TASKS) == sorted(p.stem for p in BUILTIN_DIR.glob("*.yaml"))
    assert {"agnews", "boolq", "gsm8k", "sst2", "squad", "mbpp", "humaneval", "ifeval", "dialogsum"} <= set(TASKS)
    classic = ("sst2", "agnews", "gsm8k", "boolq")
    assert {n: (TASKS[n].kind, TASKS[n].labels) for n in classic} == {
        "sst2": ("classification", (" negative", " positive")),
        "agnews": ("classification", (" World", " Sports", " Business", " Science")),
        "gsm8k": ("generation", ()),
        "boolq": ("classification", (" no", " yes")),
    }
    gsm8k = get_task("gsm8k")
    assert gsm8k.until == ("\nQuestion:", "\n\n\n") and gsm8k.max_gen_toks == 128 and gsm8k.metric == "exact_match"
    assert get_task(BUILTIN_DIR / "sst2.yaml") == TASKS["sst2"] and get_task(TASKS["sst2"]) is TASKS["sst2"]
    # the AG News special case lives in its spec now: headerless files, label names mapped to choices
    assert TASKS["agnews"].column_names == ("text", "label") and TASKS["agnews"].label_aliases["Sci/Tech"] == 3
    with_own = {"sst2", "dialogsum", "mbpp", "humaneval"}  # humaneval trains on mbpp (train_task): mbpp's split
    with_own |= {"mmlu", "mmlu-text"}  # carved out of MMLU's test set (split_carve)
    assert {n for n in TASKS if has_validation_split(n)} == with_own


def test_boolq_loads_with_yes_no_labels():
    train, test = load_task("boolq", "train"), load_task("boolq", "test")
    assert (len(train), len(test)) == (9427, 3270)  # train.jsonl / dev.jsonl, as the data README gives them
    assert sum(train["label"]) == 5874 and sum(test["label"]) == 2033  # answer true -> label 1 (" yes")
    assert {(r["target"], r["label"]) for r in test} == {(" no", 0), (" yes", 1)}
    row = load_task("boolq", "test", 3, 0)[0]
    assert row["prompt"].startswith("Passage: ") and "\nQuestion: " in row["prompt"]
    assert row["prompt"].endswith("?\nAnswer:")
    assert not has_validation_split("boolq")


# ------------------------------------------------------------------------- a spec for a data set the package lacks

REVIEWS = 'review,verdict\n"Great, really great film",good\nAwful.,bad\n"Fine, I guess",good\nDull and slow.,bad\n'
SPEC = """\
# my own task: a review -> bad / good
task: my-reviews
output_type: multiple_choice
doc_to_text: "Review: {{ review | trim }}\\nVerdict:"
doc_to_target: verdict
doc_to_choice: [bad, good]
data_files:
  train: reviews.csv
  test: reviews.csv
"""


def _write(folder: Path, spec: str = SPEC, name: str = "my.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "reviews.csv").write_text(REVIEWS, encoding="utf-8")
    (folder / name).write_text(spec, encoding="utf-8")
    return folder / name


def test_a_spec_file_for_an_unshipped_csv_loads(tmp_path):
    spec = _write(tmp_path)
    ds = load_task(str(spec), "train")
    assert ds["prompt"] == [
        "Review: Great, really great film\nVerdict:",
        "Review: Awful.\nVerdict:",
        "Review: Fine, I guess\nVerdict:",
        "Review: Dull and slow.\nVerdict:",
    ]
    assert ds["target"] == [" good", " bad", " good", " bad"] and ds["label"] == [1, 0, 1, 0]
    assert load_task(spec, "test", 2, 0)["prompt"] == load_task(read_spec(spec), "test", 2, 0)["prompt"]
    assert get_task(spec).name == "my-reviews" and not has_validation_split(spec)


def test_relative_data_files_are_looked_up_beside_the_spec_then_in_the_data_folder(tmp_path):
    data, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    _write(data / "mine")  # the CSV in a data folder laid out like shared/data
    spec = _write(elsewhere, SPEC.replace("reviews.csv", "mine/reviews.csv"))  # the spec elsewhere, without it
    assert len(load_task(spec, "test", source=str(data))) == 4
    (elsewhere / "mine").mkdir()
    (elsewhere / "mine" / "reviews.csv").write_text(REVIEWS.replace("Awful.", "Awful!"))
    assert load_task(spec, "test", source=str(data))["prompt"][1] == "Review: Awful!\nVerdict:"  # beside the spec


def test_generate_until_over_jsonl_and_multiple_choice_over_a_headerless_tsv(tmp_path):
    rows = [{"q": "2 + 2?", "a": " 4 ", "id": 1}, {"q": "3 * 3?", "a": "9", "id": 2}]
    (tmp_path / "math.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "spec.yaml").write_text(
        'task: sums\noutput_type: generate_until\ndoc_to_text: "Q: {{ q }}\\nA:"\ndoc_to_target: "{{ a | trim }}"\n'
        'generation_kwargs: {until: ["\\n"], max_gen_toks: 8}\ndata_files: {train: math.jsonl, test: math.jsonl}\n'
    )
    ds = load_task(tmp_path / "spec.yaml", "test")
    assert (
        ds["prompt"] == ["Q: 2 + 2?\nA:", "Q: 3 * 3?\nA:"] and ds["target"] == [" 4", " 9"] and ds["label"] == [-1] * 2
    )
    spec = get_task(tmp_path / "spec.yaml")
    assert (spec.kind, spec.until, spec.max_gen_toks, spec.metric) == ("generation", ("\n",), 8, "exact_match")
    # headerless TSV, label names mapped by label_aliases, choice words matched as they are
    (tmp_path / "topics.tsv").write_text("a goal\tSPORT\nrates rise\tbusiness\nnew chip\t2\n")
    (tmp_path / "topics.yaml").write_text(
        "task: topics\noutput_type: multiple_choice\ndoc_to_text: 'News: {{ story }}\\nTopic:'\ndoc_to_target: topic\n"
        "doc_to_choice: [sport, business, tech]\nlabel_aliases: {SPORT: 0}\ncolumn_names: [story, topic]\n"
        "data_files: {train: topics.tsv, test: topics.tsv}\n"
    )
    topics = load_task(tmp_path / "topics.yaml", "test")
    assert topics["label"] == [0, 1, 2] and topics["target"] == [" sport", " business", " tech"]


def test_templates_take_bare_fields_as_they_are_and_render_in_a_sandbox():
    assert fields_of("{{ passage | trim }} {% for x in opts %}{{ x }}{% endfor %} {{ range(2) | list }} {{ q }}") == (
        "passage",
        "opts",
        "q",
    )
    assert render("answer", {"answer": True}) is True and render("{{ answer }}\n", {"answer": True}) == "True\n"
    with pytest.raises(Exception, match="unsafe"):
        render("{{ a.__class__.__mro__ }}", {"a": "x"})


@pytest.mark.slow
def test_cli_finetunes_a_tiny_model_on_a_spec_file(tmp_path, capsys):
    from topotuner_lab.cli import main

    spec = _write(tmp_path / "task", SPEC.replace("reviews.csv", "more.csv"))
    (spec.parent / "more.csv").write_text("review,verdict\n" + "".join(REVIEWS.splitlines(True)[1:] * 4))
    run = tmp_path / "run"
    argv = ["finetune", "--model", "tiny-llama", "--task", str(spec), "-o", str(run), "--epochs", "1"]
    argv += [
        "--n-train",
        "8",
        "--n-test",
        "4",
        "--n-ood",
        "4",
        "--n-ppl",
        "2",
        "--batch-size",
        "4",
        "--max-length",
        "32",
    ]
    assert main(argv) == 0, capsys.readouterr().err
    results = json.loads((run / "results.json").read_text())
    assert results["task"] == str(spec) and 0.0 <= results["test_accuracy"] <= 1.0
    assert f"on {spec}: test acc " in capsys.readouterr().out


# ------------------------------------------------------------------------- bad specs: one line naming the field

BAD = [
    (
        "missing-field",
        lambda s: s.replace('doc_to_text: "Review: {{ review | trim }}\\nVerdict:"\n', ""),
        "doc_to_text",
    ),
    (
        "output-type",
        lambda s: s.replace("multiple_choice", "loglikelihood"),
        "output_type='loglikelihood' is not one of multiple_choice, generate_until",
    ),
    ("typo", lambda s: s + "doc_to_txt: x\n", "unknown field 'doc_to_txt'"),
    ("lm-eval-only", lambda s: s + "fewshot_config: {sampler: first_n}\n", "fewshot_config is not supported"),
    ("yes-no-unquoted", lambda s: s.replace("[bad, good]", "[no, yes]"), "doc_to_choice=(False, True)"),
    ("no-choices", lambda s: s.replace("doc_to_choice: [bad, good]\n", ""), "needs doc_to_choice"),
    ("jinja-syntax", lambda s: s.replace("{{ review | trim }}", "{{ review }"), "doc_to_text is not a valid Jinja2"),
    ("split-name", lambda s: s.replace("train: reviews.csv", "trian: reviews.csv"), "data_files has split 'trian'"),
    ("file-format", lambda s: s.replace("train: reviews.csv", "train: r.txt"), "data_files.train='r.txt'"),
    ("no-test", lambda s: s.replace("  test: reviews.csv\n", ""), "data_files lacks split(s) ['test']"),
    ("alias-range", lambda s: s + "label_aliases: {meh: 5}\n", "label_aliases.meh=5"),
    ("generation-kwargs", lambda s: s + "generation_kwargs: {until: [x]}\n", "generation_kwargs is for generate_until"),
    ("metric", lambda s: s + "metric_list: [{metric: exact_match}]\n", "metric_list[0].metric='exact_match'"),
    ("bad-name", lambda s: s.replace("task: my-reviews", "task: my reviews"), "task='my reviews'"),
    ("yaml", lambda s: s + "x: [unclosed\n", "is not valid YAML"),
]


@pytest.mark.parametrize("edit, message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_spec_is_one_line_naming_the_field(tmp_path, edit, message):
    spec = _write(tmp_path, edit(SPEC))
    with pytest.raises(TaskError) as info:
        get_task(spec)
    assert message in info.value.problem and str(spec) in info.value.problem
    assert "\n" not in info.value.problem and "\n" not in info.value.fix and info.value.fix


@pytest.mark.parametrize(
    "edit, message",
    [
        pytest.param(
            lambda s: s.replace("{{ review | trim }}", "{{ reveiw }}"),
            "has no column(s) ['reveiw'] named by doc_to_text of task 'my-reviews'",
            id="template-names-a-missing-column",
        ),
        pytest.param(
            lambda s: s.replace("train: reviews.csv", "train: gone.csv"),
            "gone.csv (data_files.train) for task 'my-reviews' does not exist",
            id="missing-file",
        ),
        pytest.param(
            lambda s: s.replace("[bad, good]", "[poor, fine]"),
            "label 'good' (doc_to_target) is not one of task 'my-reviews''s 2 labels",
            id="label-not-a-choice",
        ),
        pytest.param(
            lambda s: s.replace("{{ review | trim }}", "{{ review.__class__ }}"),
            "doc_to_text of task 'my-reviews' fails on a row",
            id="unsafe-template",
        ),
    ],
)
def test_a_spec_that_does_not_fit_its_data_fails_on_loading_naming_the_field(tmp_path, edit, message):
    spec = _write(tmp_path, edit(SPEC))
    with pytest.raises(TaskError) as info:
        load_task(spec, "train")
    assert message in info.value.problem and "\n" not in info.value.problem


def test_unknown_names_and_missing_spec_files(tmp_path):
    with pytest.raises(TaskError, match="unknown task 'mnli'") as info:
        get_task("mnli")
    assert "sst2" in info.value.fix and ".yaml" in info.value.fix
    with pytest.raises(TaskError, match="task spec file .*none.yaml does not exist"):
        get_task(tmp_path / "none.yaml")
    no_hub = TaskSpec.from_dict(
        {"task": "local", "output_type": "generate_until", "doc_to_text": "{{q}}", "doc_to_target": "a"}
        | {"data_files": {"train": "x.jsonl", "test": "x.jsonl"}}
    )
    with pytest.raises(TaskError, match="has no hub copy"):
        load_task(no_hub, "test", source="hub")


def test_a_bad_spec_on_the_command_line_is_one_clear_message(tmp_path, capsys):
    from topotuner_lab.cli import main

    spec = _write(tmp_path, SPEC.replace("multiple_choice", "loglikelihood"))
    assert main(["finetune", "--model", "tiny-llama", "--task", str(spec), "-o", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("error: task spec ") and "output_type='loglikelihood'" in err[0]
    assert err[1].startswith("  How to fix: use one of multiple_choice") and len(err) == 2
