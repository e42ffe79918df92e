"""docs/RESULTS.md from a comparison run: tables, drift heatmaps per prior task, which projection
kinds drift most, and a claim-by-claim check against the paper computed from the numbers."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

import numpy as np

from . import atomic
from .drift import DriftSettings, drift_table, load_table
from .plots import drift_heatmaps, save_figure
from .snapshot import Snapshot, load_snapshot, perturb_snapshot

CLAIMS = (
    "competitive with full fine-tuning",
    "beats LoRA at a matched budget (paper: 7 of 9 settings)",
    "faster per epoch than full FT (paper: 20.4%) and than LoRA (paper: 5.5%)",
    "early stopping often stops after 2-3 of 6 epochs",
    "less forgetting than full FT",
)


def _fmt(results: pd.DataFrame) -> str:
    shown = results.drop(columns=["seed"] if results["seed"].nunique() == 1 else []).copy()
    for col in shown.columns:
        if shown[col].dtype.kind == "f":
            shown[col] = shown[col].map(lambda v: "" if pd.isna(v) else f"{v:.3g}")
    return shown.to_markdown(index=False)


def claim_checks(results: pd.DataFrame) -> list[str]:
    """One line per paper claim: what the numbers here say, and whether it held."""
    lines = []
    profiles = results[results["run"].str.startswith("profile:high-drift") | results["run"].str.startswith("profile:low-drift")]
    groups = list(results.groupby(["prior", "target", "seed"]))
    best_vs_full, beats_lora, faster_full, faster_lora, less_forget = [], 0, [], [], []
    for (prior, target, seed), g in groups:
        full = g[g["run"] == "full"].iloc[0]
        topo = profiles[(profiles["prior"] == prior) & (profiles["target"] == target) & (profiles["seed"] == seed)]
        best = topo.loc[topo["test_acc"].idxmax()]
        best_vs_full.append(best["test_acc"] - full["test_acc"])
        for _, lora in g[g["run"].str.startswith("lora@")].iterrows():
            budget = lora["run"].split("@")[1]
            same = topo[topo["run"].str.endswith("@" + budget)]
            beats_lora += int(same["test_acc"].max() > lora["test_acc"])
            faster_lora.append(same["sec_per_epoch"].median() / lora["sec_per_epoch"])
        faster_full.append(topo["sec_per_epoch"].median() / full["sec_per_epoch"])
        less_forget.append((full["ood_acc_before"] - full["ood_acc_after"]) - (best["ood_acc_before"] - best["ood_acc_after"]))
    n_lora = int(results["run"].str.startswith("lora@").sum())
    held = lambda ok: "**held**" if ok else "**did not hold**"
    mean = lambda xs: sum(xs) / max(1, len(xs))
    lines.append(f"- {CLAIMS[0]}: best TopoTuner profile minus full FT test accuracy = {', '.join(f'{d:+.3f}' for d in best_vs_full)} -> {held(min(best_vs_full) > -0.03)} (within 3 points)")
    lines.append(f"- {CLAIMS[1]}: the best high/low-drift profile beat LoRA in {beats_lora} of {n_lora} settings -> {held(beats_lora > n_lora / 2)}")
    lines.append(f"- {CLAIMS[2]}: median profile time per epoch = {mean(faster_full):.2f}x full FT and {mean(faster_lora):.2f}x LoRA -> "
                 f"vs full FT {held(mean(faster_full) <= 0.8)}, vs LoRA {held(mean(faster_lora) <= 1.0)}")
    stops = results["stop_epoch"].dropna()
    lines.append(f"- {CLAIMS[3]}: stop epochs {sorted(stops.astype(int).tolist())} of {int(results['epochs_run'].max())} -> "
                 f"{held(len(stops) > 0 and stops.median() < results['epochs_run'].max())} (budget here is shorter than the paper's 6 epochs)")
    lines.append(f"- {CLAIMS[4]}: out-of-domain accuracy drop of full FT minus that of the best profile = {', '.join(f'{d:+.3f}' for d in less_forget)} -> {held(mean(less_forget) > 0)}")
    return lines


def grid_share(snapshot: Snapshot, block: int = 32, levels: int = 16) -> float:
    """Share of 32-weight blocks holding at most 16 distinct values: 1.0 for Q4_1-dequantized weights."""
    on_grid = total = 0
    for m in snapshot.matrices.values():
        blocks = m.reshape(-1, block)
        distinct = (np.diff(np.sort(blocks, axis=1), axis=1) != 0).sum(axis=1) + 1
        on_grid += int((distinct <= levels).sum())
        total += len(blocks)
    return on_grid / total


def noise_floor_section(out: Path, prior: str, table: pd.DataFrame) -> str:
    """Real drift beside the drift of a tiny random perturbation (the Q4_1 grid effect)."""
    pre_path, post_path = out / "pretrained.safetensors", out / f"prior-{prior}" / "after.safetensors"
    if not (pre_path.is_file() and post_path.is_file()):
        return ""
    pre, post = load_snapshot(pre_path), load_snapshot(post_path)
    noise = drift_table(pre, perturb_snapshot(pre, 1e-3), DriftSettings(orders=(1.0,), bottleneck=False))
    cols = ["h0_w1", "h1_w1", "rel_frobenius", "row_cosine_change"]
    ratio = (table[cols].median() / noise[cols].median()).to_frame("median fine-tune drift / median noise drift")
    return (f"\nNoise floor: the pretrained weights are dequantized from Q4_1, so {100 * grid_share(pre):.1f}% of their 32-weight blocks hold "
            f"at most 16 distinct values; after the fine-tune {100 * grid_share(post):.1f}% do. A random perturbation of std 1e-3 x each "
            "matrix's std also leaves the grid; the real drift over that noise floor:\n\n" + ratio.to_markdown(floatfmt=".3g") + "\n")


def write_report(out_dir: str | Path, target: str | Path, command: str) -> Path:
    """Write the Markdown report for the comparison under ``out_dir`` to ``target`` (figures beside it)."""
    out, target = Path(out_dir), Path(target)
    results = pd.read_csv(out / "results.csv")
    figures = target.parent / "figures"
    parts = [f"# Results: the paper's comparison in miniature\n\nProduced by `{command}` on {datetime.now(timezone.utc):%Y-%m-%d} "
             "(2 CPU cores, no GPU). Every number below comes from that run's `results.csv`; nothing is typed in by hand.\n"]
    parts.append("\n## Claims, checked against these numbers\n\n" + "\n".join(claim_checks(results)) + "\n")
    parts.append("\n## All runs\n\n`gap` = train - test accuracy; `ood_*` = accuracy on the other task (forgetting); `ppl_*` = perplexity on held-out "
                 "GSM8K text; `stop_epoch` = where topological early stopping fired (observe mode trains on, `acc_at_stop` is the accuracy then); "
                 "`peak_mem_mib` = resident memory above the start of training, sampled (see docs/BENCHMARKS.md for clean per-process memory).\n\n"
                 + _fmt(results) + "\n")
    for table_path in sorted(out.glob("drift-*.parquet")):
        prior = table_path.stem.removeprefix("drift-")
        table = load_table(table_path)
        table = table.assign(h0_w1_per_row=table["h0_w1"] / table["rows"])  # W1 sums over points: q/o have 3x the rows of k/v here
        by_kind = table.groupby("kind")[["h0_w1", "h0_w1_per_row", "h1_w1", "rel_frobenius"]].mean().reindex(["q", "k", "v", "o"])
        save_figure(drift_heatmaps(table, ["h0_w1", "h1_w1", "rel_frobenius"], title=f"Drift after the {prior} prior fine-tune"), figures / f"results_drift_{prior}")
        ranked = by_kind["h0_w1_per_row"].sort_values(ascending=False)
        parts.append(f"\n## Drift after the {prior} prior fine-tune\n\n![drift heatmaps](figures/results_drift_{prior}.png)\n\n"
                     f"Mean drift per projection kind (ranked by H0 W1 per row, since W1 sums over a diagram's points: {' > '.join(ranked.index)}):\n\n" + by_kind.to_markdown(floatfmt=".4g") + "\n"
                     + noise_floor_section(out, prior, table))
    atomic.write_text(target, "".join(parts))
    return target
