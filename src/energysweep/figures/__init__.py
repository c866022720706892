"""Figures that answer the sweep's questions: pure functions, DataFrames in, matplotlib out.

Each figure function takes the summary prepared by :func:`data.prepare` (plus, for some, the
stage table, power samples or merged shard rows) and returns a ``matplotlib.figure.Figure``;
nothing here reads or writes files except :func:`save`. :data:`FIGURES` lists them in report
order with the output name the workflow gives each.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from energysweep.figures.data import prepare
from energysweep.figures.gpu_settings import baseline, settings_figure
from energysweep.figures.headline import headline_html
from energysweep.figures.job_time import job_time_figure
from energysweep.figures.ladder import energy_ladder
from energysweep.figures.pareto import pareto_front
from energysweep.figures.phases import prefill_decode, stage_balance
from energysweep.figures.serving import serving_latency, serving_pareto, serving_slo
from energysweep.figures.style import layout_style
from energysweep.figures.sweeps import (
    backends_compared,
    energy_per_token,
    layouts_at_equal_gpus,
    training,
)
from energysweep.figures.timeline import power_timeline
from energysweep.tables.io import atomic_path

# Output stem -> the question it answers (report order).
FIGURES = {
    "energy_per_token": "energy per output token vs batch size, per layout",
    "layouts_equal_gpus": "tp vs pp vs dp at equal GPU count, per backend",
    "backends": "backends side by side on the same layouts",
    "pareto": "energy–throughput Pareto front",
    "prefill_decode": "prefill vs decode split",
    "stages": "per-stage (pp rank) share for pp > 1",
    "power_timeline": "power timeline per job with window edges",
    "training": "training: energy per token and throughput vs global batch",
    "serving_pareto": "serving: energy per request vs achieved throughput, the knee marked",
    "serving_latency": "serving: latency percentiles vs load",
    "serving_slo": "serving: energy per request vs latency under the SLO",
    "gpu_settings": "energy per token at each GPU power limit and clock",
    "energy_ladder": "energy per token as the boundary widens: GPU, host, node, facility, CO2e",
    "job_time": "where each job's time went: its phases, the share inside windows",
}

__all__ = [
    "FIGURES",
    "backends_compared",
    "baseline",
    "energy_ladder",
    "energy_per_token",
    "headline_html",
    "job_time_figure",
    "layout_style",
    "layouts_at_equal_gpus",
    "pareto_front",
    "power_timeline",
    "prefill_decode",
    "prepare",
    "save",
    "serving_latency",
    "serving_pareto",
    "serving_slo",
    "settings_figure",
    "stage_balance",
    "training",
]


def save(fig: Figure, out: str | Path, dpi: int = 110) -> None:
    """Write ``fig`` as PNG (atomically: a reader never sees half a file)."""
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=dpi, format="png")
