"""LoRA adapters merged into streamed base weights, one module at a time, by peft's own layers.

Each adapted module is rebuilt alone (its base weight in an ``nn.Linear``, or GPT-2's ``Conv1D``), peft injects its
LoRA layer from the adapter's own config and loads the adapter's tensors, and peft's ``merge`` computes the weight:
so scaling (``lora_alpha`` with peft's default 8, rsLoRA), ``rank_pattern``, ``alpha_pattern``, fan-in-fan-out and
DoRA are exactly those of ``merge_and_unload``. A full weight saved through ``modules_to_save`` replaces the base
weight, as peft does. What cannot be merged this way is refused: other peft methods, LoRA variants (aLoRA, Arrow,
...), inits that rewrite the base weights (PiSSA, OLoRA, CorDA, LoftQ), an adapter that changes no attention
projection of the base, or one whose tensors do not fit the base.
"""

from __future__ import annotations

import copy
import math
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from topotuner_lab._io.errors import InputFileError, ModelLoadError
from topotuner_lab._io.json_files import read_json
from topotuner_lab.weights.checkpoint import FLOAT_DTYPES, Checkpoint
from topotuner_lab.weights.projections import language_model_matches

ADAPTER_CONFIG = "adapter_config.json"
_RESAVE_ADAPTER = "re-save the adapter with save_pretrained (or download it again)"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PREFIX = "base_model.model."
_LORA_PART = re.compile(r"\.(lora_[A-Za-z_]+(?:\.weight|\.bias)?)$")
#: inits that leave the base weights as they are (the others rewrite them, so the adapter needs that rewritten base)
_PLAIN_INITS = ("gaussian", "eva")
#: config fields that select a LoRA variant or layout whose merge is not the plain/DoRA one of a single module
_UNSUPPORTED = (
    "alora_invocation_tokens",
    "arrow_config",
    "use_bdlora",
    "velora_config",
    "monteclora_config",
    "kasa_config",
    "use_qalora",
    "layer_replication",
    "target_parameters",
)
_MERGE_WITH_PEFT = (
    "merge it with peft (PeftModel.from_pretrained(base, adapter).merge_and_unload(), then save_pretrained) and "
    "extract the merged model"
)


def is_adapter(folder: str | Path) -> bool:
    """True for a peft adapter folder (it holds ``adapter_config.json``)."""
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def needs_base_error(folder: Path) -> ModelLoadError:
    """The error for an adapter given without its base model, naming the base its config records."""
    recorded = None
    try:
        recorded = read_json(folder / ADAPTER_CONFIG, "adapter config", _RESAVE_ADAPTER).get("base_model_name_or_path")
    except InputFileError:
        pass
    hint = f" (its config names {recorded!r})" if isinstance(recorded, str) and recorded else ""
    return ModelLoadError(
        f"{folder} is a LoRA adapter, not a model: its base model is needed{hint}",
        f"pass the pretrained checkpoint folder: topotuner-lab extract {folder} --base BASE_FOLDER -o FILE "
        "(base=... in Python)",
    )


