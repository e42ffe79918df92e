"""One registry per kind: the metrics specs name and scorers compute, the built-in tasks read lazily, the claim ids."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from topotuner_lab._io.errors import ParameterError, TaskError
from topotuner_lab.lab.report.sections import claims_section
from topotuner_lab.study import claims as claims_module
from topotuner_lab.study.claim_ids import CLAIM_TITLES, ClaimId
from topotuner_lab.study.claims import claim_results
from topotuner_lab.study.presets import Preset, read_preset
from topotuner_lab.study.stats import bootstrap_ratio
from topotuner_lab.tasks.metrics import OUTPUT_TYPES, REGISTRY, metric_names, register_metric
from topotuner_lab.tasks.registry import TASKS

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture
def registry():
    """The metric registry, restored after the test (registering is global)."""
    saved = dict(REGISTRY)
    yield REGISTRY
    REGISTRY.clear()
    REGISTRY.update(saved)


# metrics ---------------------------------------------------------------------------------------------------------
def test_the_registry_holds_every_metric_a_builtin_spec_names_for_its_output_type():
    for name in TASKS:
        spec = TASKS[name]
        for metric in spec.metrics:
            assert REGISTRY[metric].output_type == spec.output_type, (name, metric)
    assert {REGISTRY[m].output_type for m in REGISTRY} == set(OUTPUT_TYPES)
    assert [metric_names(t)[0] for t in OUTPUT_TYPES] == ["acc", "exact_match", "ndcg@10"]  # each type's default
    assert all(metric.higher_is_better for metric in REGISTRY.values())
    generation = [m for m in REGISTRY.values() if m.output_type == "generate_until"]
    assert all(m.score is not None for m in generation) and REGISTRY["pass@1"].requires == "doc_to_program"


def test_a_spec_naming_an_unknown_metric_is_one_error_listing_the_known_ones():
    with pytest.raises(TaskError) as caught:
        replace(TASKS["gsm8k"], metric_list=({"metric": "bleu"},))
    assert "metric_list[0].metric='bleu' is not a known metric" in caught.value.problem
    assert (
        all(name in caught.value.fix for name in metric_names("generate_until"))
        and "register_metric" in caught.value.fix
    )
    with pytest.raises(TaskError, match="'acc' is not scored for output_type generate_until"):
        replace(TASKS["gsm8k"], metric_list=({"metric": "acc"},))


def _shout(answers, rows, spec, limits):
    return {"shout": np.asarray([float(a.isupper()) for a in answers])}


def test_a_metric_registered_once_is_named_by_specs_and_computed_by_the_scorer(registry, monkeypatch):
    import datasets

    from topotuner_lab.training.scoring import TaskScorer

    asks = {"metric_list": ({"metric": "shout", "higher_is_better": False}, {"metric": "exact_match"})}
    with pytest.raises(TaskError, match="'shout' is not a known metric"):
        replace(TASKS["gsm8k"], **asks)
    register_metric("shout", score=_shout, higher_is_better=False)
    spec = replace(TASKS["gsm8k"], **asks)  # the spec reads the entry: lower is better, as registered
    assert spec.metric == "shout" and spec.metrics == ("shout", "exact_match")
    with pytest.raises(TaskError, match="lower is better"):
        replace(TASKS["gsm8k"], metric_list=({"metric": "shout", "higher_is_better": True},))

    scorer = TaskScorer(spec, tokenizer=None)
    monkeypatch.setattr(scorer, "answers", lambda model, ds: ["YES #### 4", "no #### 5"])
    rows = datasets.Dataset.from_dict({"prompt": ["2+2?", "2+2?"], "target": [" #### 4", " #### 4"]})
    scores, answers = scorer.score_and_predict(None, rows)
    assert list(scores) == ["shout", "exact_match"] and answers == ["YES #### 4", "no #### 5"]
    assert scores["shout"].tolist() == [1.0, 0.0] and scores["exact_match"].tolist() == [1.0, 0.0]


def test_registering_refuses_a_taken_name_and_a_generation_metric_without_its_function(registry):
    with pytest.raises(ParameterError, match=re.escape("metric(s) ['f1'] are already registered")):
        register_metric("f1", score=_shout)
    with pytest.raises(ParameterError, match="need a score function"):
        register_metric("shout")
    with pytest.raises(ParameterError, match="computed by their model step"):
        register_metric("acc_shout", output_type="multiple_choice", score=_shout)
    assert "shout" not in REGISTRY and "acc_shout" not in REGISTRY


# built-in tasks ----------------------------------------------------------------------------------------------------
LAZY = """
import topotuner_lab._io.yaml_files as yaml_files

