"""LLaMA-3.1-8B shapes end to end: a generated checkpoint with some of its 32 layers at full size (hidden 4096,
8 KV heads, intermediate 14336, vocabulary 128256; random bf16 weights, one safetensors shard per layer plus the
embedding and head, an index json; made here and deleted after), streamed into a snapshot by `topotuner-lab extract`
under `/usr/bin/time -v` for 1, 2, 4, 8... and --layers layers (the smaller checkpoints are the first layers of the
generated one: their own config and index, the same shard files), then drift tables. Reports extraction peak RSS and
time per layer (the peak must not grow with the layer count: target <= 1.5 GB), drift time per layer for H0 and
H0+H1, and extrapolates to 32 layers.

python benchmarks/bench_8b_shape.py [--layers 8] [--drift-layers 2] [--h1-layers 1]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import publish, table

HIDDEN, KV, INTER, VOCAB, FULL_LAYERS = 4096, 1024, 14336, 128256, 32
CONFIG = dict(
    hidden_size=HIDDEN, intermediate_size=INTER, num_attention_heads=32, num_key_value_heads=8, vocab_size=VOCAB
)
EMBEDDING_SHARD = "model-emb.safetensors"


def layer_tensors(i: int) -> list[tuple[str, tuple[int, ...]]]:
    return [
        (f"model.layers.{i}.self_attn.q_proj.weight", (HIDDEN, HIDDEN)),
        (f"model.layers.{i}.self_attn.k_proj.weight", (KV, HIDDEN)),
        (f"model.layers.{i}.self_attn.v_proj.weight", (KV, HIDDEN)),
        (f"model.layers.{i}.self_attn.o_proj.weight", (HIDDEN, HIDDEN)),
        (f"model.layers.{i}.mlp.gate_proj.weight", (INTER, HIDDEN)),
        (f"model.layers.{i}.mlp.up_proj.weight", (INTER, HIDDEN)),
        (f"model.layers.{i}.mlp.down_proj.weight", (HIDDEN, INTER)),
        (f"model.layers.{i}.input_layernorm.weight", (HIDDEN,)),
        (f"model.layers.{i}.post_attention_layernorm.weight", (HIDDEN,)),
    ]


def write_index(folder: Path, layers: int, shards: dict[str, list[str]]) -> None:
    """``config.json`` for ``layers`` layers and the index of the shards they need."""
    from transformers import LlamaConfig

    LlamaConfig(**CONFIG, num_hidden_layers=layers).save_pretrained(folder)
    weight_map = {name: shard for shard, names in shards.items() for name in names}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def make_checkpoint(folder: Path, layers: int) -> tuple[float, dict[str, list[str]]]:
    """A LLaMA-3.1-8B-shaped checkpoint with ``layers`` full-size layers, one shard per layer; its size in GB and
    which tensors each shard holds."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    gen = torch.Generator().manual_seed(0)
    rand = lambda *shape: (torch.randn(*shape, generator=gen) * 0.02).to(torch.bfloat16)  # noqa: E731
    embedding = [
        ("model.embed_tokens.weight", (VOCAB, HIDDEN)),
        ("lm_head.weight", (VOCAB, HIDDEN)),
        ("model.norm.weight", (HIDDEN,)),
    ]
    shards, size = {}, 0
    for shard, tensors in [(EMBEDDING_SHARD, embedding)] + [
        (f"model-layer{i}.safetensors", layer_tensors(i)) for i in range(layers)
    ]:
        data = {name: rand(*shape) for name, shape in tensors}
        save_file(data, str(folder / shard), metadata={"format": "pt"})
        shards[shard] = list(data)
        size += sum(t.numel() * 2 for t in data.values())
        del data
    write_index(folder, layers, shards)
    return size / 1e9, shards


def first_layers(full: Path, shards: dict[str, list[str]], layers: int, folder: Path) -> float:
    """A checkpoint of the first ``layers`` layers of ``full`` (links to its shard files); its size in GB."""
    folder.mkdir()
    kept = {
        s: n
        for s, n in shards.items()
        if s == EMBEDDING_SHARD or int(s.removeprefix("model-layer").split(".")[0]) < layers
    }
    for shard in kept:
        (folder / shard).symlink_to(full / shard)
    write_index(folder, layers, kept)
    return sum((full / s).stat().st_size for s in kept) / 1e9


