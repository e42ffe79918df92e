"""Every command block of the README runs, in order, on the tiny model, or is listed below with why it cannot.

The blocks are parsed from README.md itself, so a changed README is what runs. Each ``##`` section's blocks run in
one fresh folder, in the order they appear: each command of a ``bash`` block (``topotuner-lab ...`` in-process), each
``python`` block, and each ``yaml`` block (a task spec, saved as ``<task>.yaml`` beside made-up rows for its
``data_files``). The only changes made to them are the tables below: :data:`REPLACE` and :data:`APPEND` (the tiny
model, tiny sizes) and :data:`PLACEHOLDERS` (folders made here). Every entry of those tables must still match the
README, and a command that is neither run nor in :data:`NOT_RUN` fails the test.
"""

from __future__ import annotations

import csv
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from topotuner_lab.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

#: README commands that do not run here, matched by how they start, each with the reason
NOT_RUN = {
    "make run": "the notebook series on the real SmolLM2-135M (about 16 min); tests/project/test_notebooks.py runs "
    "it on the tiny model",
    "make test": "the whole suite, this test included",
    "accelerate launch": "several processes; tests/training/test_distributed_finetune.py runs this DDP fine-tune with "
    "2 CPU processes",
    "topotuner-lab reproduce --preset compare": "the whole comparison (hours); tests/study/test_experiments.py runs "
    "`reproduce --preset tiny`",
    "topotuner-lab run-notebooks": "the notebook series (minutes); tests/project/test_notebooks.py runs the tiny "
    "preset",
    "topotuner-lab finetune --model meta-llama/Llama-3.1-8B": "an 8B model from the hub on a GPU; "
    "tests/training/test_gpu_ready.py runs bf16 and gradient checkpointing on the tiny model",
}
#: README text replaced before a command or code block runs: (text, replacement, why)
REPLACE = [
    ("topotuner-lab extract -o", "topotuner-lab extract tiny-llama -o", "the tiny model, not the embedded default"),
    ("load_model()", 'load_model("tiny-llama")', "the tiny model, not the embedded default"),
    (
        "--budget-fraction 0.01 ",
        "--budget-fraction 0.05 ",
        "1% of tiny-llama's 139,584 parameters is less than one 4,096-entry matrix",
    ),
    ("fraction=0.01", "fraction=0.05", "the same, in the Python API"),
    ("evaluate --task agnews -o", "evaluate --task agnews --model tiny-llama -o", "the tiny model, zero-shot"),
    (
        "save_snapshot=True)",
        "save_snapshot=True, n_train=8, n_test=8, n_ood=4, n_ppl=4, epochs=2, max_length=32)",
        "tiny sizes",
    ),
]
#: options appended to every README command of that name: the tiny model, tiny sizes, one drift worker
APPEND = {
    "finetune": "--model tiny-llama --n-train 8 --n-test 8 --n-ood 4 --n-ppl 4 --epochs 2 --max-length 32",
    "transfer-check": "--model tiny-llama --n-rows 8 --max-length 32",
    "check-task": "--model tiny-llama",
    "evaluate": "--n-test 8 --max-length 32",
    "drift": "-j 1",
}
#: README placeholders and the folders this test makes for them (see :func:`_make_placeholders`)
PLACEHOLDERS = {
    "CHECKPOINT_FOLDER": "checkpoint",  # tiny-llama saved with save_pretrained
    "ADAPTER_OR_RUN_FOLDER": "adapter",  # a LoRA adapter of it (peft)
}


@dataclass(frozen=True)
class Item:
    """One thing the README asks a reader to run: a shell command, a Python block or a YAML task spec."""

    section: str
    lang: str
    text: str
    line: int

    def __str__(self) -> str:
        return f"README.md:{self.line} ({self.section}): {self.text.splitlines()[0][:100]}"


