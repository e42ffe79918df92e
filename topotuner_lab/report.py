"""docs/RESULTS.md from a comparison run: tables, drift heatmaps per prior task, which projection
kinds drift most, and a claim-by-claim check against the paper computed from the numbers."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import json

import numpy as np
import pandas as pd

from . import atomic
from .drift import DriftSettings, drift_table, load_table
from .plots import drift_heatmaps, save_figure
from .projections import KINDS
from .snapshot import Snapshot, load_snapshot, perturb_snapshot

CLAIMS = (
    "competitive with full fine-tuning",
    "beats LoRA at a matched budget (paper: 7 of 9 settings)",
    "faster per epoch than full FT (paper: 20.4%) and than LoRA (paper: 5.5%)",
    "early stopping often stops after 2-3 of 6 epochs",
    "less forgetting than full FT",
)


def markdown_table(table: pd.DataFrame) -> str:
    """A results table as Markdown, numbers rounded for reading; a ``seed`` column with one value is left out."""
    shown = table.drop(columns=["seed"] if "seed" in table and table["seed"].nunique() == 1 else []).copy()
    for col in shown.columns:
        if shown[col].dtype.kind == "f":
            shown[col] = shown[col].map(lambda v: "" if pd.isna(v) else f"{v:.3g}")
    return shown.to_markdown(index=False)


def _complete_groups(results: pd.DataFrame):
    """(prior, target, seed) groups that hold a full fine-tune to compare against (a partial run may lack one)."""
    for key, group in results.groupby(["prior", "target", "seed"]):
        if (group["run"] == "full").any():
            yield key, group


def claim_checks(results: pd.DataFrame) -> list[str]:
    """One line per paper claim: what the numbers here say, and whether it held."""
    lines = []
    is_topo = results["run"].str.startswith("profile:high-drift") | results["run"].str.startswith("profile:low-drift")
    is_control = results["run"].str.startswith("profile:random") | results["run"].str.startswith("profile:magnitude")
    best_vs_full, faster_full, faster_lora, less_forget, topo_vs_control = [], [], [], [], []
    beats_lora = n_lora = 0
    for _, g in _complete_groups(results):
        full = g[g["run"] == "full"].iloc[0]
        topo = g[is_topo.loc[g.index]]
        if topo.empty:
            continue
        best = topo.loc[topo["test_acc"].idxmax()]
        best_vs_full.append(best["test_acc"] - full["test_acc"])
        for _, lora in g[g["run"].str.startswith("lora@")].iterrows():
            same = topo[topo["run"].str.endswith("@" + lora["run"].split("@")[1])]
            if not same.empty:
                n_lora += 1
                beats_lora += int(same["test_acc"].max() > lora["test_acc"])
                faster_lora.append(same["sec_per_epoch"].median() / lora["sec_per_epoch"])
        controls = g[is_control.loc[g.index]]
        if not controls.empty:
            topo_vs_control.append(topo["test_acc"].max() - controls["test_acc"].max())
        faster_full.append(topo["sec_per_epoch"].median() / full["sec_per_epoch"])
        less_forget.append((full["ood_acc_before"] - full["ood_acc_after"]) - (best["ood_acc_before"] - best["ood_acc_after"]))
    held = lambda ok: "**held**" if ok else "**did not hold**"
    median = lambda xs: float(np.median(xs)) if xs else float("nan")
    n = len(best_vs_full)
    lines.append(f"- {CLAIMS[0]}: best high/low-drift profile minus full FT test accuracy, per setting and seed ({n}): "
                 f"{', '.join(f'{d:+.3f}' for d in best_vs_full)}; median {median(best_vs_full):+.3f} -> {held(median(best_vs_full) > -0.03)} (within 3 points)")
    lines.append(f"- {CLAIMS[1]}: the best high/low-drift profile beat LoRA in {beats_lora} of {n_lora} (setting, seed, budget) cases -> {held(beats_lora > n_lora / 2)}")
    lines.append(f"- {CLAIMS[2]}: median profile time per epoch = {median(faster_full):.2f}x full FT and {median(faster_lora):.2f}x LoRA -> "
                 f"vs full FT {held(median(faster_full) <= 0.8)}, vs LoRA {held(median(faster_lora) <= 1.0)}")
    stopped = results.dropna(subset=["stop_epoch"])
    budget = int(results["epochs_run"].max())
    if stopped.empty:
        lines.append(f"- {CLAIMS[3]}: the rule never fired within {budget} epochs -> **did not hold**")
    else:
        stops = stopped["stop_epoch"].astype(int)
        early = stopped[stops < budget]
        acc_cost = (early["test_acc"] - early["acc_at_stop"]).mean() if not early.empty else 0.0
        time_share = (early["train_sec_to_stop"] / early["train_sec"]).median() if not early.empty else 1.0
        lines.append(f"- {CLAIMS[3]}: stop epochs (of {budget}) {stops.value_counts().sort_index().to_dict()}; median {stops.median():g}. Where it stopped early "
                     f"({len(early)} of {len(stopped)} runs) it used {time_share:.0%} of the full budget's training time (drift computation included) and "
                     f"the full budget would have added {acc_cost:+.3f} test accuracy on average -> {held(stops.median() <= budget / 2)} (median stop in the first half)")
        if "drift_minus_lr_ratio" in results and results["drift_minus_lr_ratio"].notna().any():
            gap = results.groupby(results["run"].str.split(":|@", regex=True).str[0])["drift_minus_lr_ratio"].median()
            lines.append("  - what the rule measures here: normalized epoch drift minus the epoch's learning rate relative to the first epoch's "
                         "(linear decay), median per method: " + ", ".join(f"{k} {v:+.2f}" for k, v in gap.items()) + ". Near 0, the drift only "
                         "tracked the schedule, so with a linear decay the rule fires where the rate has fallen below the threshold; clearly "
                         "negative, the weights settled faster than the rate fell.")
    lines.append(f"- {CLAIMS[4]}: out-of-domain accuracy drop of full FT minus that of the best profile = {', '.join(f'{d:+.3f}' for d in less_forget)} -> {held(median(less_forget) > 0)}")
    lines.append(f"- not a paper claim, but the point of ranking by topology: best high/low-drift minus best random/magnitude control = "
                 f"{', '.join(f'{d:+.3f}' for d in topo_vs_control)} -> topology {'beat' if median(topo_vs_control) > 0 else 'did not beat'} the controls (median {median(topo_vs_control):+.3f})")
    return lines


def spread_table(results: pd.DataFrame) -> pd.DataFrame:
    """Mean and standard deviation over seeds, per setting and run."""
    with_drop = results.assign(ood_drop=results["ood_acc_before"] - results["ood_acc_after"])
    table = with_drop.groupby(["prior", "target", "run"], sort=False).agg(
        seeds=("seed", "nunique"), test_acc_mean=("test_acc", "mean"), test_acc_std=("test_acc", "std"), acc_at_stop_mean=("acc_at_stop", "mean"),
        stop_epoch_mean=("stop_epoch", "mean"), ood_drop_mean=("ood_drop", "mean"), sec_per_epoch_median=("sec_per_epoch", "median"),
        trainable_pct=("trainable_pct", "first"))
    return table.reset_index()


def grid_share(snapshot: Snapshot, block: int = 32, levels: int = 16) -> float:
    """Share of 32-weight blocks holding at most 16 distinct values: 1.0 for Q4_1-dequantized weights."""
    on_grid = total = 0
    for m in snapshot.matrices.values():
        blocks = m.reshape(-1, block)
        distinct = (np.diff(np.sort(blocks, axis=1), axis=1) != 0).sum(axis=1) + 1
        on_grid += int((distinct <= levels).sum())
        total += len(blocks)
    return on_grid / total


def drift_by_kind(table: pd.DataFrame) -> pd.DataFrame:
    """Mean drift per projection kind; H0 W1 also per row, since W1 sums over a diagram's points and kinds differ in rows."""
    table = table.assign(h0_w1_per_row=table["h0_w1"] / table["rows"])
    return table.groupby("kind")[["h0_w1", "h0_w1_per_row", "h1_w1", "rel_frobenius"]].mean().reindex(list(KINDS))


