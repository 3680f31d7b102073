"""`scaletrain tune`: a hyperparameter study on Optuna (TPE sampling, median pruning) whose trials
are real `scaletrain train` processes, each pinned to its own device slot and recorded as a run.

This process is the only one that asks for and closes trials on its host; a trial process only
reports its per-epoch metric (and is pruned). The trial budget counts finished trials of every
host plus the ones still running, so several hosts sharing one database stop together. A trial
whose process dies, or whose `tune` is killed, is failed (at once for this host's dead parents,
after the heartbeat grace period for other hosts') and its place in the budget freed: rerunning
the same command resumes the study without repeating a finished trial.
"""

from __future__ import annotations

import copy
import csv
import json
import os
import socket
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from scaletrain.config import TrainConfig, load_toml, write_toml
from scaletrain.console import make_console
from scaletrain.errors import PRUNED_EXIT_CODE, UserError
from scaletrain.experiments.jobs import settle, training_job
from scaletrain.experiments.pruning import TRIAL_ENV
from scaletrain.experiments.slots import Finished, SlotPool, device_slots
from scaletrain.experiments.space import SearchSpace
from scaletrain.experiments.study import (
    HEARTBEAT_S,
    WORKER_ATTR,
    build_pruner,
    build_sampler,
    check_same_training,
    fail_orphaned_trials,
    given_training,
    open_storage,
    require_optuna,
)
from scaletrain.options import from_mapping
from scaletrain.summary import RunSummary
from scaletrain.tasks import TASKS
from scaletrain.tracking.store import RunRecord, RunStore


def epoch_metrics(task) -> tuple[str, ...]:
    """The per-epoch metrics a run of `task` logs: its validation metrics, the training loss and its
    training metric."""
    return tuple([f"val_{m}" for m in task.metrics] + ["train_loss"]
                 + ([f"train_{task.train_metric}"] if task.train_metric else []))


# Per-epoch metrics of every registered task (a study on a user's own task takes that task's).
EPOCH_METRICS = tuple(dict.fromkeys(name for task in TASKS.values() for name in epoch_metrics(task)))
# Summary figures a study may optimise. Never the test split's (a study selecting on test data
# would report a figure it tuned on) and not the target itself (a setting, not a result).
SUMMARY_METRICS = tuple(name for name, tp in RunSummary.__annotations__.items()
                        if "float" in str(tp) and name not in EPOCH_METRICS
                        and not name.startswith("test_") and name != "target")
FAILED_RUN_ATTR = "failed_run"   # set on trials that failed by themselves (they use up the budget)
SURPLUS_ATTR = "surplus"         # asked for after the budget was full (another host got there first): never run


@dataclass(frozen=True, slots=True)
class TuneSettings:
    space: SearchSpace
    trials: int
    parallel: int
    metric: str
    direction: str
    out: Path
    storage_url: str
    study_name: str
    pruner: dict
    # The per-epoch metrics the trials log (the study's task's: epoch_metrics).
    epoch_metrics: tuple[str, ...] = EPOCH_METRICS


def resolve_objective(metric: str, direction: str, task) -> tuple[str, str]:
    """`--metric auto` is the task's own target on the validation split (val_accuracy, val_r2,
    val_perplexity, a user task's); `--direction auto` is the way that metric improves. A
    per-epoch metric this task does not report is refused here, before any trial trains to no
    objective. `task`: the Task the trials train."""
    if metric == "auto":
        if task.default_target is None:
            raise UserError(f"the {task.name} task has no default target: name --metric "
                            f"({', '.join('val_' + m for m in task.metrics)})")
        metric = f"val_{task.default_target}"
    if metric not in EPOCH_METRICS + epoch_metrics(task) + SUMMARY_METRICS:
        return metric, direction if direction != "auto" else "maximize"   # check_settings names the problem
    kind, _, name = metric.partition("_")
    if metric not in SUMMARY_METRICS and kind == "val" and name not in task.metrics:
        raise UserError(f"--metric {metric}: the {task.name} task reports "
                        f"{', '.join('val_' + m for m in task.metrics)} per epoch; use one of these (or --metric auto)")
    if direction == "auto":
        if kind == "val" and name in task.metrics:
            direction = "maximize" if task.metrics[name] else "minimize"
        elif metric == f"train_{task.train_metric}" or metric == "images_per_sec":
            direction = "maximize"
        elif metric.endswith("_s") or metric == "train_loss":
            direction = "minimize"
        else:
            raise UserError(f"--metric {metric}: say whether to --direction maximize or minimize it")
    return metric, direction


