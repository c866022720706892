"""Question 4: the energy–throughput Pareto front (lower energy per token, higher tokens/s)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

import energysweep.figures.draw as draw
from energysweep.figures.data import energy_quantity, throughput_quantity
from energysweep.figures.style import layout_style

FRONT_GID = "energysweep-pareto-front"


def pareto_mask(throughput, cost) -> np.ndarray:
    """True where no other point has throughput >= and cost <= with one strictly better.

    NaNs are never on the front and never dominate.
    """
    t = np.asarray(throughput, dtype=float)
    c = np.asarray(cost, dtype=float)
    ok = ~(np.isnan(t) | np.isnan(c))
    front = np.zeros(len(t), dtype=bool)
    for i in np.flatnonzero(ok):
        others = ok & (t >= t[i]) & (c <= c[i]) & ((t > t[i]) | (c < c[i]))
        front[i] = not others.any()
    return front


def _point(ax, x, y, xerr, yerr, style, on_front: bool, valid: bool, rank: int, text: str):
    """One point of the front figure: its CI bars, its marker and its label."""
    if xerr is not None or yerr is not None:
        ax.errorbar(
            [x],
            [y],
            xerr=xerr,
            yerr=yerr,
            color=style.color,
            alpha=0.45,
            linestyle="none",
            elinewidth=0.9,
            capsize=2,
            label="_ci",
        )
    ax.plot(
        [x],
        [y],
        linestyle="none",
        marker=style.marker,
        color=style.color,
        markersize=9 if on_front else 6,
        markerfacecolor=style.color if valid else "none",
        markeredgecolor="black" if on_front else style.color,
        markeredgewidth=1.4,
        label="_point",
        gid=draw.INVALID_GID if not valid else None,
    )
    # Front labels alternate below/above their points so neighbours on the front do not overlap.
    ax.annotate(
        text,
        (x, y),
        textcoords="offset points",
        xytext=(5, 4) if not on_front else (-6, -11 if rank % 2 == 0 else 7),
        ha="left" if not on_front else "right",
        fontsize=6.5,
        fontweight="bold" if on_front else "normal",
    )


def _panel(ax, rows: pd.DataFrame, scenario: str) -> None:
    q, t = energy_quantity(rows, scenario), throughput_quantity(rows, scenario)
    ax.set_title(f"{scenario.capitalize()}: energy–throughput front", fontsize=10)
    if q is None or t is None:
        draw.only_note(ax, "no point has both a per-token cost and a throughput")
        return
    pts = rows[rows[q.column].notna() & rows[t.column].notna()].reset_index(drop=True)
    valid = pts["valid_point"].to_numpy(dtype=bool)
    # Invalid points are drawn but never define a GPU-energy front. The verdict is about GPU
    # energy: where a stand-in (host energy, CPU time) is drawn, every point is invalid for
    # want of GPU energy, and the stand-in's own front is still worth showing.
    eligible = valid if q.note is None else np.ones(len(pts), dtype=bool)
    front = np.zeros(len(pts), dtype=bool)
    front[eligible] = pareto_mask(pts.loc[eligible, t.column], pts.loc[eligible, q.column])
    xs, ys = pts[t.column].to_numpy(float), pts[q.column].to_numpy(float)
    tci, qci = t.ci_of(pts), q.ci_of(pts)
    entries: dict[str, tuple[Line2D, str]] = {}
    rank = {i: k for k, i in enumerate(np.flatnonzero(front)[np.argsort(xs[front])])}
    for i, r in pts.iterrows():
        style = layout_style(r["tp"], r["pp"], r["dp"], r["backend"])
        label = draw.series_label(r, rows)
        xerr = yerr = None
        if tci is not None and pd.notna(tci[0][i]):
            xerr = [[max(xs[i] - tci[0][i], 0)], [max(tci[1][i] - xs[i], 0)]]
        if qci is not None and pd.notna(qci[0][i]):
            yerr = [[max(ys[i] - qci[0][i], 0)], [max(qci[1][i] - ys[i], 0)]]
        on_front = bool(front[i])
        text = f"*{label} bs{int(r['batch_size'])}" if on_front else f"bs{int(r['batch_size'])}"
        _point(ax, xs[i], ys[i], xerr, yerr, style, on_front, bool(valid[i]), rank.get(i, 0), text)
        entries.setdefault(
            label,
            (
                Line2D([], [], marker=style.marker, color=style.color, linestyle=style.linestyle),
                label,
            ),
        )
    order = np.argsort(xs[front])
    ax.step(
        xs[front][order],
        ys[front][order],
        where="post",
        color="black",
        linewidth=1.2,
        alpha=0.7,
        gid=FRONT_GID,
        label="_front",
    )
    ax.set_xlabel(t.label)
    ax.set_ylabel(q.label, fontsize=8.5)
    draw.log_y_if_spread(ax, ys)
    if len(xs) and np.nanmax(xs) / max(np.nanmin(xs), 1e-12) >= 20:
        ax.set_xscale("log")
    ax.grid(alpha=0.3)
    front_entry = (
        Line2D([], [], color="black", marker="o", markerfacecolor="white", markeredgecolor="black"),
        f"Pareto front ({int(front.sum())} points, *)",
    )
    draw.legend(ax, [*entries.values(), front_entry], bool((~valid).any()), loc="best")
    if q.note:
        draw.note(ax, q.note, where="top")


def pareto_front(s: pd.DataFrame) -> Figure:
    """Energy per token against throughput for every point; the non-dominated ones highlighted.

    One panel per scenario present. Points are labelled with their batch size (per replica);
    front points are larger, black-edged, starred, and joined by a step line. Invalid points
    are hollow and excluded from a GPU-energy front (not from the front of a stand-in quantity,
    CPU time say, drawn where GPU energy was not measured).
    """
    scenarios = [x for x in ("inference", "training") if len(s) and s["scenario"].eq(x).any()]
    fig, axes = draw.new_figure(1, max(len(scenarios), 1), width=6.2, height=4.8)
    if not scenarios:
        draw.only_note(axes[0, 0], "no measured points")
        return fig
    for ax, scenario in zip(axes[0], scenarios, strict=True):
        _panel(ax, s[s["scenario"].eq(scenario)], scenario)
    fig.text(
        0.01,
        0.005,
        "lower-right is better: fewer joules (or CPU seconds) per token at "
        "more tokens/s; " + draw.CI_TEXT,
        fontsize=7,
        ha="left",
        va="bottom",
    )
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def front_points(fig: Figure) -> int:
    """Points on the drawn front(s) of a :func:`pareto_front` figure."""
    return sum(
        np.asarray(line.get_xdata()).size
        for ax in fig.axes
        for line in ax.get_lines()
        if line.get_gid() == FRONT_GID
    )
