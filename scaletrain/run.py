"""Builds a whole run from a TrainConfig: data, model, callbacks, trainer; fits; summarises.

The CLI calls `run_training`; so can a notebook or a sweep.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path

import torch
from rich.console import Console

from scaletrain import config as config_mod
from scaletrain.callbacks import EarlyStopping, MetricsLog, ProgressBar, StopAtAccuracy, Throughput, TotalTime
from scaletrain.config import TrainConfig
from scaletrain.data import load_dataset
from scaletrain.models import build_model
from scaletrain.summary import RunSummary, build_summary, print_summary
from scaletrain.training import Trainer


def default_run_dir(cfg: TrainConfig) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("scaletrain-runs") / f"{stamp}-{cfg.model.name}-{cfg.data.name}-{cfg.precision.policy}"


def run_training(cfg: TrainConfig, console: Console | None = None) -> tuple[RunSummary, Trainer]:
    console = console or Console()
    cfg.validate()
    wall_start = time.perf_counter()
    dataset = load_dataset(cfg.data, seed=cfg.seed)
    torch.manual_seed(cfg.seed)  # the same initial weights for every precision and fusing choice
    model = build_model(cfg.model.name, dataset.input_shape, dataset.num_classes, **cfg.model.options)
    run_dir = Path(cfg.run_dir) if cfg.run_dir else default_run_dir(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    callbacks = [Throughput(console, verbose=False), TotalTime(console, verbose=False)]
    if cfg.target_accuracy is not None:
        callbacks.append(StopAtAccuracy(cfg.target_accuracy, cfg.patience, console=console))
    if cfg.early_stopping_patience is not None:
        callbacks.append(EarlyStopping(patience=cfg.early_stopping_patience))
    callbacks.append(MetricsLog(run_dir / f"metrics.{cfg.metrics_format}", cfg.metrics_format))
    if cfg.progress:
        callbacks.append(ProgressBar(console))
    n_params = sum(p.numel() for p in model.parameters())
    trainer = Trainer(model, cfg, callbacks)
    console.print(f"scaletrain: {cfg.model.name} ({n_params / 1e6:.2f}M params) on {dataset.name} "
                  f"({len(dataset.train)} train / {len(dataset.test)} test), {cfg.precision.policy} on "
                  f"{trainer.device}, batch {cfg.batch_size}, run folder {run_dir}", soft_wrap=True)
    trainer.fit(dataset)
    summary = build_summary(trainer, cfg, wall_time_s=time.perf_counter() - wall_start, run_dir=run_dir)
    (run_dir / "config.json").write_text(json.dumps(config_mod.to_mapping(cfg), indent=2))
    (run_dir / "summary.json").write_text(summary.to_json())
    if cfg.summary_json:
        Path(cfg.summary_json).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.summary_json).write_text(summary.to_json())
    if cfg.save_model:
        torch.save(trainer.model.state_dict(), run_dir / "model.pt")
    print_summary(summary, console)
    return summary, trainer