def check_settings(s: TuneSettings, base: TrainConfig) -> None:
    if s.trials < 1:
        raise UserError(f"--trials must be at least 1 (got {s.trials})")
    if s.parallel < 1:
        raise UserError(f"--parallel must be at least 1 (got {s.parallel})")
    if s.direction not in ("maximize", "minimize"):
        raise UserError(f"--direction must be maximize or minimize (got {s.direction!r})")
    if s.metric.startswith("test_"):
        raise UserError(f"--metric {s.metric}: a study never selects on the test split (its figure would no longer "
                        f"be an honest estimate); use the validation metric val_{s.metric[5:]}")
    if s.metric not in s.epoch_metrics + SUMMARY_METRICS:
        raise UserError(f"--metric {s.metric} is not something a run reports; per epoch: {', '.join(s.epoch_metrics)}; "
                        f"per run: {', '.join(SUMMARY_METRICS)}")
    if s.metric.startswith("val_") and not base.eval_each_epoch:
        raise UserError(f"--metric {s.metric} needs an evaluation each epoch; drop --no-eval-each-epoch")
    if base.distributed.nproc > 1:
        raise UserError("tune runs each trial as one process on its own device; drop --nproc "
                        "(use --parallel to run trials side by side)")


def objective_value(metric: str, direction: str, record: RunRecord, epochs: list[dict]) -> float | None:
    """A per-epoch metric's best epoch (what early stopping would keep), or a run summary's value."""
    if metric not in SUMMARY_METRICS:
        values = [e[metric] for e in epochs if e.get(metric) is not None]
        if not values:
            return None
        return max(values) if direction == "maximize" else min(values)
    value = record.summary_value(metric)
    return None if value is None else float(value)


