"""Load the pipeline's tables and write every figure: the one place figures touch files."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pandas as pd

from energysweep import aggregate
from energysweep.figures import (
    FIGURES,
    backends_compared,
    baseline,
    energy_ladder,
    energy_per_token,
    headline_html,
    job_time_figure,
    layouts_at_equal_gpus,
    pareto_front,
    power_timeline,
    prefill_decode,
    prepare,
    save,
    serving_latency,
    serving_pareto,
    serving_slo,
    settings_figure,
    stage_balance,
    timeline,
    training,
)
from energysweep.job.gpu_request import SETTING_AXES
from energysweep.job.spec import JOB_KEYS, JobDir, JobKey

# The energy table's columns the power timeline reads: the job's keys (the GPU setting axes
# among them), its windows and their edges.
ENERGY_COLUMNS = [
    "job_id",
    *JOB_KEYS,
    "batch_size",
    "repetition",
    "phase",
    "status",
    "window_start_ns",
    "window_end_ns",
    "output_tokens",
    "input_tokens",
]


def load_power(job_records: list[str | Path], energy: pd.DataFrame | None = None) -> pd.DataFrame:
    """The power timelines (``JobDir.power``) of the jobs the timeline draws, concatenated.

    With ``energy`` only the first :data:`timeline.MAX_JOBS` jobs in the timeline's order are
    read (their directories end in :meth:`JobKey.params_path`), so a sweep of thousands of jobs
    does not read thousands of files for twelve panels.
    """
    if energy is not None and len(energy):
        shown = timeline.job_order(timeline.job_windows(energy)).head(timeline.MAX_JOBS)
        dirs = {
            JobKey.from_strings(
                {k: getattr(r, k) for k in JOB_KEYS if k not in SETTING_AXES}
            ).params_path()
            for r in shown.itertuples()
        }
        # A job directory ends with its layout, or continues with its GPU setting's parts.
        job_records = [
            j for j in job_records if any(f"{d}/" in f"{Path(j).parent.as_posix()}/" for d in dirs)
        ]
    power_files = [Path(JobDir.of(j).power) for j in job_records]
    frames = [pd.read_parquet(p) for p in power_files if p.is_file()]
    frames = [f for f in frames if len(f)]
    return (
        pd.concat(frames, ignore_index=True)
        if frames
        else pd.DataFrame(columns=["job_id", "gpu_uuid", "time_ns", "power_mw", "status", "detail"])
    )


def load_prepared(
    summary_csv: str | Path, energy_dir: str | Path
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The prepared summary (energysweep.figures.data.prepare, with the windows' CIs) and the
    merged rows."""
    summary = pd.read_csv(summary_csv)
    energy = pd.read_parquet(energy_dir)
    windows = aggregate.windows(energy[aggregate.WINDOW_COLUMNS]) if len(energy) else None
    return prepare(summary, windows), energy


def write_headline(summary_csv: str | Path, energy_dir: str | Path, out: str | Path) -> Path:
    """The report's first screen (energysweep.figures.headline) as an HTML fragment."""
    s, _ = load_prepared(summary_csv, energy_dir)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(headline_html(s))
    tmp.replace(out)
    return out


def draw_all(
    summary_csv: str | Path,
    energy_dir: str | Path,
    job_records: list[str | Path],
    outputs: dict[str, str | Path],
    stages_csv: str | Path | None = None,
    slo: dict | None = None,
) -> dict[str, Path]:
    """Draw every figure of :data:`FIGURES` named in ``outputs`` (stem -> PNG path).

    ``stages_csv`` is results/stages.csv where the workflow produces it; without it the stage
    figure is a note saying so. ``slo`` is config ``serving.slo`` (the serving figures' lines).
    """
    unknown = set(outputs) - set(FIGURES)
    if unknown:
        raise ValueError(f"unknown figures {sorted(unknown)}; known: {sorted(FIGURES)}")
    every, energy = load_prepared(summary_csv, energy_dir)
    # The per-layout figures draw one GPU setting (lines never mix settings); gpu_settings.png
    # compares them all.
    s, _ = baseline(every)
    stages = pd.read_csv(stages_csv) if stages_csv else None
    timeline_rows = energy[[c for c in ENERGY_COLUMNS if c in energy]]
    makers = {
        "energy_per_token": lambda: energy_per_token(s),
        "layouts_equal_gpus": lambda: layouts_at_equal_gpus(s),
        "backends": lambda: backends_compared(s),
        "pareto": lambda: pareto_front(s),
        "prefill_decode": lambda: prefill_decode(s),
        "stages": lambda: stage_balance(stages, s),
        "power_timeline": lambda: power_timeline(
            load_power(job_records, timeline_rows), timeline_rows
        ),
        "training": lambda: training(s),
        "serving_pareto": lambda: serving_pareto(s),
        "serving_latency": lambda: serving_latency(s, slo),
        "serving_slo": lambda: serving_slo(s, slo),
        "gpu_settings": lambda: settings_figure(every),
        "energy_ladder": lambda: energy_ladder(every),
        "job_time": lambda: job_time_figure(every),
    }
    _draw_in_parallel(makers, outputs)
    return {name: Path(out) for name, out in outputs.items()}


# Figures are drawn by this many forked processes at most (one per core): each draws its share.
MAX_DRAWERS = 4
DRAW_TIMEOUT_S = 900  # a drawer that has not finished by then is stopped and the step fails


def _draw(makers: dict, outputs: dict, names: list[str]) -> None:
    for name in names:
        save(makers[name](), outputs[name])
        print(f"figure {name}: {outputs[name]}", flush=True)


def _draw_in_parallel(makers: dict, outputs: dict) -> None:
    """Draw ``outputs`` with up to one forked process per core (the tables loaded once, before
    the fork); in this process where there is one core or no ``fork``.

    Raises:
        RuntimeError: naming the figures of every drawer that failed (its traceback is above
            it in the log) or did not finish within :data:`DRAW_TIMEOUT_S`.
    """
    names = list(outputs)
    drawers = min(len(names), os.cpu_count() or 1, MAX_DRAWERS)
    if drawers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        _draw(makers, outputs, names)
        return
    fork = multiprocessing.get_context("fork")
    shares = [names[i::drawers] for i in range(drawers)]
    procs = [fork.Process(target=_draw, args=(makers, outputs, share)) for share in shares]
    for p in procs:
        p.start()
    failed = []
    for p, share in zip(procs, shares, strict=True):
        p.join(DRAW_TIMEOUT_S)
        if p.is_alive():
            p.kill()
            p.join()
            failed.append(f"{share} (not done within {DRAW_TIMEOUT_S} s)")
        elif p.exitcode != 0:
            failed.append(f"{share} (exit {p.exitcode})")
    if failed:
        raise RuntimeError(f"drawing figures failed: {'; '.join(failed)}")
