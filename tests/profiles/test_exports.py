"""Cards exported for trainers select exactly the card's parameters on every tiny decoder family's real model class.

axolotl's patterns are read the way axolotl reads them (``LayerNamePattern``: every ``.`` escaped, then ``match``);
ms-swift's regex with ``re.search`` (its ``activate_parameters``); PEFT's config through ``get_peft_model`` itself;
the Spectrum file through the top-fraction rule of axolotl's plugin; LLaMA-Factory's setting through the substring
rule of its ``_setup_freeze_tuning``.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
import warnings

import pytest
import torch
import yaml

from topotuner_lab._io.errors import ParameterError, ProfileError
from topotuner_lab.cli import main
from topotuner_lab.profiles.apply import apply_profile, identity_of
from topotuner_lab.profiles.card import ProfileCard
from topotuner_lab.profiles.export import FORMATS, ExportWarning, export_card, export_text, parameter_names
from topotuner_lab.profiles.select import param_counts
from topotuner_lab.weights.models import TINY_DECODERS, build_tiny_model
from topotuner_lab.weights.projections import enumerate_projections

#: a card whose matrices are a product of layers and kinds (PEFT: layers_to_transform), and one that is not (a regex)
CARDS = {"product": ["L1.k", "L1.v"], "scattered": ["L0.q", "L1.v", "L1.o"]}


def make_card(model: torch.nn.Module, name: str, trainable: list[str]) -> ProfileCard:
    """A card of ``model`` training ``trainable``, ranked in that order (the rest after it, in model order)."""
    identity = identity_of(model, name)
    order = list(identity.shapes)
    params = param_counts(identity.shapes)
    count = sum(params[p] for p in trainable)
    ranked = trainable + [p for p in order if p not in trainable]
    return ProfileCard(
        model=identity,
        prior_task="sst2",
        strategy="high-drift",
        metric="h0_w1",
        drift_settings={},
        ranking=[{"pid": p, "score": float(len(ranked) - i)} for i, p in enumerate(ranked)],
        trainable=[p for p in order if p in trainable],
        frozen=[p for p in order if p not in trainable],
        trainable_params=count,
        trainable_fraction=count / identity.total_params,
        budget={"count": len(trainable)},
    )


def card_parameters(model: torch.nn.Module, card: ProfileCard) -> set[str]:
    """What the card trains, from the model's own projections (independent of the export code's name layout)."""
    return {p.param_name for p in enumerate_projections(model) if p.pid in card.trainable}


def axolotl_selects(patterns: list[str], names: list[str]) -> set[str]:
    """axolotl's ``LayerNamePattern``: every dot not before ``+`` escaped, then ``re.match`` on the parameter name."""
    compiled = [re.compile(re.sub(r"\.(?!\+)", "\\.", p)) for p in patterns]
    return {n for n in names if any(c.match(n) for c in compiled)}


def exported(card: ProfileCard, to: str, model: torch.nn.Module | None = None):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = export_card(card, to, model)  # type: ignore[arg-type]
    return result, [str(w.message) for w in caught if issubclass(w.category, ExportWarning)]


@pytest.fixture(scope="module")
def models():
    return {name: build_tiny_model(name, seed=0) for name in TINY_DECODERS}


@pytest.mark.parametrize("shape", list(CARDS))
@pytest.mark.parametrize("name", TINY_DECODERS)
def test_names_axolotl_and_swift_select_exactly_the_cards_parameters(models, name, shape):
    model = models[name].model
    card = make_card(model, name, CARDS[shape])
    everything = [n for n, _ in model.named_parameters()]
    want = card_parameters(model, card)
    names, _ = exported(card, "names")
    assert set(names) == want and len(names) == len(want)
    assert exported(card, "names", model)[0] == names  # the standard layout without the model is the model's own
    patterns = yaml.safe_load(export_card(card, "axolotl"))["unfrozen_parameters"]
    assert axolotl_selects(patterns, everything) == want
    assert {n for n in everything if any(re.match(p, n) for p in patterns)} == want  # read as plain regexes too
    args = shlex.split(export_card(card, "swift"))
    assert args[:4] == ["--train_type", "full", "--freeze_parameters_ratio", "1"]
    regex = re.compile(args[args.index("--trainable_parameters_regex") + 1])
    assert {n for n in everything if regex.search(n)} == want


