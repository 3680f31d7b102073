"""Side-by-side views of recorded runs: the numbers seed 001's dashboard and seed 003's lab
compare (time, time to target, best accuracy, images/sec, peak memory, precision, batch size)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from rich.table import Table
from rich.text import Text

from scaletrain.memory.units import format_bytes
from scaletrain.tracking.store import RunRecord


def _config(record: RunRecord, dotted: str):
    value = record.config
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _seconds(value) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _time_to_target(record: RunRecord) -> str:
    target = record.summary_value("target", record.summary_value("target_accuracy"))  # older runs: target_accuracy
    if target is None:
        return "-"
    reached = record.summary_value("time_to_target_s")
    return f"{reached:.2f} s" if reached is not None else f"not reached ({target:g})"


@dataclass(frozen=True, slots=True)
class Column:
    header: str
    value: Callable[[RunRecord], object]          # the raw value (JSON output, best-of marking)
    text: Callable[[RunRecord], str]              # how the table shows it
    better: str | None = None                     # "min" or "max": the best run's cell is highlighted


def _formatted(record: RunRecord, key: str, spec: str) -> str:
    """A summary number as the table shows it; "-" where the run has none (no summary yet, a task
    without accuracy)."""
    value = record.summary_value(key)
    return "-" if value is None else format(value, spec)


COLUMNS = [
    Column("run", lambda r: r.id, lambda r: r.id),
    Column("status", lambda r: r.display_status, lambda r: r.display_status),
    Column("model", lambda r: _config(r, "model.name"), lambda r: str(_config(r, "model.name") or "-")),
    Column("data", lambda r: _config(r, "data.name"), lambda r: str(_config(r, "data.name") or "-")),
    Column("precision", lambda r: r.summary_value("precision", _config(r, "precision.policy")),
           lambda r: str(r.summary_value("precision", _config(r, "precision.policy")) or "-") + _how_chosen(r)),
    Column("batch", lambda r: r.summary_value("batch_size", _config(r, "batch_size")),
           lambda r: str(r.summary_value("batch_size", _config(r, "batch_size")) or "-")),
    Column("epochs", lambda r: r.summary_value("epochs_run"), lambda r: str(r.summary_value("epochs_run", "-"))),
    Column("train time", lambda r: r.summary_value("train_time_s"), lambda r: _seconds(r.summary_value("train_time_s")),
           better="min"),
    Column("wall time", lambda r: r.summary_value("wall_time_s"), lambda r: _seconds(r.summary_value("wall_time_s")),
           better="min"),
    Column("time to target", lambda r: r.summary_value("time_to_target_s"), _time_to_target, better="min"),
    Column("best acc", lambda r: r.summary_value("best_val_accuracy"),
           lambda r: _formatted(r, "best_val_accuracy", ".4f"), better="max"),
    Column("test acc", lambda r: r.summary_value("test_accuracy"), lambda r: _formatted(r, "test_accuracy", ".4f"),
           better="max"),
    Column("images/sec", lambda r: r.summary_value("images_per_sec"), lambda r: _formatted(r, "images_per_sec", ",.0f"),
           better="max"),
    Column("peak memory", lambda r: r.summary_value("peak_memory_bytes"),
           lambda r: "-" if r.summary_value("peak_memory_bytes") is None
           else format_bytes(r.summary_value("peak_memory_bytes")), better="min"),
    Column("device", lambda r: r.environment.get("device"), lambda r: str(r.environment.get("device", "-"))),
    Column("settings", lambda r: _settings(r), lambda r: _settings(r) or "-"),
]


def _how_chosen(record: RunRecord) -> str:
    """How the precision was chosen, where scaletrain chose it: ` (probed: 1.62x fp32, 3 rounds)`
    for one measured on the run's own step (training/probe.py), ` (cached: ...)` for one a run
    before measured, ` (auto)` for the rule; nothing where the configuration named it."""
    entry = (record.environment.get("settings") or {}).get("precision")
    chosen = entry.get("chosen") if isinstance(entry, dict) else None
    if not isinstance(chosen, str) or not chosen:
        return ""
    measured = entry.get("measured") or {}
    winner = (measured.get("candidates") or {}).get(entry.get("value")) if isinstance(measured, dict) else None
    how = "cached" if chosen.startswith("cached") else "probed"
    if isinstance(winner, dict) and winner.get("ratios"):
        ratios = sorted(winner["ratios"])
        return f" ({how}: {ratios[len(ratios) // 2]:.2f}x {measured.get('reference')}, {len(ratios)} rounds)"
    if "probed" in chosen.replace("not probed", ""):
        return f" ({how}: kept)"
    return " (auto)"


def _settings(record: RunRecord) -> str | None:
    """What the run computed with besides its precision (training/defaults.py's settings as its
    record keeps them): `channels_last on, threads 1 (auto)`; runs recorded before had none."""
    settings = record.environment.get("settings")
    if not isinstance(settings, dict):
        return None
    parts = []
    for name, entry in settings.items():
        if name == "precision" or not isinstance(entry, dict):
            continue
        value = {True: "on", False: "off"}.get(entry.get("value"), entry.get("value")) \
            if isinstance(entry.get("value"), bool) else entry.get("value")
        chosen = entry.get("chosen") or ""
        parts.append(f"{name} {value}" + (" (auto)" if chosen.startswith("auto") else ""))
    return ", ".join(parts) or None


def _split_metric(record: RunRecord, split: str, name: str):
    return (record.summary_value(f"{split}_metrics") or {}).get(name)


def task_columns(records: list[RunRecord]) -> list[Column]:
    """A row per metric the runs' tasks report besides accuracy (loss, r2, mae, perplexity), on
    the last validation epoch and on the test split: a regression or language model compares by
    its own figures."""
    names = sorted({name for r in records for split in ("val", "test")
                    for name in (r.summary_value(f"{split}_metrics") or {}) if name != "accuracy"})
    columns = []
    for name in names:
        for split, label in (("val", "final val"), ("test", "test")):
            columns.append(Column(f"{label} {name}", lambda r, s=split, n=name: _split_metric(r, s, n),
                                  lambda r, s=split, n=name: "-" if _split_metric(r, s, n) is None
                                  else f"{_split_metric(r, s, n):.4f}"))
    return columns


def _columns(records: list[RunRecord]) -> list[Column]:
    at = next(i for i, c in enumerate(COLUMNS) if c.header == "test acc") + 1
    return [*COLUMNS[:at], *task_columns(records), *COLUMNS[at:]]


def compare_values(records: list[RunRecord]) -> list[dict]:
    """The comparison as plain values, one dict per run (for --json)."""
    columns = _columns(records)
    return [{c.header: c.value(r) for c in columns} for r in records]


def _best(records: list[RunRecord], column: Column) -> set[str]:
    values = [(column.value(r), r.id) for r in records if isinstance(column.value(r), (int, float))]
    if len(values) < 2 or column.better is None:
        return set()
    pick = min if column.better == "min" else max
    best = pick(v for v, _ in values)
    return {run_id for v, run_id in values if v == best}


def compare_table(records: list[RunRecord]) -> Table:
    """Runs as columns, metrics as rows (side by side, as in a lab notebook); the best value of
    each comparable metric in bold green."""
    table = Table(title=f"{len(records)} runs compared")
    table.add_column("", style="bold")
    for record in records:
        table.add_column(record.id, justify="right")
    for column in _columns(records)[1:]:
        best = _best(records, column)
        table.add_row(column.header, *[Text(column.text(r), style="bold green" if r.id in best else "")
                                       for r in records])
    return table


def list_table(records: list[RunRecord]) -> Table:
    table = Table(title=f"{len(records)} runs")
    for header in ("run", "created", "status", "group", "model", "data", "precision", "batch", "best acc",
                   "train time", "images/sec"):
        numeric = header in ("batch", "best acc", "train time", "images/sec")
        table.add_column(header, justify="right" if numeric else "left")
    by_header = {c.header: c for c in COLUMNS}
    for r in records:
        table.add_row(r.id, datetime.fromtimestamp(r.created_at).strftime("%Y-%m-%d %H:%M:%S"), r.display_status,
                      r.group or "-", *[by_header[h].text(r) for h in ("model", "data", "precision", "batch",
                                                                       "best acc", "train time", "images/sec")])
    return table