reads = []
real = yaml_files.read_yaml


def counted(path, *args, **kwargs):
    reads.append(str(path))
    return real(path, *args, **kwargs)


yaml_files.read_yaml = counted
import topotuner_lab, topotuner_lab.cli, topotuner_lab.training.config
from topotuner_lab.tasks.registry import TASKS, get_task

names = list(TASKS)
assert reads == [], reads
assert get_task("sst2") is get_task("sst2") is TASKS["sst2"]
print(len(names), [path.rsplit("/", 1)[1] for path in reads])
"""


def test_importing_the_package_reads_no_builtin_task_and_a_task_is_read_once_when_asked():
    out = subprocess.run([sys.executable, "-c", LAZY], capture_output=True, text=True, check=True).stdout
    assert out.split() == [str(len(TASKS)), "['sst2.yaml']"]


# claims ------------------------------------------------------------------------------------------------------------
def _comparison():
    """Full FT, LoRA, two topology cards and a control on one target, two seeds: most claims get judged."""
    rng = np.random.default_rng(0)
    rows, stored = [], {}
    for seed in (0, 1):
        for run in ("full", "lora@0.01", "profile:high-drift@0.01", "profile:low-drift@0.01", "profile:random@0.01"):
            values = (rng.random(40) < 0.7).astype(int).tolist()
            run_dir = f"{run}/{seed}"
            stored |= {(run_dir, "test_correct"): values, (run_dir, "ood_correct_after"): values}
            profile = run.startswith("profile")
            rows.append(
                dict(prior="sst2", target="agnews", seed=seed, run=run, lr=1e-4, schedule="linear", selected=True,
                     val_acc=0.8, test_acc=float(np.mean(values)), sec_per_epoch=6.0 if profile else 10.0,
                     epochs_run=6, stop_epoch=3 if profile else None, run_dir=run_dir)
            )  # fmt: skip
    return claim_results(pd.DataFrame(rows), lambda run_dir, key: stored[(run_dir, key)])


def _summary_claims(markdown: str) -> list[str]:
    """The claims a report's one-verdict-per-claim list names (``- CLAIM: **VERDICT**``)."""
    return re.findall(r"^- (.+): \*\*[^*]+\*\*$", markdown, flags=re.MULTILINE)


def test_every_claim_a_report_prints_is_registered(monkeypatch):
    # the claims' titles are under test, not their intervals: the timing ratios need not take 10,000 draws
    monkeypatch.setattr(claims_module, "bootstrap_ratio", partial(bootstrap_ratio, n_boot=100))
    claims = _comparison()
    printed = _summary_claims(claims_section(claims))
    assert len(printed) >= 8 and set(printed) <= set(CLAIM_TITLES)
    assert all(isinstance(c.claim, str) and type(c.claim) is str for c in claims)  # plain titles in tables
    shipped = [claim for path in sorted(DOCS.glob("RESULTS*.md")) for claim in _summary_claims(path.read_text())]
    assert shipped and set(shipped) <= set(CLAIM_TITLES)  # the committed reports, stability claims included


def test_a_preset_naming_an_unknown_primary_claim_is_refused_naming_the_known_ones(tmp_path):
    assert Preset().primary_claim == ClaimId.COMPETITIVE
    assert Preset(primary_claim=ClaimId.BEATS_PAPER_LORA.value).primary_claim == ClaimId.BEATS_PAPER_LORA
    path = tmp_path / "mine.yaml"
    path.write_text("primary_claim: competitive with full finetuning\n", encoding="utf-8")
    with pytest.raises(ParameterError) as caught:
        read_preset(path)
    assert str(path) in caught.value.problem and "is not a claim the comparison judges" in caught.value.problem
    assert "did you mean 'competitive with full fine-tuning'?" in caught.value.problem
    assert all(repr(title) in caught.value.fix for title in CLAIM_TITLES)
