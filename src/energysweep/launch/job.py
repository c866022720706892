"""Running one measure job: write the launched job, start its processes, publish its outputs or
nothing.

The argv and environment come from :mod:`energysweep.launch.argv`; the processes are one unit
(:mod:`energysweep.launch.procs`); what they create outside themselves (shared memory, temp
files, sockets) is named per job and removed however the job ends, and what a dead job left is
removed before the next one starts (:mod:`energysweep.launch.cleanup`); the ranks write into a
staging directory, published only when every process exited 0 (job.json last).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

from energysweep.hw import emulated
from energysweep.job.placement import Placement
from energysweep.job.sections import Limits, as_dict
from energysweep.job.spec import JobDir, JobSpec, LaunchedJob, Outputs
from energysweep.launch import cleanup, gpu_claims, gpu_guard, procs
from energysweep.launch.argv import build_argv, build_env
from energysweep.launch.slurm import job_nodes, restore_job_identity
from energysweep.tables.io import replace, write_text_atomic
from energysweep.util.version import code_version

# Signals that stop a running job as a whole: Slurm's scancel and TIMEOUT (SIGTERM), Ctrl-C
# (SIGINT), a closed terminal (SIGHUP).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class JobFailed(RuntimeError):
    """A measure job did not complete; nothing of it was published."""


class JobInterrupted(JobFailed):
    """The measure step got a stop signal (scancel, Slurm TIMEOUT, Ctrl-C) while the job ran."""


@contextlib.contextmanager
def _stop_signals_raise():
    """While the job runs, a stop signal raises :class:`JobInterrupted` (once) in this thread.

    Yields a function that disarms it: once the job is being stopped, a signal must not
    interrupt the teardown. Only the main thread can own signal handlers; elsewhere (a test
    calling run_job from a thread) the signals keep their handlers.
    """
    armed = [True]

    def disarm() -> None:
        armed[0] = False

    if threading.current_thread() is not threading.main_thread():
        yield disarm
        return

    def handler(signum, _frame):
        if armed[0]:
            armed[0] = False
            raise JobInterrupted(f"got {signal.Signals(signum).name}")

    old = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield disarm
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def run_job(
    spec: JobSpec,
    job_dir: JobDir,
    model_dir: str,
    limits: Limits,
    log,
    cpus: int,
    python: str = sys.executable,
    server_python: str | None = None,
) -> LaunchedJob:
    """Launch ``spec``: write it as a :class:`LaunchedJob`, start its processes, and publish its
    outputs only if all of them succeeded.

    ``python`` is the interpreter of the backend's environment (energysweep.sweep.interpreters): the
    ranks, and torchrun itself, run in it. ``server_python``: a serving job's server interpreter
    (the engine's environment; the client runs in ``python``), None on other jobs.

    The ranks read the launched job from ``job_dir.spec_file`` and write into a hidden staging
    directory in ``job_dir``; the files move to their final names (``job_dir``'s, job.json last)
    only after every process exited 0. A job that fails or is killed (scancel, SIGKILL of a rank,
    node failure) therefore leaves no shard under a name that aggregation reads.

    The job's processes are one unit (energysweep.launch.procs): on a rank's failure, on
    ``limits.job_timeout_s``, or on a stop signal to this process (SIGTERM from scancel or Slurm's
    TIMEOUT, SIGINT from Ctrl-C), every one of them gets SIGTERM and, ``limits.kill_grace_s``
    later, SIGKILL; then the staging directory is removed and :class:`JobFailed` says why.

    Args:
        limits: config ``limits:``; passed to the ranks in the launched job but not part of its
            config hash: a limit changes no measurement.

    Returns:
        The launched job (its outputs are the staging paths the ranks wrote).

    Raises:
        JobFailed: the command exited non-zero, ran past the timeout, left outputs missing, or
            the step was interrupted (:class:`JobInterrupted`).
    """
    placement = spec.placement
    job_id = uuid.uuid4().hex
    final = job_dir.outputs(
        spec.batch_sizes, spec.workload.repetitions, emulated=spec.measurement.device == "emulated"
    )
    base = Path(job_dir.root).resolve()
    staging = base / f".staging-{job_id}"
    slurm_id = os.environ.get("SLURM_JOB_ID")
    head = _head_node(placement, slurm_id, log) if placement.multi_node else None
    argv = build_argv(
        placement, job_dir.spec_file, python=python, slurm_job_id=slurm_id, head_node=head
    )
    job = spec.launched(
        model_dir=model_dir,
        outputs=final.restaged(staging, base),
        limits=limits,
        # The code version is read where the job runs.
        code_version=code_version(),
        launch_argv=argv,
        job_id=job_id,
        server_python=server_python,
    )
    write_text_atomic(job.dumps(), job_dir.spec_file)
    ranks_here = placement.layout.world_size // placement.nodes
    env = _job_env(spec, cpus // max(1, ranks_here), slurm_id)
    if job.outputs.emulated is not None:
        env = _emulated_node(job, job.outputs.emulated, env, log)
    what = f"job {spec.key.label()} ({job_dir.spec_file})"
    print("launch:", json.dumps(argv), file=log, flush=True)
    try:
        # Outside Slurm: GPUs of the job's own, held until it ends (one job per GPU).
        device, timeout = spec.measurement.device, float(limits.job_timeout_s)
        with gpu_claims.job_gpus(device, ranks_here, env, log, timeout, what) as env:
            # GPU power limit and clocks: set before the ranks start, put back however they end.
            with gpu_guard.applied(spec.gpu, staging, ranks_here, env, log):
                _run_as_unit(argv, env, log, job_id, limits, what, one_node=placement.nodes == 1)
        if job.outputs.emulated is not None:
            emulated.strip_state(job.outputs.emulated)
        _publish(job.outputs, final, what)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return job


def _emulated_node(job: LaunchedJob, state: str, env: dict, log) -> dict:
    """measurement.device emulated: the node's settings in the job's (staged) state directory,
    named in the ranks' environment (energysweep.hw.emulated; docs/emulated-node.md)."""
    import time

    node = emulated.prepare(state, as_dict(job.measurement.emulated), time.time_ns())
    print(
        f"emulated GPU node: {node.profile}, {node.gpus} GPUs per node, state in {state} "
        "(a test of the measurement, never a figure to cite)",
        file=log,
        flush=True,
    )
    return emulated.job_env(state, node, env)


def _job_env(spec: JobSpec, threads: int, slurm_id: str | None) -> dict:
    """The ranks' environment (energysweep.launch.argv.build_env), with the Slurm account back
    where the job step lost it, so every row names it (sacct joins on it)."""
    env = build_env(
        spec.key.backend,
        threads=threads,
        slurm_job_id=slurm_id,
        engine=spec.engine,
    )
    return restore_job_identity(env)


def _run_as_unit(
    argv: list[str], env: dict, log, job_id: str, limits: Limits, what: str, *, one_node: bool
) -> None:
    """Run the job's processes as one unit; however the run ends, stop every one of them and
    remove what they created outside themselves (:mod:`energysweep.launch.cleanup`).

    First, what dead jobs left on this node goes (a SIGKILLed measure step cleaned up nothing).
    A one-node job's processes get a temp dir of their own (``TMPDIR``); on more nodes the
    others would not have it.
    """
    cleanup.sweep_stale(log)
    tmpdir, lock = cleanup.claim(job_id)
    if one_node:
        env = {**env, "TMPDIR": str(tmpdir)}
    proc, tracker = None, cleanup.Tracker(job_id, tmpdir)
    with _stop_signals_raise() as disarm:
        try:
            proc = procs.start(argv, env, log, job_id)
            tracker.start()
            _wait(proc, float(limits.job_timeout_s), what, argv[0])
        except JobInterrupted as exc:
            raise JobInterrupted(
                f"{what} interrupted ({exc}): stopped all its processes; nothing of it was "
                "published"
            ) from None
        finally:
            disarm()
            tracker.poll()  # what its processes map now, before they are stopped
            # Also after a clean exit: a rank's helper or engine worker may linger.
            procs.stop(proc, job_id, float(limits.kill_grace_s), log)
            cleanup.release(job_id, tracker.stop(), tmpdir, lock, log)


def _head_node(placement: Placement, slurm_id: str | None, log) -> str:
    """The first node of a multi-node job's Slurm allocation (its rendezvous host)."""
    # From the job id: the jobstep plugin strips SLURM_JOB_NODELIST from mpi rules.
    nodes = job_nodes()
    print(f"nodes: {' '.join(nodes)}", file=log, flush=True)
    if len(nodes) < placement.nodes:
        raise RuntimeError(
            f"{placement.layout} needs {placement.nodes} nodes; Slurm job "
            f"{slurm_id} has {len(nodes)}: {nodes}"
        )
    return nodes[0]


def _wait(proc, timeout: float, what: str, program: str) -> None:
    """Wait for the job's processes; JobFailed if they run past ``timeout`` or exit non-zero."""
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise JobFailed(
            f"{what} ran longer than limits.job_timeout_s={timeout:g} s: stopped all "
            "its processes; nothing of it was published"
        ) from None
    if rc != 0:
        raise JobFailed(
            f"{what} failed: {program} exited {rc} (the ranks' errors are above); "
            "nothing of it was published"
        )


def _publish(staged_outputs: Outputs, final_outputs: Outputs, what: str) -> None:
    """Move the staged outputs to their final names, job.json last (it marks a complete job)."""
    staged, targets = staged_outputs.paths(), final_outputs.paths()
    missing = [s for s in staged if not Path(s).exists()]
    if missing:
        raise JobFailed(f"{what} exited 0 but did not write {missing}")
    last = final_outputs.job_json
    pairs = sorted(zip(staged, targets, strict=True), key=lambda st: st[1] == last)
    # A stop signal now would leave some outputs published and not others: hold it until done.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        for src, dst in pairs:
            Path(dst).parent.mkdir(parents=True, exist_ok=True)
            replace(src, dst)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
