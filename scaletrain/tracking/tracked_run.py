"""The store's side of one training run, on the chief: records its start (config and
environment), its epochs (through the recorder callback) and how it ended.

Nothing is written to the store until training begins (for a resume: until its checkpoint has
loaded), so a configuration error or a failed resume attempt leaves the store as it was. A
resumed run keeps its id; the epochs it will train again are dropped, and its wall time continues
from where the store's record of it ends (reports plot one continuous run)."""

from __future__ import annotations

import traceback
from pathlib import Path

import torch

from scaletrain.config import TrainConfig, config_digest
from scaletrain.errors import RunPruned, Terminated, UserError
from scaletrain.options import to_mapping
from scaletrain.tracking.environment import capture_environment
from scaletrain.tracking.recorder import RunRecorder
from scaletrain.tracking.store import RunStore
from scaletrain.tracking.system_monitor import SystemMonitor


def ending_status(exc: BaseException) -> str:
    if isinstance(exc, RunPruned):
        return "pruned"
    if isinstance(exc, (KeyboardInterrupt, Terminated)):
        return "interrupted"
    return "failed"


class TrackedRun:
    def __init__(self, cfg: TrainConfig, run_dir: Path, run_id: str, name: str, wall_start: float,
                 device: torch.device, resumed: bool = False):
        self.cfg, self.run_dir, self.run_id, self.name, self.resumed = cfg, run_dir, run_id, name, resumed
        self.store = RunStore(cfg.tracking.store)
        if not resumed and self.store.exists(run_id):
            self.store.close()
            raise UserError(f"run id {run_id} is already recorded in {self.store.path}; a new run needs a new id: "
                            "drop --run-id or choose another")
        self.recorder = RunRecorder(self.store, self.run_id, wall_start,
                                    SystemMonitor(cfg.tracking.sample_interval_s, device))
        self.environment: dict = {}
        self.began = False

    def describe(self, device: torch.device, device_name: str, world_size: int, settings: dict | None = None) -> None:
        """The environment the record keeps; `settings`: what the run computes with, each with how it
        was chosen (training/defaults.py's `Setting.record`)."""
        self.environment = capture_environment(device, device_name, world_size)
        if settings:
            self.environment["settings"] = settings

    def on_train_begin(self, trainer) -> None:
        """Called before the recorder's own on_train_begin (it starts the sampling clock)."""
        config = to_mapping(self.cfg)
        environment = self._with_earlier_choices(self.environment) if self.resumed else self.environment
        # The digest run.json binds the run's config.json with: the store names the same configuration.
        self.store.start_run(self.run_id, name=self.name, group=self.cfg.tracking.group, run_dir=str(self.run_dir),
                             config=config, environment={**environment, "config_sha256": config_digest(config)})
        if self.resumed:
            offset = self.store.continue_run(self.run_id, len(trainer.history))
            self.recorder.wall_start -= offset   # elapsed times continue the earlier processes'
        self.began = True

    def _with_earlier_choices(self, environment: dict) -> dict:
        """A resumed run's settings, where its saved configuration now names what scaletrain chose
        when the run began (the precision `auto` probed): the earlier record of how it was chosen
        is kept for the same value, not replaced by "named"."""
        try:
            earlier = (self.store.get(self.run_id).environment or {}).get("settings") or {}
        except Exception:   # noqa: BLE001 - no earlier record to keep (a run the store never saw)
            return environment
        settings = dict(environment.get("settings") or {})
        for name, entry in settings.items():
            before = earlier.get(name)
            if (isinstance(before, dict) and before.get("chosen") and isinstance(entry, dict)
                    and not entry.get("chosen") and before.get("value") == entry.get("value")):
                settings[name] = before
        return {**environment, "settings": settings}

    def finish(self, summary: dict | None) -> None:
        """summary None: the run's stored summary stays as it was."""
        self.recorder.close()
        self.recorder.guarded(self.store.finish_run, self.run_id, "finished", summary)
        self.store.close()

    def fail(self, exc: BaseException) -> None:
        """Records how the run ended; never raises over the exception being handled."""
        try:
            self.recorder.close()
            if self.began:
                status = ending_status(exc)
                error = None if status == "pruned" else "".join(traceback.format_exception_only(exc)).strip()
                self.store.finish_run(self.run_id, status, error=error)
            self.store.close()
        except Exception:
            pass
