"""Builds a whole run from a TrainConfig: the run's folder (lifecycle), strategy, data, model,
callbacks, checkpoints, trainer; fits; summarises. Every rank runs this; the chief decides the
run's folder and configuration and tells the others, and only it prints and writes run files.

The CLI calls `run_training`; so can a notebook or a sweep.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import torch
from rich.console import Console

from scaletrain.console import make_console

from scaletrain.callbacks import AllocatorRetries, EarlyStopping, MetricsLog, ProgressBar, StopAtTarget, Throughput, TotalTime
from scaletrain.checkpoint.store import write_atomically
from scaletrain.config import TrainConfig, flatten_mapping, from_mapping, to_mapping
from scaletrain.data import load_dataset
from scaletrain.distributed import DistEnv, build_strategy, dist_env
from scaletrain.distributed.capabilities import Serving
from scaletrain.errors import UserError
from scaletrain.lifecycle import Run, RunFolder, RunPlan, make_checkpointer, open_run, plan_run, run_name
from scaletrain.optim.schedules import replica_lr_scale
from scaletrain.summary import RunSummary, build_summary, device_name, print_summary
from scaletrain.lifecycle.job_folders import JobFolders, apply_job_folders, deliver_model, job_folders
from scaletrain.tracking.loggers import build_trackers
from scaletrain.tracking.loggers.base import ExternalLogging, RunInfo
from scaletrain.tracking.tracked_run import TrackedRun, ending_status
from scaletrain.training import Trainer, build_training
from scaletrain.training.build import task_for
from scaletrain.training.preflight import settle_model_optimizer


def run_training(cfg: TrainConfig, console: Console | None = None,
                 callbacks=()) -> tuple[RunSummary | None, Trainer | None]:
    """Trains one run. `callbacks`: extra callbacks, on every rank (a tuner's pruning callback, whose
    stop every rank must take: it asks the chief and follows its answer).
    A process that serves rather than trains (a parameter server) returns (None, None)."""
    # A cloud job's folders (SM_MODEL_DIR, AIP_CHECKPOINT_DIR, ...) fill what the config leaves unset.
    folders = apply_job_folders(cfg, job_folders())
    cfg.validate()
    settle_model_optimizer(cfg)   # a LightningModule's own optimizer, in the config the run records
    env = dist_env()
    strategy = build_strategy(cfg.distributed, env)
    try:
        strategy.setup(cfg.device)
        if strategy.layout.serves:   # a parameter server: it serves the workers until they are done
            assert isinstance(strategy, Serving), f"strategy {strategy.name} lays out servers but cannot serve"
            strategy.serve(cfg.optim)
            strategy.teardown()
            return None, None
        console = console or make_console()
        if not strategy.is_chief:
            console = make_console(quiet=True)
        result = _run(cfg, env, strategy, console, list(callbacks), folders)
    except BaseException:
        strategy.teardown(clean=False)  # a peer may be dead or hung: no draining barrier
        raise
    strategy.teardown()
    return result


def _agree_on_plan(cfg: TrainConfig, env: DistEnv, strategy) -> tuple[RunPlan, TrainConfig]:
    """The chief plans the run (folder, mode, id) and every rank adopts its plan and config, so
    ranks on other hosts, which do not see the run folder, continue the same run."""
    if strategy.is_chief:
        try:
            plan = plan_run(cfg, env)
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


def _run(cfg: TrainConfig, env: DistEnv, strategy, console: Console, extra_callbacks: list,
         folders: JobFolders) -> tuple[RunSummary, Trainer]:
    wall_start = time.perf_counter()
    plan, cfg = _agree_on_plan(cfg, env, strategy)
    dataset = load_dataset(cfg.data, seed=cfg.seed)
    task = task_for(cfg, dataset)
    if cfg.target is not None:
        task.check_metric(cfg.target_metric)   # refused before the run's folder is opened
    run = open_run(plan, cfg, env) if strategy.is_chief else None
    tracked = trackers = None
    try:
        # Measuring and stopping callbacks run on every rank (a stop must be taken by all of
        # them, and the metrics they read are already reduced); reporting ones only on the chief.
        callbacks = [Throughput(console, verbose=False), TotalTime(console, verbose=False)]
        if cfg.target is not None:
            metric = task.check_metric(cfg.target_metric)
            callbacks.append(StopAtTarget(cfg.target, cfg.patience, f"val_{metric}", task.metrics[metric],
                                          console=console))
        if cfg.early_stopping_patience is not None:
            callbacks.append(EarlyStopping(patience=cfg.early_stopping_patience))
        if run is not None:
            callbacks.append(run)
            if cfg.tracking.record:
                tracked = TrackedRun(cfg, run.path, run.run_id, run_name(cfg), wall_start, strategy.device,
                                     resumed=run.resumed)
                callbacks += [tracked, tracked.recorder]
            callbacks.append(MetricsLog(run.path / f"metrics.{cfg.metrics_format}", cfg.metrics_format))
            if cfg.progress:
                callbacks.append(ProgressBar(console))
            callbacks.append(AllocatorRetries(console))   # silent where there is no CUDA allocator
            if cfg.tracking.logger_names():
                trackers = _external_logging(cfg, run, folders)
                callbacks.append(trackers)
        # Last, so the epoch is recorded before one of them stops the run.
        callbacks += extra_callbacks
        built = build_training(cfg, strategy=strategy, dataset=dataset, task=task, callbacks=callbacks,
                          checkpointer=make_checkpointer(plan, cfg, env))
        return _fit(cfg, env, console, built.trainer, dataset, plan, run, tracked, trackers, folders, wall_start)
    except BaseException as exc:
        if trackers is not None:
            trackers.finish(ending_status(exc))
        if tracked is not None:
            tracked.fail(exc)
        if run is not None:
            run.fail(ending_status(exc))
        raise


def _external_logging(cfg: TrainConfig, run: Run, folders: JobFolders) -> ExternalLogging:
    params = flatten_mapping(to_mapping(cfg))
    info = RunInfo(run_id=run.run_id, name=run_name(cfg), run_dir=run.path, group=cfg.tracking.group, params=params,
                   tags={"run_id": run.run_id, "precision": cfg.precision.policy, "model": cfg.model.name,
                         "data": cfg.data.name},
                   resumed=run.resumed, log_dir=Path(folders.tensorboard_dir) if folders.tensorboard_dir else None)
    return ExternalLogging(build_trackers(cfg.tracking.logger_names()), info)


def _fit(cfg: TrainConfig, env: DistEnv, console: Console, trainer: Trainer, dataset, plan: RunPlan, run: Run | None,
         tracked: TrackedRun | None, trackers: ExternalLogging | None, folders: JobFolders,
         wall_start: float) -> tuple[RunSummary, Trainer]:
    strategy = trainer.strategy
    n_params = sum(p.numel() for p in trainer.model.parameters())
    if tracked is not None:
        tracked.describe(trainer.device, device_name(trainer.device), strategy.world_size)
    console.print(f"scaletrain: {cfg.model.name} ({n_params / 1e6:.2f}M params) on {dataset.name} "
                  f"({len(dataset.train)} train / {len(dataset.val) if dataset.val is not None else 0} val / "
                  f"{len(dataset.test)} test, {trainer.task.name}), {cfg.precision.policy} on "
                  f"{trainer.device}, strategy {strategy.name}, {plan.describe()} {plan.run_id} in {plan.folder}",
                  soft_wrap=True)
    console.print(f"batch: {trainer.batch.describe()}", soft_wrap=True)
    if strategy.describe():
        console.print(f"layout: {strategy.describe()}", soft_wrap=True)
    for advice in trainer.advice:
        console.print(f"note: {advice}", soft_wrap=True)
    replicas = strategy.layout.replicas
    scale = replica_lr_scale(cfg.optim.lr_scaling, replicas)
    if scale != 1.0:
        console.print(f"lr: {cfg.optim.lr:g} x {scale:g} ({cfg.optim.lr_scaling} scaling for {replicas} "
                      f"replicas) = {cfg.optim.lr * scale:g}, reached after {cfg.optim.lr_scaling_warmup_epochs:g} "
                      "epoch(s) of warm-up", soft_wrap=True)
    if env.restart_count:
        console.print(f"torchrun restart {env.restart_count}: resuming from the newest complete checkpoint")
    previous_status = plan.folder.status if strategy.is_chief and plan.mode == "resume" else None
    trainer.fit(dataset)
    if trainer.resumed_from:
        console.print(f"resumed from {trainer.resumed_from}", soft_wrap=True)
    summary = build_summary(trainer, cfg, wall_time_s=time.perf_counter() - wall_start, run_dir=plan.folder.path,
                            restarts=env.restart_count)
    summary.run_id = plan.run_id
    summary.job_folders = folders.describe() or None
    if previous_status == "finished" and trainer.global_step == trainer.resumed_at_step:
        # Nothing was trained: the finished run's results stay exactly as they were.
        why = ("it had stopped at its target or by early stopping" if trainer.stop_training
               else "raise --epochs to continue it")
        console.print(f"run {plan.run_id} had already finished; nothing left to train ({why})")
        if tracked is not None:
            tracked.finish(None)
        if trackers is not None:
            trackers.finish("finished")
        run.finish()
        return summary, trainer
    # Collective where parameters are sharded: every rank takes part, the chief writes.
    weights = strategy.full_state_dict(trainer.model) if cfg.save_model else None
    if run is not None:
        _write_results(cfg, run.path, summary, weights)
        deliver_model(folders, run.path)
        if tracked is not None:
            tracked.finish(asdict(summary))
        if trackers is not None:
            trackers.finish("finished", asdict(summary), [run.path / "config.json", run.path / "summary.json"])
        run.finish()
        print_summary(summary, console)
    return summary, trainer


def _write_results(cfg: TrainConfig, folder: Path, summary: RunSummary, weights) -> None:
    """The model first (the costly result), then the summaries; each file appears whole or not at all."""
    if cfg.save_model:
        # The bare module's weights: no DDP `module.` prefix, loads without a process group.
        tmp = folder / ".model.pt.tmp"
        torch.save(weights, tmp)
        tmp.replace(folder / "model.pt")
    write_atomically(folder / "summary.json", summary.to_json())
    if cfg.summary_json:
        Path(cfg.summary_json).parent.mkdir(parents=True, exist_ok=True)
        write_atomically(Path(cfg.summary_json), summary.to_json())
