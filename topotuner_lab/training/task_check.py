"""A task before any training: its rows, labels, answer and token lengths, and every problem the loader would raise.

:func:`check_task` reads each split of a task as a fine-tune reads it (:func:`~topotuner_lab.tasks.loading.load_task`)
and measures it with the model's tokenizer alone (no weights are loaded): rows per split, label balance and the
majority baseline (classification), answer lengths (generation), prompt token percentiles and the share of prompts that
``max_length`` cuts, by the rules training and scoring apply (:func:`~topotuner_lab.training.evaluation.encode`),
with the task's few-shot examples before the scored prompts too (:mod:`~topotuner_lab.tasks.fewshot`).
It lives on the training floor because those rules do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from topotuner_lab._io.errors import ModelLoadError, TaskError
from topotuner_lab._io.paths import model_cache_dir
from topotuner_lab.tasks.fewshot import fewshot_count, with_fewshot
from topotuner_lab.tasks.loading import has_validation_split, load_task
from topotuner_lab.tasks.registry import get_task, training_spec
from topotuner_lab.training.config import FinetuneConfig
from topotuner_lab.training.data import chat_framed
from topotuner_lab.training.evaluation import encode
from topotuner_lab.weights.models import DEFAULT_MODEL, PACKAGED_MODELS, TINY_MODELS, embedded_gguf_path, tiny_tokenizer

__all__ = ["Lengths", "SplitCheck", "TaskCheck", "check_task", "load_tokenizer"]

#: ``max_length`` unless told: the fine-tune's own default
DEFAULT_MAX_LENGTH: int = FinetuneConfig().max_length
#: rows per split whose tokens are counted (drawn at random when a split holds more): percentiles settle long before
TOKEN_ROWS = 1000
#: characters of a sample prompt or target shown (its start and end)
SHOWN_CHARS = 400


def load_tokenizer(model: str | None = None) -> Any:
    """The tokenizer of ``model`` (a name, folder, ``.gguf`` file or hub id, as ``load_model`` takes it), no weights.

    ``None`` is the embedded default; a tiny name gives the tiny models' byte tokenizer; a packaged model's tokenizer
    is read from its float32 export where one was made, else from the metadata of its GGUF file (slower).
    """
    from transformers import AutoTokenizer

    name = DEFAULT_MODEL if model is None else str(model)
    if name in TINY_MODELS:
        return tiny_tokenizer()
    if name in PACKAGED_MODELS:
        export = model_cache_dir() / f"{name}-f32"  # its float32 export (load_embedded's), once made
        path = export if (export / "tokenizer_config.json").is_file() else embedded_gguf_path(name)
    else:
        path = Path(name).expanduser()
    try:
        if path.suffix == ".gguf":
            return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        return AutoTokenizer.from_pretrained(path if path.exists() else name)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(
            f"no tokenizer could be read for model {name!r} ({exc.__class__.__name__}: {str(exc).splitlines()[0]})",
            "pass a model name, a folder holding its tokenizer files, a .gguf file or a hub id (needs network); "
            "omit --model for the embedded default",
        ) from exc


@dataclass(frozen=True)
class Lengths:
    """Percentiles of a length (tokens or words) over some rows."""

    p50: float
    p90: float
    p99: float
    max: int

    @classmethod
    def of(cls, values: Sequence[int]) -> Lengths:
        """The percentiles of ``values`` (one or more)."""
        p50, p90, p99 = np.percentile(np.asarray(values, dtype=float), [50, 90, 99])
        return cls(float(p50), float(p90), float(p99), int(max(values)))

    def __str__(self) -> str:
        return f"{self.p50:.0f} / {self.p90:.0f} / {self.p99:.0f} / {self.max}"


@dataclass(frozen=True)
class SplitCheck:
    """One split as a fine-tune reads it; token figures over ``token_rows`` of its rows."""

    split: str
    rows: int
    #: classification: rows per label, in label order (by label word where the spec fixes the words)
    label_counts: dict[str, int]
    token_rows: int
    prompt_tokens: Lengths
    target_tokens: Lengths
    #: share of the counted rows whose prompt ``max_length`` cuts (from the left), by this split's rule
    prompts_cut: float
    #: share of the counted rows whose target training cuts (it keeps ``max_length - 2`` target tokens)
    targets_cut: float
    #: generation: the target's words; and the share of targets longer than the spec's ``max_gen_toks``
    target_words: Lengths | None
    over_max_gen_toks: float | None
    sample: tuple[str, str]
    #: scored splits with few-shot examples: the share of the counted prompts ``max_length`` cuts with them before
    fewshot_cut: float | None = None

    @property
    def majority(self) -> tuple[str, float] | None:
        """The most common label and its share: the accuracy of always answering it (None without labels)."""
        if not self.label_counts:
            return None
        label = max(self.label_counts, key=lambda k: self.label_counts[k])
        return label, self.label_counts[label] / max(1, self.rows)


@dataclass(frozen=True)
class TaskCheck:
    """What :func:`check_task` found: per split the rows and their lengths, and the loader's problems."""

    task: str
    output_type: str
    metric: str
    model: str
    max_length: int
    max_gen_toks: int | None
    #: rows read per split (None: all)
    rows: int | None
    splits: tuple[SplitCheck, ...]
    problems: tuple[str, ...] = field(default=())
    #: few-shot examples before each scored (validation, test) prompt
    num_fewshot: int = 0

    def text(self) -> str:
        """The check as lines of text (what ``topotuner-lab check-task`` prints)."""
        lines = [
            f"task {self.task}: {self.output_type}, metric {self.metric}; tokens by the tokenizer of {self.model}, "
            f"--max-length {self.max_length}"
            + (f", max_gen_toks {self.max_gen_toks}" if self.max_gen_toks is not None else ""),
        ]
        for s in self.splits:
            lines.append(f"{s.split}: {s.rows:,} rows" + (" drawn (--rows)" if self.rows is not None else ""))
            if s.label_counts:
                label, share = s.majority or ("", 0.0)
                counts = ", ".join(f"{k} {n:,} ({n / max(1, s.rows):.1%})" for k, n in s.label_counts.items())
                lines.append(f"  labels: {counts}; majority baseline {share:.3f} ({label})")
            if s.target_words is not None:
                lines.append(
                    f"  answers p50 / p90 / p99 / max: {s.target_words} words, {s.target_tokens} tokens; "
                    f"{s.over_max_gen_toks:.1%} longer than max_gen_toks"
                )
            lines.append(
                f"  prompt tokens p50 / p90 / p99 / max: {s.prompt_tokens} (over {s.token_rows:,} rows); "
                f"--max-length {self.max_length} cuts {s.prompts_cut:.1%} of prompts (from the left)"
                + (f" and {s.targets_cut:.1%} of targets" if s.targets_cut else "")
            )
            if s.fewshot_cut is not None:
                pushed = round((s.fewshot_cut - s.prompts_cut) * s.token_rows)
                lines.append(
                    f"  with {self.num_fewshot} few-shot examples: --max-length {self.max_length} cuts "
                    f"{s.fewshot_cut:.1%} of prompts ({pushed:,} of {s.token_rows:,} pushed past it by the examples)"
                )
        if self.splits:
            first = self.splits[0]
            lines += [f"sample ({first.split}, first row):", f"  prompt: {_shown(first.sample[0])}"]
            lines.append(f"  target: {_shown(first.sample[1])}")
        lines += [f"problem: {p}" for p in self.problems] or ["problems: none"]
        return "\n".join(lines)


