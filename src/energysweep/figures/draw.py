"""Drawing helpers shared by the figures: series with CI bars, hollow invalid points, notes."""

from __future__ import annotations

import textwrap
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from energysweep.figures.data import Quantity
from energysweep.figures.style import INVALID_LABEL, Style, layout_name

NOTE_GID = "energysweep-note"  # every note's gid: tests and readers find notes by it
INVALID_GID = "energysweep-invalid"  # hollow markers of invalid points
CI_TEXT = "bars: 95% bootstrap CI of the median over repetitions"


def new_figure(nrows: int, ncols: int, width: float = 5.0, height: float = 3.8):
    """A figure and its 2-D array of axes, outside pyplot: nothing global is kept alive."""
    fig = Figure(figsize=(width * ncols, height * nrows))
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def scenario_panels(s: pd.DataFrame, scenario: str, empty_note: str, width: float, height: float):
    """The points of ``scenario`` and a figure of two panels for them: (rows, fig, axes).

    Without such points both panels hold only ``empty_note`` (the caller returns the figure).
    """
    rows = s[s["scenario"].eq(scenario)] if len(s) else s
    fig, axes = new_figure(1, 2, width=width, height=height)
    if rows.empty:
        for ax in axes[0]:
            only_note(ax, empty_note)
    return rows, fig, axes


def note(ax: Axes, text: str, where: str = "top") -> None:
    """A visible boxed note: ``top`` above the axes (between title and plot, so it never hides
    data), ``bottom`` inside the lower edge, ``center`` in the middle."""
    bbox = {"boxstyle": "round", "facecolor": "#fff4d6", "edgecolor": "#c9a227"}
    if where == "top":
        # Wrapped to the axes' width (about 17 characters of 7.5 pt text per inch), and the
        # title lifted over however many lines that makes.
        fig = ax.get_figure(root=True)
        if fig is None:
            raise ValueError("a note needs axes placed in a figure")
        width_in = ax.get_position().width * fig.get_figwidth()
        lines = textwrap.wrap(text, max(int(width_in * 17), 30))
        ax.text(
            0.5,
            1.01,
            "\n".join(lines),
            transform=ax.transAxes,
            ha="center",
            va="bottom",
            fontsize=7.5,
            gid=NOTE_GID,
            bbox=bbox,
            zorder=10,
        )
        ax.set_title(ax.get_title(), fontsize=10, pad=12 + 10 * len(lines))
        return
    y, va = (0.02, "bottom") if where == "bottom" else (0.5, "center")
    ax.text(
        0.5,
        y,
        text,
        transform=ax.transAxes,
        ha="center",
        va=va,
        fontsize=7.5,
        wrap=True,
        gid=NOTE_GID,
        bbox=bbox,
        zorder=10,
    )


def only_note(ax: Axes, text: str) -> None:
    """An axes that holds nothing but a note: no frame, no ticks, so it cannot be read as data."""
    note(ax, text, where="center")
    ax.set_axis_off()


def notes(fig: Figure) -> list[str]:
    """Every note drawn in ``fig`` (see :func:`note`), line breaks undone."""
    texts = [t for ax in fig.axes for t in ax.texts] + list(fig.texts)
    return [t.get_text().replace("\n", " ") for t in texts if t.get_gid() == NOTE_GID]


def figure_note(fig: Figure, text: str) -> None:
    fig.text(0.5, 0.005, text, ha="center", va="bottom", fontsize=7.5, gid=NOTE_GID, wrap=True)


def series(
    ax: Axes, rows: pd.DataFrame, x: str, q: Quantity, style: Style, label: str
) -> tuple[Line2D, str] | None:
    """One line (sorted by ``x``) with CI bars where the quantity has them; valid points filled,
    invalid points hollow. Returns the legend entry (handle, label), or None if nothing drawn.
    """
    rows = rows[rows[q.column].notna()].sort_values(x)
    if rows.empty:
        return None
    xs = rows[x].to_numpy(dtype=float)
    ys = rows[q.column].to_numpy(dtype=float)
    ci = q.ci_of(rows)
    line_kw: dict[str, Any] = {
        "color": style.color,
        "linestyle": style.linestyle,
        "linewidth": 1.5,
    }
    if ci is not None and ci[0].notna().any():
        lo = np.clip(ys - ci[0].to_numpy(dtype=float), 0, None)
        hi = np.clip(ci[1].to_numpy(dtype=float) - ys, 0, None)
        yerr = np.nan_to_num(np.vstack([lo, hi]), nan=0.0)
        ax.errorbar(xs, ys, yerr=yerr, capsize=3, elinewidth=1, label="_ci", **line_kw)
    else:
        ax.plot(xs, ys, label="_line", **line_kw)
    valid = rows["valid_point"].to_numpy(dtype=bool)
    if valid.any():
        ax.plot(
            xs[valid],
            ys[valid],
            linestyle="none",
            marker=style.marker,
            color=style.color,
            markersize=6,
            label="_valid",
        )
    if (~valid).any():
        ax.plot(
            xs[~valid],
            ys[~valid],
            linestyle="none",
            marker=style.marker,
            markerfacecolor="none",
            markeredgecolor=style.color,
            markeredgewidth=1.5,
            markersize=7,
            label="_invalid",
            gid=INVALID_GID,
        )
    return Line2D([], [], marker=style.marker, **line_kw), label


def invalid_points(ax: Axes) -> int:
    """How many points ``ax`` draws hollow (invalid)."""
    return sum(
        np.asarray(line.get_xdata()).size
        for line in ax.get_lines()
        if line.get_gid() == INVALID_GID
    )


def log_x_if_spread(ax: Axes, values) -> None:
    v = pd.Series(values).dropna()
    v = v[v > 0]
    if v.nunique() >= 2 and v.max() / v.min() >= 4:
        ax.set_xscale("log", base=2)
        ticks = sorted(v.unique())
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{t:g}" for t in ticks])
        ax.minorticks_off()


def log_y_if_spread(ax: Axes, values, ratio: float = 20.0) -> None:
    v = pd.Series(values).dropna()
    v = v[v > 0]
    if len(v) >= 2 and v.max() / v.min() >= ratio:
        ax.set_yscale("log")


def legend(ax: Axes, entries: list, any_invalid: bool, **kw) -> None:
    """A legend of ``entries`` ((handle, label) pairs, None skipped), plus a hollow-marker
    entry when a point is invalid."""
    entries = [e for e in entries if e is not None]
    if any_invalid:
        entries.append(
            (
                Line2D(
                    [], [], marker="o", color="#555555", markerfacecolor="none", linestyle="none"
                ),
                INVALID_LABEL,
            )
        )
    if entries:
        ax.legend([h for h, _ in entries], [lab for _, lab in entries], fontsize=7, **kw)


def series_label(row, frame: pd.DataFrame, with_backend: bool | None = None) -> str:
    """A layout's legend label; model and backend only where the frame has more than one."""
    parts = []
    if "model" in frame and frame["model"].nunique() > 1:
        parts.append(str(row["model"]))
    if with_backend or (with_backend is None and frame["backend"].nunique() > 1):
        parts.append(str(row["backend"]))
    parts.append(layout_name(row["tp"], row["pp"], row["dp"]))
    return " ".join(parts)


def group_keys(frame: pd.DataFrame, by_backend: bool = True) -> list[str]:
    keys = ["model", *(["backend"] if by_backend else []), "tp", "pp", "dp"]
    return [k for k in keys if k in frame]
