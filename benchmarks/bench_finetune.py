"""Fine-tuning cost on SmolLM2-135M: seconds per epoch and peak memory of full FT, LoRA (rank matched
to the 1% profile) and TopoTuner 1% / 2% profiles, same data and batch, each in a fresh process.

Freezing saves more than the optimizer state: frozen weights get no gradient, and autograd stops the
backward pass below the lowest trainable layer (no embedding or lower-layer gradients are needed), so
the lowest trainable layer of each card is reported.

python benchmarks/bench_finetune.py
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, publish, table


def one(method: str, card: str, out: str) -> None:
    from topotuner_lab.training.config import FinetuneConfig
    from topotuner_lab.training.finetune import run_finetune
    from topotuner_lab.weights.models import load_model

    cfg = FinetuneConfig(
        method=method,
        task="sst2",
        output_dir=out,
        profile=card if card != "-" else None,
        lora_rank="match" if method == "lora" else 8,
        epochs=3,
        n_train=64,
        n_test=8,
        n_ood=8,
        n_ppl=4,
        batch_size=8,
        max_length=64,
        save_checkpoints=False,
    )
    run_finetune(load_model(), cfg)


def cards(tmp: Path) -> dict[str, Path]:
    from topotuner_lab.drift.cache import DriftCache
    from topotuner_lab.drift.compute import drift_table
    from topotuner_lab.drift.tables import load_table
    from topotuner_lab.profiles.card import ModelIdentity
    from topotuner_lab.profiles.select import CardSettings, build_profile
    from topotuner_lab.weights.extract import extract_snapshot
    from topotuner_lab.weights.models import load_model
    from topotuner_lab.weights.snapshot import perturb_snapshot

    loaded = load_model()
    pre = extract_snapshot(loaded)
    real = [
        path
        for path in (ROOT / "runs" / run / "drift-sst2.parquet" for run in ("reproduce-cpu-small", "reproduce-compare"))
        if path.is_file()
    ]
    table = load_table(real[0]) if real else drift_table(pre, perturb_snapshot(pre, 1e-3), cache=DriftCache(None))
    identity = ModelIdentity.from_snapshot(pre)  # the parameter count the snapshot records
    out = {}
    for name, strategy, budget in (
        ("profile 1% high-drift", "high-drift", 0.01),
        ("profile 2% high-drift", "high-drift", 0.02),
        ("profile 1% low-drift", "low-drift", 0.01),
    ):
        out[name] = build_profile(
            table, identity, CardSettings(prior_task="sst2", strategy=strategy, fraction=budget)
        ).save(tmp / f"{strategy}-{budget}.json")
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        made = cards(tmp)
        plan = [("full FT", "full", "-"), ("LoRA (rank matched to 1%)", "lora", str(made["profile 1% high-drift"]))]
        plan += [(name, "profile", str(path)) for name, path in made.items()]
        rows = []
        for name, method, card in plan:
            out = tmp / method / Path(card).stem
            subprocess.run([sys.executable, __file__, "--one", method, card, str(out)], check=True, capture_output=True)
            res = json.loads((out / "results.json").read_text())
            steady = res["epoch_seconds"][1:]  # the first epoch includes warm-up
            # full FT and LoRA (adapters on every layer) need gradients down to layer 0
            lowest = (
                min(int(p.split(".")[0][1:]) for p in json.loads(Path(card).read_text())["trainable"])
                if method == "profile"
                else 0
            )
            rows.append(
                {
                    "method": name,
                    "trainable %": 100 * res["trainable_fraction"],
                    "lowest trainable layer": lowest,
                    "s/epoch (median of epochs 2-3)": statistics.median(steady),
                    "peak RSS MiB": res["peak_rss_mib"],
                }
            )
            print(rows[-1], file=sys.stderr)
    full = rows[0]["s/epoch (median of epochs 2-3)"]
    lora = rows[1]["s/epoch (median of epochs 2-3)"]
    for r in rows:
        r["time / full FT"] = r["s/epoch (median of epochs 2-3)"] / full
        r["time / LoRA"] = r["s/epoch (median of epochs 2-3)"] / lora
    md = (
        "### Fine-tuning cost, SmolLM2-135M on SST-2 (64 examples, batch 8, 64 tokens, 3 epochs, CPU)\n\n"
        "Each method in a fresh process; peak memory = resident memory above the level before training (sampled "
        "every 20 ms). "
        "Cards ranked by H0 W1 drift of the SST-2 prior fine-tune.\n\n" + table(rows)
    )
    publish("finetune", md, rows)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        one(*sys.argv[2:5])
    else:
        main()
