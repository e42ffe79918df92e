"""The machine a run is timed on, as measured here: logical cores and the accelerator torch sees.

Each run records it, so timings from sittings on different machines are never compared as if from one.
"""

from __future__ import annotations

import os

import torch


def machine() -> str:
    """``"2 CPU cores, no GPU"`` or ``"16 CPU cores, NVIDIA H200"``: what this process can run on."""
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{os.cpu_count()} CPU cores, {device}"
