"""`scaletrain runs report`: one self-contained HTML file (inline SVG plots, inline CSS, no
scripts, nothing fetched) that opens offline in any browser. Plots: accuracy and loss against
wall time, throughput, memory over time, throughput against peak memory (an autotune's choice
starred), and seed 001's training-time-vs-loss scatter."""

from __future__ import annotations

import html
from datetime import datetime
from pathlib import Path

from scaletrain.options import flatten_mapping
from scaletrain.reports.compare import COLUMNS
from scaletrain.reports.figures import colour, new_figure, style, to_svg
from scaletrain.tracking.store import RunRecord, RunStore

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
table { border-collapse: collapse; font-size: 0.9em; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; white-space: nowrap; }
.plots { display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr)); gap: 1em; }
.plot svg { width: 100%; height: auto; }
.swatch { display: inline-block; width: 0.8em; height: 0.8em; margin-right: 0.4em; }
.muted { color: #777; font-size: 0.85em; }
"""


IGNORED_DIFFERENCES = ("tracking.", "run_dir", "progress", "summary_json")


def varying_keys(records: list[RunRecord], most: int = 3) -> list[str]:
    """The config keys whose values differ between the runs: what tells the lines apart."""
    flat = [flatten_mapping(r.config) for r in records]
    keys = sorted({k for f in flat for k in f if not k.startswith(IGNORED_DIFFERENCES)})
    varying = [k for k in keys if len({repr(f.get(k)) for f in flat}) > 1]
    return varying[:most]


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class RunData:
    """A run with its epochs and samples, loaded once for all the plots."""

    def __init__(self, store: RunStore, record: RunRecord, index: int, label_keys: list[str]):
        self.record, self.colour = record, colour(index)
        self.chosen = store.chosen(record.group) == record.id     # an experiment's pick (autotune's best)
        self.epochs = store.epochs(record.id)
        self.samples = store.samples(record.id)
        flat = flatten_mapping(record.config)
        self.label = " ".join([record.id] + [f"{k.split('.')[-1]}={_short(flat.get(k))}" for k in label_keys]) \
            if label_keys else f"{record.id} {record.name or ''}".strip()

    def series(self, key: str) -> tuple[list[float], list[float]]:
        points = [(e["elapsed_s"], e[key]) for e in self.epochs if e.get(key) is not None]
        return [p[0] for p in points], [p[1] for p in points]


def _figure(runs: list[RunData]):
    # Room for a legend beside the plot once there are more runs than fit inside it.
    return new_figure(9.5 if len(runs) > 4 else 7.0, 3.8)


def _accuracy(runs: list[RunData]) -> str:
    figure, axes = _figure(runs)
    for run in runs:
        x, y = run.series("val_accuracy")
        axes.plot(x, y, marker="o", markersize=3, color=run.colour, label=run.label)
    style(axes, "Validation accuracy against wall time", "wall time since start (s)", "validation accuracy")
    return to_svg(figure)


def _loss(runs: list[RunData]) -> str:
    figure, axes = _figure(runs)
    for run in runs:
        x, y = run.series("train_loss")
        axes.plot(x, y, color=run.colour, label=run.label)
        x, y = run.series("val_loss")
        axes.plot(x, y, color=run.colour, linestyle="--")
    style(axes, "Loss against wall time (solid: training, dashed: validation)", "wall time since start (s)", "loss")
    axes.set_yscale("log")
    return to_svg(figure)


def _throughput(runs: list[RunData]) -> str:
    figure, axes = _figure(runs)
    for run in runs:
        points = [(e["epoch"] + 1, e["images_per_sec"]) for e in run.epochs if e.get("images_per_sec")]
        if points:
            axes.plot(*zip(*points, strict=True), marker="o", markersize=3, color=run.colour, label=run.label)
    style(axes, "Training throughput per epoch (epoch 1 includes warm-up)", "epoch", "images/sec")
    return to_svg(figure)


def _memory(runs: list[RunData]) -> str:
    figure, axes = _figure(runs)
    for run in runs:
        gpu = [(s.elapsed_s, s.gpu_memory_bytes / 2**20) for s in run.samples if s.gpu_memory_bytes is not None]
        rss = [(s.elapsed_s, s.rss_bytes / 2**20) for s in run.samples if s.rss_bytes is not None]
        points, what = (gpu, "GPU memory used") if gpu else (rss, "process RSS")
        if points:
            axes.plot(*zip(*points, strict=True), marker=".", color=run.colour, label=run.label)
        peak = run.record.summary_value("peak_memory_bytes")
        if peak:
            axes.axhline(peak / 2**20, color=run.colour, linestyle=":", linewidth=1)
    kinds = {"GPU memory used" if any(s.gpu_memory_bytes is not None for s in run.samples) else "process RSS"
             for run in runs if run.samples}
    style(axes, f"Memory during training: {' / '.join(sorted(kinds)) or 'no samples'} (dotted: reported peak)",
          "wall time since start (s)", "MiB")
    return to_svg(figure)


def _time_vs_loss(runs: list[RunData]) -> str:
    figure, axes = _figure(runs)
    for run in runs:
        time_s = run.record.summary_value("train_time_s")
        losses = [e["val_loss"] for e in run.epochs if e.get("val_loss") is not None]
        if time_s is None or not losses:
            continue
        axes.scatter([time_s], [losses[-1]], color=run.colour, s=50, label=run.label, zorder=3)
        if len(runs) <= 12:
            axes.annotate(run.record.id, (time_s, losses[-1]), textcoords="offset points", xytext=(5, 5), fontsize=8)
    style(axes, "Training time against final validation loss (seed 001's scatter)", "training time (s)",
          "final validation loss")
    return to_svg(figure)


def _speed_memory(runs: list[RunData]) -> str | None:
    """Throughput against peak memory, one point per run; the run an experiment chose (autotune's
    best among its candidates) starred."""
    points = [(run, run.record.summary_value("images_per_sec"), run.record.summary_value("peak_memory_bytes"))
              for run in runs]
    points = [(run, speed, peak / 2**20) for run, speed, peak in points if speed and peak]
    if not points:
        return None
    figure, axes = _figure(runs)
    for run, speed, mib in points:
        axes.scatter([mib], [speed], color=run.colour, s=220 if run.chosen else 40, marker="*" if run.chosen else "o",
                     label=run.label + (" (chosen)" if run.chosen else ""), zorder=3 if run.chosen else 2)
    style(axes, "Throughput against peak memory (star: the run an autotune chose)", "peak memory (MiB)",
          "images/sec")
    return to_svg(figure)


def _staleness(runs: list[RunData]) -> str | None:
    """Parameter-server runs: how stale the applied gradients were (seed 002), over all epochs."""
    figure, axes = None, None
    for run in runs:
        counts = [e["ps_staleness_counts"] for e in run.epochs if isinstance(e.get("ps_staleness_counts"), list)]
        total = [sum(column) for column in zip(*counts, strict=True)]
        if not sum(total):
            continue
        if figure is None:
            figure, axes = _figure(runs)
        last = len(total) - 1
        axes.step(range(len(total)), [n / sum(total) for n in total], where="mid", color=run.colour, label=run.label)
        axes.set_xticks(range(0, len(total), 2), [str(k) if k < last else f"{k}+" for k in range(0, len(total), 2)])
    if figure is None:
        return None
    style(axes, "Staleness of the applied gradients (parameter servers)", "updates applied since the gradient's "
          "parameters", "fraction of applied gradients")
    return to_svg(figure)


PLOTS = [_accuracy, _loss, _throughput, _memory, _speed_memory, _time_vs_loss, _staleness]


def _table(runs: list[RunData]) -> str:
    head = "".join(f"<th>{html.escape(c.header)}</th>" for c in COLUMNS)
    rows = []
    for run in runs:
        cells = [f'<td><span class="swatch" style="background:{run.colour}"></span>{html.escape(run.record.id)}</td>']
        cells += [f"<td>{html.escape(c.text(run.record))}</td>" for c in COLUMNS[1:]]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _environments(runs: list[RunData]) -> str:
    rows = []
    for run in runs:
        env = run.record.environment
        git = env.get("git") or {}
        commit = (git.get("commit", "")[:12] + (" (dirty)" if git.get("dirty") else "")) if git else "-"
        values = [run.record.id, env.get("device", "-"), env.get("torch", "-"), env.get("cuda") or "-",
                  env.get("driver") or "-", env.get("host", "-"), env.get("scaletrain", "-"), commit,
                  run.record.error or ""]
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in values) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("run", "device", "torch", "CUDA", "driver", "host", "scaletrain",
                                              "git commit", "error"))
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def render_report(store: RunStore, records: list[RunRecord], title: str = "scaletrain runs") -> str:
    keys = varying_keys(records)
    runs = [RunData(store, record, i, keys) for i, record in enumerate(records)]
    figures = (plot(runs) for plot in PLOTS)
    plots = "".join(f'<div class="plot">{svg}</div>' for svg in figures if svg)
    stamp = datetime.now().strftime("%Y-%m-%d %H:%M")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>"
            f'<p class="muted">{len(runs)} runs from {html.escape(str(store.path))}, generated {stamp}. '
            "Times are training time with evaluation excluded unless marked wall time.</p>"
            f"<h2>Comparison</h2>{_table(runs)}<h2>Plots</h2><div class=\"plots\">{plots}</div>"
            f"<h2>Environment</h2>{_environments(runs)}</body></html>\n")


def write_report(store: RunStore, records: list[RunRecord], out: str | Path, title: str = "scaletrain runs") -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(render_report(store, records, title), encoding="utf-8")
    tmp.replace(out)
    return out
