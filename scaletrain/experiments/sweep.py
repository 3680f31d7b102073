"""`scaletrain sweep batch-size`: seed 003's lab as one command. Each (batch size, repeat) is
its own training process and its own run in the store; a point that crashes or runs out of
memory is recorded as failed and the sweep goes on. Results: a CSV per run, a CSV per batch size
(median, min, max, mean, std over the repeats), and PNG plots of throughput and time to accuracy
against batch size with the spread as error bars."""

from __future__ import annotations

import copy
import csv
import math
import statistics
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from scaletrain.config import TrainConfig
from scaletrain.console import make_console
from scaletrain.errors import UserError
from scaletrain.experiments.jobs import settle, training_job
from scaletrain.experiments.slots import Finished, SlotPool, device_slots
from scaletrain.tracking.store import RunStore

LR_SCALINGS = ("none", "linear", "sqrt")


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserError(f"batch sizes '{text}': write a comma-separated list of integers, e.g. 8,16,32,64") from None
    if not sizes or any(s < 1 for s in sizes):
        raise UserError(f"batch sizes '{text}': give at least one size, every size at least 1")
    if len(set(sizes)) != len(sizes):
        raise UserError(f"batch sizes '{text}' repeat a size; use --repeats for repeated measurements")
    return sizes


def scaled_lr(base_lr: float, base_batch: int, batch: int, rule: str) -> float:
    """The learning rate for `batch` when `base_lr` suits `base_batch` (Goyal et al.'s linear
    rule, or the square-root rule that suits adaptive optimisers better)."""
    ratio = batch / base_batch
    return base_lr * {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[rule]


@dataclass(slots=True)
class PointResult:
    batch_size: int
    repeat: int
    seed: int
    lr: float
    run_id: str
    status: str
    images_per_sec: float | None = None
    time_to_target_s: float | None = None
    reached_target: bool | None = None
    best_val_accuracy: float | None = None
    val_metric: str | None = None       # the task's metric shown (the target's, else accuracy, else loss)
    final_val: float | None = None      # its value after the last epoch
    epochs_run: int | None = None
    train_time_s: float | None = None
    wall_time_s: float | None = None
    peak_memory_bytes: int | None = None
    error: str | None = None


def shown_metric(summary: dict) -> tuple[str | None, float | None]:
    """The validation metric a table shows for a finished run's summary: the one its target was
    on, else the task's own target metric (accuracy, r2, perplexity); with its last value."""
    from scaletrain.tasks import TASKS
    metrics = summary.get("val_metrics") or {}
    default = TASKS[summary["task"]].default_target if summary.get("task") in TASKS else "loss"
    name = next((m for m in (summary.get("target_metric"), default, "loss") if m in metrics), None)
    return name, metrics.get(name) if name else None


def _spread(values: list[float]) -> dict:
    if not values:
        return {"median": None, "min": None, "max": None, "mean": None, "std": None}
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}


