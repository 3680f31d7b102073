"""Matplotlib figures of recorded runs, drawn without pyplot (no global state, no display
backend), for the HTML report and the sweep's PNG plots. Matplotlib is an optional extra:
`pip install 'scaletrain[report]'`."""

from __future__ import annotations

import io

from scaletrain.errors import UserError

# tab10 then the lighter half of tab20: distinguishable, and the same run keeps the same colour in
# every plot of a report. Beyond 20 runs colours repeat and the legends are left out (the table's
# swatches still name each line).
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94",
           "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5"]
MAX_LEGEND_ENTRIES = len(PALETTE)


def new_figure(width: float = 7.0, height: float = 3.6):
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise UserError("plots need matplotlib: pip install 'scaletrain[report]'") from None
    figure = Figure(figsize=(width, height), layout="constrained")
    return figure, figure.add_subplot()


def colour(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def to_svg(figure) -> str:
    """The figure as an inline <svg> element (text drawn as paths: no font needed to view it)."""
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg")
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def to_png(figure, path, dpi: int = 120) -> None:
    figure.savefig(path, format="png", dpi=dpi)


def style(axes, title: str, xlabel: str, ylabel: str, legend: bool = True) -> None:
    axes.set_title(title, fontsize="medium")
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(True, alpha=0.3)
    handles, labels = axes.get_legend_handles_labels()
    if not legend or not handles or len(handles) > MAX_LEGEND_ENTRIES:
        return
    if len(handles) <= 4:
        axes.legend(fontsize="small")
    else:  # many runs: beside the plot, not over the data
        axes.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
