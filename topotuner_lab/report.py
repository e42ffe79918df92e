"""docs/RESULTS.md from a comparison run: tables, drift heatmaps per prior task, which projection
kinds drift most, and a claim-by-claim check against the paper computed from the numbers."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from . import atomic
from .drift import load_table
from .plots import drift_heatmaps, save_figure

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
                     f"Mean drift per projection kind (ranked by H0 W1 per row, since W1 sums over a diagram's points: {' > '.join(ranked.index)}):\n\n" + by_kind.to_markdown(floatfmt=".4g") + "\n")
    atomic.write_text(target, "".join(parts))
    return target
