"""Question 7: each job's power timeline (power.parquet) with its measured windows marked."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

import energysweep.figures.draw as draw
from energysweep.figures.style import PHASE_COLOURS, layout_name
from energysweep.job.spec import JOB_KEYS
from energysweep.tables.phases import Phase

MAX_JOBS = 12  # one figure stays readable; every sample is in the jobs' power.parquet files
WINDOW_KEYS = ["job_id", "batch_size", "repetition", "phase"]
SPAN_GID = "energysweep-window"


def job_windows(energy: pd.DataFrame) -> pd.DataFrame:
    """One row per window of ``energy`` (merged shard rows): job, point, edges and tokens.

    Edges are the earliest start and latest end over the window's rows (all ranks).
    """
    ok = energy[energy["window_start_ns"].notna() & energy["window_end_ns"].notna()]
    keys = [*JOB_KEYS, *WINDOW_KEYS]
    w = (
        ok.groupby(keys, sort=True, dropna=False)
        .agg(
            start_ns=("window_start_ns", "min"),
            end_ns=("window_end_ns", "max"),
            output_tokens=("output_tokens", "first"),
            input_tokens=("input_tokens", "first"),
            status=("status", "first"),
        )
        .reset_index()
    )
    return w


def job_order(wins: pd.DataFrame) -> pd.DataFrame:
    """One row per job (its keys), in reading order: scenario, backend, model, tp, pp, dp —
    not by the jobs' random ids. The timeline draws the first :data:`MAX_JOBS`."""
    keys = ["job_id", *JOB_KEYS]
    return (
        wins[keys]
        .drop_duplicates("job_id")
        .sort_values(
            ["scenario", "backend", "model", "tp", "pp", "dp"],
            key=lambda c: c.astype(int) if c.name in ("tp", "pp", "dp") else c,
        )
        .reset_index(drop=True)
    )


def _window_rate(w: pd.DataFrame) -> pd.Series:
    dur = (w["end_ns"] - w["start_ns"]) / 1e9
    tokens = w["input_tokens"].where(w["phase"] == Phase.TRAIN.value, w["output_tokens"])
    return (tokens / dur).where(dur > 0)


def power_timeline(power: pd.DataFrame, energy: pd.DataFrame) -> Figure:
    """One panel per job: GPU power (W) per GPU against time, measured windows shaded by phase
    (generate / prefill / train) with their edges drawn.

    Where a job has no power sample (no GPU, NVML unavailable, sampler off) its panel draws
    each window's token rate instead — what was measured — labelled as such, with the sampler's
    reason. At most :data:`MAX_JOBS` panels; a note says how many were left out.
    """
    wins = job_windows(energy) if len(energy) else pd.DataFrame(columns=WINDOW_KEYS)
    order = job_order(wins)["job_id"].tolist() if len(wins) else []
    extra = sorted(set(power["job_id"] if len(power) else []) - set(order))
    jobs = order + extra
    if not jobs:
        fig, axes = draw.new_figure(1, 1)
        draw.only_note(axes[0, 0], "no job ran: no power timeline")
        return fig
    shown = jobs[:MAX_JOBS]
    ncols = 2 if len(shown) > 1 else 1
    nrows = math.ceil(len(shown) / ncols)
    fig, axes = draw.new_figure(nrows, ncols, width=6.4, height=2.9)
    for ax in axes.flat[len(shown) :]:
        ax.set_visible(False)
    unsampled: dict[str, str] = {}  # job -> why it has no power samples
    for ax, job in zip(axes.flat, shown, strict=False):
        why = _job_panel(
            ax,
            job,
            power[power["job_id"] == job] if len(power) else power,
            wins[wins["job_id"] == job],
        )
        if why is not None:
            unsampled[job] = why
    handles = [
        Patch(facecolor=c, alpha=0.25, edgecolor=c, label=f"{p} window")
        for p, c in PHASE_COLOURS.items()
    ]
    fig.legend(handles=handles, loc="upper right", fontsize=7, ncols=3)
    footer = []
    if unsampled:
        reasons = "; ".join(sorted(set(unsampled.values())))[:120]
        footer.append(
            f"no power samples in {len(unsampled)} of {len(shown)} jobs ({reasons}): "
            "their panels show each window's token rate, not power"
        )
    if len(jobs) > len(shown):
        footer.append(
            f"{len(shown)} of {len(jobs)} jobs shown; every job's samples are in its "
            "power.parquet (results/shards/<job>/)"
        )
    if footer:
        draw.figure_note(fig, "\n".join(footer))
    fig.tight_layout(rect=(0, 0.03 if footer else 0, 1, 0.97))
    return fig


