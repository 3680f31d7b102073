"""Peak memory of a run: the CUDA caching allocator's peak on a GPU, the process's peak resident
set size on a CPU (which, unlike the CUDA figure, includes the interpreter and libraries)."""

from __future__ import annotations

import resource
import sys

import torch


class PeakMemory:
    def __init__(self, device: torch.device):
        self.device = device
        self._retries_at_reset = 0

    @property
    def kind(self) -> str:
        return "cuda_max_allocated" if self.device.type == "cuda" else "process_max_rss"

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self._retries_at_reset = self._alloc_retries()

    def retries(self) -> int:
        """Allocations the CUDA caching allocator retried since the reset (it freed its cache and
        synchronised to find room: memory was nearly full); 0 on a CPU. A host-side counter:
        reading it does not synchronise the device."""
        return self._alloc_retries() - self._retries_at_reset

    def _alloc_retries(self) -> int:
        if self.device.type != "cuda":
            return 0
        return int(torch.cuda.memory_stats(self.device).get("num_alloc_retries", 0))

    def read(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(rss if sys.platform == "darwin" else rss * 1024)  # Linux reports KiB