def model_family_section(kinds: dict[tuple[str, str], pd.Series]) -> str:
    """Which projection kinds drift most, per model and prior task (the paper: V/O in LLaMA and Mistral, K/Q in Qwen)."""
    table = pd.DataFrame(kinds).T.rename_axis(["model", "prior"])
    table["ranking"] = [" > ".join(row.sort_values(ascending=False).index) for _, row in table[list(KINDS)].iterrows()]
    tops = table.groupby(level="model")["ranking"].agg(lambda r: sorted({x.split(" > ")[0] for x in r}))
    return ("\n## Is the drift profile model-dependent?\n\nMean H0 W1 per row by projection kind, per model and prior task. The paper finds high "
            "V/O drift in LLaMA and Mistral and K/Q drift in Qwen. Most-drifting kind here: "
            + "; ".join(f"{model}: {', '.join(top)}" for model, top in tops.items()) + ".\n\n" + table.reset_index().to_markdown(index=False, floatfmt=".4g") + "\n")


def noise_drift(pre: Snapshot) -> pd.DataFrame:
    """Drift of a tiny random perturbation (std 1e-3 x each matrix's std) of the pretrained weights: the noise floor."""
    return drift_table(pre, perturb_snapshot(pre, 1e-3), DriftSettings(orders=(1.0,), bottleneck=False))


