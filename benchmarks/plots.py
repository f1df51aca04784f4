"""Plots of the comparisons, drawn with matplotlib's non-interactive backend into PNG files."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

Series = Mapping[str, tuple[Sequence[float], Sequence[float]]]


def line_panels(
    path: Path,
    title: str,
    panels: Sequence[tuple[str, str, Series]],
    *,
    xlabel: str,
    log_x: bool = True,
    log_y: Sequence[bool] = (),
    columns: int = 0,
    shade_x: tuple[float, float, str] | None = None,
    marker: str = "o",
    x_tick_label: Callable[[float], str] | None = None,
) -> None:
    """Line charts, ``columns`` to a row (0: all in one row); each panel is (title, y label,
    {series name: (xs, ys)}); ``shade_x`` (start, end, label) shades that span in every panel.
    ``x_tick_label``: ticks at each panel's own x values, so labelled, where the powers of the
    log scale would read poorly (a few sizes far apart)."""
    width = columns or len(panels)
    height = -(-len(panels) // width)
    figure, axes = plt.subplots(height, width, figsize=(5.5 * width, 4.2 * height), squeeze=False)
    for unused in range(len(panels), width * height):
        axes[unused // width][unused % width].set_visible(False)
    for index, (panel_title, ylabel, series) in enumerate(panels):
        axis = axes[index // width][index % width]
        if shade_x is not None:
            axis.axvspan(shade_x[0], shade_x[1], color="0.85", label=shade_x[2])
        for name, (xs, ys) in series.items():
            axis.plot(list(xs), list(ys), marker=marker, label=name)
        axis.set_title(panel_title, fontsize=10)
        axis.set_xlabel(xlabel)
        axis.set_ylabel(ylabel)
        if log_x:
            axis.set_xscale("log", base=2)
        if index < len(log_y) and log_y[index]:
            axis.set_yscale("log")
        if x_tick_label:
            xs = sorted({float(x) for xs, _ in series.values() for x in xs})
            axis.set_xticks(xs, [x_tick_label(x) for x in xs])
            axis.minorticks_off()
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def bar_panels(
    path: Path,
    title: str,
    panels: Sequence[tuple[str, str, Mapping[str, float]]],
) -> None:
    """One row of bar charts; each panel is (title, y label, {bar label: value})."""
    figure, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.4), squeeze=False)
    for index, (panel_title, ylabel, bars) in enumerate(panels):
        axis = axes[0][index]
        labels = list(bars)
        axis.bar(range(len(labels)), [bars[label] for label in labels], color="tab:blue")
        axis.set_xticks(range(len(labels)))
        axis.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
        axis.set_title(panel_title, fontsize=10)
        axis.set_ylabel(ylabel)
        axis.grid(True, axis="y", alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
