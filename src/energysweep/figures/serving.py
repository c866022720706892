"""The serving figures: energy per request against throughput, latency against load, energy
against latency under the SLO (scenario serving).

One line per (backend, layout, batch cap), its points in order of offered load; one panel per
load axis (request rates, concurrency levels). Points past the knee (``sustainable`` false in the
summary, energysweep.validity.serving), and those whose rate the client did not send (null), are
hollow, the knee itself is marked with a large cross,
and only sustainable points can be on the Pareto front: an overloaded point's throughput is never
presented as sustained. Where GPU energy was not measured the energy axis falls back to host
energy (RAPL), else to the server's CPU seconds per request, and says so.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

import energysweep.figures.draw as draw
from energysweep.figures.data import Quantity
from energysweep.figures.pareto import FRONT_GID, pareto_mask
from energysweep.figures.style import layout_name, layout_style

KNEE_GID = "energysweep-knee"
SLO_GID = "energysweep-slo"
MODES = {"rate": "request rate [requests/s offered]", "concurrency": "requests kept in flight"}
NO_SERVING = "no serving points in this sweep (scenarios has no serving)"
_ENERGY = [
    ("energy_per_request_j", "GPU energy per request [J]", "GPU energy", True),
    ("host_energy_per_request_j", "host energy (RAPL) per request [J]", "host energy", True),
    ("cpu_time_per_request_s", "server CPU time per request [s] — not energy", "CPU time", False),
]


def serving_rows(s: pd.DataFrame) -> pd.DataFrame:
    """The serving points of a prepared summary (empty frame if none)."""
    if s.empty or "load_mode" not in s:
        return s.iloc[0:0]
    return s[s["load_mode"].isin(list(MODES))].copy()


def request_quantity(rows: pd.DataFrame) -> Quantity | None:
    """Energy per request (or the first stand-in present), with a note when it is a stand-in."""
    for i, (column, label, what, is_energy) in enumerate(_ENERGY):
        if column in rows and rows[column].notna().any():
            lo, hi = f"{column}_ci_low", f"{column}_ci_high"
            ci = (lo, hi) if lo in rows and hi in rows else None
            why = ", ".join(sorted(set(rows.get("gpu_energy_status", pd.Series()).dropna())))
            note = None if i == 0 else f"GPU energy not measured ({why}): showing {what}"
            return Quantity(column, label, what, is_energy, ci, note)
    return None


def _series(rows: pd.DataFrame):
    keys = ["model", "backend", "tp", "pp", "dp", "batch_size"]
    for key, g in rows.groupby(keys, sort=True):
        style = layout_style(key[2], key[3], key[4], key[1])
        label = f"{key[1]} {layout_name(*key[2:5])} cap {int(key[5])}"
        yield label, style, g.sort_values("offered_load")


def _draw_series(ax, g: pd.DataFrame, x: str, y: str, style, label: str) -> tuple:
    """A line through a series, sustainable points filled, the rest hollow, the knee crossed."""
    g = g[g[x].notna() & g[y].notna()]
    xs, ys = g[x].to_numpy(float), g[y].to_numpy(float)
    ok = g["sustainable"].astype(str).eq("True").to_numpy()
    ax.plot(xs, ys, color=style.color, linestyle=style.linestyle, linewidth=1.2, label="_line")
    ax.plot(xs[ok], ys[ok], linestyle="none", marker=style.marker, color=style.color)
    ax.plot(
        xs[~ok], ys[~ok], linestyle="none", marker=style.marker, markerfacecolor="none",
        markeredgecolor=style.color, gid=draw.INVALID_GID,
    )  # fmt: skip
    if len(xs):  # which batch cap a line is (layouts share colours across caps)
        ax.annotate(f"cap {int(g['batch_size'].iloc[0])}", (xs[-1], ys[-1]), fontsize=6.5,
                    textcoords="offset points", xytext=(4, 3))  # fmt: skip
    knee = g["knee"].astype(str).eq("True").to_numpy()
    if knee.any():
        ax.plot(xs[knee], ys[knee], linestyle="none", marker="X", markersize=13,
                color="red", alpha=0.8, gid=KNEE_GID)  # fmt: skip
    return Line2D([], [], marker=style.marker, color=style.color, linestyle=style.linestyle), label


def _legend_extra() -> list:
    return [
        (Line2D([], [], marker="X", color="red", linestyle="none"), "knee (first unsustainable)"),
        (Line2D([], [], marker="o", markerfacecolor="none", color="#555", linestyle="none"),
         "past the knee, or rate not sent: not sustained"),
    ]  # fmt: skip


def serving_pareto(s: pd.DataFrame) -> Figure:
    """Energy (or its stand-in) per request against achieved requests/s; the knee marked; the
    Pareto front over sustainable points only."""
    rows = serving_rows(s)
    modes = [m for m in MODES if rows["load_mode"].eq(m).any()] if len(rows) else []
    fig, axes = draw.new_figure(1, max(len(modes), 1), width=6.4, height=4.8)
    if not modes:
        draw.only_note(axes[0, 0], NO_SERVING)
        return fig
    for ax, mode in zip(axes[0], modes, strict=True):
        part = rows[rows["load_mode"].eq(mode)]
        q = request_quantity(part)
        ax.set_title(f"Serving ({mode}): cost per request vs throughput", fontsize=10)
        if q is None:
            draw.only_note(ax, "no point has a cost per request")
            continue
        entries = [_draw_series(ax, g, "achieved_rate_rps", q.column, st, lab)
                   for lab, st, g in _series(part)]  # fmt: skip
        ok = part["sustainable"].astype(str).eq("True") & part[q.column].notna()
        pts = part[ok & part["achieved_rate_rps"].notna()]
        front = pareto_mask(pts["achieved_rate_rps"], pts[q.column])
        fx = pts["achieved_rate_rps"].to_numpy(float)[front]
        fy = pts[q.column].to_numpy(float)[front]
        order = np.argsort(fx)
        ax.step(fx[order], fy[order], where="post", color="black", linewidth=1.1, alpha=0.7,
                gid=FRONT_GID, label="_front")  # fmt: skip
        ax.set_xlabel("achieved requests / s (completed inside the window)")
        ax.set_ylabel(q.label)
        draw.log_y_if_spread(ax, part[q.column])
        front_entry = (Line2D([], [], color="black"), f"Pareto front, sustainable ({len(fx)})")
        draw.legend(ax, [*entries, front_entry, *_legend_extra()], False, loc="best")
        if q.note:
            draw.note(ax, q.note, where="top")
    fig.tight_layout()
    return fig


def serving_latency(s: pd.DataFrame, slo: dict | None = None) -> Figure:
    """p50 (dashed) and p99 time to first token and time per output token against the offered
    load, per series; the SLO as a horizontal line."""
    rows = serving_rows(s)
    modes = [m for m in MODES if rows["load_mode"].eq(m).any()] if len(rows) else []
    fig, axes = draw.new_figure(max(len(modes), 1), 2, width=5.4, height=4.0)
    if not modes:
        for ax in axes[0]:
            draw.only_note(ax, NO_SERVING)
        return fig
    slo = slo or {}
    for r, mode in enumerate(modes):
        part = rows[rows["load_mode"].eq(mode)]
        for ax, metric, name, limit in (
            (axes[r, 0], "ttft", "time to first token", slo.get("ttft_ms")),
            (axes[r, 1], "tpot", "time per output token", slo.get("tpot_ms")),
        ):
            entries = []
            for lab, st, g in _series(part):
                entries.append(_draw_series(ax, g, "offered_load", f"{metric}_p99_s", st, lab))
                ax.plot(g["offered_load"], g[f"{metric}_p50_s"], color=st.color, linestyle=":",
                        linewidth=1, label="_p50")  # fmt: skip
            if limit is not None:
                ax.axhline(limit / 1e3, color="grey", linestyle="--", gid=SLO_GID)
                entries.append((Line2D([], [], color="grey", linestyle="--"), "SLO"))
            ax.set_title(f"{name} ({mode}): p99 solid, p50 dotted", fontsize=10)
            ax.set_xlabel(MODES[mode])
            ax.set_ylabel(f"{name} [s]")
            draw.log_x_if_spread(ax, part["offered_load"])
            ax.set_yscale("log")
            draw.legend(ax, [*entries, *_legend_extra()], False, loc="best")
    fig.tight_layout()
    return fig


def serving_slo(s: pd.DataFrame, slo: dict | None = None) -> Figure:
    """Energy (or its stand-in) per request against p99 time to first token, the SLO a vertical
    line: which points meet the objective, and at what cost."""
    rows = serving_rows(s)
    fig, axes = draw.new_figure(1, 1, width=6.4, height=4.8)
    ax = axes[0, 0]
    q = request_quantity(rows) if len(rows) else None
    if q is None:
        draw.only_note(ax, NO_SERVING if rows.empty else "no point has a cost per request")
        return fig
    entries = [_draw_series(ax, g, "ttft_p99_s", q.column, st, f"{lab} ({g['load_mode'].iloc[0]})")
               for lab, st, g in _series(rows)]  # fmt: skip
    limit = (slo or {}).get("ttft_ms")
    if limit is not None:
        ax.axvline(limit / 1e3, color="grey", linestyle="--", gid=SLO_GID)
        entries.append((Line2D([], [], color="grey", linestyle="--"), "TTFT SLO"))
    ax.set_xscale("log")
    ax.set_xlabel("p99 time to first token [s]")
    ax.set_ylabel(q.label)
    ax.set_title("Serving: cost per request vs latency (left of the line: within the SLO)",
                 fontsize=10)  # fmt: skip
    draw.legend(ax, [*entries, *_legend_extra()], False, loc="best")
    if q.note:
        draw.note(ax, q.note, where="top")
    fig.tight_layout()
    return fig
