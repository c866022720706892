"""The job's GPU setting on its node, for exactly the job's life: set, recorded, put back.

:func:`applied` wraps a job's run in the launcher (energysweep.launch.job.run_job). Before any
rank starts it remembers each of the job's GPUs' power limit and applications clocks, sets what
the job's routes say it sets (energysweep.job.gpu_request), reads every GPU back, and writes the
outcome to a record the ranks read (:data:`RECORD_ENV` names it). When the block ends - the
ranks exited 0, a rank failed or was SIGKILLed (torchrun stops the rest, the launcher's wait
returns), the job timed out, or the launcher got SIGTERM/SIGINT/SIGHUP - it puts the remembered
values back and reads them back. Only a SIGKILL of the launcher itself skips that: a site that
lets jobs set limits restores them in its Slurm Epilog (docs/gpu-settings.md).

A refused setter never stops the job here: the record says ``refused`` with NVML's error, and
the ranks turn every point of the job into a flagged failure without measuring it
(energysweep.gpu_setting.probe). The job's GPUs on this node are the first ``gpus`` of
``CUDA_VISIBLE_DEVICES`` (all GPUs when unset), resolved to UUIDs through NVML, as the ranks
resolve theirs. Multi-node jobs: only this (the launcher's) node is set here, so the grid
refuses an NVML power limit on them (energysweep.sweep.gpu_axes).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import socket
from pathlib import Path

from energysweep.gpu_setting import control
from energysweep.gpu_setting.record import RECORD_ENV, SettingsRecord
from energysweep.hw import nvml
from energysweep.job.gpu_request import NVML, SLURM_GPU_FREQ, GpuRequest
from energysweep.launch.slurm import job_tres_freq
from energysweep.tables.io import write_json_atomic

RECORD_NAME = "gpu-settings.json"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _job_gpus(count: int, env: dict) -> list[str]:
    """UUIDs of the job's first ``count`` GPUs on this node (in an NVML session), as the ranks
    see them (``env`` is their environment)."""
    visible = nvml.resolve_visible_gpus(env.get("CUDA_VISIBLE_DEVICES"))
    if len(visible) < count:
        raise ValueError(f"the job needs {count} GPUs on this node, NVML shows {len(visible)}")
    return visible[:count]


def _record(request: GpuRequest, routes, settings, error: str | None) -> SettingsRecord:
    return SettingsRecord(
        request=request,
        routes={"power_limit": routes[0], "clock": routes[1]},
        host=socket.gethostname(),
        # What sbatch --gpu-freq asked, as Slurm records it for the job, and what reached the
        # step's environment (the Slurm jobstep plugin drops SLURM_GPU_FREQ before its srun).
        slurm_tres_freq=job_tres_freq(os.environ.get("SLURM_JOB_ID")) if routes[1] else None,
        slurm_gpu_freq=os.environ.get("SLURM_GPU_FREQ"),
        gpus=copy.deepcopy(settings),  # as written for the ranks (the restore changes them)
        error=error,
    )


def _explain_slurm_clock(settings, clock: str | None) -> None:
    """Say, on a clock Slurm was to set but did not, what Slurm was asked and what it needs."""
    step = os.environ.get("SLURM_GPU_FREQ")
    for s in settings:
        if s.clock_status == control.NOT_APPLIED:
            s.detail.append(
                f"Slurm was asked --gpu-freq={clock}, but this step's SLURM_GPU_FREQ is "
                f"{step or 'not set'} (the jobstep plugin's inner srun drops it, and Slurm then "
                "applies GpuFreqDef to the step); slurmd sets GPU clocks only with its gpu/nvml "
                "plugin"
            )


@contextlib.contextmanager
def applied(request: GpuRequest | None, directory: str | Path, gpus: int, env: dict, log):
    """Set the job's GPU setting for the ``with`` block; always put it back.

    Args:
        request: the job's setting (``job.gpu``; None: nothing is touched).
        directory: where the record goes (the job's staging directory).
        gpus: the job's GPUs on this node.
        env: the ranks' environment; :data:`RECORD_ENV` is added to it.
        log: the job's log (what was set, read back and put back).

    Yields:
        The :class:`SettingsRecord`, or None when the job sets nothing.
    """
    if request is None:
        yield None
        return
    with nvml.for_job(env):  # measurement.device emulated: the job's emulated node
        yield from _applied(request, directory, gpus, env, log)


def _applied(request: GpuRequest, directory: str | Path, gpus: int, env: dict, log):
    routes = request.routes(under_slurm=bool(os.environ.get("SLURM_JOB_ID")))
    path = Path(directory) / RECORD_NAME
    settings: list[control.GpuSetting] = []  # filled GPU by GPU: restored even if partial
    error, session = None, False
    try:
        nvml.init()
        session = True
        control.apply(
            _job_gpus(gpus, env),
            request.power_limit_w,
            request.clock,
            set_power=routes[0] == NVML,
            set_clock=routes[1] == NVML,
            out=settings,
        )
        if routes[1] == SLURM_GPU_FREQ:
            _explain_slurm_clock(settings, request.clock)
    except Exception as exc:  # recorded: the ranks flag every point of the job
        what = "NVML unavailable" if not session else "could not apply the GPU setting"
        error = f"{what}: {control.error_text(exc)}"
    record = _record(request, routes, settings, error)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(record.to_json(), path)
    env[RECORD_ENV] = str(path)
    print("gpu settings:", json.dumps(record.to_json()), file=log, flush=True)
    try:
        yield record
    finally:
        if session:
            # A second stop signal must not cut the restore short (Slurm: SIGTERM, then SIGKILL
            # only after KillWait).
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            try:
                problems = control.restore(settings)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            print(
                "gpu settings restored:",
                json.dumps(problems) if problems else "ok (read back as they were)",
                file=log,
                flush=True,
            )
            # What the GPUs hold now, read afresh: a reader compares it with "previous_*".
            after = json.dumps(control.current(settings))
            print("gpu settings after the job:", after, file=log, flush=True)
            nvml.shutdown()
