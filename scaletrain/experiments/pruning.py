"""The trial side of a hyperparameter search: a `scaletrain train` process started by `tune`
reports its per-epoch metric to its Optuna trial and stops early when the pruner says so.

`tune` passes the trial through the SCALETRAIN_TRIAL environment variable (JSON: storage URL,
study name, trial id, metric, pruner settings), so that the trial's config file stays a plain,
re-runnable training config.
"""

from __future__ import annotations

import json
import os
import re
import time

from scaletrain.errors import RunPruned

TRIAL_ENV = "SCALETRAIN_TRIAL"


class TrialPruning:
    def __init__(self, storage_url: str, study_name: str, trial_id: int, metric: str, pruner: dict):
        import optuna

        from scaletrain.experiments.study import build_pruner, open_storage
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.load_study(study_name=study_name, storage=open_storage(storage_url),
                                  pruner=build_pruner(pruner))
        self.trial = optuna.trial.Trial(study, trial_id)
        self.metric = metric

    def on_epoch_end(self, trainer, epoch: int, logs: dict) -> None:
        # Under several processes the chief alone reports and asks, and every rank follows its
        # answer: ranks asking on their own could part ways (one stops, the rest wait on it).
        verdict = None
        value = logs.get(self.metric)
        if trainer.strategy.is_chief and value is not None:
            self.trial.report(float(value), step=epoch + 1)
            if self.trial.should_prune():
                verdict = (f"trial {self.trial.number} pruned after epoch {epoch + 1}: "
                           f"{self.metric} {float(value):.4f} trails the median of earlier trials")
        verdict = trainer.strategy.broadcast_object(verdict)
        if verdict:
            raise RunPruned(verdict)


class SpeedFloor:
    """Stops a run within an epoch once it trains slower than `samples_per_s` (autotune: the best
    candidate so far divided by --prune-factor). The median pruner decides at an epoch's end; a
    candidate at a two-hundredth of the best speed (compiled code on two OpenMP threads that share
    their cores with other work: 40 samples/s, 8,700 on a quiet machine) spent 80 s in one epoch
    getting there. Its rate is read at the end of each execution, from the end of the epoch's
    first one (a new iterator, loader workers starting, a last recompilation: once an epoch, not
    its speed), once `min_s` has passed; the first execution itself is judged less `grace_s` (with
    8 fused steps it alone took 40 s there); the trainer's own warm-up (compilation, CUDA graph
    capture) comes before any epoch and is never judged. No device sync: on a GPU the host may run
    ahead of the device, which only makes the rate look faster, never prunes a fast run.

    One process only: ranks deciding apart at a step could part ways, and agreeing at every step
    is a collective per step. autotune leaves the floor out under --nproc."""

    def __init__(self, samples_per_s: float, min_s: float = 1.0, grace_s: float = 2.0):
        self.samples_per_s, self.min_s, self.grace_s = samples_per_s, min_s, grace_s
        self.began = 0.0                                  # the epoch's start
        self.started: tuple[float, int] | None = None    # (time, epoch step) at the end of its first execution

    def on_epoch_begin(self, trainer, epoch: int) -> None:
        self.began, self.started = time.perf_counter(), None

    def on_train_batch_end(self, trainer, step: int, logs: dict) -> None:
        now, at = time.perf_counter(), int(logs.get("epoch_step", 0))
        if self.started is None:      # the first execution: its start-up allowed for
            self.started = (now, at)
            since, done = self.began + self.grace_s, at
        else:
            since, done = self.started[0], at - self.started[1]
        elapsed = now - since
        if elapsed < self.min_s:
            return
        rate = done * trainer.batch.global_batch / elapsed
        if rate < self.samples_per_s:
            raise RunPruned(f"stopped after {at} steps at {rate:.1f} samples/s, below the floor of "
                            f"{self.samples_per_s:.1f}")


_BELOW_FLOOR = re.compile(r"stopped after (\d+) steps at ([\d.]+) samples/s, below the floor of ([\d.]+)")


def rate_below_floor(line: str) -> float | None:
    """The samples/s a run stopped by SpeedFloor trained at, read from its last line (None: it was
    not stopped by the floor). autotune's confirmation counts it as that run's speed: a short
    window, but one at least --prune-factor times slower than the fastest contestant."""
    found = _BELOW_FLOOR.search(line)
    return float(found.group(2)) if found else None


def trial_callbacks_from_env() -> list:
    """The callbacks a search's trial asks for through SCALETRAIN_TRIAL: its study's pruner (and,
    from autotune, a speed floor); none outside a search."""
    spec = os.environ.get(TRIAL_ENV)
    if not spec:
        return []
    spec = json.loads(spec)
    callbacks: list = []
    if "trial_id" in spec:    # a trial of a study (autotune's confirmation runs have a floor only)
        callbacks.append(TrialPruning(spec["storage"], spec["study"], spec["trial_id"], spec["metric"], spec["pruner"]))
    if spec.get("floor") is not None:     # a floor of 0 never stops: the same callback, timed alike
        callbacks.append(SpeedFloor(**spec["floor"]))
    return callbacks