@pytest.mark.parametrize("shape", list(CARDS))
@pytest.mark.parametrize("name", TINY_DECODERS)
def test_peft_wraps_exactly_the_cards_modules(models, name, shape):
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora import LoraLayer

    model = copy.deepcopy(models[name].model)
    card = make_card(model, name, CARDS[shape])
    config, _ = exported(card, "peft", model)
    assert config == exported(card, "peft")[0]
    assert ("layers_to_transform" in config) == (shape == "product")
    assert isinstance(config["target_modules"], list if shape == "product" else str)
    want = {n.removesuffix(".weight") for n in card_parameters(model, card)}
    wrapped = get_peft_model(model, LoraConfig(**config))
    lora = {n.removeprefix("base_model.model.") for n, m in wrapped.named_modules() if isinstance(m, LoraLayer)}
    assert lora == want
    trainable = {n for n, p in wrapped.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n and any(f".{m}." in n for m in lora) for n in trainable)


@pytest.mark.parametrize("name", TINY_DECODERS)
def test_an_optimizer_step_after_apply_profile_changes_only_the_exported_parameters(name):
    loaded = build_tiny_model(name, seed=0)
    model = loaded.model
    card = make_card(model, name, CARDS["scattered"])
    apply_profile(model, card)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.0).step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(before[n], p.detach())}
    assert changed == set(export_card(card, "names"))


def test_apply_profile_under_gradient_checkpointing_as_the_names_docs_say():
    """transformers 5 checkpoints non-reentrantly and makes the inputs require grad; reentrant without that fails."""

    def grads(model: torch.nn.Module) -> set[str]:
        ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
        model(input_ids=ids, labels=ids).loss.backward()
        return {n for n, p in model.named_parameters() if p.grad is not None and bool(p.grad.abs().sum() > 0)}

    def profiled(**kwargs: object) -> tuple[torch.nn.Module, ProfileCard]:
        model = build_tiny_model("tiny-llama", seed=0).model.train()
        card = make_card(model, "tiny-llama", CARDS["scattered"])
        apply_profile(model, card)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            model.gradient_checkpointing_enable(**kwargs)
        return model, card

    model, card = profiled()
    assert grads(model) == set(parameter_names(card))
    model, card = profiled(gradient_checkpointing_kwargs={"use_reentrant": True})
    model.disable_input_require_grads()  # transformers 4.x without peft: the frozen embeddings' output needs no grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        grads(model)
    model.enable_input_require_grads()
    assert grads(model) == set(parameter_names(card))


def plugin_selects(scores: dict[str, dict], fraction: float) -> set[str]:
    """axolotl's Spectrum plugin: per type, the top int(n * fraction) modules by snr (lm_head/embed_tokens aside)."""
    by_type: dict[str, list[tuple[str, float]]] = {}
    for module, info in scores.items():
        by_type.setdefault(info["type"], []).append((module, info["snr"]))
    return {
        module
        for layers in by_type.values()
        for module, _ in sorted(layers, key=lambda x: x[1], reverse=True)[: int(len(layers) * fraction)]
    }


@pytest.mark.parametrize("trainable", [CARDS["product"], CARDS["scattered"]])
@pytest.mark.parametrize("name", TINY_DECODERS)
def test_the_spectrum_file_ranks_the_cards_matrices_first_and_names_the_fraction_that_picks_them(
    models, name, trainable
):
    model = models[name].model
    card = make_card(model, name, trainable)
    scores, notes = exported(card, "spectrum", model)
    assert scores == exported(card, "spectrum")[0]
    assert set(scores) <= {n for n, _ in model.named_modules()}
    kinds = {pid[-1] for pid in trainable}
    assert {info["type"] for info in scores.values()} == {f"self_attn.{k}_proj" for k in kinds}  # untrained: left out
    assert len(notes) == 1 and "lm_head and embed_tokens" in notes[0] and f"snr_results_{name}.json" in notes[0]
    fraction = float(re.search(r"spectrum_top_fraction: ([\d.]+)", notes[0]).group(1))
    assert plugin_selects(scores, fraction) == {n.removesuffix(".weight") for n in card_parameters(model, card)}


