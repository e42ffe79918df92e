#!/usr/bin/env bash
# GPU smoke test, under 10 minutes on one GPU: the whole comparison on the tiny preset (reproduce --preset tiny), then
# one SmolLM2-135M profile fine-tune on SST-2 with a card built at small sizes, bf16 mixed precision and activation
# checkpointing. Prints the device, and for each part its precision, seconds and peak memory. It runs on a machine
# without a GPU too, and says so (bf16 autocast then runs on the CPU).
#
# Usage: scripts/gpu_smoke.sh [OUTPUT_DIR]     (default runs/gpu-smoke; a second run reuses what the first finished)
# Environment: PYTHON (default python), PRECISION (default bf16; fp16 on a GPU without bfloat16), PARTS ("tiny
# smollm2", the default, or either alone).
set -euo pipefail

OUT=${1:-runs/gpu-smoke}
PY=${PYTHON:-python}
PRECISION=${PRECISION:-bf16}
PARTS=${PARTS:-tiny smollm2}
mkdir -p "$OUT"
tt() { "$PY" -m topotuner_lab.cli "$@"; }

"$PY" - <<'EOF'
import os
import torch
if torch.cuda.is_available():
    props = torch.cuda.get_device_properties(0)
    print(f"device: {props.name}, {props.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}, "
          f"bf16 {'yes' if torch.cuda.is_bf16_supported() else 'no'}; torch {torch.__version__}")
else:
    print(f"device: CPU only, {os.cpu_count()} cores (no CUDA GPU: this run checks the CPU paths); "
          f"torch {torch.__version__}")
EOF

# what a part's results.json files say: runs, precision, seconds, peak memory (CUDA allocated, process resident)
summary() {
    "$PY" - "$@" <<'EOF'
import json, sys
from pathlib import Path
label, folder, seconds = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])
runs = [json.loads(p.read_text()) for p in sorted(folder.rglob("results.json"))]
cuda = [r["cuda_peak_allocated_mib"] for r in runs if r.get("cuda_peak_allocated_mib") is not None]
precisions = sorted({r["config"].get("precision", "fp32") for r in runs})
train = sum(r.get("train_seconds", 0.0) for r in runs)
print(f"{label}: {len(runs)} fine-tune(s) on {runs[0]['machine'] if runs else '?'}; precision {', '.join(precisions)}; "
      f"{seconds:.0f} s wall ({train:.0f} s training); peak memory: CUDA "
      f"{f'{max(cuda):.0f} MiB allocated' if cuda else 'none (no GPU)'}, resident "
      f"{max((r['peak_rss_mib'] for r in runs), default=0):.0f} MiB")
for r in runs if len(runs) == 1 else []:
    print(f"  {r['method']} on {r['task']}: {r['metric']} {r['test_accuracy']:.3f} "
          f"(zero-shot {r['test_accuracy_before']:.3f}), trainable {100 * r['trainable_fraction']:.2f}%")
EOF
}

if [[ " $PARTS " == *" tiny "* ]]; then
    start=$SECONDS
    tt reproduce --preset tiny -o "$OUT/tiny" >"$OUT/tiny.log" 2>&1 || { tail -20 "$OUT/tiny.log"; exit 1; }
    summary "tiny preset (fp32)" "$OUT/tiny" $((SECONDS - start))
fi

if [[ " $PARTS " == *" smollm2 "* ]]; then
    start=$SECONDS
    S="$OUT/smollm2"
    mkdir -p "$S"
    {   # a card at small sizes: drift of a slightly perturbed copy, H0 only (seconds), 8 matrices
        [[ -f "$S/pre.safetensors" ]] || tt extract -o "$S/pre.safetensors"
        [[ -f "$S/post.safetensors" ]] || tt perturb "$S/pre.safetensors" -o "$S/post.safetensors" --scale 0.01
        [[ -f "$S/drift.parquet" ]] || tt drift "$S/pre.safetensors" "$S/post.safetensors" -o "$S/drift.parquet" \
            --maxdim 0 -p 1 -j 2 --no-cache
        [[ -f "$S/card.json" ]] || tt profile "$S/drift.parquet" --pretrained "$S/pre.safetensors" \
            --prior-task sst2 --count 8 -o "$S/card.json"
        tt finetune --method profile --card "$S/card.json" --task sst2 -o "$S/run" --precision "$PRECISION" \
            --gradient-checkpointing --epochs 1 --n-train 256 --n-test 128 --n-ood 64 --n-ppl 16 \
            --batch-size 16 --max-length 64 --lr 1e-3
    } >"$OUT/smollm2.log" 2>&1 || { tail -20 "$OUT/smollm2.log"; exit 1; }
    summary "SmolLM2-135M profile fine-tune" "$S/run" $((SECONDS - start))
fi
