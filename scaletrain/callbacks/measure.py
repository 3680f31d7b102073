"""Seed 003's measurement callbacks, made first-class: throughput, stop at a target (accuracy, or
any metric the task reports),
cumulative training time. The trainer's clock (device-synchronised, paused during evaluation)
supplies the times in the epoch logs; these callbacks turn them into the reported figures."""

from __future__ import annotations

import statistics

from rich.console import Console

from scaletrain.console import make_console


class Throughput:
    """Images/sec of each epoch's training loop. The first epoch is marked as warm-up and left
    out of the steady-state figure when there are later epochs."""

    def __init__(self, console: Console | None = None, verbose: bool = True):
        self.console = console or make_console()
        self.verbose = verbose
        self.per_epoch: list[float] = []

    def on_epoch_end(self, trainer, epoch: int, logs: dict) -> None:
        ips = logs["samples"] / max(logs["epoch_train_time_s"], 1e-12)
        logs["images_per_sec"] = ips
        logs["warmup_epoch"] = epoch == 0
        self.per_epoch.append(ips)
        if self.verbose:
            mark = " (warm-up epoch)" if epoch == 0 else ""
            self.console.print(f"Epoch {epoch + 1}: {ips:,.0f} images/sec{mark}")

    def state_dict(self) -> dict:
        return {"per_epoch": self.per_epoch}

    def load_state_dict(self, state: dict) -> None:
        self.per_epoch = list(state["per_epoch"])

    def steady_state(self) -> float | None:
        values = self.per_epoch[1:] or self.per_epoch
        return statistics.median(values) if values else None


class StopAtTarget:
    """Stops once the monitored validation metric has reached `target` (at or above it; at or
    below where lower is better, as for loss or perplexity) for `patience` consecutive epochs.
    Time to target is the cumulative training time (evaluation excluded) at the first epoch that
    reached it."""

    def __init__(self, target: float, patience: int = 1, monitor: str = "val_accuracy",
                 higher_is_better: bool = True, console: Console | None = None, verbose: bool = True):
        self.target, self.patience, self.monitor = target, patience, monitor
        self.higher_is_better = higher_is_better
        self.console = console or make_console()
        self.verbose = verbose
        self.met_in_a_row = 0
        self.reached_epoch: int | None = None
        self.time_to_target_s: float | None = None
        self.stopped_epoch: int | None = None

    def on_epoch_end(self, trainer, epoch: int, logs: dict) -> None:
        value = logs.get(self.monitor)
        if value is None:
            return
        if value >= self.target if self.higher_is_better else value <= self.target:
            self.met_in_a_row += 1
            if self.reached_epoch is None:
                self.reached_epoch = epoch
                self.time_to_target_s = logs["cumulative_train_time_s"]
        else:
            self.met_in_a_row = 0
        if self.met_in_a_row >= self.patience:
            self.stopped_epoch = epoch
            trainer.stop_training = True

    def state_dict(self) -> dict:
        return {"met_in_a_row": self.met_in_a_row, "reached_epoch": self.reached_epoch,
                "time_to_target_s": self.time_to_target_s, "stopped_epoch": self.stopped_epoch}

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, value)

    @property
    def relation(self) -> str:
        return ">=" if self.higher_is_better else "<="

    def on_train_end(self, trainer, logs: dict) -> None:
        if self.verbose and self.stopped_epoch is not None:
            self.console.print(f"Reached {self.monitor} {self.relation} {self.target} for {self.patience} epoch(s): "
                               f"stopping after epoch {self.stopped_epoch + 1}")


class TotalTime:
    """Cumulative training time after each epoch and at the end (seed 003's PrintTotalTime)."""

    def __init__(self, console: Console | None = None, verbose: bool = True):
        self.console = console or make_console()
        self.verbose = verbose
        self.after_epoch: list[float] = []

    def on_epoch_end(self, trainer, epoch: int, logs: dict) -> None:
        self.after_epoch.append(logs["cumulative_train_time_s"])
        if self.verbose:
            self.console.print(f"Cumulative training time after epoch {epoch + 1}: "
                               f"{logs['cumulative_train_time_s']:.2f} s")

    def state_dict(self) -> dict:
        return {"after_epoch": self.after_epoch}

    def load_state_dict(self, state: dict) -> None:
        self.after_epoch = list(state["after_epoch"])

    def on_train_end(self, trainer, logs: dict) -> None:
        if self.verbose and self.after_epoch:
            self.console.print(f"Cumulative training time: {self.after_epoch[-1]:.2f} s")


class EarlyStopping:
    """Stops after `patience` epochs without improvement of `monitor` by more than `min_delta`."""

    def __init__(self, monitor: str = "val_loss", patience: int = 3, min_delta: float = 0.0,
                 mode: str | None = None):
        self.monitor, self.patience, self.min_delta = monitor, patience, min_delta
        self.mode = mode or ("max" if "acc" in monitor else "min")
        self.best: float | None = None
        self.bad_epochs = 0
        self.stopped_epoch: int | None = None

    def on_epoch_end(self, trainer, epoch: int, logs: dict) -> None:
        value = logs.get(self.monitor)
        if value is None:
            return
        better = self.best is None or (
            value < self.best - self.min_delta if self.mode == "min" else value > self.best + self.min_delta)
        if better:
            self.best, self.bad_epochs = value, 0
            return
        self.bad_epochs += 1
        if self.bad_epochs >= self.patience:
            self.stopped_epoch = epoch
            trainer.stop_training = True

    def state_dict(self) -> dict:
        return {"best": self.best, "bad_epochs": self.bad_epochs, "stopped_epoch": self.stopped_epoch}

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, value)