def noise_floor_section(pre: Snapshot, post_path: Path, table: pd.DataFrame, noise: pd.DataFrame) -> str:
    """Real drift beside the noise floor (the 4-bit grid effect); empty without the fine-tuned snapshot."""
    if not post_path.is_file():
        return ""
    post = load_snapshot(post_path)
    cols = ["h0_w1", "h1_w1", "rel_frobenius", "row_cosine_change"]
    ratio = (table[cols].median() / noise[cols].median()).to_frame("median fine-tune drift / median noise drift")
    return (f"\nNoise floor: {100 * grid_share(pre):.1f}% of the pretrained matrices' 32-weight blocks hold at most 16 distinct values (weights dequantized "
            f"from a 4-bit GGUF sit on such a grid; Q4_K_M keeps some matrices in 6 bits); after the fine-tune {100 * grid_share(post):.1f}% do. A random perturbation of std 1e-3 x each "
            "matrix's std also leaves the grid; the real drift over that noise floor:\n\n" + ratio.to_markdown(floatfmt=".3g") + "\n")


def setup_section(out: Path, runs: int) -> str:
    """What was run, from the preset the comparison recorded."""
    path = out / "preset.json"
    if not path.is_file():
        return ""
    preset = json.loads(path.read_text())
    prior, target = preset["prior"], preset["target"]
    lines = [
        f"Model: {preset['model'] or 'embedded SmolLM2-135M-Instruct'}; priors {', '.join(preset['prior_tasks'])}, each card transferred to the other "
        f"task(s) of {', '.join(preset['target_tasks'])}; seeds {preset['seeds']} (each sets the training seed and which rows are drawn).",
        f"Prior fine-tune: full FT, {prior['n_train']} examples x {prior['epochs']} epoch(s), lr {prior['learning_rate'] or 'default'}.",
        f"Targets: {target['n_train']} training / {target['n_test']} test examples, {target['epochs']} epochs, batch {target['batch_size']}, "
        f"{target['max_length']} tokens, linear learning-rate decay; untuned default learning rates (full 3e-5, LoRA 3e-4, profile 2e-4).",
        f"Cards: {', '.join(preset['strategies'])} ranked by `{preset['metric']}`, at budgets {', '.join(f'{100 * b:g}%' for b in preset['budgets'])} of all "
        "parameters; LoRA on q/k/v/o with the rank closest to the high-drift card's parameter count.",
        f"Early stopping: threshold {preset['stop_threshold']} on H0 W1 epoch-to-epoch drift normalized by the first epoch's"
        + (", observe mode (a stopped run is the full-budget run cut at its stop epoch: same seeds, same schedule)." if target["observe_only"] else "."),
    ]
    if preset.get("other_models"):
        lines.append(f"Drift only (own prior fine-tunes, no transfer grid): {', '.join(preset['other_models'])}.")
    per_setting = ("full" in preset["baselines"]) + len(preset["budgets"]) * (len(preset["strategies"]) + ("lora" in preset["baselines"]))
    settings = sum(t != p for p in preset["prior_tasks"] for t in preset["target_tasks"])
    planned = len(preset["seeds"]) * settings * len(preset["early_stopping"]) * per_setting
    if runs < planned:
        lines.append(f"**Partial run**: {runs} of the {planned} planned fine-tunes are done (seeds are the outer loop, so earlier seeds are complete); "
                     "rerunning the command resumes the rest.")
    return "\n## Setup\n\n" + "".join(f"- {line}\n" for line in lines)


