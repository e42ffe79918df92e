"""The authors' released orderings as profile cards, built from a model's config shapes without its weights.

FDataLab/TopoTuner publishes two kinds of lists, stored verbatim (with the file and commit each was read from) in
``upstream_orderings.json`` beside this module:

- ``orderings`` (``codes/layer_orderings.txt``): for Llama-3.1-8B, Llama-3.2-3B, Mistral-7B-v0.3 and Qwen3-8B-Base,
  every Q, K and V layer ordered from lowest to highest H0 Wasserstein drift (their mean over the epochs of full and
  LoRA fine-tunes on IMDB, SST-2 and MMLU). A card of size N takes the N lowest (``low-drift``) or highest
  (``high-drift``) layers of each of the three kinds.
- ``vo-lists`` (``EXPECTED_FROZEN_LAYERS`` in ``codes/analysis/freeze_comparison_multi_metric.py``): for
  Qwen3-8B-Base only, the V and O layers of the ``low-N`` / ``high-N`` variants (N = 3, 6, 9, 15) of a Wasserstein
  and a norm (relative Frobenius change) selector; the only published lists with O projections.

**Trained or frozen.** A card built here *trains* the listed matrices and freezes everything else. The source calls
the V/O lists "expected frozen layers" (and its fine-tuning script ``finetune_gsm8k_frozen.py`` freezes a list's
layers and trains every other V and O), but training them is what matches the paper's budget of 1-2% of the
parameters: 3 + 3 listed Qwen3-8B-Base matrices are 0.77% of the model, 6 + 6 are 1.54%, while freezing them would
train 8.4% (low-3). Each card says so in its ``metric`` field, with the source file and commit.

Cards carry ``weights_hash = "config-only"``: :func:`~topotuner_lab.profiles.apply.apply_profile` (and so
``finetune --method profile``) checks such a card against the model's config shape instead of a weight hash (the
architecture, each projection's shape, the parameter count) and warns in one line that it did; or export the card for
a trainer (:mod:`topotuner_lab.profiles.export`).
"""

from __future__ import annotations

import ast
import re
from functools import cache
from importlib import resources
from typing import Any, Literal, get_args

from topotuner_lab._io.errors import ProfileError
from topotuner_lab._io.json_files import read_json
from topotuner_lab.profiles.card import ModelIdentity, ProfileCard
from topotuner_lab.profiles.select import param_counts
from topotuner_lab.weights.projections import KINDS, expected_shape

Selector = Literal["wasserstein", "norm"]
Source = Literal["orderings", "vo-lists"]
End = Literal["high-drift", "low-drift"]
SELECTORS: tuple[str, ...] = get_args(Selector)
SOURCES: tuple[str, ...] = get_args(Source)
ENDS: tuple[str, ...] = get_args(End)
#: what the weight hash of a card built from config shapes says: no weights were read
CONFIG_ONLY = "config-only"
DATA_FILE = "upstream_orderings.json"
#: the selector names of the V/O lists' source
_VO_SELECTOR = {"wasserstein": "wass", "norm": "norm"}
_MEASURE = {"wasserstein": "H0 Wasserstein drift", "norm": "relative Frobenius change (norm)"}


@cache
def upstream_data() -> dict[str, Any]:
    """The stored data file: the verbatim sources (path, commit, text) and each model's config shape."""
    path = resources.files("topotuner_lab.profiles").joinpath(DATA_FILE)
    data: dict[str, Any] = read_json(path, "upstream orderings file", "reinstall topotuner-lab (its data files)")
    return data


def upstream_models() -> dict[str, str]:
    """The authors' model keys (``llama31_8b``...) and the hub ids they stand for."""
    return {key: info["name"] for key, info in upstream_data()["models"].items()}


def resolve_model(model: str) -> str:
    """The authors' key of ``model``: a key (``qwen_8b_base``), a hub id or its last part, in any letter case."""
    wanted = model.strip().lower()
    for key, name in upstream_models().items():
        if wanted in (key, name.lower(), name.split("/")[-1].lower()):
            return key
    choices = ", ".join(f"{name} ({key})" for key, name in upstream_models().items())
    raise ProfileError(f"the authors released no orderings for {model!r}", f"use one of {choices}")


