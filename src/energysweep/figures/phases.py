"""Where the energy goes: prefill vs decode (question 5) and pipeline stages (question 6)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

import energysweep.figures.draw as draw
from energysweep.figures.data import Quantity
from energysweep.figures.style import layout_name, layout_style
from energysweep.tables.phases import HEADLINE_PHASES
from energysweep.tables.shards import POINT_KEYS

# The columns of results/stages.csv this figure reads.
STAGE_COLUMNS = [
    *POINT_KEYS,
    "phase",
    "pp_rank",
    "gpu_energy_j",
    "gpu_energy_share",
    "cpu_time_s",
    "cpu_time_share",
]
PREFILL_HATCH = "////"
PREFILL_GID, DECODE_GID = "energysweep-prefill", "energysweep-decode"


def _split(rows: pd.DataFrame) -> tuple[pd.Series, str, str | None]:
    """Per point the prefill share of one generate iteration, what it is a share of, and a note.

    Energy share where prefill/decode energy was measured; otherwise the time share from the
    prefill pass and generate windows (labelled as time).
    """
    energy = rows.get("prefill_energy_fraction", pd.Series(np.nan, index=rows.index))
    if energy.notna().any():
        return energy, "energy", None
    per_iteration = rows["window_s"] / rows["iterations_per_window"]
    time_share = rows["prefill_s_per_iteration"] / per_iteration
    return (
        time_share.where(time_share.between(0, 1)),
        "wall time",
        "GPU energy not measured: showing the split of wall time, not energy",
    )


def prefill_decode(s: pd.DataFrame) -> Figure:
    """Question 5: the prefill share vs the decode share of a generate iteration, per point.

    Left: stacked bars (prefill hatched, decode solid) per layout and batch size. Right: decode
    energy per output token vs batch size (or, without energy, decode tokens per second).
    """
    rows, fig, axes = draw.scenario_panels(
        s, "inference", "no inference points in this sweep", width=5.8, height=4.6
    )
    if rows.empty:
        return fig
    share, of, split_note = _split(rows)
    rows = rows.assign(_share=share)
    drawn = rows[rows["_share"].notna()].sort_values(
        ["backend", "world_size", "tp", "pp", "dp", "batch_size"]
    )
    _share_panel(axes[0, 0], rows, drawn, of, split_note)
    _decode_panel(axes[0, 1], rows)
    fig.tight_layout()
    return fig


def _share_panel(ax, rows: pd.DataFrame, drawn: pd.DataFrame, of: str, split_note) -> None:
    """Left panel: stacked prefill/decode bars per layout and batch size."""
    ax.set_title(f"Prefill vs decode share of one generate iteration ({of})", fontsize=10)
    if drawn.empty:
        draw.only_note(
            ax,
            "no prefill pass measured (measurement.prefill_pass: false, or every "
            "prefill window failed); see prefill_decode_status in summary.csv",
        )
    else:
        labels = []
        for i, (_, r) in enumerate(drawn.iterrows()):
            st = layout_style(r["tp"], r["pp"], r["dp"], r["backend"])
            p = float(r["_share"])
            ax.barh(
                i,
                p,
                color=st.color,
                alpha=0.45,
                hatch=PREFILL_HATCH,
                edgecolor=st.color,
                gid=PREFILL_GID,
            )
            ax.barh(
                i,
                1 - p,
                left=p,
                color=st.color,
                edgecolor="white",
                gid=DECODE_GID,
                alpha=1.0 if r["valid_point"] else 0.25,
            )
            ax.text(min(p, 0.9) + 0.01, i, f"{p:.0%}", va="center", fontsize=6.5)
            labels.append(f"{draw.series_label(r, rows)}  bs{int(r['batch_size'])}")
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlim(0, 1)
        ax.set_xlabel(f"share of one generate iteration's {of}")
        ax.legend(
            [
                Patch(facecolor="#aaaaaa", hatch=PREFILL_HATCH, alpha=0.45),
                Patch(facecolor="#555555"),
            ],
            ["prefill (1-token pass)", "decode (the rest)"],
            fontsize=7,
            loc="lower right",
        )
        if split_note:
            draw.note(ax, split_note, where="top")
        if (~drawn["valid_point"]).any():
            draw.note(ax, "faded bars: invalid points (see invalid_reasons)", where="bottom")


def _decode_panel(ax, rows: pd.DataFrame) -> None:
    """Right panel: decode energy per output token (or decode throughput) vs batch size."""
    if rows["decode_energy_per_output_token_j"].notna().any():
        q = Quantity(
            "decode_energy_per_output_token_j",
            "GPU energy per decode output token [J]",
            "GPU energy",
            True,
        )
        title = "Decode energy per output token"
    else:
        q = Quantity(
            "decode_output_tokens_per_s",
            "decode output tokens / s (all replicas)",
            "throughput",
            False,
            note="GPU energy not measured: showing decode throughput, not energy",
        )
        title = "Decode throughput"
    ax.set_title(title, fontsize=10)
    if rows[q.column].notna().any():
        entries = []
        for _, g in rows.groupby(draw.group_keys(rows), sort=True):
            r = g.iloc[0]
            entries.append(
                draw.series(
                    ax,
                    g,
                    "batch_size",
                    q,
                    layout_style(r["tp"], r["pp"], r["dp"], r["backend"]),
                    draw.series_label(r, rows),
                )
            )
        ax.set_xlabel("batch size per replica")
        ax.set_ylabel(q.label, fontsize=8.5)
        draw.log_x_if_spread(ax, rows["batch_size"])
        draw.log_y_if_spread(ax, rows[q.column])
        ax.grid(alpha=0.3)
        draw.legend(ax, entries, bool((~rows.loc[rows[q.column].notna(), "valid_point"]).any()))
        if q.note:
            draw.note(ax, q.note, where="top")
    else:
        draw.only_note(ax, "no decode figures (see prefill_decode_status in summary.csv)")


def _stage_share(rows: pd.DataFrame) -> tuple[str, str]:
    if rows["gpu_energy_share"].notna().any():
        return "gpu_energy_share", "share of the point's GPU energy"
    return "cpu_time_share", "share of the point's CPU time (GPU energy not measured)"


def stage_balance(stages: pd.DataFrame | None, s: pd.DataFrame | None = None) -> Figure:
    """Question 6: per pipeline stage (pp rank), its share of the point's energy (pp > 1).

    ``stages`` is results/stages.csv (one row per point, phase and pp_rank). One panel per
    (backend, scenario, layout) with pp > 1: bars per stage at each batch size, and a dashed
    line at 1/pp (perfect balance). Without GPU energy the share of CPU time is shown, labelled.
    A note replaces the bars when the table is absent or holds no pp > 1 layout.
    """
    if stages is None:
        fig, axes = draw.new_figure(1, 1, width=6.5)
        draw.only_note(
            axes[0, 0],
            "per-stage table results/stages.csv was not produced by this "
            "pipeline version: no per-stage (pp rank) energy to show",
        )
        return fig
    missing = [c for c in STAGE_COLUMNS if c not in stages]
    if missing:
        raise ValueError(f"results/stages.csv lacks columns {missing}")
    st = stages[(stages["pp"] > 1) & stages["phase"].isin(HEADLINE_PHASES)]
    layouts = list(st.groupby(["backend", "scenario", "model", "tp", "pp", "dp"], sort=True))
    if not layouts:
        fig, axes = draw.new_figure(1, 1, width=6.5)
        pp = sorted(set(s["pp"])) if s is not None and len(s) else sorted(set(stages["pp"]))
        draw.only_note(
            axes[0, 0],
            f"no pipeline-parallel (pp > 1) point in this sweep "
            f"(pp degrees run: {pp}): nothing to split by stage",
        )
        return fig
    fig, axes = draw.new_figure(1, len(layouts), width=4.6, height=4.2)
    for ax, ((backend, scenario, _model, tp, pp, dp), g) in zip(axes[0], layouts, strict=True):
        col, what = _stage_share(g)
        base = layout_style(tp, pp, dp, backend)
        batches = sorted(g["batch_size"].unique())
        width = 0.8 / pp
        for k in range(int(pp)):
            gk = g[g["pp_rank"] == k].set_index("batch_size").reindex(batches)
            xs = np.arange(len(batches)) + (k - (pp - 1) / 2) * width
            ax.bar(
                xs,
                gk[col].to_numpy(float),
                width=width * 0.95,
                color=base.color,
                alpha=1.0 - 0.55 * k / max(pp - 1, 1),
                edgecolor="black",
                linewidth=0.5,
                label=f"stage {k} (pp rank {k})",
            )
        ax.axhline(
            1 / pp, color="black", linestyle="--", linewidth=1, label=f"balanced (1/{int(pp)})"
        )
        ax.set_xticks(range(len(batches)))
        ax.set_xticklabels([str(b) for b in batches])
        ax.set_xlabel("batch size per replica")
        ax.set_ylabel(what, fontsize=8.5)
        ax.set_ylim(0, 1)
        ax.set_title(f"{backend} {scenario}: {layout_name(tp, pp, dp)}", fontsize=10)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, axis="y")
        if col == "cpu_time_share":
            draw.note(ax, "GPU energy not measured: CPU-time share, not energy", where="top")
    fig.tight_layout()
    return fig
