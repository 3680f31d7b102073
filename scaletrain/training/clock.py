"""A clock that waits for the device before it reads the time (MEASURE.md: synchronise first)."""

from __future__ import annotations

import time

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class DeviceClock:
    """Accumulates device-synchronised wall time over start/stop intervals."""

    def __init__(self, device: torch.device):
        self.device = device
        self.total = 0.0
        self._started: float | None = None

    def now(self) -> float:
        synchronize(self.device)
        return time.perf_counter()

    def start(self) -> None:
        self._started = self.now()

    def stop(self) -> float:
        """Stops the clock; returns the interval just measured."""
        if self._started is None:
            return 0.0
        interval = self.now() - self._started
        self.total += interval
        self._started = None
        return interval