def _job_title(w: pd.DataFrame, job: str) -> str:
    if w.empty:
        return str(job)[:40]
    r = w.iloc[0]
    return f"{r['backend']} {r['scenario']} {layout_name(r['tp'], r['pp'], r['dp'])}"


def _job_panel(ax, job: str, p: pd.DataFrame, w: pd.DataFrame) -> str | None:
    """Draw one job; returns why it has no power samples (None when it has them)."""
    samples = p[p["time_ns"].notna() & p["power_mw"].notna()] if len(p) else p
    starts = [*w["start_ns"].dropna()] + ([*samples["time_ns"]] if len(samples) else [])
    t0 = min(starts) if starts else 0
    ax.set_title(_job_title(w, job), fontsize=9, pad=10)
    ax.set_xlabel("time since the job's first sample or window [s]", fontsize=8)
    for _, r in w.iterrows():
        a, b = (r["start_ns"] - t0) / 1e9, (r["end_ns"] - t0) / 1e9
        colour = PHASE_COLOURS.get(r["phase"], "#999999")
        ax.axvspan(a, b, color=colour, alpha=0.18, gid=SPAN_GID, label="_window")
        ax.axvline(a, color=colour, linewidth=0.6, alpha=0.8)
        ax.axvline(b, color=colour, linewidth=0.6, alpha=0.8, linestyle=":")
        if r["phase"] != Phase.PREFILL.value:  # one label per repetition: its generate/train window
            ax.text(
                a,
                1.0,
                f"bs{int(r['batch_size'])}",
                transform=ax.get_xaxis_transform(),
                fontsize=6,
                va="bottom",
                ha="left",
                color="#333333",
            )
    if len(samples):
        for uuid, g in samples.sort_values("time_ns").groupby("gpu_uuid", sort=True):
            ax.plot(
                (g["time_ns"] - t0) / 1e9,
                g["power_mw"] / 1e3,
                linewidth=1,
                label=f"GPU {str(uuid)[-8:]}",
            )
        ax.set_ylabel("GPU power [W]", fontsize=8)
        ax.legend(fontsize=6.5, loc="lower right")
        why = None
    else:
        reasons = sorted(set(p["detail"].dropna())) if len(p) else []
        why = "; ".join(reasons)[:90] or "no power.parquet rows"
        rate = _window_rate(w)
        for (_, r), v in zip(w.iterrows(), rate, strict=True):
            if pd.notna(v):
                a, b = (r["start_ns"] - t0) / 1e9, (r["end_ns"] - t0) / 1e9
                ax.plot(
                    [a, b],
                    [v, v],
                    color=PHASE_COLOURS.get(r["phase"], "#999999"),
                    linewidth=2.2,
                    label="_rate",
                    solid_capstyle="butt",
                )
        ax.set_ylabel("tokens / s in the window", fontsize=8)
        if rate.notna().any() and np.nanmax(rate) / max(np.nanmin(rate), 1e-9) > 20:
            ax.set_yscale("log")
        ax.set_title(f"{ax.get_title()} — token rate, no power samples", fontsize=9, pad=10)
    ax.grid(alpha=0.3)
    return why