def readme_items(text: str) -> list[Item]:
    """Every fenced block of ``text``: a bash block split into its commands (continued lines joined)."""
    items, section = [], ""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("## "):
            section = lines[i][3:].strip()
        fence = re.match(r"```(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        start = i + 1
        end = next(j for j in range(start, len(lines)) if lines[j].startswith("```"))
        body = "\n".join(lines[start:end])
        if fence.group(1) == "bash":
            joined = re.sub(r"\\\n\s*", "", body)
            offsets = [start + n + 1 for n, line in enumerate(lines[start:end]) if line.strip() and line[0] != " "]
            commands = [c for c in joined.splitlines() if c.strip()]
            items += [Item(section, "bash", c.strip(), line) for c, line in zip(commands, offsets)]
        else:
            items.append(Item(section, fence.group(1), body, start))
        i = end + 1
    return items


def not_run_reason(item: Item) -> str | None:
    """Why ``item`` is not run here (:data:`NOT_RUN`), or None."""
    return next((why for start, why in NOT_RUN.items() if item.text.startswith(start)), None)


def substituted(text: str, used: set[str]) -> str:
    """``text`` with :data:`REPLACE`'s replacements made; each one that matched is added to ``used``."""
    for old, new, _ in REPLACE:
        if old in text:
            text = text.replace(old, new)
            used.add(old)
    return text


def command_argv(item: Item, used: set[str]) -> list[str]:
    """The ``topotuner-lab`` arguments of a README command, substituted and with :data:`APPEND`'s options."""
    words = shlex.split(substituted(item.text, used), comments=True)
    assert words[0] == "topotuner-lab", f"{item} is neither run nor listed in NOT_RUN"
    words = [PLACEHOLDERS.get(w, w) for w in words[1:]]
    return words + shlex.split(APPEND.get(words[0], ""))


def _make_placeholders(folder: Path) -> None:
    """The folders :data:`PLACEHOLDERS` names: tiny-llama's checkpoint and a LoRA adapter trained on nothing."""
    from peft import LoraConfig, get_peft_model

    from topotuner_lab.weights.models import build_tiny_model

    build_tiny_model("tiny-llama").model.save_pretrained(folder / PLACEHOLDERS["CHECKPOINT_FOLDER"])
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    adapter = get_peft_model(build_tiny_model("tiny-llama").model, config)
    adapter.save_pretrained(folder / PLACEHOLDERS["ADAPTER_OR_RUN_FOLDER"])


def _write_task_spec(folder: Path, text: str) -> None:
    """A README task spec as ``<task>.yaml``, with a few made-up rows in each of its ``data_files``."""
    spec = yaml.safe_load(text)
    (folder / f"{spec['task']}.yaml").write_text(text)
    choices = spec["doc_to_choice"]
    target = spec["doc_to_target"]
    fields = set(re.findall(r"{{\s*(\w+)", spec["doc_to_text"])) - {target}
    for name in spec["data_files"].values():
        with open(folder / name, "w", newline="") as f:
            writer = csv.DictWriter(f, [*sorted(fields), target])
            writer.writeheader()
            for i in range(12):
                word = choices[i % 2]
                writer.writerow({**{c: f"{c} number {i}: it was {word}" for c in fields}, target: word})


def _run(item: Item, folder: Path, used: set[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(folder)
    if item.lang == "python":
        code = substituted(item.text, used)
        exec(compile(code, str(README), "exec"), {})  # noqa: S102 - the project's own documentation
    elif item.lang == "yaml":
        _write_task_spec(folder, item.text)
    elif item.lang == "bash":
        if (
            any(name in item.text for name in PLACEHOLDERS)
            and not (folder / PLACEHOLDERS["CHECKPOINT_FOLDER"]).exists()
        ):
            _make_placeholders(folder)
        argv = command_argv(item, used)
        assert main(argv) == 0, f"{item} failed (ran: topotuner-lab {shlex.join(argv)})"
    else:
        pytest.fail(f"{item}: a ```{item.lang} block is neither run nor listed in NOT_RUN")


def test_every_readme_block_is_run_or_listed_with_its_reason():
    """Fast: each README item is one this test runs (a known command, Python, a task spec) or one NOT_RUN lists."""
    items = readme_items(README.read_text())
    commands = set(build_parser()._subparsers._group_actions[0].choices)
    for item in items:
        if not_run_reason(item):
            continue
        assert item.lang in ("bash", "python", "yaml"), f"{item}: a ```{item.lang} block is neither run nor listed"
        if item.lang == "bash":
            words = shlex.split(item.text, comments=True)
            assert words[0] == "topotuner-lab" and words[1] in commands, f"{item} is neither run nor listed in NOT_RUN"
    for start in NOT_RUN:  # no stale entry: each still names a README command
        assert any(item.text.startswith(start) for item in items), f"NOT_RUN lists {start!r}, which the README lacks"
    assert any(item.lang == "yaml" for item in items) and any(item.lang == "python" for item in items)


@pytest.mark.slow
def test_readme_blocks_run_in_order_on_the_tiny_model(tmp_path, monkeypatch, capsys):
    """Every block not in NOT_RUN runs, section by section in a fresh folder each, and every table entry is used."""
    items = [item for item in readme_items(README.read_text()) if not not_run_reason(item)]
    used: set[str] = set()
    folders: dict[str, Path] = {}
    for item in items:
        if item.section not in folders:
            folders[item.section] = tmp_path / f"section-{len(folders)}"
            folders[item.section].mkdir()
        _run(item, folders[item.section], used, monkeypatch)
    assert used == {old for old, _, _ in REPLACE}, f"REPLACE entries the README no longer has: {set(REPLACE) - used}"
    pipeline = folders["The pipeline from the command line"]
    assert (pipeline / "card.json").is_file() and (pipeline / "runs/agnews-lora/results.json").is_file()
    assert (folders["The Python API"] / "card.json").is_file()