def _shown(text: str, room: int = SHOWN_CHARS) -> str:
    """``text`` as a Python literal (newlines visible), its middle left out when it is longer than ``room``."""
    if len(text) <= room:
        return repr(text)
    return f"{text[: room // 2]!r} ... {text[-room // 2 :]!r} ({len(text):,} characters)"


def _splits(spec: Any, source: str | None) -> tuple[str, ...]:
    """The splits a fine-tune reads: train and test, and validation where the task has its own."""
    return ("train", "validation", "test") if has_validation_split(spec, source) else ("train", "test")


def _cut_shares(
    tokenizer: Any, rows: Any, split: str, generation: bool, max_length: int
) -> tuple[list[int], list[int], float, float]:
    """Prompt and target token counts of ``rows``, and the shares of prompts and targets ``max_length`` cuts.

    Training rows are encoded as training encodes them (prompt, target and an end token within ``max_length``:
    ``trainer.tokenize_for_training``); test rows as scoring does: a label word after its prompt within
    ``max_length``, a generation prompt keeping its last ``max_length`` tokens.
    """
    prompts, targets = list(rows["prompt"]), list(rows["target"])
    prompt_counts = [len(ids) for ids in tokenizer(prompts, add_special_tokens=True).input_ids]
    target_counts = [len(ids) for ids in tokenizer(targets, add_special_tokens=False).input_ids]
    if split == "test":
        kept = [encode(tokenizer, p, "" if generation else t, max_length) for p, t in zip(prompts, targets)]
    else:
        kept = [encode(tokenizer, p, t, max_length - 1) for p, t in zip(prompts, targets)]
    prompts_cut = np.mean([len(k[0]) < n for k, n in zip(kept, prompt_counts)])
    targets_cut = 0.0 if split == "test" else np.mean([len(k[1]) < n for k, n in zip(kept, target_counts)])
    return prompt_counts, target_counts, float(prompts_cut), float(targets_cut)