def _number(value: Any) -> bool:
    """True for a finite JSON number (not a boolean) that a float holds."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _rank(value: Any) -> bool:
    """True for a LoRA rank: a whole number >= 1 (not a boolean)."""
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value < 2**31


def _check_config(raw: dict[str, Any], where: Path) -> None:
    """Refuse configs that are not plain LoRA/DoRA, or whose merge fields have the wrong type."""

    def bad(problem: str, fix: str = f"fix {where}, or {_MERGE_WITH_PEFT}") -> InputFileError:
        return InputFileError(f"adapter config {where}: {problem}", fix)

    if raw.get("peft_type") != "LORA":
        raise bad(
            f"peft_type is {raw.get('peft_type')!r}; only LoRA (and DoRA) adapters are merged here", _MERGE_WITH_PEFT
        )
    rank, alpha = raw.get("r", 8), raw.get("lora_alpha", 8)
    if not _rank(rank):
        raise bad(f"r is {rank!r}, not a whole number >= 1")
    if not _number(alpha):
        raise bad(f"lora_alpha is {alpha!r}, not a number")
    for name, ok in (("rank_pattern", _rank), ("alpha_pattern", _number)):
        pattern = raw.get(name) or {}
        if not isinstance(pattern, dict) or not all(isinstance(k, str) and ok(v) for k, v in pattern.items()):
            raise bad(f"{name} is {pattern!r}, not an object of module pattern -> number")
    names = lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v))
    numbers = lambda v: isinstance(v, int) or (isinstance(v, list) and all(isinstance(x, int) for x in v))
    if not names(raw.get("target_modules")) or not raw.get("target_modules"):
        raise bad(f"target_modules is {raw.get('target_modules')!r}, not the names of the adapted modules")
    for name, ok in (
        ("exclude_modules", names),
        ("modules_to_save", names),
        ("layers_pattern", names),
        ("layers_to_transform", numbers),
    ):
        if raw.get(name) is not None and not ok(raw[name]):
            raise bad(f"{name} is {raw[name]!r}, not {'module names' if ok is names else 'layer numbers'}")
    for name in ("use_rslora", "use_dora", "fan_in_fan_out"):
        if not isinstance(raw.get(name, False), bool):
            raise bad(f"{name} is {raw.get(name)!r}, not true or false")
    init = raw.get("init_lora_weights", True)
    if not (isinstance(init, bool) or init in _PLAIN_INITS):
        raise bad(
            f"init_lora_weights is {init!r}: such an adapter is trained against base weights that its init rewrote",
            "convert it to a plain LoRA adapter (peft's save_pretrained(path_initial_model_for_weight_conversion=...)),"
            f" or {_MERGE_WITH_PEFT}",
        )
    used = [name for name in _UNSUPPORTED if raw.get(name) not in (None, False, [], {})]
    if used:
        raise bad(f"it uses {', '.join(used)}, which is not merged here", _MERGE_WITH_PEFT)


@dataclass
class _Module:
    """The adapter's tensors for one base weight: LoRA parts by their peft name, or a full replacement weight."""

    key: str  # the module's name in the adapted model (peft matches target_modules and patterns against it)
    param: str  # the base checkpoint's weight it changes
    lora: dict[str, str] = field(default_factory=dict)  # "lora_A.weight" -> tensor name in the adapter file
    replacement: str | None = None  # a modules_to_save weight


