"""Matplotlib figures of recorded runs, drawn without pyplot (no global state, no display
backend), for the HTML report and the sweep's PNG plots. Matplotlib is an optional extra:
`pip install 'scaletrain[report]'`."""

from __future__ import annotations

import io

from scaletrain.errors import UserError

# tab10: distinguishable, and the same run keeps the same colour in every plot of a report.
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf"]


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
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(True, alpha=0.3)
    if legend and axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize="small")
