r"""A card in the formats the trainers read: axolotl, ms-swift, PEFT, a name list, Spectrum scores, LLaMA-Factory.

Each export names the parameters the card trains (its projections' weights), exactly where the format can:

- ``axolotl``: ``unfrozen_parameters``, one anchored pattern per weight (``^model.layers.3.self_attn.v_proj.weight$``).
  Dots are left unescaped because axolotl escapes them itself (``LayerNamePattern`` turns every ``.`` into ``\.``, so
  an escaped ``\.`` would match a backslash and select nothing); read as plain regexes they match the same names.
- ``swift``: ms-swift's full-parameter arguments ``--train_type full --freeze_parameters_ratio 1
  --trainable_parameters_regex REGEX``: freeze everything, then reopen the names one exact regex matches.
- ``peft``: a ``LoraConfig`` keyword dict restricted to the card's modules: ``target_modules`` with
  ``layers_to_transform`` when the card trains the same kinds in the same layers (a product of layers and kinds),
  else ``target_modules`` as one regex (peft full-matches it against module names).
- ``names``: the list of parameter names. With HF ``Trainer`` or TRL's ``SFTTrainer`` no export is needed:
  :func:`~topotuner_lab.profiles.apply.apply_profile` sets ``requires_grad`` on the model you pass them (no
  ``peft_config``). Under gradient checkpointing, frozen embeddings need one more step with reentrant checkpointing
  (transformers 4.x's default): a checkpointed layer whose inputs do not require grad passes no gradient back (the
  backward fails with "element 0 of tensors does not require grad"), so call ``model.enable_input_require_grads()``
  or set ``gradient_checkpointing_kwargs={"use_reentrant": False}``. transformers 5.x does both by default.
- ``spectrum``: a Spectrum score file ``{module: {"snr": score, "type": kind}}`` (``snr_results_<model>.json``, the
  file axolotl's Spectrum plugin and ``spectrum.py`` read; type names as Spectrum writes them, ``self_attn.q_proj``).
  ``snr`` is the card's preference, not a signal-to-noise ratio: 1 for its first pick, falling by rank, every trained
  matrix above every frozen one; kinds the card never trains are left out. The plugin trains the top
  ``spectrum_top_fraction`` of each type, so it reproduces the card only when one fraction fits every kind (the
  export's warning gives it), and always adds ``lm_head`` and ``embed_tokens``.
- ``llama-factory``: LLaMA-Factory's freeze tuning trains the first or last n layers' ``self_attn`` (or ``mlp``)
  whole; the export picks the setting closest to the card (the largest Jaccard overlap of the trained matrices,
  counted in parameters; fewer layers on a tie) and warns with what it loses and adds.

Formats that cannot say exactly what the card trains warn with :class:`ExportWarning`. Without a model, parameter
names follow the standard ``model.layers.N.self_attn.{q,k,v,o}_proj.weight`` layout (LLaMA, Mistral, Qwen, Gemma);
pass the model for other layouts.
"""

from __future__ import annotations

import json
import re
import shlex
import warnings
from typing import TYPE_CHECKING, Any, Literal, get_args

from topotuner_lab._io.errors import ParameterError, ProfileError
from topotuner_lab.profiles.card import ProfileCard
from topotuner_lab.profiles.select import param_counts
from topotuner_lab.weights.projections import enumerate_projections, is_llama_like, parse_pid

if TYPE_CHECKING:
    import torch

Format = Literal["axolotl", "swift", "peft", "names", "spectrum", "llama-factory"]
FORMATS: tuple[str, ...] = get_args(Format)
#: a numbered component of a parameter name: the layer index (``model.layers.12.self_attn...``)
_LAYER = re.compile(r"^(.*?\.)(\d+)(\..*)$")


class ExportWarning(UserWarning):
    """An export that trains other matrices than the card, or more than them."""


