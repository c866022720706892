"""Where each job's time went: its rank-0 wall time as one stacked bar of phases per job.

A cluster user pays for the whole job, not for its windows: the bar shows how much of the job
was measurement (``window``) and what the rest was spent on (the phases of
:class:`energysweep.tables.phases.JobPhase`, from the summary's ``job_<phase>_s`` columns).
"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from energysweep.figures.draw import new_figure, only_note
from energysweep.job.spec import JOB_KEYS
from energysweep.tables.phases import JOB_PHASES, JobPhase

# The window stands out; set-up phases in warm colours, waits in greys, the rest light.
PHASE_COLOURS = {
    JobPhase.START: "#8c564b",
    JobPhase.LOAD: "#d62728",
    JobPhase.SERVER_START: "#ff7f0e",
    JobPhase.WARMUP: "#e6ab02",
    JobPhase.IDLE_BASELINE: "#9467bd",
    JobPhase.COOLDOWN: "#7f7f7f",
    JobPhase.EDGES: "#bcbd22",
    JobPhase.WINDOW: "#2ca02c",
    JobPhase.RAMP: "#17becf",
    JobPhase.DRAIN: "#1f77b4",
    JobPhase.WRITE: "#e377c2",
    JobPhase.TEARDOWN: "#c49c94",
    JobPhase.OTHER: "#d9d9d9",
}
KEYS = ["backend", "scenario", "tp", "pp", "dp"]


def jobs_of(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per job with its phases recorded, in the summary's key order."""
    if summary.empty or "job_wall_s" not in summary:
        return summary.iloc[0:0]
    jobs = summary.dropna(subset=["job_wall_s"])
    jobs = jobs.drop_duplicates([k for k in JOB_KEYS if k in jobs])
    keys = [k for k in KEYS if k in jobs]
    return jobs.sort_values(keys).reset_index(drop=True)


def job_label(row) -> str:
    return f"{row.backend} {row.scenario} tp{row.tp} pp{row.pp} dp{row.dp}"


def job_time_figure(summary: pd.DataFrame) -> Figure:
    """One horizontal stacked bar per job: seconds of each phase, the window fraction at its end."""
    jobs = jobs_of(summary)
    fig, axes = new_figure(1, 1, width=10.0, height=max(2.5, 0.42 * len(jobs) + 1.6))
    ax = axes[0][0]
    if jobs.empty:
        only_note(ax, "no job recorded its phases (job.json timing.phases_s)")
        return fig
    y = list(range(len(jobs)))
    left = pd.Series(0.0, index=jobs.index)
    for phase in JOB_PHASES:
        seconds = jobs[f"job_{phase.value}_s"].fillna(0.0).astype(float)
        if (seconds > 0).any():
            ax.barh(y, seconds, left=left, color=PHASE_COLOURS[phase], label=phase.value)
        left = left + seconds
    for i, row in enumerate(jobs.itertuples()):
        ax.text(
            float(left.iloc[i]),
            i,
            f"  {row.job_window_fraction:.2f} in windows",
            va="center",
            fontsize=7.5,
        )
    ax.set_yticks(y, [job_label(r) for r in jobs.itertuples()], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, float(left.max()) * 1.25)
    ax.set_xlabel("rank-0 wall time (s), process start to job.json")
    ax.set_title("Where each job's time went", fontsize=10)
    handles = [Patch(color=PHASE_COLOURS[p], label=p.value) for p in JOB_PHASES]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig
