"""The callback that writes a run into the run store as it trains (on the chief only)."""

from __future__ import annotations

import numbers
import sqlite3
import sys
import time

from scaletrain.tracking.store import RunStore
from scaletrain.tracking.system_monitor import SystemMonitor


def plain_metrics(logs: dict) -> dict:
    """The JSON-able values of an epoch log: scalars, and lists of numbers (a distribution, such as
    a parameter server's staleness counts). Tensors and arrays have been read back by then."""
    return {k: (v if isinstance(v, (bool, str, list)) or v is None else float(v)) for k, v in logs.items()
            if isinstance(v, (numbers.Number, bool, str)) or v is None
            or (isinstance(v, list) and all(isinstance(x, numbers.Number) for x in v))}


class RunRecorder:
    """Per-epoch metrics (with the wall time since the run began) and system samples, written at
    each epoch end: one small SQLite transaction per epoch, none inside the step loop.

    A store that cannot be written (locked past its timeout, disk full) never ends a training:
    the recorder says so once on stderr and stops recording; the run folder's own files stay
    complete."""

    def __init__(self, store: RunStore, run_id: str, wall_start: float, monitor: SystemMonitor | None = None):
        self.store, self.run_id, self.wall_start, self.monitor = store, run_id, wall_start, monitor
        self.failed: str | None = None

    def guarded(self, write, *args) -> None:
        """Calls a store write; on a database error, warns once and records nothing more."""
        if self.failed is not None:
            return
        try:
            write(*args)
        except sqlite3.Error as exc:
            self.failed = str(exc)
            print(f"scaletrain: warning: stopped recording run {self.run_id} in {self.store.path} ({exc}); "
                  "training goes on, the run folder keeps its metrics", file=sys.stderr)

    def on_train_begin(self, trainer) -> None:
        if self.monitor is not None:
            self.monitor.start(self.wall_start)

    def on_epoch_end(self, trainer, epoch: int, logs: dict) -> None:
        samples = self.monitor.drain() if self.monitor is not None else []
        self.guarded(self.store.log_epoch, self.run_id, epoch, time.perf_counter() - self.wall_start,
                    plain_metrics(logs), samples)

    def flush_samples(self) -> None:
        if self.monitor is not None:
            self.guarded(self.store.log_samples, self.run_id, self.monitor.drain())

    def on_train_end(self, trainer, logs: dict) -> None:
        self.close()

    def close(self) -> None:
        """Stops sampling and writes what is left; safe to call twice (also on a failed run)."""
        if self.monitor is not None:
            self.monitor.stop()
            self.flush_samples()