def _layout(card: ProfileCard, model: torch.nn.Module | None) -> dict[str, str]:
    """Projection id -> parameter name, for every projection of the card's model (in model order)."""
    if model is None:
        if not is_llama_like(card.model.architecture):
            raise ProfileError(
                f"parameter names of a {card.model.architecture!r} model cannot be written without the model",
                "pass the model (export_card(card, to, model)); GPT-2's fused q/k/v can only be unfrozen whole",
            )
        return {
            pid: f"model.layers.{layer}.self_attn.{kind}_proj.weight"
            for pid, (layer, kind) in ((pid, parse_pid(pid)) for pid in card.model.shapes)
        }
    names = {p.pid: p.param_name for p in enumerate_projections(model)}
    missing = sorted(set(card.model.shapes) - set(names))
    if missing:
        raise ProfileError(
            f"the model has no projections {missing[:5]} of the card's {card.model.name!r}",
            "export the card with the model it was built for",
        )
    return {pid: names[pid] for pid in card.model.shapes}


def _parameters(card: ProfileCard, model: torch.nn.Module | None) -> dict[str, list[str]]:
    """Parameter name -> its projection ids, in model order; a parameter only partly trained is refused."""
    by_name: dict[str, list[str]] = {}
    for pid, name in _layout(card, model).items():
        by_name.setdefault(name, []).append(pid)
    trained = set(card.trainable)
    for name, pids in by_name.items():
        if 0 < len(trained.intersection(pids)) < len(pids):
            raise ProfileError(
                f"the card trains only part of the fused parameter {name} ({', '.join(sorted(trained & set(pids)))}), "
                "which no name or pattern can select",
                "train with apply_profile, which masks the frozen rows' gradients, or use a card that trains all of "
                "q, k and v of that layer",
            )
    return by_name


def parameter_names(card: ProfileCard, model: torch.nn.Module | None = None) -> list[str]:
    """The names of the parameters the card trains (its projections' weights), in model order."""
    trained = set(card.trainable)
    return [name for name, pids in _parameters(card, model).items() if trained.issuperset(pids)]


def exact_regex(names: list[str]) -> str:
    r"""One regex that matches exactly ``names`` (whole names; dots escaped), numbers of a layer grouped.

    ``model.layers.1.self_attn.q_proj.weight`` and ``model.layers.4.self_attn.q_proj.weight`` become
    ``model\.layers\.(?:1|4)\.self_attn\.q_proj\.weight``, the groups joined by ``|`` inside ``^(?:...)$``.
    """
    groups: dict[tuple[str, str], list[str]] = {}
    for name in names:
        match = _LAYER.match(name)
        prefix, number, suffix = match.groups() if match else (name, "", "")
        groups.setdefault((prefix, suffix), []).append(number)
    parts = []
    for (prefix, suffix), numbers in groups.items():
        middle = numbers[0] if len(numbers) == 1 else "(?:" + "|".join(numbers) + ")"
        parts.append(re.escape(prefix) + middle + re.escape(suffix))
    return "^(?:" + "|".join(parts) + ")$"


def _module(name: str) -> str:
    return name.removesuffix(".weight")


def _peft(card: ProfileCard, model: torch.nn.Module | None) -> dict[str, Any]:
    """LoraConfig keywords: the card's modules as layers x module names where that is exact, else one regex."""
    modules = [_module(name) for name in parameter_names(card, model)]
    layers = sorted({parse_pid(pid)[0] for pid in card.trainable})
    kinds = {parse_pid(pid)[1] for pid in card.trainable}
    suffixes = sorted({module.rsplit(".", 1)[-1] for module in modules})
    product = set(card.trainable) == {f"L{layer}.{kind}" for layer in layers for kind in kinds}
    if product and model is not None:  # exact only if no other module of those names sits in those layers
        product = {
            name
            for name, _ in model.named_modules()
            if name.rsplit(".", 1)[-1] in suffixes and (m := _LAYER.match(name)) and int(m.group(2)) in layers
        } == set(modules)
    config: dict[str, Any] = (
        {"target_modules": suffixes, "layers_to_transform": layers}
        if product
        else {"target_modules": exact_regex(modules)}
    )
    if is_llama_like(card.model.architecture) or card.model.architecture == "gpt2":
        config["task_type"] = "CAUSAL_LM"
    return config


def _spectrum_type(module: str) -> str:
    """Spectrum's type of a module: the part of its name after the layer number (``self_attn.q_proj``)."""
    match = _LAYER.match(module)
    return match.group(3)[1:] if match else module


