"""Profile cards: which projections a fine-tune trains.

Schema and JSON (no torch), selection from a drift table, applying a card to a model (torch), comparing cards.
"""

from topotuner_lab._io.lazy import lazy_exports

_EXPORTS = {
    "ProfileCard": ".card",
    "ModelIdentity": ".card",
    "STRATEGIES": ".card",
    "NORMALIZATIONS": ".card",
    "build_profile": ".select",
    "normalized_scores": ".select",
    "apply_profile": ".apply",
    "identity_of": ".apply",
    "compare_cards": ".compare",
    "CardComparison": ".compare",
    "selector_scores": ".compare",
    "rank_agreement": ".compare",
    "matched_per_kind": ".select",
    "strategy_scores": ".select",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