def _check_split(
    spec: Any,
    task: str,
    split: str,
    tokenizer: Any,
    max_length: int,
    source: str | None,
    rows: int | None,
    shots: int = 0,
) -> SplitCheck:
    """One split's figures, ``shots`` few-shot examples before a scored prompt.

    A problem the loader, the few-shot draw or the chat template raises is a :class:`TaskError`.
    """
    ds = load_task(spec, split, rows, 0, source)
    framed_by = task if split == "test" else training_spec(spec)
    drawn = ds if len(ds) <= TOKEN_ROWS else ds.shuffle(seed=0).select(range(TOKEN_ROWS))
    counted = chat_framed(drawn, framed_by, tokenizer)
    generation = spec.kind == "generation"
    prompt_counts, target_counts, prompts_cut, targets_cut = _cut_shares(
        tokenizer, counted, split, generation, max_length
    )
    fewshot_cut = None
    if shots and split != "train":  # training rows stay zero-shot
        framed = chat_framed(with_fewshot(drawn, framed_by, shots, source), framed_by, tokenizer)
        fewshot_cut = _cut_shares(tokenizer, framed, split, generation, max_length)[2]
    labels: dict[str, int] = {}
    if spec.kind == "classification":
        words = spec.doc_to_choice if isinstance(spec.doc_to_choice, tuple) else ()
        found = np.bincount(np.asarray(ds["label"], dtype=int))
        labels = {(words[i] if i < len(words) else str(i)): int(n) for i, n in enumerate(found)}
        labels |= {w: 0 for w in words if w not in labels}
    words_per_target = [len(t.split()) for t in counted["target"]] if generation else None
    return SplitCheck(
        split=split,
        rows=len(ds),
        label_counts=labels,
        token_rows=len(counted),
        prompt_tokens=Lengths.of(prompt_counts),
        target_tokens=Lengths.of(target_counts),
        prompts_cut=prompts_cut,
        targets_cut=targets_cut,
        target_words=Lengths.of(words_per_target) if words_per_target else None,
        over_max_gen_toks=float(np.mean([n > spec.max_gen_toks for n in target_counts])) if generation else None,
        sample=(ds[0]["prompt"], ds[0]["target"]),
        fewshot_cut=fewshot_cut,
    )


def check_task(
    task: str,
    *,
    model: str | None = None,
    max_length: int = DEFAULT_MAX_LENGTH,
    source: str | None = None,
    rows: int | None = None,
    num_fewshot: int | None = None,
) -> TaskCheck:
    """Check ``task`` (a built-in name or a spec file) as a fine-tune would read it, without loading a model.

    Parameters
    ----------
    task : a built-in task or the path of a ``.yaml`` spec; a spec that cannot be read raises :class:`TaskError`.
    model : whose tokenizer counts the tokens (see :func:`load_tokenizer`; default the embedded model).
    max_length : tokens per example, as ``FinetuneConfig.max_length``.
    source : where rows come from, as ``FinetuneConfig.data_source`` (None: the offline copies).
    rows : rows read per split, drawn at random with seed 0 (None: all of them, exact counts).
    num_fewshot : few-shot examples before each scored prompt, as ``FinetuneConfig.num_fewshot`` (None: the spec's);
        the validation and test splits then also report the share of prompts ``max_length`` cuts with them.

    Returns
    -------
    :class:`TaskCheck`: the splits that loaded, and one line per problem of those that did not (``problems``).
    """
    spec = get_task(task)
    shots = fewshot_count(spec, num_fewshot)
    tokenizer = load_tokenizer(model)
    checked, problems = [], []
    for split in _splits(spec, source):
        try:
            checked.append(_check_split(spec, str(task), split, tokenizer, max_length, source, rows, shots))
        except TaskError as exc:
            problems.append(f"{split}: {exc.problem} (how to fix: {exc.fix})")
    return TaskCheck(
        task=spec.name,
        output_type=spec.output_type,
        metric=spec.metric,
        model=DEFAULT_MODEL if model is None else str(model),
        max_length=max_length,
        max_gen_toks=spec.max_gen_toks if spec.kind == "generation" else None,
        rows=rows,
        splits=tuple(checked),
        problems=tuple(problems),
        num_fewshot=shots,
    )
