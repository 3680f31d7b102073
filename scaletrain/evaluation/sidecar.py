"""A sidecar evaluator (seed 002's *evaluator* task): evaluates each newly committed checkpoint of
a run on one device while the run trains, so evaluation never stalls the training processes.

It only reads what training writes (the run's config, committed checkpoints, its status) and
writes its own results: `<run>/evaluations.jsonl` and the run store's `evaluations` table. It
never takes the run folder's lock, so starting, killing or restarting it cannot disturb training;
a restarted evaluator continues after the last checkpoint it recorded. Checkpoints reshard: one
device loads what any layout saved. It stops once the run is no longer running and every
checkpoint committed before that has been evaluated.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from scaletrain.checkpoint.checkpointer import load_model_weights
from scaletrain.checkpoint.store import CheckpointStore
from scaletrain.config import DistributedConfig, TrainConfig
from scaletrain.errors import UserError
from scaletrain.lifecycle import RunFolder, checkpoint_store
from scaletrain.lifecycle.folder import EVALUATIONS
from scaletrain.lifecycle.lock import LOCK_FILE
from scaletrain.options import from_mapping
from scaletrain.tracking.store import RunStore, process_alive
from scaletrain.training import build_training


@dataclass(slots=True)
class Evaluation:
    step: int
    epoch: float      # epochs trained: 1.0 is the end of the first (metrics.jsonl's "epoch": 1)
    metrics: dict     # val_loss, val_accuracy, ... as the training loop names them
    eval_time_s: float

    def to_json(self) -> str:
        return json.dumps({"step": self.step, "epoch": self.epoch,
                           **self.metrics, "eval_time_s": self.eval_time_s})


def read_evaluations(folder: Path) -> list[dict]:
    """The results recorded so far; a last line cut off by a kill mid-write is left out."""
    file = folder / EVALUATIONS
    if not file.is_file():
        return []
    out = []
    for line in file.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


class SidecarEvaluator:
    def __init__(self, run_dir: str | Path, device: str | None = None, store: str | None = None,
                 console: Console | None = None):
        self.folder = RunFolder(run_dir)
        config = self.folder.trusted_config() if self.folder.holds_run() else None
        if config is None:
            raise UserError(f"{run_dir} holds no run (no config.json); pass the --run-dir of a training that has "
                            "started")
        cfg = from_mapping(TrainConfig, config)
        self.checkpoints: CheckpointStore = checkpoint_store(cfg, self.folder)
        # One process, one device, the run's own model, data and precision; nothing compiled.
        cfg.distributed = DistributedConfig(strategy="single")
        cfg.compile, cfg.cuda_graphs, cfg.steps_per_execution = False, False, 1
        cfg.device = device or cfg.device
        # The store the run is recorded in (relative paths from where the evaluator runs), if any.
        self.store_path = store if store is not None else (cfg.tracking.store if cfg.tracking.record else None)
        self.console = console or Console()
        self.built = build_training(cfg)
        dataset = self.built.dataset
        self.split = "val" if dataset.val is not None or not dataset.test_held_out else "test"
        self.done = {e["step"] for e in read_evaluations(self.folder.path)}

    def close(self) -> None:
        self.built.close()

    def __enter__(self) -> SidecarEvaluator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def pending(self) -> list[Path]:
        return [p for p in self.checkpoints.complete() if CheckpointStore.step_of(p) not in self.done]

    def evaluate(self, path: Path) -> Evaluation:
        trainer, dataset = self.built.trainer, self.built.dataset
        started = time.perf_counter()
        load_model_weights(path, trainer.model)
        logs = trainer.evaluate(dataset, self.split)
        meta = CheckpointStore.read_meta(path)
        return Evaluation(step=meta["global_step"], epoch=round(meta["global_step"] / meta["steps_per_epoch"], 4),
                          metrics={f"val_{k}": v for k, v in logs.items()},
                          eval_time_s=time.perf_counter() - started)

    def record(self, result: Evaluation) -> None:
        # The store first, the results file last: its line is what marks the step done for a
        # restarted evaluator, so a kill between the two leaves the step undone, and evaluating it
        # again replaces the store's row (keyed by run and step) instead of leaving the store without it.
        if self.store_path and self.folder.run_id:
            with RunStore(self.store_path) as store:
                if store.exists(self.folder.run_id):
                    store.log_evaluation(self.folder.run_id, result.step, result.epoch,
                                         {**result.metrics, "eval_time_s": result.eval_time_s})
        file = self.folder.path / EVALUATIONS
        text = file.read_text() if file.is_file() else ""
        with open(file, "a") as out:
            if text and not text.endswith("\n"):
                out.write("\n")   # a line cut off by a kill: the next result starts its own line
            out.write(result.to_json() + "\n")
            out.flush()
            os.fsync(out.fileno())
        self.done.add(result.step)

    def _evaluate_pending(self) -> int:
        count = 0
        for path in self.pending():
            try:
                result = self.evaluate(path)
            except (OSError, UserError, RuntimeError) as exc:
                # Pruning takes the marker away first, then the files: a folder still there without
                # its marker is being removed, not damaged.
                if CheckpointStore.is_complete(path):
                    raise
                # Pruned by the training (it keeps its newest few) before or while it was read.
                self.console.print(f"evaluator: skipped {path.name}: removed by the training before it was read "
                                   f"({type(exc).__name__})")
                continue
            self.record(result)
            count += 1
            shown = ", ".join(f"{k} {v:.4g}" for k, v in result.metrics.items() if isinstance(v, float))
            self.console.print(f"evaluator: step {result.step} (epoch {result.epoch:g}): {shown} "
                               f"[{result.eval_time_s:.2f} s]", soft_wrap=True)
        return count

    def _training_gone(self) -> bool:
        """The folder's lock names a process of this host that no longer exists (a killed training
        leaves its status 'running')."""
        try:
            host, pid = (self.folder.path / LOCK_FILE).read_text().split()
        except (OSError, ValueError):
            return False
        return host == socket.gethostname() and not process_alive(int(pid))

    def watch(self, poll_s: float = 2.0, once: bool = False, gone_grace_s: float = 120.0) -> int:
        """Evaluates checkpoints as they come until the run ends; returns how many it evaluated."""
        count, gone_since = 0, None
        while True:
            # Read the status first: checkpoints committed before the run ended are then all listed.
            running = self.folder.status == "running"
            count += self._evaluate_pending()
            if once or not running:
                return count
            gone_since = (gone_since or time.monotonic()) if self._training_gone() else None
            if gone_since is not None and time.monotonic() - gone_since > gone_grace_s:
                self.console.print(f"evaluator: the training of {self.folder} is gone (its status still says running); "
                                   "stopping. Start the evaluator again beside the resumed run.")
                return count
            time.sleep(poll_s)