def write_report(out_dir: str | Path, target: str | Path, command: str) -> Path:
    """Write the Markdown report for the comparison under ``out_dir`` to ``target`` (figures beside it)."""
    out, target = Path(out_dir), Path(target)
    results = pd.read_csv(out / "results.csv")
    figures = target.parent / "figures"
    parts = [f"# Results: the paper's comparison in miniature\n\nProduced by `{command}` on {datetime.now(timezone.utc):%Y-%m-%d} "
             "(2 CPU cores, no GPU). Every number below comes from that run's `results.csv`; nothing is typed in by hand.\n"]
    parts.append(setup_section(out, len(results)))
    parts.append("\n## Claims, checked against these numbers\n\n" + "\n".join(claim_checks(results)) + "\n")
    parts.append("\n## Mean and spread over seeds\n\n`test_acc_std` is the standard deviation over seeds (empty with one seed); `ood_drop_mean` = out-of-domain "
                 "accuracy before minus after (forgetting).\n\n" + markdown_table(spread_table(results)) + "\n")
    parts.append("\n## All runs\n\n`gap` = train - test accuracy; `ood_*` = accuracy on the other task (forgetting); `ppl_*` = perplexity on held-out "
                 "GSM8K text; `stop_epoch` = where topological early stopping fired (observe mode trains on, `acc_at_stop` is the accuracy then); "
                 "`peak_mem_mib` = resident memory above the start of training, sampled (see docs/BENCHMARKS.md for clean per-process memory).\n\n"
                 + markdown_table(results) + "\n")
    kinds: dict[tuple[str, str], pd.Series] = {}
    for folder in [out, *sorted(p for p in (out / "models").glob("*") if p.is_dir())]:
        tables = sorted(folder.glob("drift-*.parquet"))
        pre = load_snapshot(folder / "pretrained.safetensors") if tables and (folder / "pretrained.safetensors").is_file() else None
        noise = noise_drift(pre) if pre is not None else None  # one noise floor per model, shared by its prior tasks
        model = pre.model if pre is not None else folder.name
        tag = "" if folder == out else f"{folder.name}_"
        for table_path in tables:
            prior = table_path.stem.removeprefix("drift-")
            table = load_table(table_path)
            by_kind = drift_by_kind(table)
            kinds[(model, prior)] = by_kind["h0_w1_per_row"]
            save_figure(drift_heatmaps(table, ["h0_w1", "h1_w1", "rel_frobenius"], title=f"{model}: drift after the {prior} prior fine-tune"), figures / f"results_drift_{tag}{prior}")
            ranked = by_kind["h0_w1_per_row"].sort_values(ascending=False)
            parts.append(f"\n## {model}: drift after the {prior} prior fine-tune\n\n![drift heatmaps](figures/results_drift_{tag}{prior}.png)\n\n"
                         f"Mean drift per projection kind (ranked by H0 W1 per row, since W1 sums over a diagram's points: {' > '.join(ranked.index)}):\n\n"
                         + by_kind.to_markdown(floatfmt=".4g") + "\n"
                         + (noise_floor_section(pre, folder / f"prior-{prior}" / "after.safetensors", table, noise) if pre is not None else ""))
    if len({model for model, _ in kinds}) > 1:
        parts.append(model_family_section(kinds))
    atomic.write_text(target, "".join(parts))
    return target
