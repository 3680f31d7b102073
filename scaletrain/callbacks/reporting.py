"""Progress display and the per-run metrics log."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from scaletrain.console import make_console
from scaletrain.errors import write_failed


class ProgressBar:
    """A rich progress bar per epoch (only on a terminal), and one summary line per epoch always."""

    def __init__(self, console: Console | None = None, show_bar: bool | None = None):
        self.console = console or make_console()
        self.show_bar = self.console.is_terminal if show_bar is None else show_bar
        self.progress: Progress | None = None
        self.task = None

    def on_train_begin(self, trainer) -> None:
        if self.show_bar:
            self.progress = Progress(TextColumn("epoch {task.fields[epoch]}"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(),
                                     console=self.console, transient=True)
            self.progress.start()

    def on_epoch_begin(self, trainer, epoch: int) -> None:
        if self.progress is not None:
            self.task = self.progress.add_task("train", total=trainer.steps_per_epoch, epoch=epoch + 1, loss="-")

    def on_train_batch_end(self, trainer, step: int, logs: dict) -> None:
        if self.progress is not None and self.task is not None:
            fields = {"loss": f"{logs['loss']:.4f}"} if "loss" in logs else {}
            self.progress.update(self.task, completed=logs["epoch_step"], **fields)

    def on_epoch_end(self, trainer, epoch: int, logs: dict) -> None:
        if self.progress is not None and self.task is not None:
            self.progress.remove_task(self.task)
            self.task = None
        # The task's own metrics (accuracy, mae, perplexity...): nothing here assumes classification.
        task = trainer.task
        shown = [("loss", "train_loss"), (task.train_metric, f"train_{task.train_metric}"), ("val_loss", "val_loss")]
        if task.default_target != "loss":
            shown.append((f"val_{task.default_target}", f"val_{task.default_target}"))
        figures = "  ".join(f"{name} {logs[key]:.4f}" for name, key in shown if name and logs.get(key) is not None)
        self.console.print(f"epoch {epoch + 1:>3}  {figures}  lr {logs['lr']:.3g}  {logs['epoch_train_time_s']:.2f}s",
                           soft_wrap=True)

    def on_train_end(self, trainer, logs: dict) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


class MetricsLog:
    """One record per epoch, as JSON lines or CSV, flushed as it is written."""

    def __init__(self, path: str | Path, fmt: str | None = None):
        self.path = Path(path)
        self.format = fmt or ("csv" if self.path.suffix == ".csv" else "jsonl")
        self.columns: list[str] | None = None

    def on_train_begin(self, trainer) -> None:
        # Written from the start here, after a resume's checkpoint has loaded: a failed resume
        # attempt leaves the run's log as it was.
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("")
        for epoch, logs in enumerate(trainer.history):  # a resumed run: the epochs before the resume
            self.on_epoch_end(trainer, epoch, logs)

    def on_epoch_end(self, trainer, epoch: int, logs: dict) -> None:
        record = {k: v for k, v in logs.items() if isinstance(v, (int, float, str, bool, list)) or v is None}
        try:
            with self.path.open("a", newline="") as fh:
                if self.format == "jsonl":
                    fh.write(json.dumps(record) + "\n")
                    return
                if self.columns is None:
                    self.columns = list(record)
                    csv.DictWriter(fh, self.columns).writeheader()
                csv.DictWriter(fh, self.columns, extrasaction="ignore").writerow(record)
        except OSError as exc:
            raise write_failed(self.path, exc) from None


class AllocatorRetries:
    """Says once per epoch in which the CUDA caching allocator had to retry allocations (seed
    004: memory nearly full stalls the step). Reads a host-side counter at epoch end only."""

    def __init__(self, console: Console | None = None):
        self.console = console or make_console()
        self.seen = 0

    def on_epoch_end(self, trainer, epoch: int, logs: dict) -> None:
        from scaletrain.precision.hardware import allocator_retry_warning
        retries = trainer.peak_memory.retries()
        warning = allocator_retry_warning(self.seen, retries)
        self.seen = retries
        if warning:
            self.console.print(f"note: epoch {epoch + 1}: {warning}", soft_wrap=True)
