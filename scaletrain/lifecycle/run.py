"""One owner of a run, from its configuration to how it ended.

    settle_config   a cloud job's folders applied, a resumed run's saved configuration adopted, the
                    model's own optimizer written in, every value checked: once, before any
                    worker starts (the launcher settles what its workers will settle again)
    start_run       the chief plans the folder and every rank adopts its plan; the data the run
                    trains on is read and its target checked (a refusal costs no folder); the
                    folder is taken, the store record and the trackers opened; the run hands out
                    its checkpointer and callbacks
    Run.finish      the summary and the model written, then the store, the trackers and the
                    folder told, each once
    Run.fail        every party not yet told hears how the run ended, once

The runner reads start -> build -> fit -> finish; whatever raises in between ends the run
through `with run:`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

import torch
from rich.console import Console

from scaletrain.callbacks import (
    AllocatorRetries,
    EarlyStopping,
    MetricsLog,
    ProgressBar,
    StopAtTarget,
    Throughput,
    TotalTime,
)
from scaletrain.checkpoint.space import Reserved
from scaletrain.config import TrainConfig
from scaletrain.data import load_dataset
from scaletrain.distributed.batching import adopt_loader_batch
from scaletrain.distributed.strategies.registry import strategy_class
from scaletrain.errors import ConfigError, UserError, WriteFailed
from scaletrain.lifecycle.folder import RunFolder
from scaletrain.lifecycle.job_folders import JobFolders, apply_job_folders, deliver_model, job_folders
from scaletrain.lifecycle.plan import (
    RunPlan,
    TakenFolder,
    checkpoint_store,
    make_checkpointer,
    plan_run,
    record_job_end,
    resume_source,
    run_name,
)
from scaletrain.lifecycle.rescue import checkpoint_bytes, keeps_checkpoint, rescue
from scaletrain.lifecycle.resume import resume_config
from scaletrain.lifecycle.stops import StopGuard, StopWatch, finishing, raise_if_owed
from scaletrain.models.structure import forget_structures
from scaletrain.optim.schedules import replica_lr_scale
from scaletrain.options import flatten_mapping, from_mapping, to_mapping
from scaletrain.summary import RunSummary, build_summary, device_label, device_name, print_summary
from scaletrain.tracking.loggers import build_trackers, check_trackers
from scaletrain.tracking.loggers.base import ExternalLogging, RunInfo
from scaletrain.tracking.tracked_run import TrackedRun, ending_status
from scaletrain.training.build import task_for
from scaletrain.training.defaults import (
    Setting,
    choose_compile,
    choose_cuda_graphs,
    describe_settings,
    device_kind_here,
    settle_precision_here,
)
from scaletrain.training.device_rules import device_problem
from scaletrain.training.preflight import settle_model_optimizer
from scaletrain.training.probe_settings import probed_settings
from scaletrain.user_code.trust import code_names

SUMMARY_RESERVE = 256 * 1024    # summary.json's space set aside (a run's summary is a few KiB)


T = TypeVar("T")     # what `_chief_decides` decides


@dataclass(slots=True)
class RunRequest:
    """A configuration settled for one run (see `settle_config`), the cloud job's folders in
    effect (the summary names them; the finished model is delivered to one), and what the
    settling chose from the hardware (the start line says it, the record keeps it)."""
    config: TrainConfig
    folders: JobFolders
    settings: list[Setting] = field(default_factory=list)
    # Fixed keys the command did not name that the run may settle itself (plan.py: latest_resumable).
    unnamed: tuple[str, ...] = ()

    def undecided(self) -> set[str]:
        """The settings `auto` chose by rule, which the run's probe may still change."""
        return {s.name for s in self.settings}


