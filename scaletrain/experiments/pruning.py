"""The trial side of a hyperparameter search: a `scaletrain train` process started by `tune`
reports its per-epoch metric to its Optuna trial and stops early when the pruner says so.

`tune` passes the trial through the SCALETRAIN_TRIAL environment variable (JSON: storage URL,
study name, trial id, metric, pruner settings), so that the trial's config file stays a plain,
re-runnable training config.
"""

from __future__ import annotations

import json
import os
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
    """Stops a run, within its first measured epoch, once it trains slower than `samples_per_s`
    (autotune: the best candidate so far divided by --prune-factor). The median pruner decides
    at an epoch's end; a candidate at a twentieth of the best speed (a loaded machine's two
    OpenMP threads: 39 samples/s against 2,830) would spend a whole epoch, over a minute, getting
    there. Epochs before `from_epoch` are warm-up and never judged; the rate is judged after
    `min_s` of an epoch, at the end of each execution (no device sync: on a GPU the host may run
    ahead of the device, which only makes the rate look faster, never prunes a fast run).

    One process only: ranks deciding apart at a step could part ways, and agreeing at every step
    is a collective per step. autotune leaves the floor out under --nproc."""

    def __init__(self, samples_per_s: float, from_epoch: int = 1, min_s: float = 1.0):
        self.samples_per_s, self.from_epoch, self.min_s = samples_per_s, from_epoch, min_s
        self.started: float | None = None

    def on_epoch_begin(self, trainer, epoch: int) -> None:
        self.started = time.perf_counter() if epoch >= self.from_epoch else None

    def on_train_batch_end(self, trainer, step: int, logs: dict) -> None:
        if self.started is None:
            return
        elapsed = time.perf_counter() - self.started
        if elapsed < self.min_s:
            return
        steps = int(logs.get("epoch_step", 0))
        rate = steps * trainer.batch.global_batch / elapsed
        if rate < self.samples_per_s:
            raise RunPruned(f"stopped after {steps} measured steps at {rate:,.0f} samples/s, below the floor of "
                            f"{self.samples_per_s:,.0f}")


def trial_callbacks_from_env() -> list:
    """The callbacks a search's trial asks for through SCALETRAIN_TRIAL: its study's pruner (and,
    from autotune, a speed floor); none outside a search."""
    spec = os.environ.get(TRIAL_ENV)
    if not spec:
        return []
    spec = json.loads(spec)
    callbacks: list = [TrialPruning(spec["storage"], spec["study"], spec["trial_id"], spec["metric"], spec["pruner"])]
    if spec.get("floor"):
        callbacks.append(SpeedFloor(**spec["floor"]))
    return callbacks