def published_orderings(key: str) -> dict[str, list[int]]:
    """The Q, K and V layer orderings of one model (lowest to highest drift), read from the verbatim text."""
    text = upstream_data()["sources"]["orderings"]["text"]
    found = {
        m.group(1).lower(): [int(x) for x in m.group(2).split()]
        for m in re.finditer(rf"^([QKV])_ORDERED_LAYERS_{key.upper()}=\(([\d ]+)\)$", text, re.MULTILINE)
    }
    return {kind: found[kind] for kind in KINDS if kind in found}


def published_vo_lists() -> dict[str, Any]:
    """``EXPECTED_FROZEN_LAYERS`` as the source file defines it (model -> selector -> variant -> kind -> layers)."""
    tree = ast.parse(upstream_data()["sources"]["vo-lists"]["text"])
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "EXPECTED_FROZEN_LAYERS" for t in node.targets
        ):
            lists: dict[str, Any] = ast.literal_eval(node.value)
            return lists
    raise ProfileError(f"{DATA_FILE} holds no EXPECTED_FROZEN_LAYERS", "reinstall topotuner-lab")


def upstream_identity(key: str) -> ModelIdentity:
    """The identity of an upstream model from its config shape: no weights, so the hash says ``config-only``."""
    info = upstream_data()["models"][key]
    config = info["config"]
    mtype = config["model_type"]
    shapes: dict[str, list[int]] = {}
    for layer in range(config["num_hidden_layers"]):
        for kind in KINDS:
            shape = expected_shape(config, mtype, kind)
            assert shape is not None  # the stored configs name hidden size and heads
            shapes[f"L{layer}.{kind}"] = list(shape)
    return ModelIdentity(info["name"], CONFIG_ONLY, mtype, info["total_params"], shapes)


def _lists(key: str, selector: str, source: str, strategy: str, size: int) -> tuple[dict[str, list[int]], str, str]:
    """The published lists a card reads (kind -> layers, in the source's order), the chosen ones' name, the meaning."""
    name = upstream_models()[key]
    if source == "orderings":
        if selector != "wasserstein":
            raise ProfileError(
                f"the authors' Q/K/V orderings rank by Wasserstein drift only, not by {selector}",
                "use --selector wasserstein, or --upstream-source vo-lists for the norm lists (Qwen3-8B-Base)",
            )
        lists = published_orderings(key)
        layers = len(next(iter(lists.values())))
        if not 1 <= size <= layers:
            raise ProfileError(
                f"size {size} is not a number of layers of {name} (1 to {layers})", "give --size between 1 and that"
            )
        which = "highest" if strategy == "high-drift" else "lowest"
        chosen = {kind: order[-size:] if strategy == "high-drift" else order[:size] for kind, order in lists.items()}
        names = "/".join(f"{kind.upper()}_ORDERED_LAYERS_{key.upper()}" for kind in lists)
        meaning = f"trains the {size} {which} layers of each of {', '.join(lists)}; everything else frozen"
        return chosen, names, meaning
    vo_key = upstream_data()["models"][key].get("vo_key")
    if vo_key is None:
        raise ProfileError(f"the authors' V/O lists cover Qwen3-8B-Base only, not {name}", "use the orderings")
    variants = published_vo_lists()[vo_key][_VO_SELECTOR[selector]]
    variant = f"{'high' if strategy == 'high-drift' else 'low'}-{size}"
    if variant not in variants:
        sizes = sorted({int(v.split("-")[1]) for v in variants})
        raise ProfileError(f"the V/O lists have no {variant!r} variant", f"give --size as one of {sizes}")
    names = f"EXPECTED_FROZEN_LAYERS[{vo_key!r}][{_VO_SELECTOR[selector]!r}][{variant!r}]"
    meaning = (
        "TRAINS the listed V and O layers, everything else frozen (the source names them expected frozen layers; "
        "the paper trains 1-2% of the parameters)"
    )
    return {kind: list(layers) for kind, layers in variants[variant].items()}, names, meaning