def _top_fraction(counts: dict[str, tuple[int, int]]) -> float | None:
    """The ``spectrum_top_fraction`` f with int(n * f) == k for every type's (k trained, n listed), if one exists."""
    low = max(k / n for k, n in counts.values())
    high = min((k + 1) / n for k, n in counts.values())
    fraction = round((low + high) / 2, 6)
    return fraction if low < high and all(int(n * fraction) == k for k, n in counts.values()) else None


def _spectrum(card: ProfileCard, model: torch.nn.Module | None) -> dict[str, dict[str, Any]]:
    """Spectrum's score file for the kinds the card trains, trained matrices first, scored by the card's preference.

    A kind the card never trains is left out (as in a Spectrum scan of some types), so the plugin cannot unfreeze it.
    """
    parameters = _parameters(card, model)
    trained = set(card.trainable)
    types = {name: _spectrum_type(_module(name)) for name in parameters}
    wanted = {types[name] for name, pids in parameters.items() if trained.issuperset(pids)}
    first = {pid: i for i, pid in enumerate(r["pid"] for r in card.ranking)}

    def preference(item: tuple[str, list[str]]) -> tuple[bool, int]:
        _, pids = item
        return (not trained.issuperset(pids), min(first.get(pid, len(first)) for pid in pids))

    ordered = sorted(((n, p) for n, p in parameters.items() if types[n] in wanted), key=preference)
    counts: dict[str, tuple[int, int]] = {}
    for name, pids in ordered:
        k, n = counts.get(types[name], (0, 0))
        counts[types[name]] = (k + trained.issuperset(pids), n + 1)
    fraction = _top_fraction(counts)
    slug = card.model.name.replace("/", "-").replace("_", "-")
    picks = (
        f"set spectrum_top_fraction: {fraction} to pick exactly the card's attention matrices"
        if fraction is not None
        else "no single spectrum_top_fraction picks the card's matrices ("
        + ", ".join(f"{k} of {n} {t}" for t, (k, n) in counts.items())
        + "); use --to axolotl for the exact list"
    )
    warnings.warn(
        f"axolotl's Spectrum plugin reads model_snr_results/snr_results_{slug}.json; {picks}; it also always unfreezes "
        "lm_head and embed_tokens, which the card freezes",
        ExportWarning,
        stacklevel=3,
    )
    return {
        _module(name): {"snr": (len(ordered) - i) / len(ordered), "type": types[name]}
        for i, (name, _) in enumerate(ordered)
    }


def _ids(pids: list[str]) -> str:
    return ", ".join(pids) if pids else "none"


def _llama_factory(card: ProfileCard, model: torch.nn.Module | None) -> str:
    """The LLaMA-Factory freeze setting closest to the card (first / last n layers' attention), with what it loses."""
    layout = _layout(card, model)
    match = re.search(r"\.\d+\.([^.]+)\.", next(iter(layout.values())))
    attention = match.group(1) if match else "self_attn"
    params = param_counts(card.model.shapes)
    layer_of = {pid: parse_pid(pid)[0] for pid in card.model.shapes}
    n_layers = max(layer_of.values()) + 1
    trained = set(card.trainable)

    def covered(n: int) -> set[str]:  # n > 0: the last n layers; n < 0: the first -n (LLaMA-Factory's sign)
        keep = range(n_layers - n, n_layers) if n > 0 else range(-n)
        return {pid for pid, layer in layer_of.items() if layer in keep}

    def overlap(n: int) -> float:  # Jaccard index of the two sets of matrices, counted in parameters
        both, either = trained & covered(n), trained | covered(n)
        return sum(params[p] for p in both) / sum(params[p] for p in either)

    n = max((s * k for k in range(1, n_layers + 1) for s in (-1, 1)), key=lambda n: (overlap(n), -abs(n)))
    chosen = covered(n)
    lost = [p for p in card.model.shapes if p in trained - chosen]
    added = [p for p in card.model.shapes if p in chosen - trained]
    side = f"last {n}" if n > 0 else f"first {-n}"
    if model is None:
        extra = f"; it also trains every other parameter under {attention} in those layers (biases, q/k norms)"
    else:
        inside = re.compile(rf"\.({'|'.join(str(layer_of[p]) for p in chosen)})\.{re.escape(attention)}\.")
        others = [n for n, _ in model.named_parameters() if inside.search(n) and n not in layout.values()]
        extra = f"; it also trains {len(others)} other parameters under {attention} (biases, norms)" if others else ""
    differences = [f"does not train {_ids(lost)}, which the card trains"] if lost else []
    differences += [f"trains {_ids(added)}, which the card freezes"] if added else []
    if differences or extra:
        warnings.warn(
            f"LLaMA-Factory's freeze tuning trains whole layers' {attention}: the closest setting (the {side} layers, "
            f"Jaccard overlap {overlap(n):.2f} in parameters) "
            f"{' and '.join(differences) or 'trains the same matrices as the card'}{extra}",
            ExportWarning,
            stacklevel=3,
        )
    return (
        f"# TopoTuner profile: {card.strategy} on {card.prior_task}, {card.model.name}\n"
        f"# the closest LLaMA-Factory freeze setting: the {side} layers' {attention}, not the card\n"
        f"# the card trains, this does not: {_ids(lost)}\n"
        f"# this trains, the card does not: {_ids(added)}\n"
        "finetuning_type: freeze\n"
        f"freeze_trainable_layers: {n}\n"
        f"freeze_trainable_modules: {attention}\n"
    )


