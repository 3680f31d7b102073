"""A clock that waits for the device before it reads the time (MEASURE.md: synchronise first)."""

from __future__ import annotations

import time

import torch

from scaletrain.accelerators import xla


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif xla.is_xla(device):
        xla.wait()


def _nothing() -> None:
    pass


def execution_boundary(device: torch.device):
    """What ends one host round-trip's work on `device` (called after each chunk of
    `steps_per_execution` steps, and after each evaluation batch): nothing where kernels run as
    they are issued (CPU, CUDA); on an XLA device the traced graph is cut there and started, so a
    chunk of N steps is one graph (accelerators/xla.py)."""
    return xla.sync if xla.is_xla(device) else _nothing


class DeviceClock:
    """Accumulates device-synchronised wall time over start/stop intervals. Inside an interval,
    `pause`/`resume` leave out work that is not training (a checkpoint save) without ending the
    interval: `stop` returns the whole interval's training time."""

    def __init__(self, device: torch.device):
        self.device = device
        self.total = 0.0
        self._started: float | None = None
        self._interval = 0.0      # time of the current interval before its last pause

    def now(self) -> float:
        synchronize(self.device)
        return time.perf_counter()

    def start(self, already: float = 0.0) -> None:
        """Starts an interval; `already`: training time it had before (a resumed epoch's)."""
        self._interval = already
        self._started = self.now()

    @property
    def interval(self) -> float:
        """The current interval's training time up to its last pause."""
        return self._interval

    def pause(self) -> float:
        """Stops counting (the interval goes on); returns the time of day for the paused work."""
        now = self.now()
        if self._started is not None:
            self._interval += now - self._started
            self._started = None
        return now

    def resume(self) -> None:
        self._started = self.now()

    def stop(self) -> float:
        """Stops the clock; returns the training time of the interval just measured."""
        if self._started is not None:
            self._interval += self.now() - self._started
            self._started = None
        interval, self._interval = self._interval, 0.0
        self.total += interval
        return interval
