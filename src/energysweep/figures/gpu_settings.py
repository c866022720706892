"""The GPU setting axes in the figures: the baseline the other figures draw, and the figure that
compares settings (energy per token against each setting, per layout and batch size)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

import energysweep.figures.draw as draw
from energysweep.figures.data import energy_quantity, with_setting_keys
from energysweep.figures.style import layout_name, layout_style

NO_SETTING = "no GPU setting swept (gpu.power_limit_w and gpu.clock are empty): nothing to compare"


def _order(frame: pd.DataFrame) -> pd.DataFrame:
    """Settings in reading order: the node default first, then by power limit, then clock."""
    f = with_setting_keys(frame)
    watts = pd.to_numeric(f["power_limit_w"], errors="coerce")
    return f.assign(_w=watts.fillna(-1.0), _c=f["gpu_clock"].astype(str))


def settings_of(s: pd.DataFrame) -> list[str]:
    """The distinct setting labels of ``s`` (prepared: ``gpu_setting``), in reading order."""
    if s.empty:
        return []
    o = _order(s).sort_values(["_w", "_c"])
    return list(dict.fromkeys(o["gpu_setting"]))


def baseline(s: pd.DataFrame) -> tuple[pd.DataFrame, str | None]:
    """The points the per-layout figures draw: one GPU setting, so lines never mix settings.

    The node default where the sweep has it, else the first setting in reading order. Returns
    the rows and, where the sweep has other settings, a sentence saying which one is drawn.
    """
    labels = settings_of(s)
    if len(labels) <= 1:
        return s, None
    chosen = "node default" if "node default" in labels else labels[0]
    return s[s["gpu_setting"].eq(chosen)], (
        f"GPU setting shown: {chosen} (the sweep has {len(labels)}; gpu_settings.png compares them)"
    )


def _tick(rows: pd.DataFrame, label: str) -> str:
    """A setting's x tick: its label and the read-back as % of the GPU's default."""
    r = rows[rows["gpu_setting"].eq(label)]
    parts = []
    for col, name in (("power_limit_pct_of_default", "limit"), ("sm_clock_pct_of_default", "SM")):
        if col in r and r[col].notna().any():
            parts.append(f"{name} {r[col].median():.0f}%")
    return label + ("\n(" + ", ".join(parts) + " of default)" if parts else "")


def settings_figure(s: pd.DataFrame) -> Figure:
    """Energy per token at every GPU setting, one line per (layout, batch size), per scenario.

    x: the settings in reading order, each with its read-back limit and SM clock as a percentage
    of the GPU's default (median over the points); invalid points hollow (a refused or
    not-applied setting is invalid: ``cap_not_applied`` / ``clock_not_applied``).
    """
    scenarios = [sc for sc in ("inference", "training") if len(s) and s["scenario"].eq(sc).any()]
    fig, axes = draw.new_figure(1, max(1, len(scenarios)), width=6.0, height=4.6)
    labels = settings_of(s)
    if len(labels) <= 1:
        draw.only_note(axes[0, 0], NO_SETTING)
        return fig
    for ax, scenario in zip(axes[0], scenarios, strict=False):
        rows = s[s["scenario"].eq(scenario)]
        q = energy_quantity(rows, scenario)
        ax.set_title(f"{scenario}: energy per token by GPU setting", fontsize=10)
        if q is None:
            draw.only_note(ax, "nothing per token measured (no energy, no CPU time)")
            continue
        x = {lab: i for i, lab in enumerate(labels)}
        entries = []
        for _, g in rows.groupby(["model", "backend", "tp", "pp", "dp", "batch_size"], sort=True):
            r = g.iloc[0]
            style = layout_style(r["tp"], r["pp"], r["dp"], r["backend"])
            g = g.assign(_x=g["gpu_setting"].map(x).astype(float))
            name = f"{r['backend']} {layout_name(r['tp'], r['pp'], r['dp'])} bs {r['batch_size']}"
            entries.append(draw.series(ax, g, "_x", q, style, name))
        ax.set_xticks(np.arange(len(labels)))
        ax.set_xticklabels([_tick(rows, lab) for lab in labels], fontsize=7)
        ax.set_xlabel("GPU setting (gpu.power_limit_w, gpu.clock), read back")
        ax.set_ylabel(q.label, fontsize=8.5)
        ax.grid(alpha=0.3)
        draw.legend(ax, entries, bool((~rows["valid_point"]).any()))
        if q.note:
            draw.note(ax, q.note, where="top")
    fig.tight_layout()
    return fig