def settle_config(cfg: TrainConfig, env, flags: dict | None = None) -> RunRequest:
    """The configuration a run trains with, checked once. `flags`: what the command line named
    (the CLI's), for a resume to continue the run with its saved configuration, changing only what
    may change mid-run (resume.py); the Python API's configuration is taken whole."""
    forget_structures()     # this run's builders build its model's structure (models/structure.py)
    folders = apply_job_folders(cfg, job_folders())
    saved = None
    # A user's data may bring a DataLoader, whose batch the run recorded (start_run): unless the
    # command names a batch, the batch does not tell `--resume auto`'s runs apart.
    unnamed = (("batch_size",) if flags is not None and ":" in cfg.data.name
               and not {"batch_size", "per_replica_batch_size"} & set(flags) else ())
    if flags is not None:
        source = resume_source(cfg, env, unnamed)
        saved = source.trusted_config(named=code_names(flags)) if source is not None else None
        if saved is not None:
            cfg = resume_config(saved, flags, str(source))
            cfg.run_dir = str(source.path)
            folders = apply_job_folders(cfg, job_folders())
    if env.launched_restarts is not None:
        # A worker of `--nproc N`: the launcher took its flags out of the workers' arguments, and
        # the run records what started it (a bare --resume then starts the same N).
        cfg.distributed.nproc, cfg.distributed.max_restarts = env.local_world_size, env.launched_restarts
    try:
        cfg.validate()
    except ConfigError as exc:
        if saved is None:
            raise
        # The flags were checked as they were read: what fails here is the folder's.
        raise ConfigError(f"{source}'s saved configuration is not one a run could have started with ({exc}); the "
                          "run folder is damaged: start a new run (another --run-dir, or --overwrite)") from None
    check_trackers(cfg.tracking.logger_names())
    if settle_model_optimizer(cfg):   # a LightningModule's own optimizer, in the config the run records
        try:                          # (its values are the user's: checked as theirs, and said so)
            cfg.validate()
        except ConfigError as exc:
            key, _, rule = str(exc).removeprefix("config key 'optim.").partition("' ")
            raise ConfigError(f"{cfg.model.name}'s configure_optimizers gives the optimizer's {key}, which {rule}; "
                              "fix what it builds the optimizer or its scheduler with") from None
    world = max(env.world_size, cfg.distributed.nproc)
    problem = device_problem(cfg, strategy_class(cfg.distributed, world), world)
    if problem:                       # before the device is opened (an XLA device's rules)
        raise ConfigError(problem)
    # `--precision auto` becomes the device's policy in the configuration the run saves, so a
    # resume (or another host of the job, which adopts the chief's) runs the same one.
    precision = settle_precision_here(cfg)
    compiling = choose_compile(cfg.compile)     # (the probe may turn it on: start_run)
    cfg.compile = compiling.value
    graphs = choose_cuda_graphs(cfg.cuda_graphs, cfg.steps_per_execution, device_kind_here(cfg),
                                strategy_class(cfg.distributed, world).supports_cuda_graphs)
    return RunRequest(cfg, folders, [s for s in (precision, compiling, graphs) if s is not None and s.why], unnamed)


def agree_on_plan(cfg: TrainConfig, env, strategy, undecided: Collection[str] = (),
                  unnamed: Collection[str] = ()) -> tuple[RunPlan, TrainConfig]:
    """The chief plans the run (folder, mode, id) and every rank adopts its plan and config, so
    ranks on other hosts, which do not see the run folder, continue the same run. `undecided`:
    the settings the run's probe may still change; `unnamed`: RunRequest's."""
    if strategy.is_chief:
        try:
            plan = plan_run(cfg, env, undecided, unnamed)
            message = {"folder": str(plan.folder.path), "mode": plan.mode, "run_id": plan.run_id,
                       "config": to_mapping(cfg)}
        except UserError as exc:
            strategy.broadcast_object({"error": str(exc)})
            raise
        strategy.broadcast_object(message)
        return plan, cfg
    message = strategy.broadcast_object(None)
    if "error" in message:
        raise UserError(message["error"])
    return (RunPlan(RunFolder(message["folder"]), message["mode"], message["run_id"]),
            from_mapping(TrainConfig, message["config"]))


def start_run(request: RunRequest, env, strategy, console: Console, extra_callbacks=()) -> Run:
    """Every rank's run, started (see the module doc). `extra_callbacks`: a caller's own (a tuner's
    pruning), last, so an epoch is recorded before one of them stops the run."""
    wall_start = time.perf_counter()
    raise_if_owed()       # a stop swallowed while the command started: no run is begun
    plan, cfg = agree_on_plan(request.config, env, strategy, request.undecided(), request.unnamed)
    dataset = load_dataset(cfg.data, seed=cfg.seed)
    adopt_loader_batch(cfg, dataset.loader_batch, strategy.layout.replicas)   # the batch the record names
    task = task_for(cfg, dataset)
    metric = task.check_metric(cfg.target_metric) if cfg.target is not None else None
    started = time.perf_counter()
    settings, probe_s = _probe(request.settings, cfg, dataset, task, plan, strategy, console)
    fp8 = _fp8_shapes(cfg, dataset, task, plan, strategy)
    if fp8 is not None:    # (the user waited for it: the probe's seconds)
        settings, probe_s = [*settings, fp8], time.perf_counter() - started
    run = Run(plan, cfg, env, strategy, request.folders, dataset, task, console, wall_start, settings)
    run.probe_s = probe_s
    run.open(metric, list(extra_callbacks))
    return run


