"""The run summary: the headline numbers of a run, as a table and as JSON."""

from __future__ import annotations

import json
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from scaletrain.callbacks import StopAtTarget, Throughput


@dataclass(slots=True)
class RunSummary:
    reached_target: bool | None
    target: float | None
    time_to_target_s: float | None
    best_val_accuracy: float | None     # None where the task reports no accuracy (regression)
    final_val_accuracy: float | None
    images_per_sec: float | None
    warmup_s: float
    train_time_s: float
    eval_time_s: float
    wall_time_s: float
    peak_memory_bytes: int
    peak_memory_kind: str
    precision: str
    device: str
    epochs_run: int
    optimizer_steps: int
    skipped_steps: int
    model: str
    data: str
    batch_size: int
    steps_per_execution: int
    compile: bool
    cuda_graphs: bool
    torch_version: str
    run_dir: str | None
    strategy: str = "single"
    world_size: int = 1
    per_replica_batch_size: int = 0
    grad_accum_steps: int = 1
    restarts: int = 0               # torchrun restarts of the worker group before this attempt finished
    resumed_from: str | None = None
    checkpoints_saved: int = 0
    checkpoint_time_s: float = 0.0     # saving checkpoints, not counted as training time
    # Host time the training loop spent blocked on its loader (part of train_time_s): near zero
    # when the input pipeline keeps up, the input-bound share of training when it does not.
    data_wait_s: float = 0.0
    # The test split, evaluated once after training (validation drove stopping and selection).
    test_accuracy: float | None = None
    test_loss: float | None = None
    task: str = "classification"
    target_metric: str | None = None    # the validation metric `target` refers to (e.g. accuracy)
    target_higher_is_better: bool | None = None   # its direction, as the task states it
    val_metrics: dict | None = None     # the last epoch's validation metrics, by name
    test_metrics: dict | None = None    # every metric of the test split, by name
    run_id: str | None = None       # the run's id in the run store (None when not recorded)
    alloc_retries: int = 0          # CUDA allocator retries during training (memory nearly full)
    job_folders: dict | None = None     # a cloud job's folders in use: name -> "path (VARIABLE)"
    probe_s: float = 0.0            # measuring the settings on the run's own step, before training (training/probe.py)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def device_label(device: torch.device) -> str:
    """The device as the run's start line names it: `cuda:0`, `cpu`; an XLA device with what it
    is (`xla:0 (XLA on a CPU, 4 device(s); not a TPU)`)."""
    return f"{device} ({device_name(device).removeprefix('xla (')}" if device.type == "xla" else str(device)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "xla":   # what ran, honestly named: "XLA on a CPU, 4 device(s); not a TPU"
        from scaletrain.accelerators import xla
        return xla.describe()
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def build_summary(trainer, cfg, wall_time_s: float, run_dir: Path | None = None, restarts: int = 0) -> RunSummary:
    history = trainer.history
    stopper = trainer.callbacks.find(StopAtTarget)
    val_names = [k for k in (history[-1] if history else {}) if k.startswith("val_")]
    throughput = trainer.callbacks.find(Throughput)
    accs = [h["val_accuracy"] for h in history if "val_accuracy" in h]
    last = history[-1] if history else {}
    ips = throughput.steady_state() if throughput else None
    return RunSummary(
        reached_target=(stopper.reached_epoch is not None) if stopper else None,
        target=stopper.target if stopper else None,
        time_to_target_s=stopper.time_to_target_s if stopper else None,
        best_val_accuracy=max(accs) if accs else None,
        final_val_accuracy=accs[-1] if accs else None,
        images_per_sec=ips,
        warmup_s=trainer.warmup_s,
        train_time_s=trainer.clock.total,
        eval_time_s=trainer.eval_time_s,
        wall_time_s=wall_time_s,
        peak_memory_bytes=trainer.peak_memory.read(),
        peak_memory_kind=trainer.peak_memory.kind,
        precision=cfg.precision.policy,
        device=device_name(trainer.device),
        epochs_run=len(history),
        optimizer_steps=last.get("optimizer_steps", 0),
        skipped_steps=last.get("skipped_steps", 0),
        model=cfg.model.name,
        data=cfg.data.name,
        batch_size=trainer.batch.global_batch,
        steps_per_execution=cfg.steps_per_execution,
        compile=bool(trainer.setting("compile")),
        cuda_graphs=trainer.use_graphs,
        torch_version=torch.__version__,
        run_dir=str(run_dir) if run_dir else None,
        strategy=trainer.strategy.name,
        world_size=trainer.strategy.world_size,
        per_replica_batch_size=trainer.batch.per_replica,
        grad_accum_steps=trainer.batch.accum_steps,
        restarts=restarts,
        resumed_from=trainer.resumed_from,
        checkpoints_saved=trainer.checkpointer.saves if trainer.checkpointer else 0,
        checkpoint_time_s=trainer.checkpoint_time_s,
        data_wait_s=sum(h.get("data_wait_s", 0.0) for h in history),
        test_accuracy=trainer.test_logs.get("test_accuracy"),
        test_loss=trainer.test_logs.get("test_loss"),
        task=trainer.task.name if trainer.task is not None else "classification",
        target_metric=stopper.monitor[4:] if stopper else None,
        target_higher_is_better=stopper.higher_is_better if stopper else None,
        val_metrics={k[4:]: history[-1][k] for k in val_names} if history else None,
        test_metrics={k[5:]: v for k, v in trainer.test_logs.items()} or None,
        alloc_retries=trainer.peak_memory.retries(),
    )


