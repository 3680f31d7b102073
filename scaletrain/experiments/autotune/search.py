"""The search: which system settings train this model fastest here, and do they train the same.

1. The knobs (knobs.py) give every candidate; before anything runs, planning.py discards those
   the device only emulates, a launch would refuse or the memory planner predicts will not fit.
2. Optuna's TPE proposes candidates (the given configuration first, then each knob's values
   alone); each is measured as its own `scaletrain train` process for a short window
   (measuring.py: pruned when it trails, refused when its loss departs from the baseline's).
3. The given configuration and the best few are measured again, interleaved round by round
   (confirming.py), so that a change in the machine's load cannot pick the winner. The winner is
   written as a TOML `train --config` runs as is.

Each trial is a run in the store (group `autotune-<name>`), and the study lives in SQLite under
--out: killed and rerun, the search goes on where it stopped (a trial the kill interrupted is
failed and asked again).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import time
import warnings
from collections import Counter
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from scaletrain.config import TrainConfig, write_toml
from scaletrain.data import sample_shape
from scaletrain.data.dataset import ArraySplit
from scaletrain.distributed.batching import adopt_loader_batch
from scaletrain.distributed.strategies import resolve_device
from scaletrain.errors import UserError
from scaletrain.experiments.autotune.confirming import confirm_finalists
from scaletrain.experiments.autotune.knobs import Knob, apply, candidates, first_candidates, model_facts, system_knobs
from scaletrain.experiments.autotune.measuring import CandidateRuns
from scaletrain.experiments.autotune.pilot import check_budget_holds_one
from scaletrain.experiments.autotune.planning import device_memory, plan_candidates
from scaletrain.experiments.autotune.settings import (
    THROUGHPUT,
    TIME_TO_TARGET,
    AutotuneSettings,
    Row,
    row_key,
    study_group,
)
from scaletrain.experiments.slots import SlotPool, device_slots, machine_slot
from scaletrain.experiments.study import (
    WORKER_ATTR,
    check_same_training,
    fail_orphaned_trials,
    given_training,
    open_storage,
    require_optuna,
)
from scaletrain.experiments.sweep import scaled_lr
from scaletrain.memory.units import format_bytes
from scaletrain.tracking.store import RunStore
from scaletrain.training.defaults import choose_channels_last, choose_compile, settle_precision_here
from scaletrain.training.rounds import AGAIN, Confirmation
from scaletrain.training.threads import choose_threads

PARAMS_ATTR, OUTCOME_ATTR = "params", "outcome"
SHOWN_DISCARDS = 3   # discarded candidates with one reason listed row by row; more: one caption line


class AutoTuner:
    def __init__(self, base: TrainConfig, settings: AutotuneSettings, console: Console):
        problems = settings.problems()
        if problems:
            raise UserError(problems[0])
        if settings.objective is TIME_TO_TARGET and base.target is None:
            raise UserError("--objective time-to-target needs a target: --target VALUE (with --target-metric), "
                            "as the default recipe has (0.94 accuracy)")
        self.optuna = require_optuna()
        self.base, self.s, self.console = base, settings, console
        # --budget-s counts from here: the data and the plan are part of what the user waits for.
        self.started = time.perf_counter()
        self.deadline = self.started + settings.budget_s if settings.budget_s else None
        self.noise: list[float] = []           # the confirmation's given-against-itself ratios (the noise floor)
        self.group = study_group(settings.study_name, settings.out, base.tracking.store)
        self.me = f"{socket.gethostname()}:{os.getpid()}"
        self.device = resolve_device(base.device)
        if self.device.type == "cpu" and base.threads is None and base.distributed.nproc == 1:
            # The given configuration is what the caller runs: the thread count a `scaletrain
            # train` from their shell would start with (OMP_NUM_THREADS, else the cores the load
            # leaves now: training/threads.py), not the whole machine that the candidates' slot
            # would give. Under --nproc the launcher shares the cores out itself.
            base.threads = choose_threads(None).setting.value
        shape, outputs, task = sample_shape(base.data)
        self.shape, self.outputs, self.task = shape, outputs, task
        from scaletrain.data import load_dataset
        dataset = self.dataset = load_dataset(base.data, seed=base.seed)
        train, self.example = dataset.train, dataset.example
        # A user's DataLoader batches the data itself: its batch is every candidate's and best.toml's.
        adopt_loader_batch(base, dataset.loader_batch, max(base.distributed.nproc, 1))
        self.train_samples = len(train)
        # Read on the host (streamed shards, a user's own samples, or asked for): its workers matter.
        streamed = base.data.placement == "stream" or not isinstance(train, ArraySplit)
        # The given configuration's defaults settled for this device, so each knob's baseline value
        # is the one it runs with (and `auto` is never tried beside what it stands for).
        settle_precision_here(base)
        facts = model_facts(base, shape, outputs)
        base.channels_last = choose_channels_last(base.channels_last, self.device, facts.convolutions_2d).value
        base.compile = choose_compile(base.compile).value
        knobs = system_knobs(base, self.device, facts, streamed)
        if settings.objective is TIME_TO_TARGET and dataset.loader_batch is not None:
            console.print(f"note: the batch size is not searched: the training DataLoader fixes it "
                          f"({dataset.loader_batch} per process); pass its Dataset to search it", soft_wrap=True)
        elif settings.objective is TIME_TO_TARGET:    # what changes the steps needed, not only their speed
            sizes = [b for b in (base.batch_size // 2, base.batch_size * 2) if 8 <= b <= self.train_samples // 4]
            knobs.insert(0, Knob("batch_size", (base.batch_size, *sizes)))
        unknown = set(settings.only) - {k.label for k in knobs}
        if unknown:
            raise UserError(f"--knobs {','.join(sorted(unknown))}: not a knob for this training here; it has "
                            f"{', '.join(k.label for k in knobs)}")
        # The batch size is what time to target is about: searched under that objective whatever
        # --knobs names (the docs say so), the given batch first.
        always = {"batch_size"} if settings.objective is TIME_TO_TARGET else set()
        self.knobs: list[Knob] = [k for k in knobs
                                  if not settings.only or k.label in settings.only or k.label in always]
        self.grid = candidates(self.knobs)
        self.memory = settings.device_memory or device_memory(self.device)
        self.storage_url = f"sqlite:///{(settings.out / 'autotune.db').resolve()}"
        self.sample = (shape, outputs, task, self.example)
        self.runs = CandidateRuns(base, settings, console, self.configure, self.knobs, self.train_samples,
                                  self.group, self.storage_url, self.deadline)

    def configure(self, params: dict) -> TrainConfig:
        """The given configuration with `params` set; a new batch size brings its LR by --lr-rule."""
        cfg = apply(self.base, params)
        if cfg.batch_size != self.base.batch_size:
            cfg.optim.lr = scaled_lr(self.base.optim.lr, self.base.batch_size, cfg.batch_size, self.s.lr_rule)
        return cfg

    def plan(self) -> tuple[list[dict], list[Row]]:
        """(candidates the checks and the planner let through, rows for those they discard)."""
        return plan_candidates(self.base, self.grid, self.configure, self.sample, self.memory, self.device,
                               emulated_too=self.s.emulated)

    @property
    def budget_ran_out(self) -> bool:
        return self.runs.budget_ran_out

    # -- the study ------------------------------------------------------------------------------

    def _open_study(self):
        optuna = self.optuna
        # Optuna's heartbeats are meant for Study.optimize; this process records them itself (as tune does).
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
        sampler = optuna.samplers.TPESampler(seed=self.base.seed, multivariate=True,
                                             n_startup_trials=max(2, self.s.trials // 3))
        pruner = optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1)
        self.storage = open_storage(self.storage_url)
        study = optuna.create_study(study_name=self.s.study_name, storage=self.storage,
                                    sampler=sampler, pruner=pruner, direction=self.s.objective.direction,
                                    load_if_exists=True)
        space = json.dumps({"objective": self.s.objective.name, **{k.key: list(k.values) for k in self.knobs}},
                           sort_keys=True, default=str)
        if "space" not in study.user_attrs:
            study.set_user_attr("space", space)
            study.set_user_attr("base", row_key(self.grid[0]))
        elif study.user_attrs["space"] != space:
            raise UserError(f"{self.s.out} holds a search over other knobs; use a new --out (or --study-name) "
                            "for this one")
        check_same_training(study, given_training(self.base, {k.key for k in self.knobs}), str(self.s.out))
        return study

    def _fail_orphans(self, study) -> None:
        for number in fail_orphaned_trials(study, self.storage):
            self.console.print(f"trial {number} was cut short by a killed autotune; it will be asked again")

    def _rows_so_far(self, study) -> dict[str, Row]:
        rows = {}
        for t in study.get_trials(deepcopy=False):
            if OUTCOME_ATTR in t.user_attrs:
                rows[t.user_attrs[PARAMS_ATTR]] = Row(**json.loads(t.user_attrs[OUTCOME_ATTR]))
        return rows

    def _suggest(self, trial) -> dict:
        return {k.key: trial.suggest_categorical(k.label, [json.dumps(v) for v in k.values]) for k in self.knobs}

    def run(self) -> list[Row]:
        kept, discarded = self.plan()
        check_budget_holds_one(self.base, self.s, self.dataset, self.deadline)    # before the study is made
        self.s.out.mkdir(parents=True, exist_ok=True)
        budget = len(kept) if self.s.exhaustive else min(self.s.trials, len(kept))
        window = (f"each trained until validation {self.base.target_metric} reaches {self.base.target} "
                  f"(at most {self.base.epochs} epochs)" if self.s.objective is TIME_TO_TARGET else
                  f"{self.s.steps} steps x {self.s.epochs} epochs each (the first a warm-up)")
        self.console.print(f"autotune {self.base.model.name} on {self.base.data.name} ({self.device}), "
                           f"{self.s.objective.name}: {len(self.grid)} candidates over "
                           f"{', '.join(k.label for k in self.knobs)}; {len(discarded)} discarded before running; "
                           f"measuring {budget}, {window}", soft_wrap=True)
        study = self._open_study()
        self._fail_orphans(study)
        if not study.get_trials(deepcopy=False):
            # The baseline and each knob's values alone first (knobs.first_candidates); for the grid,
            # every candidate in order (Optuna serves enqueued trials as they are asked for).
            for params in (kept if self.s.exhaustive else first_candidates(self.knobs, kept)):
                study.enqueue_trial({k.label: json.dumps(params[k.key]) for k in self.knobs})
        allowed = {row_key(p) for p in kept}
        rows = self._rows_so_far(study)
        given_key = row_key(self.grid[0])
        given = rows.get(given_key)
        ran = [t for t in study.get_trials(deepcopy=False) if t.state != self.optuna.trial.TrialState.WAITING]
        if ran and (given is None or given.outcome != "measured"):
            self._given_first(study)
        store = RunStore(self.base.tracking.store)
        # One candidate at a time, so none is timed beside another; a multi-process one gets the
        # whole machine (a one-slot share would pin all its workers to one GPU, or give each all cores).
        pool = SlotPool([machine_slot()] if self.base.distributed.nproc > 1 else device_slots(1, self.base.device))
        repeats = 0
        try:
            while sum(1 for r in rows.values() if r.outcome != "discarded") < budget and repeats < 50:
                if self.runs.past_deadline():
                    self.runs.budget_ran_out = True
                    break
                reserve = self.runs.confirmation_reserve(rows, given_key)
                if reserve is not None and time.perf_counter() + reserve >= self.deadline:
                    self.console.print("searching stops here: the rest of --budget-s "
                                       f"({self.deadline - time.perf_counter():.0f} s) is the confirmation's (about "
                                       f"{reserve:.0f} s)", soft_wrap=True)
                    break
                trial = study.ask()
                params = {key: json.loads(v) for key, v in self._suggest(trial).items()}
                key = row_key(params)
                if key in rows or key not in allowed:
                    # Asked again, or a combination the planner discarded: told at once, nothing runs.
                    repeats += 1
                    known = rows.get(key)
                    if known is not None and known.value is not None and known.outcome == "measured":
                        study.tell(trial, known.value)
                    else:
                        study.tell(trial, state=self.optuna.trial.TrialState.FAIL)
                    continue
                repeats = 0
                trial.set_user_attr(WORKER_ATTR, self.me)
                trial.set_user_attr(PARAMS_ATTR, key)
                row = self.runs.candidate(trial, params, pool, store, rows.get(given_key), self.runs.floor(rows))
                rows[key] = row
                trial.set_user_attr(OUTCOME_ATTR, json.dumps(_row_dict(row)))
                state = self.optuna.trial.TrialState
                if row.outcome == "measured":
                    study.tell(trial, row.value)
                elif row.outcome == "pruned":
                    study.tell(trial, state=state.PRUNED)
                else:
                    study.tell(trial, state=state.FAIL)
            self.runs.check_all(rows, given_key)
            if self.s.confirm_rounds and not self.budget_ran_out:
                self.noise = confirm_finalists(self.runs, rows, given_key, pool, store, self.sample)
        finally:
            pool.terminate()
            store.close()
        tried = set(rows)
        untried = [Row(p, "not tried") for p in kept if row_key(p) not in tried]
        return list(rows.values()) + discarded + untried

    def _given_first(self, study) -> None:
        """A search stopped while its given configuration ran (SIGTERM, a kill) measures it again,
        first: every loss check compares with it. The candidates still queued are queued again
        after it (Optuna serves its queue oldest first; the old entries are closed as failed, and
        carry no row)."""
        state = self.optuna.trial.TrialState
        waiting = study.get_trials(deepcopy=False, states=(state.WAITING,))
        for t in waiting:
            self.storage.set_trial_state_values(t._trial_id, state=state.FAIL)
        given = {k.label: json.dumps(self.grid[0][k.key]) for k in self.knobs}
        study.enqueue_trial(given)
        for t in waiting:
            queued = t.system_attrs.get("fixed_params") or t.params
            if queued and queued != given:
                study.enqueue_trial(queued)

    # -- results ----------------------------------------------------------------------------------

    def best(self, rows: list[Row]) -> Row | None:
        """Where the finalists were confirmed: the one with the best median advantage among those
        that won every interleaved round, else (all ties) the given configuration. Otherwise the
        best figure of the search."""
        measured = [r for r in rows if r.outcome == "measured" and r.value is not None]
        if any(r.confirmed for r in rows):    # a finalist refused by its test metric counts as confirmed
            winners = [r for r in measured if r.confirmed and r.wins]
            if winners:
                return max(winners, key=lambda r: statistics.median(r.confirmed))
            given = next((r for r in measured if r.params == self.grid[0]), None)
            if given is not None:
                return given
        pick = max if self.s.objective.direction == "maximize" else min
        return pick(measured, key=lambda r: r.value) if measured else None

    def speed_up(self, row: Row, baseline: Row | None) -> str:
        """How many times better than the given configuration on the objective: the confirmed
        rounds' median and range where there are some, else the search's one figure."""
        if row.confirmed:
            found = Confirmation("", row.confirmed, noise=Confirmation(AGAIN, self.noise))
            return found.describe() + ("" if found.wins else " tie")
        if row.value is None or baseline is None or baseline.outcome != "measured" or not baseline.value:
            return "-"
        ratio = row.value / baseline.value if self.s.objective.direction == "maximize" else baseline.value / row.value
        return f"{ratio:.2f}x"

    def best_config(self, best: Row) -> TrainConfig:
        cfg = self.configure(best.params)
        cfg.tracking.run_id = cfg.tracking.group = cfg.run_dir = None
        return cfg

    def write_results(self, rows: list[Row]) -> tuple[Path | None, Table]:
        baseline = next((r for r in rows if r.params == self.grid[0]), None)
        best = self.best(rows)
        objective = self.s.objective
        order = {"measured": 0, "refused": 1, "pruned": 2, "failed": 3, "stopped": 4, "discarded": 5, "not tried": 6}
        sign = -1 if objective.direction == "maximize" else 1
        rows = sorted(rows, key=lambda r: (order[r.outcome], sign * (r.value or 0), -(r.images_per_sec or 0)))
        table = Table(title=f"autotune ({objective.name}): {self.base.model.name} on {self.base.data.name}, "
                            f"{self.device}")
        labels = [k.label + (" *" if k.numerics else "") for k in self.knobs]
        timed = [objective.shown] if objective is not THROUGHPUT else []
        for header in ("trial", *labels, *timed, "samples/s", "speed-up", "peak memory", "warm-up", "loss vs base",
                       "outcome"):
            table.add_column(header, justify="right" if header not in ("outcome",) else "left")
        untried = [r for r in rows if r.outcome == "not tried"]
        # A reason shared by many discarded candidates (every bf16 one on a CPU without bfloat16
        # instructions: 144 of 216) is one caption line, not a row each; autotune.json keeps them all.
        reasons = Counter(r.why for r in rows if r.outcome == "discarded")
        summed = {why for why, n in reasons.items() if n > SHOWN_DISCARDS}
        for r in rows:
            if r.outcome == "not tried" or (r.outcome == "discarded" and r.why in summed):
                continue
            style = "bold green" if best is not None and r is best else None
            speed_up = self.speed_up(r, baseline)
            table.add_row("-" if r.trial is None else str(r.trial), *[str(r.params[k.key]) for k in self.knobs],
                          *([("-" if r.value is None else f"{r.value:.2f} s")] if timed else []),
                          "-" if r.images_per_sec is None else f"{r.images_per_sec:,.0f}",
                          speed_up,
                          "-" if r.peak_memory_bytes is None else format_bytes(r.peak_memory_bytes),
                          "-" if r.warmup_s is None else f"{r.warmup_s:.1f} s",
                          "-" if r.departure is None else f"{r.departure:.2%}",
                          r.outcome + (f": {r.why}" if r.why and r.outcome != "measured" else ""), style=style)
        caption = [f"{reasons[why]} candidates discarded: {why}" for why in summed]
        if self.noise:
            floor = Confirmation(AGAIN, self.noise)
            caption.append(f"noise floor: the given configuration against itself {floor.describe()}; a speed-up "
                           "inside it is a tie")
        if untried:
            caption.append(f"{len(untried)} more candidates not measured (--trials {self.s.trials})")
        table.caption = "\n".join(caption) or None
        (self.s.out / "autotune.json").write_text(json.dumps(
            {"objective": objective.name, "baseline": self.grid[0],
             "knobs": {k.key: list(k.values) for k in self.knobs},
             "noise_floor": self.noise or None,
             "best": None if best is None else best.params, "rows": [_row_dict(r) for r in rows]},
            indent=2, default=str))
        plot_speed_against_memory(rows, best, self.s.out / "speed_memory.png")
        if best is None:
            return None, table
        with RunStore(self.base.tracking.store) as store:
            store.set_chosen(self.group, best.run_id)     # starred in `runs report --group`
        return write_toml(self.best_config(best), self.s.out / "best.toml"), table


def plot_speed_against_memory(rows: list[Row], best: Row | None, path: Path) -> Path | None:
    """speed_memory.png: samples/s against peak memory of every measured candidate, refused ones
    hollow, the chosen one starred. Skipped (None) where matplotlib is not installed."""
    try:
        from scaletrain.reports.figures import new_figure, style, to_png
        figure, axes = new_figure(7.0, 4.0)
    except UserError:
        return None
    for outcome, marker, fill in (("measured", "o", True), ("refused", "o", False)):
        points = [(r.peak_memory_bytes / 2**20, r.images_per_sec) for r in rows
                  if r.outcome == outcome and r.images_per_sec and r.peak_memory_bytes]
        if points:
            axes.scatter(*zip(*points, strict=True), marker=marker, s=30, label=f"{outcome} ({len(points)})",
                         facecolors="#1f77b4" if fill else "none", edgecolors="#1f77b4")
    if best is not None and best.peak_memory_bytes:
        axes.scatter([best.peak_memory_bytes / 2**20], [best.images_per_sec], marker="*", s=220, color="#d62728",
                     label="chosen", zorder=3)
    style(axes, "Autotune: speed against peak memory", "peak memory (MiB)", "samples/s")
    to_png(figure, path)
    return path


def _row_dict(row: Row) -> dict:
    return asdict(row)
