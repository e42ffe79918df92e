"""Views of a profile card for people and other tools: a Markdown summary, Spectrum / axolotl YAML."""

from __future__ import annotations

from typing import TYPE_CHECKING

from topotuner_lab.profiles.card import ProfileCard
from topotuner_lab.profiles.export import parameter_names

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
    """``unfrozen_parameters`` patterns (Spectrum / axolotl format) for the trainable projections' weights.

    Anchored names with their dots as they are: axolotl escapes every dot itself, so an escaped one would select
    nothing (see :mod:`topotuner_lab.profiles.export`).
    """
    return [f"^{name}$" for name in parameter_names(card, model)]


def spectrum_yaml(card: ProfileCard, model: torch.nn.Module | None = None) -> str:
    """``unfrozen_parameters`` YAML (Spectrum / axolotl format) for the trainable projections."""
    lines = [
        f"# TopoTuner profile: {card.strategy} on {card.prior_task}, {card.model.name}",
        "unfrozen_parameters:",
    ]
    return "\n".join(lines + [f"- {p}" for p in spectrum_patterns(card, model)]) + "\n"
