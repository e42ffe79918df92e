"""Safetensors checkpoints read one tensor at a time, checked before anything is written.

A checkpoint folder's ``config.json`` and index must be JSON of the right form; the index and its shards must agree
(each listed tensor in the shard the index names, no tensor in two shards, none missing from the index). Weights are
float (F16, BF16, F32, F64) or FP8 with their ``weight_scale_inv`` (dequantized by transformers' own FP8 code);
any other dtype (int8, bool, float8 without scales) is refused rather than read as numbers it does not hold.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from topotuner_lab._io.errors import InputFileError, ModelLoadError
from topotuner_lab._io.json_files import read_json

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})
FP8_DTYPES = frozenset({"F8_E4M3", "F8_E5M2"})
_RESAVE = "re-save the model with save_pretrained (or re-download the checkpoint)"
_SHARD = re.compile(r"^(.*)-\d+-of-(\d+)\.safetensors$")  # save_pretrained's shard names


def scale_name(name: str) -> str:
    """The name of an FP8 weight's inverse-scale tensor (``...q_proj.weight`` -> ``...q_proj.weight_scale_inv``)."""
    return f"{name}_scale_inv"


@dataclass
class Checkpoint:
    """Where each tensor of a safetensors checkpoint lives, its shape and dtype (read from the headers only)."""

    folder: Path
    files: dict[str, Path]  # tensor name -> shard
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, str]  # safetensors dtype names: "BF16", "F32", "F8_E4M3", "I8", ...
    config: dict[str, Any]

    @classmethod
    def open(cls, source: str | os.PathLike[str]) -> Checkpoint:
        """A checkpoint folder (``config.json`` + safetensors, sharded or not), indexed and cross-checked."""
        folder = Path(source)
        if not folder.is_dir() or not (folder / "config.json").is_file():
            raise ModelLoadError(
                f"{folder} is not a checkpoint folder with config.json", "point at a folder written by save_pretrained"
            )
        config = read_json(folder / "config.json", "model config", _RESAVE)
        if (folder / INDEX).is_file():
            weight_map = _weight_map(folder / INDEX)
            missing = sorted({s for s in weight_map.values() if not (folder / s).is_file()})
            if missing:
                raise InputFileError(f"{folder / INDEX} lists shards that are missing: {missing[:3]}", _RESAVE)
            checkpoint = cls.of_files(folder, [folder / s for s in sorted(set(weight_map.values()))], config)
            checkpoint._check_index(weight_map)
            _check_unlisted_shards(folder, set(weight_map.values()))
            return checkpoint
        if (folder / SINGLE).is_file():
            return cls.of_files(folder, [folder / SINGLE], config)
        raise ModelLoadError(
            f"{folder} holds no {SINGLE} and no {INDEX}", "save the model with safetensors (save_pretrained's default)"
        )

    @classmethod
    def of_files(cls, folder: Path, paths: list[Path], config: dict[str, Any] | None = None) -> Checkpoint:
        """The tensors of some safetensors files (a tensor stored in two of them is refused)."""
        from safetensors import safe_open

        files: dict[str, Path] = {}
        shapes: dict[str, tuple[int, ...]] = {}
        dtypes: dict[str, str] = {}
        for path in paths:
            try:
                with safe_open(str(path), framework="pt") as handle:
                    slices = {name: handle.get_slice(name) for name in handle.keys()}
                    found = {n: (tuple(s.get_shape()), s.get_dtype()) for n, s in slices.items()}
            except Exception as exc:  # noqa: BLE001 - safetensors raises several types for damaged files
                raise InputFileError(f"safetensors file {path} cannot be read ({exc})", _RESAVE) from exc
            for name, (shape, dtype) in found.items():
                if name in files:
                    raise InputFileError(
                        f"tensor {name} is stored twice, in {files[name].name} and {path.name}: which one is the "
                        "model's is unknown",
                        _RESAVE,
                    )
                files[name], shapes[name], dtypes[name] = path, shape, dtype
        return cls(folder, files, shapes, dtypes, config or {})

    def _check_index(self, weight_map: dict[str, str]) -> None:
        index = self.folder / INDEX
        for name, shard in weight_map.items():
            if name not in self.files:
                raise InputFileError(f"{index} lists {name} in {shard}, but no shard holds it", _RESAVE)
            if self.files[name].name != Path(shard).name:
                raise InputFileError(
                    f"{index} lists {name} in {shard}, but it is stored in {self.files[name].name}", _RESAVE
                )
        extra = sorted(set(self.files) - set(weight_map))
        if extra:
            raise InputFileError(f"the shards hold tensors {extra[:3]} that {index} does not list", _RESAVE)

    @property
    def model_type(self) -> str:
        """The config's ``model_type`` (``"unknown"`` when absent)."""
        return str(self.config.get("model_type", "unknown"))

    @property
    def total_params(self) -> int:
        """Parameters of all the checkpoint's tensors (FP8 scales left out)."""
        return int(sum(np.prod(s) for n, s in self.shapes.items() if not n.endswith("_scale_inv")))

    def check_weight(self, name: str) -> None:
        """Raise unless tensor ``name`` can be read as float weights (a float dtype, or FP8 with its scales)."""
        dtype = self.dtypes[name]
        if dtype in FLOAT_DTYPES or (dtype in FP8_DTYPES and scale_name(name) in self.files):
            return
        method = (self.config.get("quantization_config") or {}).get("quant_method", "none")
        why = "FP8 without its weight_scale_inv" if dtype in FP8_DTYPES else f"{dtype}, not a float type"
        raise InputFileError(
            f"tensor {name} of {self.folder} is {why} (quantization: {method}); its stored numbers are not the weights",
            "extract a float checkpoint (load the quantized model dequantized and save_pretrained it), or an FP8 "
            "checkpoint that stores each weight's weight_scale_inv",
        )

    def read(self, name: str) -> np.ndarray:
        """One tensor as float32 (bf16/fp16 converted, FP8 dequantized); its shard is opened for this read only."""
        from safetensors import safe_open

        self.check_weight(name)
        with safe_open(str(self.files[name]), framework="pt") as handle:
            tensor = handle.get_tensor(name)
        if self.dtypes[name] in FP8_DTYPES:
            tensor = self._dequantize(name, tensor)
        return tensor.float().numpy()

    def _dequantize(self, name: str, tensor: Any) -> Any:
        """An FP8 weight times its per-block (or per-tensor) inverse scales, by transformers' own dequantizer."""
        import torch
        from safetensors import safe_open
        from transformers.integrations.finegrained_fp8 import Fp8Dequantize

        with safe_open(str(self.files[scale_name(name)]), framework="pt") as handle:
            scales = handle.get_tensor(scale_name(name))
        try:
            return Fp8Dequantize(None)._dequantize_one(tensor, scales, output_dtype=torch.float32)
        except (ValueError, RuntimeError) as exc:
            raise InputFileError(
                f"FP8 weight {name} of {self.folder} {tuple(tensor.shape)} does not fit its weight_scale_inv "
                f"{tuple(scales.shape)} ({exc})",
                _RESAVE,
            ) from exc


def _check_unlisted_shards(folder: Path, listed: set[str]) -> None:
    """Refuse a shard of the index's own series (``model-00003-of-00004``) that the index does not list."""
    series = {m.groups() for m in map(_SHARD.match, listed) if m}
    stray = sorted(
        p.name
        for p in folder.glob("*.safetensors")
        if p.name not in listed and (m := _SHARD.match(p.name)) is not None and m.groups() in series
    )
    if stray:
        raise InputFileError(f"{folder} holds shards {stray[:3]} that its index {INDEX} does not list", _RESAVE)


def _weight_map(index: Path) -> dict[str, str]:
    data = read_json(index, "checkpoint index", _RESAVE)
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in weight_map.items()
    ):
        raise InputFileError(
            f"checkpoint index {index} has no 'weight_map' object of tensor name -> shard file name", _RESAVE
        )
    return weight_map
