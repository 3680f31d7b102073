"""The store's side of one training run, on the chief: picks the run's id, records its start
(config and environment), its epochs (through the recorder callback) and how it ended."""

from __future__ import annotations

import traceback
from pathlib import Path

import torch

from scaletrain.config import TrainConfig, to_mapping
from scaletrain.errors import RunPruned
from scaletrain.tracking.environment import capture_environment
from scaletrain.tracking.recorder import RunRecorder
from scaletrain.tracking.store import RunStore, new_run_id
from scaletrain.tracking.system_monitor import SystemMonitor

RUN_ID_FILE = "run_id"


def resolve_run_id(cfg: TrainConfig, run_dir: Path) -> str:
    """--run-id, else the id a resumed run folder was recorded under, else a new one."""
    if cfg.tracking.run_id:
        return cfg.tracking.run_id
    saved = run_dir / RUN_ID_FILE
    if saved.is_file() and saved.read_text().strip():
        return saved.read_text().strip()
    return new_run_id()


def ending_status(exc: BaseException) -> str:
    if isinstance(exc, RunPruned):
        return "pruned"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    return "failed"


class TrackedRun:
    def __init__(self, cfg: TrainConfig, run_dir: Path, name: str, wall_start: float, device: torch.device):
        self.cfg, self.run_dir, self.name = cfg, run_dir, name
        self.store = RunStore(cfg.tracking.store)
        self.run_id = resolve_run_id(cfg, run_dir)
        (run_dir / RUN_ID_FILE).write_text(self.run_id + "\n")
        self.recorder = RunRecorder(self.store, self.run_id, wall_start,
                                    SystemMonitor(cfg.tracking.sample_interval_s, device))

    def start(self, device: torch.device, device_name: str, world_size: int) -> None:
        self.store.start_run(self.run_id, name=self.name, group=self.cfg.tracking.group, run_dir=str(self.run_dir),
                             config=to_mapping(self.cfg),
                             environment=capture_environment(device, device_name, world_size))

    def finish(self, summary: dict) -> None:
        self.recorder.close()
        self.recorder.guarded(self.store.finish_run, self.run_id, "finished", summary)
        self.store.close()

    def fail(self, exc: BaseException) -> None:
        """Records how the run ended; never raises over the exception being handled."""
        try:
            self.recorder.close()
            status = ending_status(exc)
            error = None if status == "pruned" else "".join(traceback.format_exception_only(exc)).strip()
            self.store.finish_run(self.run_id, status, error=error)
            self.store.close()
        except Exception:
            pass