def _probe(settings: list[Setting], cfg: TrainConfig, dataset, task, plan: RunPlan, strategy,
           console: Console) -> tuple[list[Setting], float]:
    """The settings `auto` chose by rule, measured on the run's own step where that applies
    (training/probe.py), before the run's folder records its configuration; the probe's seconds.
    A resumed run keeps its recorded choice (its configuration names it: nothing is `auto`).
    Under several processes of data parallelism the chief decides, measuring one process's step,
    and every rank takes its decision; a model split over processes (pipeline, tensor, parameter
    servers) is not measured as one."""
    if plan.mode == "resume" or not settings:
        return settings, 0.0
    say = (lambda line: console.print(line, soft_wrap=True))
    if strategy.layout.replicas != strategy.world_size:
        return [Setting(s.name, s.value, f"{s.why}; not probed: the model is split over {strategy.world_size} "
                                         "processes (a probe measures one)") for s in settings], 0.0

    def adopt(message: dict) -> tuple[list[Setting], float]:
        cfg.precision.policy, cfg.compile = message["precision"], message["compile"]
        return [Setting(*fields) for fields in message["settings"]], message["seconds"]
    return _chief_decides(
        strategy, "probe",
        lambda: probed_settings(cfg, dataset, task, settings, plan.run_id, strategy.device, say,
                                replicas=strategy.world_size),
        lambda found: {"settings": [(s.name, s.value, s.why, s.figures) for s in found[0]],
                       "precision": cfg.precision.policy, "compile": cfg.compile, "seconds": found[1]},
        adopt)


def _chief_decides(strategy, what: str, decide: Callable[[], T], shared: Callable[[T], dict],
                   adopt: Callable[[dict], T]) -> T:
    """What the run measures before it starts, decided once: by this process alone, or under
    several processes by the chief (`decide`), which sends every rank `shared(its answer)` for them
    to `adopt`; a failure of the chief's is every rank's (one line naming `what`)."""
    if strategy.world_size == 1:
        return decide()
    if strategy.is_chief:
        try:
            found = decide()
        except BaseException as exc:
            strategy.broadcast_object({"error": str(exc) or type(exc).__name__})
            raise
        strategy.broadcast_object(shared(found))
        return found
    message = strategy.broadcast_object(None)
    if "error" in message:
        raise UserError(f"the chief's {what} failed: {message['error']}")
    return adopt(message)


def _fp8_shapes(cfg: TrainConfig, dataset, task, plan: RunPlan, strategy) -> Setting | None:
    """Under --precision fp8 with --fp8-shapes auto on float8 tensor cores, the linear layer shapes
    that train in float8, measured on this device (training/float8_shapes.py) and written into the
    configuration before the folder records it; a resume converts what its record names. The chief
    measures and every rank takes its answer; a model split over processes keeps torchao's rule."""
    from scaletrain.distributed import divide_batch
    from scaletrain.precision.float8 import measures_shapes
    from scaletrain.precision.hardware import device_facts
    from scaletrain.training.float8_shapes import measured_fp8_shapes
    facts = device_facts(strategy.device)
    if plan.mode == "resume" or cfg.precision.policy != "fp8" or not measures_shapes(cfg.precision, facts.kind,
                                                                                      facts.capability):
        return None
    if strategy.layout.replicas != strategy.world_size:
        cfg.precision.fp8_shapes = "all"
        return Setting("fp8 shapes", "all", "torchao's rule: the model is split over processes (each measures "
                                            "its own part of a layer)")
    division = divide_batch(cfg.batch_size, cfg.per_replica_batch_size, strategy.layout.replicas,
                            cfg.optim.grad_accum_steps, cfg.accumulate_to_global)

    def adopt(message: dict) -> Setting | None:
        cfg.precision.fp8_shapes = message["fp8_shapes"]
        return Setting(*message["setting"]) if message["setting"] is not None else None
    return _chief_decides(
        strategy, "float8 measurement",
        lambda: measured_fp8_shapes(cfg, dataset, task, strategy.device, division.micro_batch, plan.run_id),
        lambda found: {"setting": None if found is None else (found.name, found.value, found.why, found.figures),
                       "fp8_shapes": cfg.precision.fp8_shapes},
        adopt)


