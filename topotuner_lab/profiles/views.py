"""Views of a profile card for people and other tools: a Markdown summary, Spectrum / axolotl YAML."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from topotuner_lab._io.errors import ProfileError
from topotuner_lab.profiles.card import ProfileCard
from topotuner_lab.weights.projections import enumerate_projections, is_llama_like

if TYPE_CHECKING:
    import torch


def card_markdown(card: ProfileCard) -> str:
    """A model-card-like summary for sharing."""
    top = "\n".join(
        f"| {i + 1} | `{r['pid']}` | {r['score']:.4g} | {'trainable' if r['pid'] in card.trainable else 'frozen'} |"
        for i, r in enumerate(card.ranking[:20])
    )
    return (
        f"# TopoTuner profile card: {card.strategy} on {card.prior_task}\n\n"
        f"- **Model**: {card.model.name} ({card.model.architecture}, weights `{card.model.weights_hash[:12]}`, "
        f"{card.model.total_params:,} parameters)\n"
        f"- **Prior task**: {card.prior_task}\n- **Strategy**: {card.strategy}, ranked by `{card.metric}` "
        f"({card.normalization})\n"
        f"- **Drift**: recipe {card.recipe or 'not recorded'}, {card.aggregation} over the prior's epochs"
        f"{f'; gradient of {card.gradient_task}' if card.gradient_task else ''}\n"
        f"- **Budget**: {card.budget}; **trainable**: {len(card.trainable)} projections, "
        f"{card.trainable_params:,} parameters "
        f"({100 * card.trainable_fraction:.2f}% of the model)\n"
        f"- **Trainable ids**: {', '.join(card.trainable)}\n"
        f"- **Stopping threshold**: {card.stop_threshold}\n- **Transferred to**: "
        f"{', '.join(card.transferred_to) or 'not in the card (each run records its card in results.json)'}\n"
        f"- **Seed**: {card.seed}; **created**: {card.created}; schema v{card.schema_version}\n\n"
        f"## Ranking (top 20)\n\n| rank | projection | score | state |\n|---|---|---|---|\n{top}\n"
    )


def spectrum_patterns(card: ProfileCard, model: torch.nn.Module | None = None) -> list[str]:
    """``unfrozen_parameters`` regexes (Spectrum / axolotl format) for the trainable projections."""
    if model is None:
        if not is_llama_like(card.model.architecture):
            raise ProfileError(
                f"parameter names of a {card.model.architecture!r} model cannot be written without the model",
                "pass the model (card.to_spectrum_yaml(model)); GPT-2's fused q/k/v can only be unfrozen whole",
            )
        return [
            rf"^model\.layers\.{pid.split('.')[0][1:]}\.self_attn\.{pid[-1]}_proj\.weight$" for pid in card.trainable
        ]
    names = {p.pid: p.param_name for p in enumerate_projections(model)}
    return sorted({"^" + re.escape(names[pid]) + "$" for pid in card.trainable})


def spectrum_yaml(card: ProfileCard, model: torch.nn.Module | None = None) -> str:
    """``unfrozen_parameters`` YAML (Spectrum / axolotl format) for the trainable projections."""
    lines = [
        f"# TopoTuner profile: {card.strategy} on {card.prior_task}, {card.model.name}",
        "unfrozen_parameters:",
    ]
    return "\n".join(lines + [f"- {p}" for p in spectrum_patterns(card, model)]) + "\n"