class BatchSizeSweep:
    def __init__(self, base: TrainConfig, sizes: list[int], repeats: int, lr_scaling: str, out: Path,
                 parallel: int = 1, console: Console | None = None):
        if repeats < 1:
            raise UserError(f"--repeats must be at least 1 (got {repeats})")
        if parallel < 1:
            raise UserError(f"--parallel must be at least 1 (got {parallel})")
        if lr_scaling not in LR_SCALINGS:
            raise UserError(f"--lr-scaling must be one of {', '.join(LR_SCALINGS)} (got {lr_scaling!r})")
        self.base, self.sizes, self.repeats, self.lr_scaling = base, sizes, repeats, lr_scaling
        self.out, self.parallel = Path(out), parallel
        self.console = console or make_console()
        self.group = f"sweep-{self.out.name}"
        self.results: list[PointResult] = []

    def _jobs(self):
        # Repeat-major order: every size once, then again, so slow drift of the machine spreads
        # over all sizes instead of biasing the last ones.
        for repeat in range(self.repeats):
            for size in self.sizes:
                cfg = copy.deepcopy(self.base)
                cfg.batch_size = size
                cfg.seed = self.base.seed + repeat
                cfg.optim.lr = scaled_lr(self.base.optim.lr, self.base.batch_size, size, self.lr_scaling)
                yield training_job(cfg, f"bs{size:05d}-r{repeat + 1}", self.out / "points", self.group,
                                   payload=(size, repeat))

    def run(self) -> list[PointResult]:
        self.out.mkdir(parents=True, exist_ok=True)
        store = RunStore(self.base.tracking.store)
        jobs = list(self._jobs())
        self.console.print(f"sweep: {len(self.sizes)} batch sizes x {self.repeats} repeat(s) = {len(jobs)} runs, "
                           f"lr scaling {self.lr_scaling}, group {self.group}, results in {self.out}", soft_wrap=True)

        def done(finished: Finished) -> None:
            cfg, (size, repeat) = finished.job.payload
            record = settle(store, finished)
            s = record.summary or {}
            result = PointResult(batch_size=size, repeat=repeat + 1, seed=cfg.seed, lr=cfg.optim.lr, run_id=record.id,
                                 status=record.status, error=record.error,
                                 **{k: s.get(k) for k in ("images_per_sec", "time_to_target_s", "reached_target",
                                                          "best_val_accuracy", "epochs_run", "train_time_s",
                                                          "wall_time_s", "peak_memory_bytes")})
            result.val_metric, result.final_val = shown_metric(s)
            self.results.append(result)
            shown = (f"{result.images_per_sec:,.0f} img/s, val {result.val_metric} {result.final_val:.4f}"
                     if record.status == "finished" and result.final_val is not None
                     else f"{record.status}: {record.error or ''}")
            self.console.print(f"  batch {size:>5} repeat {repeat + 1}: {shown} (run {record.id}, "
                               f"{finished.seconds:.1f} s)", soft_wrap=True)
            self.write_csv()  # after every point: an interrupted sweep keeps what it measured

        try:
            SlotPool(device_slots(self.parallel, self.base.device)).run_all(jobs, on_done=done)
        finally:
            store.close()
        self.write_csv()
        return self.results

    # -- results ------------------------------------------------------------------------------

    def per_size(self) -> list[dict]:
        rows = []
        for size in self.sizes:
            points = [r for r in self.results if r.batch_size == size]
            ok = [r for r in points if r.status == "finished"]
            ips = _spread([r.images_per_sec for r in ok if r.images_per_sec is not None])
            ttt = _spread([r.time_to_target_s for r in ok if r.time_to_target_s is not None])
            row = {"batch_size": size, "runs": len(points), "finished": len(ok),
                   "reached_target": sum(1 for r in ok if r.reached_target)}
            row.update({f"images_per_sec_{k}": v for k, v in ips.items()})
            row.update({f"time_to_target_s_{k}": v for k, v in ttt.items()})
            row["best_val_accuracy_median"] = _spread([r.best_val_accuracy for r in ok
                                                       if r.best_val_accuracy is not None])["median"]
            row["final_val_median"] = _spread([r.final_val for r in ok if r.final_val is not None])["median"]
            failures = Counter(f"{r.status}: {r.error}" for r in points if r.status != "finished")
            row["failures"] = "; ".join(f"{n}x {text}" if n > 1 else text for text, n in failures.items())
            rows.append(row)
        return rows

    def write_csv(self) -> None:
        points = sorted(self.results, key=lambda r: (r.batch_size, r.repeat))
        with (self.out / "points.csv").open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(PointResult.__dataclass_fields__))
            writer.writeheader()
            writer.writerows(asdict(r) for r in points)
        rows = self.per_size()
        with (self.out / "summary.csv").open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)

    def write_plots(self) -> list[Path]:
        from scaletrain.reports.figures import new_figure, style, to_png
        rows, written = self.per_size(), []
        has_target = self.base.target is not None
        plots = [("images_per_sec", "throughput.png", "Training throughput against batch size", "images/sec")]
        if has_target:
            plots.append(("time_to_target_s", "time_to_accuracy.png",
                          f"Time to validation {self.base.target_metric} {self.base.target:g} against batch size",
                          "time to target (s, training only)"))
        for key, filename, title, ylabel in plots:
            measured = [r for r in rows if r[f"{key}_median"] is not None]
            figure, axes = new_figure(7.0, 4.2)
            if measured:
                x = [r["batch_size"] for r in measured]
                median = [r[f"{key}_median"] for r in measured]
                low = [m - r[f"{key}_min"] for m, r in zip(median, measured, strict=True)]
                high = [r[f"{key}_max"] - m for m, r in zip(median, measured, strict=True)]
                axes.errorbar(x, median, yerr=[low, high], marker="o", capsize=4,
                              label=f"median, bars min-max over {self.repeats} repeat(s)")
            for r in rows:
                if r[f"{key}_median"] is None:  # a size with no measurement: marked on the axis
                    axes.axvline(r["batch_size"], color="#d62728", linestyle=":", linewidth=1)
            axes.set_xscale("log", base=2)
            axes.set_xticks([r["batch_size"] for r in rows], [str(r["batch_size"]) for r in rows])
            style(axes, title + ("  (red dotted: no result)" if len(measured) < len(rows) else ""),
                  "batch size", ylabel)
            to_png(figure, self.out / filename)
            written.append(self.out / filename)
        return written

    def table(self) -> Table:
        table = Table(title=f"Batch-size sweep ({self.repeats} repeat(s); median [min-max])")
        metric = next((r.val_metric for r in self.results if r.val_metric), "accuracy")
        for header in ("batch", "finished", "images/sec", "time to target", f"final val {metric}", "failures"):
            table.add_column(header, justify="left" if header == "failures" else "right")

        def spread(row, key, fmt):
            if row[f"{key}_median"] is None:
                return "-"
            return f"{fmt(row[key + '_median'])} [{fmt(row[key + '_min'])}-{fmt(row[key + '_max'])}]"
        for row in self.per_size():
            table.add_row(str(row["batch_size"]), f"{row['finished']}/{row['runs']}",
                          spread(row, "images_per_sec", lambda v: f"{v:,.0f}"),
                          spread(row, "time_to_target_s", lambda v: f"{v:.2f} s"),
                          "-" if row["final_val_median"] is None else f"{row['final_val_median']:.4f}",
                          row["failures"][:120])
        return table
