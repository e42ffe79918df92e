"""Memory of a training step, measured honestly.

The process's resident peak, what training added to it, and torch's own peak allocation on CUDA.
"""

from __future__ import annotations

import threading
from typing import Any, TypedDict

import torch


class MemoryFields(TypedDict):
    """The memory fields of a run's results (MiB)."""

    peak_rss_mib: float
    rss_increase_mib: float
    cuda_peak_allocated_mib: float | None


class PeakMemory:
    """Resident memory sampled every 20 ms in a thread while the block runs (and torch's peak counter on CUDA).

    ``peak_rss_mib`` is the process's resident peak during the block; ``rss_increase_mib`` is that peak minus the
    resident size when the block began, i.e. what this block added. A second run in the same process reuses memory
    freed by the first, so its increase can be near 0 while its peak says what the process needed.
    """

    def __init__(self) -> None:
        import psutil

        self._proc = psutil.Process()
        self._stop = threading.Event()
        self.start = self._proc.memory_info().rss
        self.peak = self.start
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __enter__(self) -> PeakMemory:
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)

    def fields(self) -> MemoryFields:
        """``peak_rss_mib``, ``rss_increase_mib`` and ``cuda_peak_allocated_mib`` (None without CUDA)."""
        cuda = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
        return {
            "peak_rss_mib": self.peak / 2**20,
            "rss_increase_mib": (self.peak - self.start) / 2**20,
            "cuda_peak_allocated_mib": cuda,
        }
