"""Profile fine-tuning under ``accelerate launch`` with 2 CPU processes (DDP over gloo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from topotuner_lab.cli import main
from topotuner_lab.weights.snapshot import load_snapshot

pytestmark = pytest.mark.slow


# the sliding-window (Mistral) and q/k-norm, explicit head_dim (Qwen3) families too, ~25 s each
@pytest.mark.parametrize("model", ["tiny-llama", "tiny-mistral", "tiny-qwen3"])
def test_profile_finetune_runs_as_two_ddp_processes(tmp_path, model):
    pre, post, table, card = (tmp_path / n for n in ("pre.safetensors", "post.safetensors", "t.parquet", "card.json"))
    assert main(["extract", model, "-o", str(pre)]) == 0
    assert main(["perturb", str(pre), "-o", str(post)]) == 0
    assert main(["drift", str(pre), str(post), "-o", str(table), "-j", "1", "--no-cache"]) == 0
    assert (
        main(["profile", str(table), "--pretrained", str(pre), "--prior-task", "sst2", "--count", "2", "-o", str(card)])
        == 0
    )
    accelerate = Path(sys.executable).parent / "accelerate"
    cmd = [
        str(accelerate),
        "launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "-m",
        "topotuner_lab.cli",
        "finetune",
        "--model",
        model,
        "--method",
        "profile",
        "--profile",
        str(card),
        "--task",
        "agnews",
        "-o",
        str(tmp_path / "run"),
        "--epochs",
        "2",
        "--n-train",
        "32",
        "--n-test",
        "8",
        "--n-ood",
        "8",
        "--n-ppl",
        "2",
        "--max-length",
        "40",
        "--lr",
        "1e-3",
        "--save-snapshot",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["world_size"] == 2 and results["epochs_run"] == 2
    assert [h["step"] for h in results["log_history"]] == [
        2,
        4,
    ]  # 32 examples, batch 8, two processes: 2 steps per epoch
    before, after = load_snapshot(pre), load_snapshot(tmp_path / "run" / "after.safetensors")
    changed = {pid for pid in before.matrices if not np.array_equal(before.matrices[pid], after.matrices[pid])}
    assert changed == set(json.loads(card.read_text())["trainable"])
    assert not list((tmp_path / "run").glob("checkpoint-*"))  # a finished run keeps no checkpoint