class LoraAdapter:
    """A peft LoRA adapter folder, checked against a base checkpoint and merged into its attention weights."""

    def __init__(self, folder: Path, base: Checkpoint) -> None:
        from peft import LoraConfig

        self.folder, self.base = folder, base
        raw = read_json(folder / ADAPTER_CONFIG, "adapter config", _RESAVE_ADAPTER)
        _check_config(raw, folder / ADAPTER_CONFIG)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.config = LoraConfig.from_pretrained(str(folder))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise InputFileError(f"peft cannot read the adapter config of {folder} ({exc})", _MERGE_WITH_PEFT) from exc
        weights = folder / ADAPTER_WEIGHTS
        if not weights.is_file():
            raise InputFileError(
                f"adapter {folder} has no {ADAPTER_WEIGHTS}",
                "save the adapter with peft's save_pretrained (safetensors is its default)",
            )
        self.tensors = Checkpoint.of_files(folder, [weights])
        self.modules = self._modules()

    def _modules(self) -> dict[str, _Module]:
        """The base attention weight each adapter module changes (by layer and kind), checked against the base."""
        mtype = self.base.model_type
        base_params = {key: name for name, key in language_model_matches(self.base.shapes, mtype).items()}
        by_key: dict[str, _Module] = {}
        for name in self.tensors.files:
            short = name.removeprefix(_PREFIX)
            lora = _LORA_PART.search(short)
            key = short[: lora.start()] if lora else short.rsplit(".", 1)[0]
            module = by_key.setdefault(key, _Module(key, ""))
            if lora:
                module.lora[lora.group(1)] = name
            elif short.endswith(".weight"):
                module.replacement = name
        attention = language_model_matches([f"{key}.weight" for key in by_key], mtype)
        if not attention:
            raise InputFileError(
                f"adapter {self.folder} changes no attention projection of the {mtype} base {self.base.folder} (it "
                f"adapts {', '.join(sorted(by_key)[:3]) or 'nothing'}): its snapshot would be the base's",
                "pass an adapter that targets the attention projections (q/k/v/o), for this base model",
            )
        modules: dict[str, _Module] = {}
        for name, (layer, kind) in attention.items():
            module = by_key[name.removesuffix(".weight")]
            if (layer, kind) not in base_params:
                raise InputFileError(
                    f"adapter {self.folder} changes {module.key}, which the base {self.base.folder} does not have "
                    f"(layer {layer}, {kind}): it is an adapter for another model",
                    "pass the --base the adapter was trained on",
                )
            module.param = base_params[layer, kind]
            self._check_shapes(module)
            modules[module.param] = module
        self._check_complete(set(modules), base_params.values())
        self._check_saved_whole({key for key, module in by_key.items() if module.replacement})
        return modules

    def _saved_whole(self, key: str) -> bool:
        """True for a module the adapter's config saves whole (``modules_to_save``, matched as peft matches it)."""
        return any(re.match(rf"(^|.*\.){m}($|\..*)", key) for m in self.config.modules_to_save or [])

    def _check_saved_whole(self, saved: set[str]) -> None:
        """Refuse an adapter whose ``modules_to_save`` names a base weight it does not store (peft refuses it too)."""
        for name in self.base.files:
            key = name.removesuffix(".weight")
            if name.endswith(".weight") and self._saved_whole(key):
                if not any(k == key or k.endswith(f".{key}") or key.endswith(f".{k}") for k in saved):
                    raise InputFileError(
                        f"adapter {self.folder}'s config saves {key} whole (modules_to_save) but its weights file "
                        "does not hold it (an incomplete or damaged adapter)",
                        "save the adapter again with peft's save_pretrained",
                    )

    def _check_complete(self, adapted: set[str], params: Any) -> None:
        """Refuse an adapter whose config targets an attention weight for which it stores no tensors."""
        from peft.tuners.tuners_utils import check_target_module_exists

        for param in params:
            try:
                targeted = check_target_module_exists(self.config, param.removesuffix(".weight"))
            except (re.error, TypeError, ValueError) as exc:
                raise InputFileError(
                    f"peft cannot match the adapter config of {self.folder} ({exc})", _MERGE_WITH_PEFT
                ) from exc
            if param not in adapted and targeted:
                raise InputFileError(
                    f"adapter {self.folder}'s config targets {param.removesuffix('.weight')} but its weights file has "
                    "no tensors for it (an incomplete or damaged adapter)",
                    "save the adapter again with peft's save_pretrained",
                )

    def _check_shapes(self, module: _Module) -> None:
        """The adapter's tensors for a module fit the base weight: LoRA ``A`` (r x in), ``B`` (out x r), r >= 1."""
        base_shape = self.base.shapes[module.param]
        names = [*module.lora.values(), *([module.replacement] if module.replacement else [])]
        for name in names:
            if self.tensors.dtypes[name] not in FLOAT_DTYPES:
                raise InputFileError(
                    f"adapter tensor {name} is {self.tensors.dtypes[name]}, not float", _MERGE_WITH_PEFT
                )
        if module.replacement and (module.lora or not self._saved_whole(module.key)):
            raise InputFileError(
                f"adapter {self.folder} holds a full weight {module.replacement} for a module its config does not "
                "save whole (modules_to_save)",
                _MERGE_WITH_PEFT,
            )
        if module.replacement and self.tensors.shapes[module.replacement] != base_shape:
            raise InputFileError(
                f"adapter weight {module.replacement} has shape {self.tensors.shapes[module.replacement]}, the base's "
                f"{module.param} {base_shape}: an adapter for a base of another width",
                "pass the --base the adapter was trained on",
            )
        if not module.lora:
            return
        out_f, in_f = base_shape[::-1] if self.base.model_type == "gpt2" else base_shape
        a, b = (self.tensors.shapes.get(module.lora.get(part, ""), ()) for part in ("lora_A.weight", "lora_B.weight"))
        if len(a) != 2 or len(b) != 2:
            raise InputFileError(
                f"adapter {self.folder} holds no 2-D lora_A and lora_B weights for {module.key} (shapes {a}, {b})",
                "save the adapter again with peft's save_pretrained (gathering sharded weights first)",
            )
        if a[0] < 1 or a[0] != b[1]:
            raise InputFileError(
                f"adapter {self.folder}: {module.key} has lora_A {a} and lora_B {b}, not a rank >= 1 shared by both",
                "save the adapter again with peft's save_pretrained (gathering sharded weights first)",
            )
        if a[1] != in_f or b[0] != out_f:
            raise InputFileError(
                f"adapter {self.folder}: {module.key} maps {a[1]} -> {b[0]} features, but the base's {module.param} "
                f"maps {in_f} -> {out_f}: an adapter for a base of another width",
                "pass the --base the adapter was trained on",
            )

    def merge(self, param: str, weight: np.ndarray) -> np.ndarray:
        """The base weight ``param`` (as stored) with this adapter merged into it, as peft's ``merge`` computes it."""
        module = self.modules.get(param)
        if module is None:
            return weight
        if module.replacement:
            return self.tensors.read(module.replacement)
        import torch
        from peft import inject_adapter_in_model, set_peft_model_state_dict

        state = {f"{module.key}.{part}": torch.from_numpy(self.tensors.read(n)) for part, n in module.lora.items()}
        try:
            with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
                warnings.simplefilter("ignore")
                bias = module.param.removesuffix("weight") + "bias" in self.base.files  # peft merges lora_bias there
                root = _skeleton(module.key, torch.from_numpy(weight), conv1d=self.base.model_type == "gpt2", bias=bias)
                inject_adapter_in_model(copy.deepcopy(self.config), root, low_cpu_mem_usage=True)
                loaded: Any = set_peft_model_state_dict(root, state, low_cpu_mem_usage=True)
                layer = root.get_submodule(module.key)
                missing = [k for k in loaded.missing_keys if ".base_layer." not in k]
                if missing or loaded.unexpected_keys:
                    raise ValueError(f"tensors missing: {missing[:3]}, not used: {loaded.unexpected_keys[:3]}")
                with torch.no_grad():
                    layer.merge()
        except (ValueError, TypeError, KeyError, AttributeError, RuntimeError, re.error) as exc:
            raise InputFileError(
                f"peft cannot merge adapter {self.folder} into {module.param} ({exc.__class__.__name__}: {exc})",
                _MERGE_WITH_PEFT,
            ) from exc
        return layer.get_base_layer().weight.detach().numpy()


def _skeleton(path: str, weight: Any, *, conv1d: bool, bias: bool) -> Any:
    """A module tree holding only the layer at ``path`` (dotted), whose weight is ``weight`` (as stored).

    The bias (zeros; snapshots hold weights only) is there when the base layer has one, so that peft merges a
    ``lora_bias`` adapter exactly where it can.
    """
    import torch
    from torch import nn

    root = node = nn.Module()
    *parents, leaf = path.split(".")
    for part in parents:
        child = nn.Module()
        node.add_module(part, child)
        node = child
    with torch.device("meta"):  # no random init: the weight is ours
        if conv1d:
            from transformers.pytorch_utils import Conv1D

            layer: nn.Module = Conv1D(weight.shape[1], weight.shape[0])
        else:
            layer = nn.Linear(weight.shape[1], weight.shape[0])
    layer.weight = nn.Parameter(weight, requires_grad=False)
    out_features = weight.shape[1] if conv1d else weight.shape[0]
    layer.register_parameter(
        "bias", nn.Parameter(weight.new_zeros(out_features), requires_grad=False) if bias else None
    )
    node.add_module(leaf, layer)
    return root
