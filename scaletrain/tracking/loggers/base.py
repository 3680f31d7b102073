"""The seam every external tracker plugs into, and the one callback that drives them.

A tracker (MLflow, W&B, TensorBoard: one file each in this folder) implements `ExternalLogger`:
start, one call per epoch, finish. `ExternalLogging` runs each tracker's calls on a thread of its
own, so a slow or dead tracking server never stalls a training step or an epoch's end; the first
call that fails prints one warning line and that tracker is dropped for the rest of the run. At
the end it waits for each tracker a bounded time (FINISH_WAIT_S), then leaves it.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from scaletrain.errors import first_line
from scaletrain.tracking.recorder import plain_metrics

# How long the end of a run waits for a tracker to take its last calls (the model and the run's
# own files are already written by then: nothing is lost if a tracker needs longer).
FINISH_WAIT_S = 60.0


@dataclass(slots=True)
class RunInfo:
    """What a tracker is told about the run when it starts."""
    run_id: str
    name: str
    run_dir: Path
    group: str | None
    params: dict                    # the flattened config: dotted keys, the values as configured
    tags: dict[str, str]            # strategy, precision, device, world size, run id
    resumed: bool = False
    log_dir: Path | None = None     # where a tracker that writes files puts them (TensorBoard)
    extra: dict = field(default_factory=dict)


class ExternalLogger(Protocol):
    name: str

    def start(self, info: RunInfo) -> None: ...

    def log_epoch(self, step: int, epoch: int, metrics: dict[str, float]) -> None: ...

    def finish(self, status: str, summary: dict | None, files: list[Path]) -> None:
        """status: finished, failed or interrupted; files: the run's config and summary."""


class _Tracker:
    """One tracker and the thread that makes its calls, in order."""

    def __init__(self, logger: ExternalLogger, warn):
        self.logger, self.warn = logger, warn
        self.calls: queue.Queue = queue.Queue()
        self.failed = False
        self.thread = threading.Thread(target=self._work, name=f"scaletrain-{logger.name}-logger", daemon=True)
        self.thread.start()

    def submit(self, method: str, *args) -> None:
        if not self.failed:
            self.calls.put((method, args))

    def end(self) -> None:
        self.calls.put(None)        # after the calls already queued

    def wait(self, deadline: float) -> None:
        self.thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if self.thread.is_alive() and not self.failed:
            self.warn(f"the {self.logger.name} logger did not finish within {FINISH_WAIT_S:g} s; its record of this "
                      "run may be incomplete (the run's own files are complete)")

    def _work(self) -> None:
        while True:
            item = self.calls.get()
            if item is None:
                return
            if self.failed:
                continue
            method, args = item
            try:
                getattr(self.logger, method)(*args)
            except Exception as exc:  # any tracker error: warn once, training goes on without it
                self.failed = True
                self.warn(f"the {self.logger.name} logger failed ({first_line(exc)}); the run goes on without it")


def _warn(line: str) -> None:
    print(f"scaletrain: warning: {line}", file=sys.stderr, flush=True)


class ExternalLogging:
    """The callback (on the recording process only) that hands a run's start, epochs and end to
    its trackers. `info` is completed at the first epoch's start with what only the built trainer
    knows (strategy, device)."""

    def __init__(self, loggers: list[ExternalLogger], info: RunInfo, warn=_warn):
        self.info = info
        self.trackers = [_Tracker(logger, warn) for logger in loggers]
        self.started = self.closed = False

    def on_train_begin(self, trainer) -> None:
        self.info.tags.update({"strategy": trainer.strategy.name, "device": str(trainer.device),
                               "world_size": str(trainer.strategy.world_size)})
        for tracker in self.trackers:
            tracker.submit("start", self.info)
        self.started = True

    def on_epoch_end(self, trainer, epoch: int, logs: dict) -> None:
        # The epoch goes to each tracker as its own argument (trackers log it beside the metrics).
        metrics = {k: v for k, v in plain_metrics(logs).items() if isinstance(v, float) and k != "epoch"}
        step = int(logs.get("optimizer_steps", trainer.global_step))   # the x axis every tracker shares
        for tracker in self.trackers:
            tracker.submit("log_epoch", step, epoch + 1, metrics)

    def finish(self, status: str, summary: dict | None = None, files: list[Path] = ()) -> None:
        """Once, after the run's files are written (or the run failed); waits a bounded time."""
        if self.closed:
            return
        self.closed = True
        deadline = time.monotonic() + FINISH_WAIT_S
        for tracker in self.trackers:
            if self.started:    # a run that failed before training began was never told to a tracker
                tracker.submit("finish", status, summary, [f for f in files if Path(f).is_file()])
            tracker.end()
        for tracker in self.trackers:
            tracker.wait(deadline)
