"""Figures of a quantity against batch size: per layout, at equal GPU count, across backends,
and for training. Each takes :func:`energysweep.figures.data.prepare`'d summary rows."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

import energysweep.figures.draw as draw
from energysweep.figures.data import Quantity, energy_quantity, throughput_quantity
from energysweep.figures.style import layout_name, layout_style

BATCH_LABEL = "batch size per replica"
GLOBAL_BATCH_LABEL = "global batch (per replica x dp: requests in flight)"
TRAIN_BATCH_LABEL = "global batch (sequences per step, all replicas)"


def _lines(ax, rows: pd.DataFrame, x: str, q: Quantity, label_of) -> list:
    """One line per (model, backend, layout) of ``rows``; returns legend entries."""
    entries = []
    for _, g in rows.groupby(draw.group_keys(rows), sort=True):
        r = g.iloc[0]
        style = layout_style(r["tp"], r["pp"], r["dp"], r["backend"])
        entries.append(draw.series(ax, g, x, q, style, label_of(r)))
    return entries


def _panel(
    ax,
    rows: pd.DataFrame,
    x: str,
    q: Quantity | None,
    title: str,
    xlabel: str,
    label_of,
    empty: str,
) -> None:
    """Draw ``q`` against ``x``; a note instead where nothing of it was measured."""
    if q is not None and q.note:
        title = f"{title}: {q.what} shown"
    ax.set_title(title, fontsize=10)
    if q is None:
        draw.only_note(ax, empty)
        return
    entries = _lines(ax, rows, x, q, label_of)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(q.label, fontsize=8.5)
    draw.log_x_if_spread(ax, rows[x])
    draw.log_y_if_spread(ax, rows[q.column])
    ax.grid(alpha=0.3)
    draw.legend(ax, entries, bool((~rows.loc[rows[q.column].notna(), "valid_point"]).any()))
    if q.note:
        draw.note(ax, q.note, where="top")
    missing = rows[rows[q.column].isna()]
    if len(missing) and q.is_energy:
        names = sorted({label_of(r) for _, r in missing.iterrows()})
        draw.note(ax, f"{q.what} not measured for: " + ", ".join(names)[:150], where="bottom")


def _pair(
    ax_q, ax_t, rows: pd.DataFrame, x: str, scenario: str, titles, xlabel: str, label_of, empties
) -> tuple[Quantity | None, Quantity | None]:
    """Energy per token on ``ax_q`` and throughput on ``ax_t`` for ``rows``; returns both."""
    q, t = energy_quantity(rows, scenario), throughput_quantity(rows, scenario)
    _panel(ax_q, rows, x, q, titles[0], xlabel, label_of, empties[0])
    _panel(ax_t, rows, x, t, titles[1], xlabel, label_of, empties[1])
    return q, t


def _columns(axes, columns, x: str, xlabel: str) -> tuple[Quantity | None, Quantity | None]:
    """One inference column per ``(title, rows, label_of)``: energy per token over throughput."""
    q = t = None
    for i, (title, rows, label_of) in enumerate(columns):
        q, t = _pair(
            axes[0, i],
            axes[1, i],
            rows,
            x,
            "inference",
            (title, f"{title} — throughput"),
            xlabel,
            label_of,
            ("nothing per token measured", "no throughput measured"),
        )
    return q, t


def _ci_caption(fig: Figure, q: Quantity | None, t: Quantity | None) -> None:
    with_ci = [x.what for x in (q, t) if x is not None and x.ci is not None]
    if with_ci:
        fig.text(
            0.01,
            0.005,
            draw.CI_TEXT + "; filled marker = valid point",
            fontsize=7,
            ha="left",
            va="bottom",
        )


# Per scenario of the side-by-side figures: x column, x label, panel titles, notes where empty.
_SIDE_BY_SIDE = {
    "inference": ("batch_size", BATCH_LABEL, "Energy per output token", "Throughput", "token"),
    "training": (
        "global_batch",
        TRAIN_BATCH_LABEL,
        "Training: energy per training token",
        "Training throughput",
        "training token",
    ),
}


def _side_by_side(s: pd.DataFrame, scenario: str) -> Figure:
    """Energy per token (left) and throughput (right) against batch, one line per layout."""
    x, xlabel, energy_title, throughput_title, per = _SIDE_BY_SIDE[scenario]
    rows, fig, axes = draw.scenario_panels(
        s, scenario, f"no {scenario} points in this sweep", width=5.6, height=4.4
    )
    if rows.empty:
        return fig
    q, t = _pair(
        axes[0, 0],
        axes[0, 1],
        rows,
        x,
        scenario,
        (energy_title, throughput_title),
        xlabel,
        lambda r: draw.series_label(r, rows),
        (f"nothing per {per} measured", "no throughput measured (every point failed)"),
    )
    _ci_caption(fig, q, t)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def energy_per_token(s: pd.DataFrame) -> Figure:
    """Question 1: energy per output token vs batch size, one line per layout (inference).

    Left: GPU energy per output token with its CI (or, where not measured, host energy or CPU
    time per token, labelled as such). Right: output tokens per second with its CI.
    """
    return _side_by_side(s, "inference")


def layouts_at_equal_gpus(s: pd.DataFrame) -> Figure:
    """Question 2: at equal GPU count, tp vs pp vs dp (and mixed), per backend (inference).

    One column per (backend, GPU count) holding at least two layouts; energy per token (top)
    and throughput (bottom) against the global batch, so dp replicas are compared at the same
    number of requests in flight as tp/pp.
    """
    rows = s[s["scenario"].eq("inference")] if len(s) else s
    groups = []
    if len(rows):
        for (backend, world), g in rows.groupby(["backend", "world_size"], sort=True):
            if g[["tp", "pp", "dp"]].drop_duplicates().shape[0] >= 2:
                groups.append((backend, int(world), g))
    if not groups:
        fig, axes = draw.new_figure(1, 1)
        draw.only_note(
            axes[0, 0],
            "no GPU count with two or more layouts in this sweep (nothing to compare side by side)",
        )
        return fig
    fig, axes = draw.new_figure(2, len(groups), width=5.0, height=3.9)
    columns = [
        (
            f"{backend}: {world} GPU{'s' if world > 1 else ''} per job",
            g,
            lambda r, g=g: draw.series_label(r, g, with_backend=False),
        )
        for backend, world, g in groups
    ]
    q, t = _columns(axes, columns, "global_batch", GLOBAL_BATCH_LABEL)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    _ci_caption(fig, q, t)
    return fig


def backends_compared(s: pd.DataFrame) -> Figure:
    """Question 3: backends side by side on the layouts they share (inference).

    One column per (model, layout) that at least two backends ran; one line per backend (line
    style = backend, colour = layout); energy per token on top, throughput below.
    """
    rows = s[s["scenario"].eq("inference")] if len(s) else s
    shared = []
    if len(rows):
        for key, g in rows.groupby(["model", "tp", "pp", "dp"], sort=True):
            if g["backend"].nunique() >= 2:
                shared.append((key, g))
    if not shared:
        backends = ", ".join(sorted(set(rows["backend"]))) if len(rows) else "none"
        fig, axes = draw.new_figure(1, 1)
        draw.only_note(
            axes[0, 0],
            "no layout was run by two or more backends in this sweep "
            f"(backends with inference points: {backends}); nothing to compare",
        )
        return fig
    fig, axes = draw.new_figure(2, len(shared), width=4.6, height=3.9)
    several_models = rows["model"].nunique() > 1
    columns = [
        (
            layout_name(tp, pp, dp) + (f" ({model})" if several_models else ""),
            g,
            lambda r: str(r["backend"]),
        )
        for (model, tp, pp, dp), g in shared
    ]
    q, t = _columns(axes, columns, "batch_size", BATCH_LABEL)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    _ci_caption(fig, q, t)
    return fig


def training(s: pd.DataFrame) -> Figure:
    """Question 8: training energy per training token and tokens/s vs global batch per layout."""
    return _side_by_side(s, "training")
