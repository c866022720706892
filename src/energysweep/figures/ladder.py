"""The energy boundary ladder figure: the same points' energy per token as the boundary widens
(GPU, + host, node, idle-net, x PUE) and their gCO2e per token, each rung named with how it was
obtained; an unmeasured rung is a gap with its reason, never a zero."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

import energysweep.figures.draw as draw
from energysweep.figures.style import layout_name, layout_style

# (column stem, tick label) from narrow to wide; the estimate rungs carry a band.
RUNGS = [
    ("boundary_gpu", "GPU boards\n(NVML)"),
    ("boundary_gpu_host", "+ host CPU/DRAM\n(RAPL)"),
    ("boundary_node", "node\n(Slurm energy)"),
    ("boundary_idle_net", "idle-net\n(- idle power)"),
    ("facility_energy_estimate", "x PUE\n(ESTIMATE)"),
]
MAX_LINES = 8


def _column(stem: str) -> str:
    return f"{stem}_j_per_token"


def _status(stem: str) -> str:
    return (
        f"{stem}_status" if not stem.startswith("facility") else "facility_energy_estimate_status"
    )


def ladder_points(s: pd.DataFrame) -> pd.DataFrame:
    """The points the ladder draws: per scenario and batch size the lowest GPU energy per
    token among valid points (else among all), at most :data:`MAX_LINES` per scenario."""
    if s.empty or _column("boundary_gpu") not in s:
        return s.iloc[0:0]
    rows = s[s[_column("boundary_gpu")].notna()]
    out = []
    for _, g in rows.groupby(["scenario", "batch_size"], sort=True):
        pool = g[g["valid_point"]] if g["valid_point"].any() else g
        out.append(pool.nsmallest(1, _column("boundary_gpu")))
    if not out:
        return s.iloc[0:0]
    return pd.concat(out).groupby("scenario", sort=True).head(MAX_LINES)


def _why_missing(rows: pd.DataFrame) -> list[str]:
    why = []
    for stem, tick in RUNGS:
        col = _column(stem)
        if col in rows and rows[col].isna().all():
            statuses = sorted(set(rows[_status(stem)].astype(str)))
            why.append(f"{tick.splitlines()[0]}: {'; '.join(statuses)[:140]}")
    return why


def energy_ladder(s: pd.DataFrame) -> Figure:
    """Left: energy per token at each boundary, one line per drawn point (gaps where a rung was
    not measured; the PUE rung with its band). Right: gCO2e per token with its band."""
    fig, axes = draw.new_figure(1, 2, width=6.4, height=4.8)
    left, right = axes[0]
    pts = ladder_points(s)
    left.set_title("Energy per token as the boundary widens", fontsize=10)
    right.set_title("Emissions per token (ESTIMATE)", fontsize=10)
    if pts.empty:
        statuses = sorted(set(s.get("boundary_gpu_status", pd.Series(dtype=object)).astype(str)))
        draw.only_note(
            left, "no rung measured: GPU energy " + ("; ".join(statuses) or "absent")[:200]
        )
        draw.only_note(right, "no emissions estimate: it needs a measured boundary")
        return fig
    xs = np.arange(len(RUNGS))
    entries = []
    for _, r in pts.iterrows():
        style = layout_style(r["tp"], r["pp"], r["dp"], r["backend"])
        ys = np.array([r.get(_column(stem), np.nan) for stem, _ in RUNGS], dtype=float)
        left.plot(xs, ys, marker=style.marker, color=style.color, linestyle=style.linestyle)
        lo, hi = (
            r.get(f"{_column('facility_energy_estimate')}_low"),
            r.get(f"{_column('facility_energy_estimate')}_high"),
        )
        if pd.notna(lo) and pd.notna(hi):
            left.vlines(xs[-1], lo, hi, color=style.color, linewidth=3, alpha=0.5)
        label = (
            f"{r['scenario']} {r['backend']} {layout_name(r['tp'], r['pp'], r['dp'])} "
            f"bs {r['batch_size']} ({r.get('gpu_setting', 'node default')})"
        )
        entries.append((left.get_lines()[-1], label))
        co2 = r.get("co2e_estimate_g_per_token", np.nan)
        if pd.notna(co2):
            i = len(entries) - 1
            right.bar(i, co2, color=style.color, alpha=0.8)
            right.vlines(
                i, r["co2e_estimate_g_per_token_low"], r["co2e_estimate_g_per_token_high"], "k"
            )
    left.set_xticks(xs)
    left.set_xticklabels([t for _, t in RUNGS], fontsize=7)
    left.set_ylabel("J per token (output tokens; training: tokens trained on)", fontsize=8)
    left.grid(alpha=0.3)
    draw.legend(left, entries, False, loc="upper left")
    missing = _why_missing(pts)
    if missing:
        draw.note(left, "not measured (gap): " + " | ".join(missing), where="top")
    if not right.patches:
        statuses = sorted(set(pts["co2e_estimate_status"].astype(str)))
        draw.only_note(right, "no emissions estimate: " + "; ".join(statuses)[:200])
    else:
        right.set_ylabel("gCO2e per token (ESTIMATE; bar: band)", fontsize=8)
        right.set_xticks(range(len(entries)))
        right.set_xticklabels([str(i + 1) for i in range(len(entries))], fontsize=7)
        right.set_xlabel("point (legend order)")
        right.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig
