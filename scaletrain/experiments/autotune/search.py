"""The search: which system settings train this model fastest here, and do they train the same.

1. The knobs (knobs.py) give every candidate; before anything runs, a candidate whose precision
   the device only emulates (precision/hardware.py: bf16 on a CPU without bfloat16 instructions,
   or on a GPU older than Ampere) is discarded, and the memory planner discards each one it
   predicts will not fit the device (or, on a CPU, the memory free now).
2. Optuna's TPE proposes candidates (the given configuration first); each runs as its own
   `scaletrain train` process for a short window: the same seeded steps for every candidate, the
   first epoch a warm-up (compilation included) that is timed apart and never enters images/sec.
   A candidate whose images/sec trails the median of earlier ones after its warm-up is pruned.
3. Every finished candidate's per-epoch training loss is compared with the baseline's; one that
   departs beyond the tolerance (looser where the precision changes the arithmetic) is refused.
4. The given configuration and the best few are measured again, interleaved round by round
   (confirm.py), so that a change in the machine's load cannot pick the winner: a finalist wins
   only if it beat the given configuration in every round; otherwise it is a tie and the given
   configuration stays. The winner is written as a TOML `train --config` runs as is.

Each trial is a run in the store (group `autotune-<name>`), and the study lives in SQLite under
--out: killed and rerun, the search goes on where it stopped (a trial the kill interrupted is
failed and asked again).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import socket
import statistics
import time
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from scaletrain.config import TrainConfig, write_toml
from scaletrain.distributed.strategies import resolve_device
from scaletrain.distributed.strategies.registry import strategy_class
from scaletrain.data import sample_shape
from scaletrain.data.dataset import ArraySplit
from scaletrain.errors import PRUNED_EXIT_CODE, ConfigError, UserError
from scaletrain.experiments.autotune.confirm import AGAIN, WINDOW_S, Confirmation, Measured, confirm, window_steps
from scaletrain.experiments.autotune.knobs import (Knob, apply, candidates, emulated_precisions, first_candidates,
                                                  model_facts, system_knobs)
from scaletrain.experiments.jobs import settle, training_job
from scaletrain.experiments.pruning import TRIAL_ENV, rate_below_floor
from scaletrain.experiments.slots import Finished, SlotPool, device_slots, machine_slot
from scaletrain.experiments.sweep import LR_SCALINGS, scaled_lr
from scaletrain.experiments.study import WORKER_ATTR, fail_orphaned_trials, open_storage, require_optuna
from scaletrain.memory.planner import Planner, PlanRequest
from scaletrain.memory.units import format_bytes
from scaletrain.precision.hardware import device_facts
from scaletrain.training.defaults import choose_channels_last, settle_precision_here
from scaletrain.training.threads import choose_threads
from scaletrain.tracking.store import RunStore
from scaletrain.training.preflight import check_job, meta_model, run_task

PARAMS_ATTR, OUTCOME_ATTR = "params", "outcome"
# The per-epoch mean training loss of a candidate may differ from the baseline's by this fraction
# of the baseline's: float32 reorderings (threads, compile, accumulation) stay far inside 2 %;
# 16-bit arithmetic moves the loss more without changing what is learned. Measured in the note
# of docs/autotune.md; both can be set with --loss-tolerance / --loss-tolerance-16bit.
LOSS_TOLERANCE = 0.02
LOSS_TOLERANCE_16BIT = 0.05
SHOWN_DISCARDS = 3   # discarded candidates with one reason listed row by row; more: one caption line


@dataclass(frozen=True, slots=True)
class Objective:
    """What a candidate is ranked by: run-summary figures (summed) and which way is better."""
    name: str
    summary_keys: tuple[str, ...]
    direction: str       # maximize or minimize
    shown: str           # the table's column

    def value(self, record) -> float | None:
        values = [record.summary_value(key) for key in self.summary_keys]
        return None if any(v is None for v in values) else float(sum(values))


THROUGHPUT = Objective("throughput", ("images_per_sec",), "maximize", "samples/s")
# The seeds' headline: training time (evaluation excluded) until the validation metric first
# reaches the target, plus the warm-up (compilation), which a user waits for too though every
# run's clock reports it apart. Batch size is searched as well (its LR by --lr-rule); each
# candidate trains until it gets there, so a faster step that needs more of them does not win
# (seed 003: images/sec rises with the batch, time to accuracy does not follow).
TIME_TO_TARGET = Objective("time-to-target", ("time_to_target_s", "warmup_s"), "minimize", "time to target")
OBJECTIVES = {o.name: o for o in (THROUGHPUT, TIME_TO_TARGET)}


@dataclass(frozen=True, slots=True)
class AutotuneSettings:
    out: Path
    trials: int                  # candidates measured (the baseline included), at most the grid
    steps: int = 20              # optimizer steps per epoch of the measured window
    epochs: int = 3              # of which the first is the warm-up
    device_memory: int | None = None
    loss_tolerance: float = LOSS_TOLERANCE
    loss_tolerance_16bit: float = LOSS_TOLERANCE_16BIT
    study_name: str = "autotune"
    only: tuple[str, ...] = ()   # knob labels to search (empty: every knob that applies)
    exhaustive: bool = False     # measure every candidate the planner keeps, in order (the grid)
    objective: Objective = THROUGHPUT
    lr_rule: str = "sqrt"        # time-to-target: how the LR follows the batch size (none, linear, sqrt)
    budget_s: float | None = None  # wall-clock bound of the whole search: the best so far is reported
    # A candidate running longer than this many times the baseline's whole run (its process, data,
    # warm-up and window) is stopped: hopeless, whatever it would measure.
    cap_factor: float = 10.0
    # A candidate training slower than the best so far divided by this, a second into an epoch, is
    # stopped there (pruned; one process per candidate: pruning.SpeedFloor).
    prune_factor: float = 3.0
    emulated: bool = False         # also measure precisions this device only emulates (skipped otherwise)
    # The finalists (the best few and the given configuration) measured again, interleaved, this
    # many rounds before the winner is named (confirm.py); 0: the search's own figures decide.
    # 5: the range of n paired ratios holds their median with probability 1 - 2**(1 - n), 75 % at 3
    # rounds and 94 % at 5 (and MEASURE.md asks 5 runs for time to accuracy).
    confirm_rounds: int = 5
    finalists: int = 2
    # Time to target: the confirmation's rounds are seeds (seed, seed + 1, ...), and a finalist
    # whose median final test metric is below the given configuration's by more than this is
    # refused, however fast it got there.
    test_tolerance: float = 0.005

    def problems(self) -> list[str]:
        out = []
        if self.trials < 1:
            out.append(f"--trials must be at least 1 (got {self.trials})")
        if self.steps < 1:
            out.append(f"--steps must be at least 1 (got {self.steps})")
        if self.epochs < 2:
            out.append(f"--window-epochs must be at least 2, a warm-up and a measured epoch (got {self.epochs})")
        if self.lr_rule not in LR_SCALINGS:
            out.append(f"--lr-rule must be one of {', '.join(LR_SCALINGS)} (got {self.lr_rule!r})")
        if self.budget_s is not None and not (self.budget_s > 0 and math.isfinite(self.budget_s)):
            out.append(f"--budget-s must be a positive number of seconds (got {self.budget_s})")
        if not (self.cap_factor > 1 and math.isfinite(self.cap_factor)):
            out.append(f"--cap-factor must be a number above 1 (got {self.cap_factor})")
        if not (self.prune_factor > 1 and math.isfinite(self.prune_factor)):
            out.append(f"--prune-factor must be a number above 1 (got {self.prune_factor})")
        if self.confirm_rounds < 0:
            out.append(f"--confirm-rounds must be 0 or more (got {self.confirm_rounds})")
        if not (self.test_tolerance >= 0 and math.isfinite(self.test_tolerance)):
            out.append(f"--test-tolerance must be 0 or a positive number (got {self.test_tolerance})")
        if self.finalists < 1:
            out.append(f"--finalists must be at least 1 (got {self.finalists})")
        for flag, value in (("--loss-tolerance", self.loss_tolerance), ("--loss-tolerance-16bit", self.loss_tolerance_16bit)):
            if not (value > 0 and math.isfinite(value)):
                out.append(f"{flag} must be a positive fraction (got {value})")
        return out


@dataclass(slots=True)
class Row:
    """One candidate in the result table."""
    params: dict
    outcome: str                      # measured, refused, pruned, failed, stopped (--budget-s), discarded, not tried
    value: float | None = None        # the objective's figure
    images_per_sec: float | None = None
    peak_memory_bytes: int | None = None
    warmup_s: float | None = None
    loss: list[float] = field(default_factory=list)
    departure: float | None = None
    why: str = ""
    run_id: str | None = None
    trial: int | None = None
    # A finalist's interleaved rounds against the given configuration (confirm.py): the paired
    # advantage's median and range, and whether it won every round (else a tie).
    confirmed: list[float] = field(default_factory=list)
    wins: bool | None = None
    test_delta: float | None = None   # time to target: its median final test metric minus the given's


def study_group(study: str, out: Path, store: str) -> str:
    """The run-store group of a study's trials: `autotune-<study name>` for a study in its default
    folder (<store folder>/autotune/<name>); one in a folder of its own (--out) gets the folder's
    mark too, so two studies of one name in two folders never share a group (issue 66)."""
    out = Path(out).resolve()
    if out == (Path(store).parent / "autotune" / study).resolve():
        return f"autotune-{study}"
    return f"autotune-{study}-{hashlib.sha256(str(out).encode()).hexdigest()[:8]}"


def _key(params: dict) -> str:
    return json.dumps(params, sort_keys=True)


def measuring_config(cfg: TrainConfig, s: AutotuneSettings, train_samples: int, steps: int | None = None) -> TrainConfig:
    """For throughput, `cfg` cut to the measured window: the same seeded steps for every
    candidate (`steps` per epoch, else --steps), nothing but training inside it (no evaluation or
    target). For time to target, the whole training, stopped where validation first reaches the
    target. Neither saves a checkpoint or a model."""
    m = copy.deepcopy(cfg)
    if s.objective is TIME_TO_TARGET:
        m.eval_each_epoch, m.patience = True, 1
    else:
        m.epochs = s.epochs
        m.data.train_subset = min((steps or s.steps) * cfg.batch_size, train_samples)
        m.eval_each_epoch = False
        m.target = None
    m.early_stopping_patience = None
    m.save_model = False
    m.checkpoint.every = 0
    m.checkpoint.resume = None
    m.summary_json = None
    m.run_dir = None
    return m


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
        self.budget_ran_out = False
        self.noise: list[float] = []           # the confirmation's given-against-itself ratios (the noise floor)
        self.baseline_s: float | None = None   # the baseline's whole run, in seconds: what caps the others
        self.run_seconds: list[float] = []     # every finished candidate's whole run: what a confirmation run costs
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
        dataset = load_dataset(base.data, seed=base.seed)
        train, self.example = dataset.train, dataset.example
        self.train_samples = len(train)
        # Read on the host (streamed shards, a user's own samples, or asked for): its workers matter.
        streamed = base.data.placement == "stream" or not isinstance(train, ArraySplit)
        # The given configuration's defaults settled for this device, so each knob's baseline value
        # is the one it runs with (and `auto` is never tried beside what it stands for).
        settle_precision_here(base)
        facts = model_facts(base, shape, outputs)
        base.channels_last = choose_channels_last(base.channels_last, self.device, facts.convolutions_2d).value
        knobs = system_knobs(base, self.device, facts, streamed)
        if settings.objective is TIME_TO_TARGET:    # what changes the steps needed, not only their speed
            sizes = [b for b in (base.batch_size // 2, base.batch_size * 2) if 8 <= b <= self.train_samples // 4]
            knobs.insert(0, Knob("batch_size", (base.batch_size, *sizes)))
        unknown = set(settings.only) - {k.label for k in knobs}
        if unknown:
            raise UserError(f"--knobs {','.join(sorted(unknown))}: not a knob for this training here; it has "
                            f"{', '.join(k.label for k in knobs)}")
        # The batch size is what time to target is about: searched under that objective whatever
        # --knobs names (the docs say so), the given batch first.
        always = {"batch_size"} if settings.objective is TIME_TO_TARGET else set()
        self.knobs: list[Knob] = [k for k in knobs if not settings.only or k.label in settings.only or k.label in always]
        self.grid = candidates(self.knobs)
        self.memory = settings.device_memory or self._device_memory()
        self.storage_url = f"sqlite:///{(settings.out / 'autotune.db').resolve()}"

    def configure(self, params: dict) -> TrainConfig:
        """The given configuration with `params` set; a new batch size brings its LR by --lr-rule."""
        cfg = apply(self.base, params)
        if cfg.batch_size != self.base.batch_size:
            cfg.optim.lr = scaled_lr(self.base.optim.lr, self.base.batch_size, cfg.batch_size, self.s.lr_rule)
        return cfg

    # -- before anything runs -------------------------------------------------------------------

    def _device_memory(self) -> int:
        """What a candidate may use: the GPU's memory, or the host memory free now."""
        if self.device.type == "cuda":
            import torch
            return torch.cuda.get_device_properties(self.device).total_memory
        import psutil
        return psutil.virtual_memory().available

    def plan(self) -> tuple[list[dict], list[Row]]:
        """(candidates the checks and the planner let through, rows for those they discard)."""
        nproc = self.base.distributed.nproc
        model = meta_model(self.base, (self.shape, self.outputs))
        # Each process's share: the GPU is its own; a CPU host's memory is shared by all of them.
        memory = self.memory if self.device.type == "cuda" else self.memory // nproc
        planners: dict[tuple, Planner] = {}
        emulated = ({} if self.s.emulated
                    else emulated_precisions(self.base.precision.policy, device_facts(self.device)))
        kept, discarded = [], []
        for params in self.grid:
            cfg = self.configure(params)
            if cfg.precision.policy in emulated:
                discarded.append(Row(params, "discarded", why=emulated[cfg.precision.policy]))
                continue
            try:
                # What a launch would refuse (the strategy's rules about this model and process
                # count, micro-batches that do not divide the batch) is not a candidate.
                check_job(cfg, nproc, model)
            except ConfigError as exc:
                discarded.append(Row(params, "discarded", why=str(exc)))
                continue
            micro = cfg.batch_size // cfg.optim.grad_accum_steps
            strategy = strategy_class(cfg.distributed, nproc)
            # One process per candidate plans as ddp on one device (plan-memory's rule).
            plan_as = strategy.name if strategy.memory_plan == "device" else "ddp"
            key = (cfg.precision.policy, cfg.memory.activation_checkpointing)
            try:
                if key not in planners:
                    planners[key] = Planner(PlanRequest(
                        model=cfg.model.name, model_options=dict(cfg.model.options), input_shape=self.shape,
                        num_classes=self.outputs, task=self.task, batch_size=micro, precision=cfg.precision.policy,
                        devices=nproc, activation_checkpointing=cfg.memory.activation_checkpointing,
                        block_classes=tuple(cfg.memory.block_classes), optimizer=cfg.optim.optimizer,
                        distributed=cfg.distributed, example=self.example, task_choice=cfg.task))
                # Whether this batch fits, not the largest that would: no search over batch sizes.
                plan = planners[key].plan(plan_as, nproc, micro)
                fits = plan.total_bytes <= memory * (1 - planners[key].req.headroom)
            except Exception as exc:   # the user's model raised while traced: this candidate, not the search
                detail = (str(exc).splitlines() or [""])[0][:120]
                discarded.append(Row(params, "discarded", why=f"the model raised while the planner traced it "
                                                              f"({type(exc).__name__}: {detail})"))
                continue
            if fits:
                kept.append(params)
            else:
                discarded.append(Row(params, "discarded", why=f"planner: needs {format_bytes(plan.total_bytes)} of "
                                                              f"{format_bytes(memory)}"
                                                              + (" per process" if nproc > 1 else "")))
        if not kept or kept[0] != self.grid[0]:
            why = next((r.why for r in discarded if r.params == self.grid[0]), "")
            raise UserError(f"the given configuration is not a candidate ({why}); make it run and fit first "
                            "(scaletrain plan-memory shows what fits), then tune its speed")
        return kept, discarded

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
            study.set_user_attr("base", _key(self.grid[0]))
        elif study.user_attrs["space"] != space:
            raise UserError(f"{self.s.out} holds a search over other knobs or another configuration; "
                            "use a new --out (or --study-name) for this one")
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
        self.s.out.mkdir(parents=True, exist_ok=True)
        kept, discarded = self.plan()
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
        allowed = {_key(p) for p in kept}
        rows = self._rows_so_far(study)
        given = rows.get(_key(self.grid[0]))
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
                if self.deadline is not None and time.perf_counter() >= self.deadline:
                    self.budget_ran_out = True
                    break
                reserve = self._confirmation_reserve(rows)
                if reserve is not None and time.perf_counter() + reserve >= self.deadline:
                    self.console.print(f"searching stops here: the rest of --budget-s ({self.deadline - time.perf_counter():.0f} s) "
                                       f"is the confirmation's (about {reserve:.0f} s)", soft_wrap=True)
                    break
                trial = study.ask()
                params = {key: json.loads(v) for key, v in self._suggest(trial).items()}
                key = _key(params)
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
                row = self._measure(trial, params, pool, store, rows.get(_key(self.grid[0])), self._floor(rows))
                rows[key] = row
                trial.set_user_attr(OUTCOME_ATTR, json.dumps(_row_dict(row)))
                state = self.optuna.trial.TrialState
                if row.outcome == "measured":
                    study.tell(trial, row.value)
                elif row.outcome == "pruned":
                    study.tell(trial, state=state.PRUNED)
                else:
                    study.tell(trial, state=state.FAIL)
            self._check_all(rows)
            if self.s.confirm_rounds and not self.budget_ran_out:
                self._confirm(rows, pool, store)
        finally:
            pool.terminate()
            store.close()
        tried = set(rows)
        untried = [Row(p, "not tried") for p in kept if _key(p) not in tried]
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

    def _check_all(self, rows: dict[str, Row]) -> None:
        """Every measured candidate's loss against the given configuration's, whenever each was
        measured: a search resumed after the given configuration's run was cut short measured some
        before it (issue 66: they had gone unchecked, `departure: null`). The losses compared are
        the ones stored with the study (each trial's row)."""
        given = rows.get(_key(self.grid[0]))
        if self.s.objective is not THROUGHPUT or given is None or given.outcome != "measured" or not given.loss:
            return
        for key, row in rows.items():
            if key != _key(self.grid[0]) and row.outcome == "measured" and row.departure is None:
                self._check_loss(row, given)

    def _confirmation_reserve(self, rows: dict[str, Row]) -> float | None:
        """Under --budget-s, the seconds the confirmation will take once a finalist is measured:
        its runs (rounds x the given configuration and the finalists) at the median whole run of
        the candidates so far, so that a search bounded by the budget still ends confirmed."""
        if self.deadline is None or not self.s.confirm_rounds or not self.run_seconds:
            return None
        given = rows.get(_key(self.grid[0]))
        others = sum(1 for k, r in rows.items() if r.outcome == "measured" and r is not given)
        if given is None or given.outcome != "measured" or not others:
            return None
        return self.s.confirm_rounds * (1 + min(self.s.finalists, others)) * statistics.median(self.run_seconds)

    def _floor(self, rows: dict[str, Row]) -> float | None:
        """The speed below which a candidate is stopped within an epoch: the best accepted
        samples/s so far over --prune-factor (0 before any: the baseline carries the same callback,
        so every candidate is timed alike). None where nothing is pruned (the grid, time to target)
        or the processes would have to agree at every step (--nproc)."""
        if self.s.exhaustive or self.s.objective is not THROUGHPUT or self.base.distributed.nproc > 1:
            return None
        best = max((r.images_per_sec for r in rows.values() if r.outcome == "measured" and r.images_per_sec),
                   default=None)
        return 0.0 if best is None else best / self.s.prune_factor

    def _measure(self, trial, params: dict, pool: SlotPool, store: RunStore, baseline: Row | None,
                 floor: float | None = None) -> Row:
        cfg = measuring_config(self.configure(params), self.s, self.train_samples)
        name = f"trial-{trial.number:04d}"
        spec = {"storage": self.storage_url, "study": self.s.study_name, "trial_id": trial._trial_id,
                "metric": "images_per_sec",
                # The grid measures every candidate whole: it is the reference the search is judged by.
                # Time to target stops each candidate at its own target: nothing to prune on.
                "pruner": {"kind": "none"} if self.s.exhaustive or self.s.objective is TIME_TO_TARGET else
                {"kind": "median", "startup_trials": 2, "warmup_epochs": 1},
                "floor": None if floor is None else {"samples_per_s": floor}}
        job = training_job(cfg, name, self.s.out / "trials", self.group, payload=trial.number,
                           env={TRIAL_ENV: json.dumps(spec)})
        run_id = job.payload[0].tracking.run_id
        shown = ", ".join(f"{k.label}={params[k.key]}" for k in self.knobs)
        self.console.print(f"trial {trial.number}: {shown} ...", soft_wrap=True)
        pool.start(job)
        started = time.perf_counter()
        cap = started + self.s.cap_factor * self.baseline_s if self.baseline_s is not None else None
        until = min((t for t in (self.deadline, cap) if t is not None), default=None)
        finished = pool.wait_any(until=until)
        if finished is None:   # --budget-s ran out, or the candidate outran its cap, while it ran
            pool.terminate()
            settle(store, Finished(job, None, -15, time.perf_counter() - started))
            if self.deadline is not None and time.perf_counter() >= self.deadline:
                self.budget_ran_out = True
                why = f"the --budget-s of {self.s.budget_s:g} s ran out while it ran"
            else:
                why = (f"ran past {self.s.cap_factor:g}x the baseline's {self.baseline_s:.0f} s "
                       f"(--cap-factor): stopped as hopeless")
            self.console.print(f"  stopped: {why}")
            return Row(params, "stopped", why=why, run_id=run_id, trial=trial.number)
        if baseline is None and finished.returncode == 0:
            self.baseline_s = finished.seconds   # the given configuration, measured first
        if finished.returncode == 0:
            self.run_seconds.append(finished.seconds)
        if finished.returncode == PRUNED_EXIT_CODE:
            below_floor = rate_below_floor(finished.last_lines(1)) is not None
            why = (f"{finished.last_lines(1).split(': ', 1)[-1]} (the best so far / --prune-factor "
                   f"{self.s.prune_factor:g})" if below_floor else "images/sec below the median of earlier candidates")
            self.console.print(f"  pruned: {why} ({finished.seconds:.1f} s)", soft_wrap=True)
            return Row(params, "pruned", why=why, run_id=run_id, trial=trial.number)
        record = settle(store, finished)
        if record.status != "finished":
            why = (record.error or f"exit code {finished.returncode}").strip().splitlines()[-1][:160]
            self.console.print(f"  failed: {why}", soft_wrap=True)
            return Row(params, "failed", why=why, run_id=run_id, trial=trial.number)
        epochs = store.epochs(record.id)
        value = self.s.objective.value(record)
        if value is None:
            why = f"did not reach {cfg.target_metric} {cfg.target} in {cfg.epochs} epochs"
            self.console.print(f"  failed: {why}")
            return Row(params, "failed", why=why, run_id=run_id, trial=trial.number,
                       images_per_sec=record.summary_value("images_per_sec"))
        row = Row(params, "measured", value=float(value), images_per_sec=record.summary_value("images_per_sec"),
                  peak_memory_bytes=record.summary_value("peak_memory_bytes"),
                  warmup_s=record.summary_value("warmup_s"),
                  loss=[float(e["train_loss"]) for e in epochs if e.get("train_loss") is not None],
                  run_id=run_id, trial=trial.number)
        # The loss check compares the same seeded steps; time to target trains other batch sizes,
        # whose proof is reaching the target on the validation split.
        if self.s.objective is THROUGHPUT and baseline is not None and baseline.loss:
            self._check_loss(row, baseline)
        note = f", loss departs {row.departure:.2%}" if row.departure is not None else ""
        reached = f", {row.value:.2f} s to target" if self.s.objective is TIME_TO_TARGET else ""
        self.console.print(f"  {row.outcome}: {row.images_per_sec:,.0f} samples/s{reached}, warm-up "
                           f"{row.warmup_s:.1f} s{note}{' -- ' + row.why if row.why else ''}", soft_wrap=True)
        return row

    def _confirm(self, rows: dict[str, Row], pool: SlotPool, store: RunStore) -> None:
        """The given configuration and the best `finalists` measured again, interleaved
        (confirm.py); each finalist's row gets its paired advantage and whether it won."""
        given = _key(self.grid[0])
        if given not in rows or rows[given].outcome != "measured":
            return
        better = self.s.objective.direction == "maximize"
        ranked = sorted((r for k, r in rows.items() if k != given and r.outcome == "measured" and r.value),
                        key=lambda r: r.value, reverse=better)[:self.s.finalists]
        if not ranked:
            return
        # confirm-R-0: the given one; its second run each round is the noise floor (confirm.AGAIN).
        by_key = {given: rows[given]} | {_key(r.params): r for r in ranked} | {AGAIN: rows[given]}
        seeded = self.s.objective is TIME_TO_TARGET
        window = (f" (seeds {self.base.seed}..{self.base.seed + self.s.confirm_rounds - 1})" if seeded else
                  f", each {self.s.steps} steps x {self.s.epochs} epochs or about {WINDOW_S:g} s of measured steps "
                  f"where that is fewer")
        self.console.print(f"confirming: the given configuration (twice a round: the noise floor) and "
                           f"{len(ranked)} finalist(s), {self.s.confirm_rounds} interleaved rounds{window}",
                           soft_wrap=True)
        metric = self.base.target_metric
        higher = run_task(self.base, (self.shape, self.outputs, self.task, self.example)).metrics.get(metric, True) \
            if seeded else True

        # Each contestant's last measured samples/s sizes its next window (confirm.window_steps):
        # a slow one is confirmed over about WINDOW_S, not minutes; its ratio is samples/s all the same.
        latest = {key: row.images_per_sec for key, row in by_key.items()}

        def measure(key: str, number: int) -> Measured | None:
            params = self.configure(by_key[key].params)
            steps = None if seeded else window_steps(latest[key], params.batch_size, self.s.steps, self.s.epochs - 1)
            cfg = measuring_config(params, self.s, self.train_samples, steps)
            if seeded:     # the whole training proved over seeds, not over one seed's luck
                cfg.seed = self.base.seed + number
            # A run that falls below the fastest contestant's speed / --prune-factor (the given
            # configuration's two threads on a loaded machine: a minute where it took 8 s a round
            # before) is stopped there, and the speed it trained at is its figure for the round.
            fastest = max((v for v in latest.values() if v), default=None)
            floor = None if seeded or fastest is None or self.base.distributed.nproc > 1 else fastest / self.s.prune_factor
            job = training_job(cfg, f"confirm-{number}-{list(by_key).index(key)}", self.s.out / "trials", self.group,
                               env={TRIAL_ENV: json.dumps({"floor": {"samples_per_s": floor}})} if floor else None)
            pool.start(job)
            started = time.perf_counter()
            cap = started + self.s.cap_factor * self.baseline_s if self.baseline_s is not None else None
            finished = pool.wait_any(until=min((t for t in (self.deadline, cap) if t is not None), default=None))
            if finished is None:
                pool.terminate()
                settle(store, Finished(job, None, -15, time.perf_counter() - started))
                return None
            record = settle(store, finished)
            if finished.returncode == PRUNED_EXIT_CODE:
                rate = rate_below_floor(finished.last_lines(1))
                if rate is None:
                    return None
                latest[key] = rate
                return Measured(rate)
            value = self.s.objective.value(record) if record.status == "finished" else None
            if value is None:
                return None
            latest[key] = record.summary_value("images_per_sec") or latest[key]
            test = (record.summary_value("test_metrics") or {}).get(metric) if seeded else None
            return Measured(value, None if test is None else (test if higher else -test))

        found = confirm(given, [k for k in by_key if k not in (given, AGAIN)], self.s.confirm_rounds, measure,
                        (lambda v, b: v / b) if better else (lambda v, b: b / v), self.deadline,
                        test_tolerance=self.s.test_tolerance if seeded else None)
        noise = next(iter(found.values())).noise
        if noise is not None and noise.ratios:
            self.noise = noise.ratios
            self.console.print(f"  noise floor: the given configuration against itself {noise.describe()}; a "
                               f"finalist's median must be above {noise.high:.2f}x to win", soft_wrap=True)
        for key, confirmation in found.items():
            row = by_key[key]
            row.confirmed, row.wins = confirmation.ratios, confirmation.wins
            if confirmation.test_deltas:
                row.test_delta = statistics.median(confirmation.test_deltas) * (1 if higher else -1)
            if confirmation.loses_test:
                row.outcome = "refused"
                row.why = (f"test {metric} {row.test_delta:+.4f} against the given configuration (median over "
                           f"{len(confirmation.test_deltas)} seeds; --test-tolerance {self.s.test_tolerance:g})")
            if confirmation.ratios:
                verdict = ("" if confirmation.wins else ": refused, " + row.why if confirmation.loses_test
                           else ": slower in every round" if confirmation.slower
                           else ": a tie (inside the noise floor)" if not confirmation.beyond_noise else ": a tie")
                self.console.print(f"  {', '.join(f'{k.label}={row.params[k.key]}' for k in self.knobs)}: "
                                   f"{confirmation.describe()} against the given configuration{verdict}",
                                   soft_wrap=True)

    def tolerance(self, params: dict) -> float:
        numerics = any(k.numerics and params[k.key] != k.values[0] for k in self.knobs)
        return self.s.loss_tolerance_16bit if numerics else self.s.loss_tolerance

    def _check_loss(self, row: Row, baseline: Row) -> None:
        pairs = list(zip(row.loss, baseline.loss))
        row.departure = max(abs(a - b) / max(abs(b), 1e-12) for a, b in pairs) if pairs else None
        tol = self.tolerance(row.params)
        if row.departure is None or not math.isfinite(row.departure) or row.departure > tol:
            row.outcome = "refused"
            row.why = f"loss departs {row.departure:.2%} from the baseline's (tolerance {tol:.0%})"

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
            {"objective": objective.name, "baseline": self.grid[0], "knobs": {k.key: list(k.values) for k in self.knobs},
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
            axes.scatter(*zip(*points), marker=marker, s=30, label=f"{outcome} ({len(points)})",
                         facecolors="#1f77b4" if fill else "none", edgecolors="#1f77b4")
    if best is not None and best.peak_memory_bytes:
        axes.scatter([best.peak_memory_bytes / 2**20], [best.images_per_sec], marker="*", s=220, color="#d62728",
                     label="chosen", zorder=3)
    style(axes, "Autotune: speed against peak memory", "peak memory (MiB)", "samples/s")
    to_png(figure, path)
    return path


def _row_dict(row: Row) -> dict:
    return asdict(row)