class Tuner:
    def __init__(self, base: TrainConfig, settings: TuneSettings, console: Console | None = None):
        check_settings(settings, base)
        self.optuna = require_optuna()
        self.base, self.s = base, settings
        self.console = console or make_console()
        self.group = f"tune-{settings.study_name}"
        self.me = f"{socket.gethostname()}:{os.getpid()}"
        self.storage = open_storage(settings.storage_url)
        self.study = self._open_study()
        self.running: dict[str, object] = {}  # job name -> optuna Trial
        self._last_idle_beat = 0.0

    def _open_study(self):
        optuna = self.optuna
        # Optuna's heartbeats are meant for Study.optimize; this process records them itself.
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
        try:
            study = optuna.create_study(study_name=self.s.study_name, storage=self.storage,
                                        sampler=build_sampler(self.s.trials), pruner=build_pruner(self.s.pruner),
                                        direction=self.s.direction, load_if_exists=True)
        except Exception as exc:
            raise UserError(f"cannot open study '{self.s.study_name}' in {self.s.storage_url}: {exc}") from None
        stored = study.direction.name.lower()
        if stored != self.s.direction:
            raise UserError(f"study '{self.s.study_name}' was created to {stored} its metric; rerun with "
                            f"--direction {stored} or choose another --study-name")
        attrs = study.user_attrs
        if "metric" in attrs and attrs["metric"] != self.s.metric:
            raise UserError(f"study '{self.s.study_name}' optimises {attrs['metric']}; rerun with --metric "
                            f"{attrs['metric']} or choose another --study-name")
        if "metric" not in attrs:
            study.set_user_attr("metric", self.s.metric)
            study.set_user_attr("space", self.s.space.text)
        elif attrs.get("space") != self.s.space.text:
            self.console.print("note: the space file differs from the one this study started with; "
                               "finished trials keep their values")
        check_same_training(study, given_training(self.base, {p.key for p in self.s.space.parameters}),
                            f"study '{self.s.study_name}' in {self.s.storage_url}")
        return study

    # -- the trial budget ---------------------------------------------------------------------

    def _fail_orphans(self) -> None:
        for number in fail_orphaned_trials(self.study, self.storage):
            self.console.print(f"trial {number} was left running by a killed tune; failed it "
                               "(it does not count towards --trials)")

    def _counts(self) -> tuple[int, int]:
        """(trials that count as done, trials running anywhere)."""
        State = self.optuna.trial.TrialState
        done = running = 0
        for trial in self.study.get_trials(deepcopy=False):
            if trial.state in (State.COMPLETE, State.PRUNED):
                done += 1
            elif trial.state == State.FAIL and FAILED_RUN_ATTR in trial.user_attrs:
                done += 1
            elif trial.state in (State.RUNNING, State.WAITING):
                running += 1
        return done, running

    def _heartbeat(self) -> None:
        for trial in self.running.values():
            self.storage.record_heartbeat(trial._trial_id)

    # -- running trials -----------------------------------------------------------------------

    def _surplus(self, trial) -> bool:
        """Whether the budget was already used up by trials asked for before this one: two hosts
        that counted at the same moment both ask, and the later trial number gives way."""
        State = self.optuna.trial.TrialState
        earlier = sum(1 for t in self.study.get_trials(deepcopy=False)
                      if t.number < trial.number and (t.state in (State.COMPLETE, State.PRUNED, State.RUNNING,
                                                                  State.WAITING)
                                                      or (t.state == State.FAIL and FAILED_RUN_ATTR in t.user_attrs)))
        return earlier >= self.s.trials

    def _start(self, pool: SlotPool, store: RunStore) -> bool:
        trial = self.study.ask()
        trial.set_user_attr(WORKER_ATTR, self.me)
        if self._surplus(trial):
            trial.set_user_attr(SURPLUS_ATTR, True)
            self.study.tell(trial, state=self.optuna.trial.TrialState.FAIL)
            return False
        self.storage.record_heartbeat(trial._trial_id)
        values = self.s.space.suggest(trial)
        cfg = self.s.space.apply(self.base, values)
        name = f"trial-{trial.number:04d}"
        spec = {"storage": self.s.storage_url, "study": self.s.study_name, "trial_id": trial._trial_id,
                "metric": "" if self.s.metric in SUMMARY_METRICS else self.s.metric, "pruner": self.s.pruner}
        job = training_job(cfg, name, self.s.out / "trials", self.group, payload=trial.number,
                           env={TRIAL_ENV: json.dumps(spec)})
        trial.set_user_attr("run_id", job.payload[0].tracking.run_id)
        trial.set_user_attr("config", str(self.s.out / "trials" / name / "config.toml"))
        slot = pool.start(job)
        self.running[name] = trial
        shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
        self.console.print(f"trial {trial.number} on {slot.label}: {shown}", soft_wrap=True)
        return True

    def _finish(self, finished: Finished, store: RunStore) -> None:
        State = self.optuna.trial.TrialState
        trial = self.running.pop(finished.job.name)
        if finished.returncode == PRUNED_EXIT_CODE:
            self.study.tell(trial, state=State.PRUNED)
            self.console.print(f"trial {trial.number}: pruned ({finished.seconds:.1f} s)")
            return
        record = settle(store, finished)
        value = objective_value(self.s.metric, self.s.direction, record, store.epochs(record.id)) \
            if record.status == "finished" else None
        if value is None:
            reason = record.error or f"the run reported no {self.s.metric}"
            trial.set_user_attr(FAILED_RUN_ATTR, reason)
            self.study.tell(trial, state=State.FAIL)
            self.console.print(f"trial {trial.number}: failed ({reason}), run {record.id}",
                               soft_wrap=True)
            return
        self.study.tell(trial, value)
        self.console.print(f"trial {trial.number}: {self.s.metric} {value:.4f} ({finished.seconds:.1f} s, "
                           f"run {record.id})")

    def run(self):
        self.s.out.mkdir(parents=True, exist_ok=True)
        self._fail_orphans()
        done, running = self._counts()
        self.console.print(f"study '{self.s.study_name}' in {self.s.storage_url}: {done} of {self.s.trials} trials "
                           f"done{f', {running} running elsewhere' if running else ''}; {self.s.parallel} at a time; "
                           f"{self.s.direction} {self.s.metric}", soft_wrap=True)
        store = RunStore(self.base.tracking.store)
        pool = SlotPool(device_slots(self.s.parallel, self.base.device))
        last_beat = 0.0
        try:
            while True:
                if time.monotonic() - last_beat >= HEARTBEAT_S:
                    self._heartbeat()
                    self.optuna.storages.fail_stale_trials(self.study)
                    last_beat = time.monotonic()
                done, running = self._counts()
                while pool.has_free_slot and done + running < self.s.trials:
                    if not self._start(pool, store):
                        break
                    running += 1
                if pool.running:
                    self._finish(pool.wait_any(idle=self._beat_if_due), store)
                elif done >= self.s.trials:
                    break
                else:  # the rest of the budget runs on other hosts (or is stale): wait and look again
                    time.sleep(1.0)
        finally:
            pool.terminate()
            store.close()
        return self.study

    def _beat_if_due(self) -> None:
        now = time.monotonic()
        if now - self._last_idle_beat >= HEARTBEAT_S:
            self._heartbeat()
            self._last_idle_beat = now

    # -- results ------------------------------------------------------------------------------

    def best_config(self, trial) -> TrainConfig:
        """The best trial's exact config where its file is on this host, else the base config with
        its parameters applied."""
        path = Path(trial.user_attrs.get("config", ""))
        if path.is_file():
            cfg = from_mapping(TrainConfig, load_toml(path))
        else:
            cfg = self.s.space.apply(self.base, {p.name: p.decode(trial.params[p.name])
                                                 for p in self.s.space.parameters})
        cfg = copy.deepcopy(cfg)
        cfg.tracking.run_id = cfg.tracking.group = cfg.run_dir = None
        cfg.progress = self.base.progress
        return cfg

    def best_params(self, trial) -> dict:
        """A trial's values in the config's terms (list choices decoded)."""
        return {p.name: p.decode(trial.params[p.name]) for p in self.s.space.parameters if p.name in trial.params}

    def write_results(self) -> tuple[Path | None, Table]:
        State = self.optuna.trial.TrialState
        trials = [t for t in self.study.get_trials(deepcopy=False) if SURPLUS_ATTR not in t.user_attrs]
        names = [p.name for p in self.s.space.parameters]
        with (self.s.out / "trials.csv").open("w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["number", "state", "value", *names, "run_id", "worker", "error"])
            for t in trials:
                writer.writerow([t.number, t.state.name, t.value, *[t.params.get(n) for n in names],
                                 t.user_attrs.get("run_id"), t.user_attrs.get(WORKER_ATTR),
                                 t.user_attrs.get(FAILED_RUN_ATTR)])
        table = Table(title=f"Study {self.s.study_name}: {self.s.direction} {self.s.metric}")
        for header in ("trial", "state", self.s.metric, *names, "run"):
            table.add_column(header, justify="right")
        complete = [t for t in trials if t.state == State.COMPLETE]
        best = None
        if complete:
            best = self.study.best_trial
        for t in trials:
            style = "bold green" if best is not None and t.number == best.number else None
            table.add_row(str(t.number), t.state.name.lower(), "-" if t.value is None else f"{t.value:.4f}",
                          *[f"{t.params[n]:.4g}" if isinstance(t.params.get(n), float) else str(t.params.get(n, "-"))
                            for n in names], t.user_attrs.get("run_id", "-"), style=style)
        if best is None:
            return None, table
        best_path = write_toml(self.best_config(best), self.s.out / "best.toml")
        (self.s.out / "best.json").write_text(json.dumps({"trial": best.number, "value": best.value,
                                                          "params": self.best_params(best),
                                                          "run_id": best.user_attrs.get("run_id")}, indent=2))
        return best_path, table
