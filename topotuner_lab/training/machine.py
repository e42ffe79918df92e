"""The machine a run is timed on, as measured here: logical cores, the CPU's model and the accelerator torch sees.

Each run records it, so timings from sittings on different machines are never compared as if from one. The CPU's
model is part of it because hosts with the same core count differ several-fold in speed (a 2-core AVX2 EPYC at
2.0 GHz trains SmolLM2-135M about 5x slower than the host that ran cpu-decide).
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name: Linux's ``/proc/cpuinfo``, else :func:`platform.processor` ("" where neither says)."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor().strip()


def machine() -> str:
    """``"2 CPU cores (AMD EPYC), no GPU"`` or ``"16 CPU cores (...), NVIDIA H200"``: what this process runs on."""
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    model = cpu_model()
    return f"{os.cpu_count()} CPU cores{f' ({model})' if model else ''}, {device}"