def upstream_card(
    model: str,
    *,
    selector: Selector = "wasserstein",
    size: int = 3,
    strategy: End = "high-drift",
    source: Source | None = None,
) -> ProfileCard:
    """A card from the authors' released lists for ``model``, with the source file and commit and what trains.

    Parameters
    ----------
    model : str
        An upstream model: its hub id (``Qwen/Qwen3-8B-Base``), the id's last part, or the authors' key
        (:func:`upstream_models`).
    selector : {"wasserstein", "norm"}
        ``wasserstein`` (drift) or ``norm`` (relative Frobenius change; V/O lists of Qwen3-8B-Base only).
    size : int, default 3
        Matrices per kind: any number of layers for the orderings, 3, 6, 9 or 15 for the V/O lists.
    strategy : {"high-drift", "low-drift"}
        ``high-drift`` trains the highest end of the list, ``low-drift`` the lowest.
    source : {"orderings", "vo-lists"}, optional
        ``orderings`` (Q/K/V, every model) or ``vo-lists`` (V/O, Qwen3-8B-Base); default: ``orderings`` for
        ``wasserstein``, ``vo-lists`` for ``norm``.

    Returns
    -------
    ProfileCard
        Its ranking holds each listed matrix with its position in the published list as score (0 = first; for
        the orderings, 0 = lowest drift), best first for ``strategy``; ``metric`` names the source, commit, list and
        what trains; ``prior_task`` the fine-tunes that ranked them (``imdb+sst2+mmlu``, or ``unrecorded``); its model
        identity is the config shape (``weights_hash="config-only"``).

    Raises
    ------
    ProfileError
        An unknown model, selector, strategy or source, a selector the source has no list for, or a size the list
        does not have.

    Examples
    --------
    >>> from topotuner_lab import upstream_card
    >>> card = upstream_card("Qwen/Qwen3-8B-Base", size=3)
    >>> card.model.name, card.model.weights_hash, card.prior_task
    ('Qwen/Qwen3-8B-Base', 'config-only', 'imdb+sst2+mmlu')
    >>> card.trainable
    ['L3.v', 'L5.v', 'L19.q', 'L22.k', 'L33.k', 'L34.q', 'L34.k', 'L35.q', 'L35.v']
    >>> vo = upstream_card("Qwen3-8B-Base", selector="norm", size=3)
    >>> vo.budget
    {'per_kind': {'v': 3, 'o': 3}}
    """
    for value, choices, what in ((selector, SELECTORS, "selector"), (strategy, ENDS, "strategy")):
        if value not in choices:
            raise ProfileError(f"{what} {value!r} is not one of {', '.join(choices)}", f"use one of {choices}")
    source = source or ("orderings" if selector == "wasserstein" else "vo-lists")
    if source not in SOURCES:
        raise ProfileError(f"source {source!r} is not one of {', '.join(SOURCES)}", f"use one of {SOURCES}")
    key = resolve_model(model)
    chosen, names, meaning = _lists(key, selector, source, strategy, size)
    published = published_orderings(key) if source == "orderings" else chosen
    info = upstream_data()["sources"][source]
    identity = upstream_identity(key)
    descending = strategy == "high-drift"
    entries = [(f"L{layer}.{kind}", pos) for kind, layers in published.items() for pos, layer in enumerate(layers)]
    ranking = sorted(entries, key=lambda e: -e[1] if descending else e[1])
    picked = {f"L{layer}.{kind}" for kind, layers in chosen.items() for layer in layers}
    params = param_counts(identity.shapes)
    trainable = [p for p in identity.shapes if p in picked]
    count = sum(params[p] for p in trainable)
    return ProfileCard(
        model=identity,
        prior_task=info["prior"],
        strategy=strategy,
        metric=(
            f"upstream {upstream_data()['repository']}@{info['commit']}:{info['path']} {names} "
            f"({_MEASURE[selector]}, published order); {meaning}"
        ),
        drift_settings={},
        ranking=[{"pid": pid, "score": float(pos)} for pid, pos in ranking],
        trainable=trainable,
        frozen=[p for p in identity.shapes if p not in picked],
        trainable_params=count,
        trainable_fraction=count / identity.total_params,
        budget={"per_kind": {kind: len(layers) for kind, layers in chosen.items()}},
        normalization="raw",
        aggregation="mean" if source == "orderings" else "final",
    )