class Run:
    """A started run on one rank. The chief holds the parties that record it (its folder, its store
    record, the external trackers); every rank holds its configuration, data, task, checkpointer
    and callbacks. `with run:` ends it through `fail` if anything raises."""

    def __init__(self, plan: RunPlan, cfg: TrainConfig, env, strategy, folders: JobFolders, dataset, task,
                 console: Console, wall_start: float, settings: list[Setting] = ()):
        self.plan, self.config, self.env, self.strategy, self.folders = plan, cfg, env, strategy, folders
        self.settled = list(settings)   # what settling the configuration chose (the precision)
        self.dataset, self.task, self.console, self.wall_start = dataset, task, console, wall_start
        self.run_id, self.path = plan.run_id, plan.folder.path
        # A resumed run that had finished: known before training marks it running again.
        self.previous_status = plan.folder.status if strategy.is_chief and plan.mode == "resume" else None
        self._parties: dict = {}    # who records the run, each told once how it ended
        self._reserved: dict[str, Reserved] = {}   # the chief's disk space for model.pt and summary.json
        self._trainer = None                       # the chief's, once it reserved (what a failed write keeps)
        self.tracked: TrackedRun | None = None
        self.callbacks: list = []
        self.checkpointer = None
        self.stop_watch: StopWatch | None = None
        self.probe_s = 0.0    # what measuring the settings on the run's own step took (probe.py)

    def open(self, metric: str | None, extra_callbacks: list) -> None:
        """Opens the parties that record the run (the chief takes its folder, opens its store
        record and the trackers) and builds its callbacks and checkpointer; a failure here is told
        to whichever had opened. `metric`: the one --target names (None without a target)."""
        try:
            self.callbacks = self._callbacks(metric, extra_callbacks)
            self.checkpointer = make_checkpointer(self.plan, self.config, self.env)
        except BaseException as exc:
            with finishing():
                self.fail(exc)
            raise
        # A signal while the main thread is stuck in C++ (a collective with a hung peer) still
        # ends the run as interrupted (stops.py); disarmed when the `with` block ends.
        self.stop_watch = StopWatch.arm(self._last_words)

    @property
    def is_chief(self) -> bool:
        return self.strategy.is_chief

    def _callbacks(self, metric: str | None, extra: list) -> list:
        cfg, console = self.config, self.console
        # Measuring and stopping callbacks run on every rank (a stop must be taken by all of them,
        # and the metrics they read are already reduced); recording ones only on the chief.
        callbacks = [StopGuard(), Throughput(console, verbose=False), TotalTime(console, verbose=False)]
        if metric is not None:
            callbacks.append(StopAtTarget(cfg.target, cfg.patience, f"val_{metric}", self.task.metrics[metric],
                                          console=console))
        if cfg.early_stopping_patience is not None:
            callbacks.append(EarlyStopping(patience=cfg.early_stopping_patience))
        if self.is_chief:
            folder = self._parties["folder"] = TakenFolder(self.plan, cfg, self.env)
            callbacks.append(folder)
            if cfg.tracking.record:
                tracked = self._parties["tracked"] = self.tracked = TrackedRun(
                    cfg, self.path, self.run_id, run_name(cfg), self.wall_start, self.strategy.device,
                    resumed=folder.resumed)
                callbacks += [tracked, tracked.recorder]
            callbacks.append(MetricsLog(self.path / f"metrics.{cfg.metrics_format}", cfg.metrics_format))
            if cfg.progress:
                callbacks.append(ProgressBar(console))
            callbacks.append(AllocatorRetries(console))   # silent where there is no CUDA allocator
            if cfg.tracking.logger_names():
                callbacks.append(self._external_logging(folder.resumed))
        return callbacks + extra

    def _external_logging(self, resumed: bool) -> ExternalLogging:
        cfg = self.config
        info = RunInfo(run_id=self.run_id, name=run_name(cfg), run_dir=self.path, group=cfg.tracking.group,
                       params=flatten_mapping(to_mapping(cfg)),
                       tags={"run_id": self.run_id, "precision": cfg.precision.policy, "model": cfg.model.name,
                             "data": cfg.data.name},
                       resumed=resumed,
                       log_dir=Path(self.folders.tensorboard_dir) if self.folders.tensorboard_dir else None)
        trackers = self._parties["trackers"] = ExternalLogging(build_trackers(cfg.tracking.logger_names()), info)
        return trackers

    def announce(self, trainer) -> None:
        """The run's opening lines, and the environment its store record will hold."""
        cfg, console, strategy = self.config, self.console, self.strategy
        # The trainer's own settings, with what the configuration's settling chose in place of the
        # trainer's "as configured" where both name one (the precision `auto` chose).
        settled = {s.name: s for s in self.settled}
        settings = [settled.pop(s.name, s) for s in trainer.settings] + list(settled.values())
        if self.tracked is not None:
            self.tracked.describe(trainer.device, device_name(trainer.device), strategy.world_size,
                                  {s.name: s.record() for s in settings})
        dataset = self.dataset
        n_params = sum(p.numel() for p in trainer.model.parameters())
        console.print(f"scaletrain: {cfg.model.name} ({n_params / 1e6:.2f}M params) on {dataset.name} "
                      f"({dataset.describe_splits()}, {trainer.task.name}), {cfg.precision.policy} on "
                      f"{device_label(trainer.device)}, strategy {strategy.name}, {self.plan.describe()} "
                      f"{self.run_id} in {self.plan.folder}", soft_wrap=True)
        console.print(f"batch: {trainer.batch.describe()}", soft_wrap=True)
        console.print(f"settings: {describe_settings(settings)}", soft_wrap=True)
        if strategy.describe():
            console.print(f"layout: {strategy.describe()}", soft_wrap=True)
        for advice in trainer.advice:
            console.print(f"note: {advice}", soft_wrap=True)
        replicas = strategy.layout.replicas
        scale = replica_lr_scale(cfg.optim.lr_scaling, replicas)
        if scale != 1.0:
            console.print(f"lr: {cfg.optim.lr:g} x {scale:g} ({cfg.optim.lr_scaling} scaling for {replicas} "
                          f"replicas) = {cfg.optim.lr * scale:g}, reached after "
                          f"{cfg.optim.lr_scaling_warmup_epochs:g} epoch(s) of warm-up", soft_wrap=True)
        if self.env.restart_count:
            console.print(f"torchrun restart {self.env.restart_count}: resuming from the newest complete checkpoint")

    def __enter__(self) -> Run:
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        # A second stop (Ctrl-C twice, a killed launcher's repeated SIGTERM) waits for the record.
        with finishing():
            try:
                if exc is not None:
                    self.fail(exc)
            finally:
                if self.stop_watch is not None:
                    self.stop_watch.disarm()
        return False

    def _last_words(self) -> None:
        """Run by the stop watch's thread when the main thread cannot run `fail`: the folder and
        the store (a connection of its own) told the run was interrupted."""
        if (folder := self._parties.pop("folder", None)) is not None:
            folder.fail("interrupted")
        if self.is_chief:
            record_job_end(self.plan, self.config, "interrupted")

    def finish(self, trainer) -> RunSummary:
        """The run's summary, its results written (chief) and every party told it finished. A
        collective where parameters are sharded: every rank calls it. A stop that arrives
        meanwhile ends the command once the run is recorded finished (stops.finishing); one that
        came before and was swallowed ends it as interrupted instead."""
        raise_if_owed()
        with finishing():
            return self._finish(trainer)

    def _finish(self, trainer) -> RunSummary:
        cfg, console = self.config, self.console
        summary = build_summary(trainer, cfg, wall_time_s=time.perf_counter() - self.wall_start, run_dir=self.path,
                                restarts=self.env.restart_count)
        summary.run_id = self.run_id
        summary.job_folders = self.folders.describe() or None
        # The user waited for the probe: its time is in the wall clock already, and in time to target.
        summary.probe_s = self.probe_s
        if summary.time_to_target_s is not None:
            summary.time_to_target_s += self.probe_s
        if self.previous_status == "finished" and trainer.global_step == trainer.resumed_at_step:
            # Nothing was trained: the finished run's results stay exactly as they were.
            why = ("it had stopped at its target or by early stopping" if trainer.stop_training
                   else "raise --epochs to continue it")
            console.print(f"run {self.run_id} had already finished; nothing left to train ({why})")
            self._release()
            self._tell_finished(None)
            return summary
        # Collective where parameters are sharded: every rank takes part, the chief writes.
        weights = self.strategy.full_state_dict(trainer.model) if cfg.save_model else None
        if self.is_chief:
            self._write_results(summary, weights)
            self._release()         # the checkpoint's space a failed write would have used
            deliver_model(self.folders, self.path)
            self._tell_finished(summary)
            print_summary(summary, console)
        return summary

    def _reservation(self, name: str, path: Path, what: str) -> Reserved:
        """The space `reserve` set aside for `name`; a caller that did not reserve gets it now."""
        return self._reserved.pop(name, None) or Reserved(path, 0, what)

    def _tell_finished(self, summary: RunSummary | None) -> None:
        """summary None: nothing was trained, the stored summary stays as it was."""
        if (tracked := self._parties.pop("tracked", None)) is not None:
            tracked.finish(asdict(summary) if summary is not None else None)
        if (trackers := self._parties.pop("trackers", None)) is not None:
            if summary is None:
                trackers.finish("finished")
            else:
                trackers.finish("finished", asdict(summary), [self.path / "config.json", self.path / "summary.json"])
        if (folder := self._parties.pop("folder", None)) is not None:
            folder.finish()

    def reserve(self, trainer) -> None:
        """The chief sets aside the disk space of what the run writes at its end (model.pt, summary.json:
        checkpoint/space.py), before it trains: a disk without room refuses the run now in one line,
        and one that fills while it trains cannot cost the trained weights. The model's size is the
        chief's view of it (whole under single, ddp, zero and fsdp, whose sharded tensors count their
        global size; one stage under a pipeline, the rest asked of the disk at the end)."""
        if not self.is_chief:
            return
        self._trainer = trainer
        if self.config.save_model:
            tensors = [t for t in trainer.model.state_dict().values() if isinstance(t, torch.Tensor)]
            # torch.save's zip adds about 330-460 bytes a tensor (alignment, headers, the pickle).
            size = sum(t.numel() * t.element_size() for t in tensors) + 1024 * len(tensors) + 64 * 1024
            self._reserved["model"] = Reserved(self.path / "model.pt", size, "the finished model")
        self._reserved["summary"] = Reserved(self.path / "summary.json", SUMMARY_RESERVE, "the run's summary")
        if self.config.summary_json:
            summary_json = Path(self.config.summary_json)
            summary_json.parent.mkdir(parents=True, exist_ok=True)
            self._reserved["summary_json"] = Reserved(summary_json, SUMMARY_RESERVE, "--summary-json")
        if keeps_checkpoint(trainer):   # where a failed write mid-run saves the training (rescue.py)
            self._reserved["rescue"] = Reserved(self.path / "checkpoint", checkpoint_bytes(trainer),
                                                "a checkpoint kept if a write fails mid-run")

    def _release(self) -> None:
        for reserved in self._reserved.values():
            reserved.release()
        self._reserved.clear()

    def fail(self, exc: BaseException) -> None:
        """Tells every party not yet told how the run ended (failed, interrupted, pruned). A failed
        write keeps what was trained first, in the space held for it (rescue.py)."""
        if isinstance(exc, WriteFailed) and self._trainer is not None:
            self._keep_what_was_trained(exc)
        self._release()
        status = ending_status(exc)
        if (trackers := self._parties.pop("trackers", None)) is not None:
            trackers.finish(status)
        if (tracked := self._parties.pop("tracked", None)) is not None:
            tracked.fail(exc)
        if (folder := self._parties.pop("folder", None)) is not None:
            folder.fail(status)

    def _keep_what_was_trained(self, exc: WriteFailed) -> None:
        trainer = self._trainer
        if trainer.global_step == trainer.resumed_at_step:
            return        # nothing trained in this process: what the folder holds is all there is
        single = keeps_checkpoint(trainer)
        kept = rescue(trainer, trainer.checkpointer or checkpoint_store(self.config, self.plan.folder, self.run_id),
                      self._reserved.pop("rescue", None), self._reserved.pop("model", None) if single else None,
                      lambda: self.strategy.full_state_dict(trainer.model))
        if kept:
            exc.args = (f"{exc}; kept {' and '.join(kept)}",)

    def _write_results(self, summary: RunSummary, weights) -> None:
        """The model first (the costly result), then the summaries; each file appears whole or not at all."""
        cfg, folder = self.config, self.path
        if cfg.save_model:
            # The bare module's weights: no DDP `module.` prefix, loads without a process group. Into
            # the space set aside before training (`reserve`), so a full disk cannot lose them.
            self._reservation("model", folder / "model.pt", "the finished model").write(
                lambda fh: torch.save(weights, fh))
        self._reservation("summary", folder / "summary.json", "the run's summary").write(
            lambda fh: fh.write(summary.to_json().encode()))
        if cfg.summary_json:
            self._reservation("summary_json", Path(cfg.summary_json), "--summary-json").write(
                lambda fh: fh.write(summary.to_json().encode()))
