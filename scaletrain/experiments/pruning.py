"""The trial side of a hyperparameter search: a `scaletrain train` process started by `tune`
reports its per-epoch metric to its Optuna trial and stops early when the pruner says so.

`tune` passes the trial through the SCALETRAIN_TRIAL environment variable (JSON: storage URL,
study name, trial id, metric, pruner settings), so that the trial's config file stays a plain,
re-runnable training config.
"""

from __future__ import annotations

import json
import os

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


def trial_pruning_from_env() -> TrialPruning | None:
    spec = os.environ.get(TRIAL_ENV)
    if not spec:
        return None
    spec = json.loads(spec)
    return TrialPruning(spec["storage"], spec["study"], spec["trial_id"], spec["metric"], spec["pruner"])