def extract_in_child(checkpoint: Path, output: Path) -> tuple[float, float]:
    """``topotuner-lab extract CHECKPOINT -o OUTPUT`` under ``/usr/bin/time -v``: wall seconds, peak RSS (GB)."""
    command = ["/usr/bin/time", "-v", sys.executable, "-m", "topotuner_lab.cli", "extract", str(checkpoint)]
    start = time.perf_counter()
    out = subprocess.run([*command, "-o", str(output)], check=True, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    peak_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", out.stderr).group(1))
    return seconds, peak_kb / 1e6


def drift_seconds(pre, post, pids: list[str], maxdim: int) -> tuple[float, dict]:
    from topotuner_lab.drift.cache import DriftCache
    from topotuner_lab.drift.compute import drift_between
    from topotuner_lab.drift.settings import DriftSettings

    settings = DriftSettings(maxdim=maxdim, orders=(1.0,), bottleneck=True)
    start = time.perf_counter()
    table_ = drift_between(pre.matrices, post.matrices, settings, pids=pids, n_jobs=2, cache=DriftCache(None))
    return time.perf_counter() - start, table_.set_index("pid")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=8, help="full-size layers generated (peak RSS measured up to it)")
    parser.add_argument("--drift-layers", type=int, default=2, help="layers whose H0 drift table is timed")
    parser.add_argument("--h1-layers", type=int, default=1)
    args = parser.parse_args()
    from topotuner_lab.weights.snapshot import load_snapshot, perturb_snapshot

    rows, drift_rows = [], []
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp_name:
        tmp = Path(tmp_name)
        start = time.perf_counter()
        full_size, shards = make_checkpoint(tmp / "full", args.layers)
        generated = f"generated {args.layers} layers ({full_size:.2f} GB) in {time.perf_counter() - start:.0f} s"
        print(generated, file=sys.stderr)
        counts = {2**k for k in range(8) if 2**k < args.layers} | {args.drift_layers, args.layers}
        for layers in sorted(counts):  # the peak must not grow with the layer count
            ckpt = tmp / "full" if layers == args.layers else tmp / f"first{layers}"
            size = full_size if layers == args.layers else first_layers(tmp / "full", shards, layers, ckpt)
            seconds, peak = extract_in_child(ckpt, tmp / f"pre{layers}.safetensors")
            rows.append(
                {
                    "layers": layers,
                    "checkpoint_GB (bf16)": size,
                    "extract_s": seconds,
                    "peak_RSS_GB": peak,
                    "within 1.5 GB": peak <= 1.5,
                }
            )
            print(rows[-1], file=sys.stderr)
            if layers != args.drift_layers:
                (tmp / f"pre{layers}.safetensors").unlink()
        shutil.rmtree(tmp / "full")
        per_layer, fixed = np.polyfit([r["layers"] for r in rows], [r["extract_s"] for r in rows], 1)
        fit = {"fixed_s": fixed, "s_per_layer": per_layer, "extrapolated 32-layer extract_s": fixed + per_layer * 32}
        pre = load_snapshot(tmp / f"pre{args.drift_layers}.safetensors")
        post = perturb_snapshot(pre, 1e-2)  # a stand-in fine-tune: every row moves
        all_pids = list(pre.matrices)
        h0_s, h0 = drift_seconds(pre, post, all_pids, 0)
        drift_rows.append(
            {
                "homology": "H0 (W1, bottleneck, magnitude)",
                "layers measured": args.drift_layers,
                "s_per_layer": h0_s / args.drift_layers,
                "extrapolated 32 layers_min": h0_s / args.drift_layers * FULL_LAYERS / 60,
            }
        )
        print(drift_rows[-1], file=sys.stderr)
        h1_pids = [p for p in all_pids if int(p.split(".")[0][1:]) < args.h1_layers]
        h1_s, h1 = drift_seconds(pre, post, h1_pids, 1)
        drift_rows.append(
            {
                "homology": "H0+H1 (W1, bottleneck, magnitude)",
                "layers measured": args.h1_layers,
                "s_per_layer": h1_s / args.h1_layers,
                "extrapolated 32 layers_min": h1_s / args.h1_layers * FULL_LAYERS / 60,
                "H1 points (q, k, v, o of layer 0)": ", ".join(
                    str(int(h1.loc[f"L0.{k}", "n_h1_before"])) for k in "qkvo"
                ),
            }
        )
        print(drift_rows[-1], file=sys.stderr)
    md = (
        "### LLaMA-3.1-8B shapes: streaming extraction and drift per layer\n\n"
        f"A generated checkpoint of {args.layers} full-size layers with the 8B model's shapes (random bf16 weights, "
        "one safetensors shard per layer plus the embedding and head, an index json); the smaller rows are its first "
        "layers (their own config and index over the same shard files). Each is streamed into a float32 snapshot by "
        "`topotuner-lab extract FOLDER -o FILE` in a fresh process (one tensor in memory at a time, no model; the "
        "written file is verified by reading it back in chunks). Peak RSS is `/usr/bin/time -v`'s maximum resident "
        "set size of that process; the target is <= 1.5 GB whatever the layer count.\n\n"
        + table(rows)
        + "\nExtraction time, a straight line through those rows (start-up and the embedding shard's header, then "
        "each layer):\n\n"
        + table([fit])
        + "\nDrift between a snapshot and a 1e-2 random perturbation of it (2 processes, no cache; exact H0, H1 "
        "by giotto-ph, W1 by the H0 route / hera above 2,000 H1 points, exact bottleneck, Lanczos spectral norm). The "
        "per-layer time is measured on the layers given, then multiplied by 32.\n\n" + table(drift_rows)
    )
    command = f"python benchmarks/bench_8b_shape.py --layers {args.layers} --drift-layers {args.drift_layers}"
    publish(
        "8b_shape",
        md,
        {"extraction": rows, "extraction_fit": fit, "drift": drift_rows},
        command + f" --h1-layers {args.h1_layers}",
    )


if __name__ == "__main__":
    main()
