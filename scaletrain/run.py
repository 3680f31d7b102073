"""Builds a whole run from a TrainConfig: strategy, data, model, callbacks, checkpoints, trainer;
fits; summarises. Every rank runs this; only the chief prints and writes run files.

The CLI calls `run_training`; so can a notebook or a sweep.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

import torch
from rich.console import Console

from scaletrain import config as config_mod
from scaletrain.callbacks import EarlyStopping, MetricsLog, ProgressBar, StopAtAccuracy, Throughput, TotalTime
from scaletrain.checkpoint import Checkpointer, CheckpointStore
from scaletrain.config import TrainConfig
from scaletrain.data import load_dataset
from scaletrain.distributed import DistEnv, build_strategy, dist_env
from scaletrain.experiments.pruning import trial_pruning_from_env
from scaletrain.models import build_model
from scaletrain.optim.schedules import replica_lr_scale
from scaletrain.summary import RunSummary, build_summary, device_name, print_summary
from scaletrain.tracking.tensorboard import TensorBoardLogger
from scaletrain.tracking.tracked_run import TrackedRun
from scaletrain.training import Trainer

RUNS_ROOT = Path("scaletrain-runs")


def run_name(cfg: TrainConfig) -> str:
    return f"{cfg.model.name}-{cfg.data.name}-{cfg.precision.policy}".replace("/", "_").replace(":", "_")


def default_run_dir(cfg: TrainConfig, env: DistEnv | None = None) -> Path:
    """A new timestamped folder; under torchrun the rendezvous id names it too, so a restarted
    worker group finds the folder (and the checkpoints) of the attempt before it."""
    if env is not None and env.run_id:
        existing = sorted(RUNS_ROOT.glob(f"*-{run_name(cfg)}-{env.run_id}"))
        if existing:
            return existing[-1]
        suffix = f"-{env.run_id}"
    else:
        suffix = ""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return RUNS_ROOT / f"{stamp}-{run_name(cfg)}{suffix}"


def latest_resumable_run(cfg: TrainConfig) -> Path | None:
    """For `--resume auto` without --run-dir: the newest run folder of this model, data and
    precision that holds a complete checkpoint."""
    for folder in sorted(RUNS_ROOT.glob(f"*-{run_name(cfg)}*"), reverse=True):
        if CheckpointStore(folder / "checkpoints").latest() is not None:
            return folder
    return None


def resolve_run_dir(cfg: TrainConfig, env: DistEnv) -> Path:
    if cfg.run_dir:
        return Path(cfg.run_dir)
    if cfg.checkpoint.resume == "auto" and not cfg.checkpoint.dir:
        found = latest_resumable_run(cfg)
        if found is not None:
            return found
    return default_run_dir(cfg, env)


def _checkpointer(cfg: TrainConfig, env: DistEnv, run_dir: Path) -> Checkpointer | None:
    # After a torchrun restart the worker group always continues from the last checkpoint.
    resume = cfg.checkpoint.resume or ("auto" if env.restart_count > 0 else None)
    if cfg.checkpoint.every <= 0 and resume is None:
        return None
    root = Path(cfg.checkpoint.dir) if cfg.checkpoint.dir else run_dir / "checkpoints"
    return Checkpointer(CheckpointStore(root, keep=cfg.checkpoint.keep), every=cfg.checkpoint.every, resume=resume)


def run_training(cfg: TrainConfig, console: Console | None = None) -> tuple[RunSummary, Trainer]:
    cfg.validate()
    env = dist_env()
    strategy = build_strategy(cfg.distributed, env)
    try:
        strategy.setup(cfg.device)
        console = console or Console()
        if not strategy.is_chief:
            console = Console(quiet=True)
        result = _run(cfg, env, strategy, console)
    except BaseException:
        strategy.teardown(clean=False)  # a peer may be dead or hung: no draining barrier
        raise
    strategy.teardown()
    return result


def _run(cfg: TrainConfig, env: DistEnv, strategy, console: Console) -> tuple[RunSummary, Trainer]:
    wall_start = time.perf_counter()
    dataset = load_dataset(cfg.data, seed=cfg.seed)
    torch.manual_seed(cfg.seed)  # the same initial weights for every precision, fusing choice and rank
    model = build_model(cfg.model.name, dataset.input_shape, dataset.num_classes, **cfg.model.options)
    run_dir = Path(strategy.broadcast_object(str(resolve_run_dir(cfg, env)) if strategy.is_chief else None))
    if strategy.is_chief:
        run_dir.mkdir(parents=True, exist_ok=True)
    # Measuring and stopping callbacks run on every rank (a stop must be taken by all of them, and
    # the metrics they read are already reduced); reporting ones only on the chief.
    callbacks = [Throughput(console, verbose=False), TotalTime(console, verbose=False)]
    if cfg.target_accuracy is not None:
        callbacks.append(StopAtAccuracy(cfg.target_accuracy, cfg.patience, console=console))
    if cfg.early_stopping_patience is not None:
        callbacks.append(EarlyStopping(patience=cfg.early_stopping_patience))
    tracked = None
    if strategy.is_chief:
        callbacks.append(MetricsLog(run_dir / f"metrics.{cfg.metrics_format}", cfg.metrics_format))
        if cfg.progress:
            callbacks.append(ProgressBar(console))
        if cfg.tracking.record:
            tracked = TrackedRun(cfg, run_dir, run_name(cfg), wall_start, strategy.device)
            callbacks.append(tracked.recorder)
        if cfg.tracking.tensorboard:
            callbacks.append(TensorBoardLogger(run_dir / "tensorboard"))
        pruning = trial_pruning_from_env()
        if pruning is not None:
            callbacks.append(pruning)
    try:
        return _fit(cfg, env, strategy, console, dataset, model, run_dir, callbacks, tracked, wall_start)
    except BaseException as exc:
        if tracked is not None:
            tracked.fail(exc)
        raise


def _fit(cfg: TrainConfig, env: DistEnv, strategy, console: Console, dataset, model, run_dir: Path, callbacks,
         tracked: TrackedRun | None, wall_start: float) -> tuple[RunSummary, Trainer]:
    n_params = sum(p.numel() for p in model.parameters())
    checkpointer = _checkpointer(cfg, env, run_dir)
    trainer = Trainer(model, cfg, callbacks, strategy=strategy, checkpointer=checkpointer)
    if tracked is not None:
        tracked.start(trainer.device, device_name(trainer.device), strategy.world_size)
    console.print(f"scaletrain: {cfg.model.name} ({n_params / 1e6:.2f}M params) on {dataset.name} "
                  f"({len(dataset.train)} train / {len(dataset.test)} test), {cfg.precision.policy} on "
                  f"{trainer.device}, strategy {strategy.name}, run folder {run_dir}"
                  + (f", run id {tracked.run_id}" if tracked else ""), soft_wrap=True)
    console.print(f"batch: {trainer.batch.describe()}", soft_wrap=True)
    for advice in trainer.alignment_advice:
        console.print(f"note: {advice}", soft_wrap=True)
    scale = replica_lr_scale(cfg.optim.lr_scaling, strategy.world_size)
    if scale != 1.0:
        console.print(f"lr: {cfg.optim.lr:g} x {scale:g} ({cfg.optim.lr_scaling} scaling for {strategy.world_size} "
                      f"replicas) = {cfg.optim.lr * scale:g}, reached after {cfg.optim.lr_scaling_warmup_epochs:g} "
                      "epoch(s) of warm-up", soft_wrap=True)
    if env.restart_count:
        console.print(f"torchrun restart {env.restart_count}: resuming from the newest complete checkpoint")
    trainer.fit(dataset)
    if trainer.resumed_from:
        console.print(f"resumed from {trainer.resumed_from}", soft_wrap=True)
    summary = build_summary(trainer, cfg, wall_time_s=time.perf_counter() - wall_start, run_dir=run_dir,
                            restarts=env.restart_count)
    summary.run_id = tracked.run_id if tracked else None
    # Collective where parameters are sharded: every rank takes part, the chief writes.
    weights = strategy.full_state_dict(trainer.model) if cfg.save_model else None
    if strategy.is_chief:
        (run_dir / "config.json").write_text(json.dumps(config_mod.to_mapping(cfg), indent=2))
        (run_dir / "summary.json").write_text(summary.to_json())
        if cfg.summary_json:
            Path(cfg.summary_json).parent.mkdir(parents=True, exist_ok=True)
            Path(cfg.summary_json).write_text(summary.to_json())
        if cfg.save_model:
            # The bare module's weights: no DDP `module.` prefix, loads without a process group.
            torch.save(weights, run_dir / "model.pt")
        if tracked is not None:
            tracked.finish(asdict(summary))
        print_summary(summary, console)
    return summary, trainer