def test_a_card_no_spectrum_fraction_can_pick_says_so(models):
    model = models["tiny-llama"].model
    _, notes = exported(make_card(model, "tiny-llama", ["L0.q", "L1.q", "L0.v"]), "spectrum")
    assert "no single spectrum_top_fraction" in notes[0] and "2 of 2 self_attn.q_proj" in notes[0]
    assert "snr_results_tiny-llama.json" in notes[0]


def llama_factory_trains(model: torch.nn.Module, text: str) -> set[str]:
    """The parameters LLaMA-Factory's freeze tuning trains under an exported setting (its substring rule)."""
    setting = yaml.safe_load(text)
    n, n_layers = setting["freeze_trainable_layers"], model.config.num_hidden_layers
    layers = range(max(0, n_layers - n), n_layers) if n > 0 else range(min(-n, n_layers))
    marks = [f".{i}.{setting['freeze_trainable_modules']}" for i in layers]
    return {name for name, _ in model.named_parameters() if any(m in name for m in marks)}


@pytest.mark.parametrize("name", TINY_DECODERS)
def test_the_llama_factory_setting_is_the_closest_and_its_warning_names_what_it_loses(models, name):
    model = models[name].model
    projections = {p.param_name: p.pid for p in enumerate_projections(model)}
    card = make_card(model, name, ["L0.q", "L0.k", "L0.v", "L1.o"])  # most of layer 0: the first layer is closest
    text, notes = exported(card, "llama-factory", model)
    assert yaml.safe_load(text)["freeze_trainable_layers"] == -1
    trains = {projections[n] for n in llama_factory_trains(model, text) if n in projections}
    lost, added = sorted(set(card.trainable) - trains), sorted(trains - set(card.trainable))
    assert (lost, added) == (["L1.o"], ["L0.o"])
    assert len(notes) == 1 and "does not train L1.o, which the card trains" in notes[0]
    assert "trains L0.o, which the card freezes" in notes[0]
    extras = llama_factory_trains(model, text) - set(projections)  # Qwen2's biases, Qwen3's and Gemma-3's q/k norms
    assert (f"{len(extras)} other parameters" in notes[0]) == bool(extras)
    assert "# the card trains, this does not: L1.o" in text


def test_exports_refuse_what_they_cannot_say_exactly():
    gpt2 = build_tiny_model("tiny-gpt2").model
    card = make_card(gpt2, "tiny-gpt2", ["L0.q", "L1.o"])  # q alone of the fused c_attn
    with pytest.raises(ProfileError, match="without the model"):
        export_card(card, "names")
    with pytest.raises(ProfileError, match="only part of the fused parameter"):
        export_card(card, "axolotl", gpt2)
    whole = make_card(gpt2, "tiny-gpt2", ["L0.q", "L0.k", "L0.v"])
    assert export_card(whole, "names", gpt2) == ["transformer.h.0.attn.c_attn.weight"]
    with pytest.raises(ParameterError, match="not one of"):
        export_card(whole, "deepspeed", gpt2)  # type: ignore[arg-type]
    llama = build_tiny_model("tiny-llama").model
    with pytest.raises(ProfileError, match="has no projections"):
        export_card(make_card(build_tiny_model("tiny-llama", num_hidden_layers=3).model, "x", ["L2.q"]), "names", llama)


def test_export_command_writes_each_format_and_warns_on_one_line(models, tmp_path, capsys):
    model = models["tiny-llama"].model
    card = make_card(model, "tiny-llama", CARDS["scattered"])
    path = card.save(tmp_path / "card.json")
    for to in FORMATS:
        out = tmp_path / f"card.{to}"
        assert main(["export", str(path), "--to", to, "-o", str(out)]) == 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert out.read_text() == export_text(card, to)  # type: ignore[arg-type]
    err = capsys.readouterr().err
    assert err.count("warning: LLaMA-Factory's freeze tuning") == 1 and "Traceback" not in err
    assert main(["export", str(path), "--to", "names"]) == 0
    assert json.loads(capsys.readouterr().out) == parameter_names(card)
    assert main(["export", str(path), "--to", "names", "-o", str(path)]) == 2  # never over its input
    assert "would destroy an input" in capsys.readouterr().err
    assert json.loads(path.read_text())["trainable"] == card.trainable