def export_card(
    card: ProfileCard, to: Format, model: torch.nn.Module | None = None
) -> str | dict[str, Any] | list[str]:
    """The card in a trainer's format (see the module's docstring for each).

    Parameters
    ----------
    card : ProfileCard
        The profile card.
    to : {"axolotl", "swift", "peft", "names", "spectrum", "llama-factory"}
        The trainer's format (:data:`FORMATS`).
    model : torch.nn.Module, optional
        The model, for parameter names of a layout other than ``model.layers.N.self_attn.*_proj``.

    Returns
    -------
    str or dict or list of str
        Text for ``axolotl`` (YAML), ``swift`` (command-line arguments) and ``llama-factory`` (YAML); a dict for
        ``peft`` (``LoraConfig(**result)``) and ``spectrum`` (the score file); a list of names for ``names``.
        :func:`export_text` writes each as a file.

    Raises
    ------
    ParameterError
        An unknown format.
    ProfileError
        Names of a non-LLaMA-like layout without the model, a model without the card's projections, or a card that
        trains only part of a fused parameter.

    Warns
    -----
    ExportWarning
        A format that cannot reproduce the card exactly (it trains other or more matrices), saying what it changes.

    Examples
    --------
    >>> from topotuner_lab import export_card, upstream_card
    >>> card = upstream_card("Qwen3-8B-Base", size=3)
    >>> export_card(card, "names")[:2]
    ['model.layers.3.self_attn.v_proj.weight', 'model.layers.5.self_attn.v_proj.weight']
    >>> print(export_card(card, "axolotl"))
    # TopoTuner profile: high-drift on imdb+sst2+mmlu, Qwen/Qwen3-8B-Base
    unfrozen_parameters:
    - ^model.layers.3.self_attn.v_proj.weight$
    ...
    """
    if to == "axolotl":
        return card.to_spectrum_yaml(model)
    if to == "swift":
        regex = exact_regex(parameter_names(card, model))
        return f"--train_type full --freeze_parameters_ratio 1 --trainable_parameters_regex {shlex.quote(regex)}\n"
    if to == "peft":
        return _peft(card, model)
    if to == "names":
        return parameter_names(card, model)
    if to == "spectrum":
        return _spectrum(card, model)
    if to == "llama-factory":
        return _llama_factory(card, model)
    raise ParameterError(f"export format {to!r} is not one of {', '.join(FORMATS)}", f"use one of {FORMATS}")


def export_text(card: ProfileCard, to: Format, model: torch.nn.Module | None = None) -> str:
    """:func:`export_card` as the file a trainer reads (dicts and lists as JSON)."""
    result = export_card(card, to, model)
    return result if isinstance(result, str) else json.dumps(result, indent=1) + "\n"