LOWER_IS_BETTER = ("loss", "perplexity", "mae")


def _fmt_time(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f} s"


def print_summary(s: RunSummary, console: Console) -> None:
    table = Table(title="Run summary", show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value")
    if s.target is not None:
        lower = (not s.target_higher_is_better if s.target_higher_is_better is not None
                 else s.target_metric in LOWER_IS_BETTER)   # summaries written before it was recorded
        relation = "<=" if lower else ">="
        table.add_row("reached target", f"{'yes' if s.reached_target else 'no'} "
                                        f"(val {s.target_metric} {relation} {s.target:g})")
        table.add_row("time to target", _fmt_time(s.time_to_target_s) + " (training time, evaluation excluded)")
    if s.best_val_accuracy is not None:
        table.add_row("best val accuracy", f"{s.best_val_accuracy:.4f}")
    for name, value in (s.val_metrics or {}).items():
        if name != "accuracy":
            table.add_row(f"final val {name}", f"{value:.4f}")
    for name, value in (s.test_metrics or {}).items():
        table.add_row(f"test {name} (once, at the end)", f"{value:.4f}")
    table.add_row("images/sec (steady state)", "-" if s.images_per_sec is None else f"{s.images_per_sec:,.0f}")
    table.add_row("training time", _fmt_time(s.train_time_s))
    waited = f" ({s.data_wait_s / s.train_time_s:.0%} of training time)" if s.train_time_s else ""
    table.add_row("waiting for data", _fmt_time(s.data_wait_s) + waited)
    table.add_row("evaluation time", _fmt_time(s.eval_time_s))
    if s.checkpoints_saved:
        table.add_row("checkpoint time", f"{_fmt_time(s.checkpoint_time_s)} ({s.checkpoints_saved} saved)")
    table.add_row("compile / warm-up", _fmt_time(s.warmup_s))
    if s.probe_s:
        table.add_row("probing the settings", _fmt_time(s.probe_s) + " (before training; in time to target)")
    table.add_row("peak memory", f"{s.peak_memory_bytes / 2**20:,.1f} MiB ({s.peak_memory_kind})")
    if s.alloc_retries:
        table.add_row("allocator retries", f"{s.alloc_retries} (memory nearly full: each one stalled a step)")
    table.add_row("precision", s.precision)
    table.add_row("strategy", f"{s.strategy} x {s.world_size} (per-replica batch {s.per_replica_batch_size})")
    if s.restarts or s.resumed_from:
        table.add_row("restarts / resumed from", f"{s.restarts} / {s.resumed_from or '-'}")
    table.add_row("skipped steps (fp16 overflow)", str(s.skipped_steps))
    table.add_row("epochs run", str(s.epochs_run))
    table.add_row("device", s.device)
    if s.run_id:
        table.add_row("run id", f"{s.run_id} (scaletrain runs show {s.run_id})")
    for name, where in (s.job_folders or {}).items():
        table.add_row(f"job {name.replace('_', ' ')}", where)
    console.print(table)
