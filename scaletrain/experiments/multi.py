"""`scaletrain multi a.toml b.toml ...`: independent trainings side by side, one per device
(seed 002: "train several models in parallel, each on its own GPU"), each a run in the store."""

from __future__ import annotations

import os
from pathlib import Path

from rich.console import Console

from scaletrain.config import TrainConfig, load_toml
from scaletrain.errors import UserError
from scaletrain.experiments.jobs import settle, training_job
from scaletrain.experiments.slots import Finished, SlotPool, device_slots
from scaletrain.options import from_mapping
from scaletrain.tracking.store import RunRecord, RunStore


def default_parallel(n_configs: int, device: str) -> int:
    """One training per GPU where there are GPUs, else one per CPU core, never more than configs."""
    if device != "cpu":
        import torch
        if torch.cuda.is_available():
            return max(1, min(n_configs, torch.cuda.device_count()))
    return max(1, min(n_configs, len(os.sched_getaffinity(0))))


def load_configs(paths: list[str]) -> list[tuple[str, TrainConfig]]:
    configs, names = [], set()
    for path in paths:
        cfg = from_mapping(TrainConfig, load_toml(path))
        cfg.validate()
        if cfg.distributed.nproc > 1:
            raise UserError(f"{path}: multi runs each training as one process on its own device; drop nproc")
        name = Path(path).stem
        while name in names:
            name += "_"
        names.add(name)
        configs.append((name, cfg))
    return configs


def train_side_by_side(paths: list[str], out: Path, parallel: int | None, group: str, store_path: str | None,
              console: Console) -> list[RunRecord]:
    configs = load_configs(paths)
    device = configs[0][1].device
    parallel = parallel or default_parallel(len(configs), device)
    jobs = []
    for name, cfg in configs:
        if store_path:
            cfg.tracking.store = store_path
        jobs.append(training_job(cfg, name, out, group))
    slots = device_slots(parallel, device)
    trainings = f"{len(jobs)} training" + ("s" if len(jobs) != 1 else "")
    console.print(f"multi: {trainings}, {parallel} at a time on {', '.join(s.label for s in slots)}; "
                  f"group {group}, folders under {out}", soft_wrap=True)
    records: dict[str, RunRecord] = {}

    def done(finished: Finished) -> None:
        cfg = finished.job.payload[0]
        with RunStore(cfg.tracking.store) as store:
            record = settle(store, finished)
        records[finished.job.name] = record
        why = f": {record.error}" if record.status != "finished" and record.error else ""
        console.print(f"  {finished.job.name} on {finished.slot.label}: {record.status} after "
                      f"{finished.seconds:.1f} s (run {record.id}){why}", soft_wrap=True, markup=False)

    SlotPool(slots).run_all(jobs, on_start=lambda job, slot: console.print(f"  {job.name} started on {slot.label}"),
                            on_done=done)
    return [records[name] for name, _ in configs]
