"""Every second of a job in one phase: the phase clock, the summary's columns, the figure."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from energysweep.aggregate import nulls
from energysweep.aggregate.job_time import COLUMNS, job_time_columns
from energysweep.figures.draw import notes
from energysweep.figures.job_time import job_time_figure
from energysweep.measure.phase_clock import PhaseClock, process_age_s
from energysweep.tables.phases import JOB_PHASES, JobPhase


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_phases_add_up_and_nest():
    t = FakeClock()
    clock = PhaseClock(clock=t, age_s=2.0)  # the process ran 2 s before the clock was made
    t.now += 1.0
    assert clock.switch(JobPhase.OTHER) == JobPhase.START
    t.now += 0.5
    with clock.during(JobPhase.WARMUP):
        t.now += 3.0
        with clock.during(JobPhase.COOLDOWN):
            t.now += 0.25
        t.now += 1.0
        clock.switch(JobPhase.WINDOW)  # a switch inside a block ends where the block ends
        t.now += 2.0
    t.now += 0.75
    totals = clock.totals()
    assert list(totals) == [p.value for p in JOB_PHASES]
    assert totals["start"] == pytest.approx(3.0)
    assert totals["warmup"] == pytest.approx(4.0)
    assert totals["cooldown"] == pytest.approx(0.25)
    assert totals["window"] == pytest.approx(2.0)
    assert totals["other"] == pytest.approx(1.25)
    assert sum(totals.values()) == pytest.approx(clock.wall_s()) == pytest.approx(10.5)
    assert clock.current == JobPhase.OTHER


def test_an_exception_inside_a_phase_restores_the_outer_one():
    t = FakeClock()
    clock = PhaseClock(clock=t, phase=JobPhase.OTHER)
    with pytest.raises(ValueError), clock.during(JobPhase.LOAD):
        t.now += 1.0
        raise ValueError
    t.now += 1.0
    assert clock.current == JobPhase.OTHER
    assert clock.totals()["load"] == pytest.approx(1.0)


def test_this_process_is_older_than_zero():
    assert 0.0 < process_age_s() < 24 * 3600


TP = {"a": 1, "b": 2}  # job -> its tp


def key(job):
    return {"model": "m", "backend": "pytorch", "scenario": "inference", "tp": TP[job], "pp": 1,
            "dp": 1, "power_limit_w": None, "gpu_clock": None}  # fmt: skip


def record(job, phases=None, window_fraction=0.5):
    timing = {"rank0_wall_s": sum((phases or {}).values()), "window_fraction": window_fraction}
    if phases is not None:
        timing["phases_s"] = phases
    return {"job_id": f"id-{job}", "job": key(job), "timing": timing}


def summary_of(jobs):
    """Summary rows of ``jobs`` (no job_id: a point is found by its job's key; the setting axes
    null as NaN, as pandas reads them)."""
    return pd.DataFrame([{**key(j), "power_limit_w": float("nan"), "batch_size": 1} for j in jobs])


def test_every_point_carries_its_jobs_phases_and_an_older_job_says_why_not():
    phases = {p.value: 1.0 for p in JOB_PHASES}
    records = {Path("a/job.json"): record("a", phases), Path("b/job.json"): record("b")}
    s = summary_of(["a", "a", "b"])
    cols = job_time_columns(s, records)
    assert list(cols.index) == list(s.index)
    assert cols.loc[0, "job_wall_s"] == len(JOB_PHASES)
    assert cols.loc[1, "job_window_s"] == 1.0
    assert list(cols["job_time_status"]) == ["counted", "counted", "not_recorded"]
    assert cols.loc[2, COLUMNS].isna().all()
    assert not nulls.unexplained_nulls(cols)


def test_the_figure_draws_one_bar_per_job_or_says_why_none():
    phases = {p.value: 1.0 + i for i, p in enumerate(JOB_PHASES)}
    records = {Path(f"{j}/job.json"): record(j, phases) for j in ("a", "b")}
    s = summary_of(["a", "b", "b"])
    s = pd.concat([s, job_time_columns(s, records)], axis=1)
    fig = job_time_figure(s)
    ax = fig.axes[0]
    drawn = [lbl.get_text() for lbl in ax.get_yticklabels()]
    assert drawn == ["pytorch inference tp1 pp1 dp1", "pytorch inference tp2 pp1 dp1"]
    # One bar segment per job and phase, each as long as its seconds.
    assert len(ax.patches) == 2 * len(JOB_PHASES)
    assert sorted({round(p.get_width(), 6) for p in ax.patches}) == sorted(set(phases.values()))
    empty = job_time_figure(summary_of(["a"]))
    assert any("no job recorded its phases" in n for n in notes(empty))
