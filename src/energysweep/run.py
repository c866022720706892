"""The per-rank entry point a measure job executes (``torchrun ... -m energysweep.run --spec F``).

Flow on every rank: load the launched job (:class:`energysweep.job.spec.LaunchedJob`, typed; read
by attribute, never indexed), check the world against its placement, start the process group,
audit the processes, load the backend once. Then the :class:`energysweep.measure.monitor.JobMonitor`
snapshots the environment and starts the power sampler, and the job's scenario
(:mod:`energysweep.scenarios`), for each batch size, warms up (the first time, then the idle
baseline once the GPUs settled: ``JobMonitor.ensure_idle``) and measures
``repetitions`` windows (window rule: :mod:`energysweep.measure.window`); rank 0 combines the
ranks' rows of each window (:func:`energysweep.measure.combine.combine_ranks`) and writes one
shard per repetition, and at the end all of them again as the job table (one file, what the
merge reads), then generations.parquet, power.parquet and job.json. A failure at one batch size
(OOM, error) is recorded as that point's status and the job goes on; a crash of the job fails it.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
import time
import traceback

from energysweep import dist
from energysweep.hw import nvml as hw_nvml
from energysweep.job.backends import SERVING
from energysweep.job.spec import LaunchedJob
from energysweep.launch import procs
from energysweep.measure import phase_clock, progress
from energysweep.measure.combine import combine_ranks
from energysweep.measure.monitor import JobMonitor
from energysweep.scenarios.base import Scenario
from energysweep.tables import io as tables_io
from energysweep.tables import shards
from energysweep.tables.phases import JobPhase


def _seed(seed: int) -> dict:
    """Seed every RNG a rank uses; returns what was set (recorded in job.json)."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    return {"seed": seed, "python_random": seed, "numpy": seed, "torch": seed, "cuda": seed}


def _start_ranks(job: LaunchedJob) -> tuple[dist.RankContext, list[dict], dict]:
    """Process group, rank context, audit of the world, seeds: (ctx, audits, seeds)."""
    # The placement (launch mode torchrun / direct / mpi) decides what world the audit expects.
    placement = job.placement
    _, local_rank, _ = dist.env_world()
    device = dist.choose_device(job.measurement.device, local_rank)
    if device == "cpu":
        import torch

        # Ranks share the node's cores; without this every rank spawns one thread per core.
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    dist.init(placement, device, timeout_s=job.limits.collective_timeout_s)
    ctx = dist.make_context(
        placement,
        device,
        model_dir=job.model_dir,
        dtype=job.dtype,
        seed=job.seed,
        max_input_tokens=job.workload.max_input_tokens,
    )
    audits = dist.gather(ctx.audit())
    dist.check_world(audits, placement)
    if ctx.rank == 0:
        progress.say(
            f"{len(audits)} rank(s) up on {device} ({job.key.backend}, {job.key.scenario})"
        )
    return ctx, audits, _seed(job.seed)


def _gpus_measured(job: LaunchedJob, ctx: dist.RankContext) -> list[str]:
    """The GPUs this process measures: its own device's, or a serving client's every GPU of the
    job (by NVML alone: the client must not open a CUDA context on its server's GPUs)."""
    if job.key.scenario == SERVING:
        from energysweep.scenarios.serving.client import ServedGpus

        served = ctx.device.startswith("cuda") or hw_nvml.emulated()
        return ServedGpus(ctx.layout.world_size).gpu_uuids() if served else []
    return hw_nvml.gpu_uuids(ctx.device, ctx.local_rank)


def _gpu_load(job: LaunchedJob):
    """The processes whose activity is the emulated GPUs' load: this rank's own (None), or a
    serving client's server (every process of it, as it changes with each batch cap's server):
    the server computes on the GPUs, the client only sends requests and reads counters."""
    if job.key.scenario == SERVING:
        from energysweep.launch.server import server_pids

        return server_pids
    return None


def _write_no_requests(job: LaunchedJob) -> None:
    """An empty requests.parquet: this backend/scenario reports no per-request timings."""
    from energysweep.backends import request_log

    request_log.write([], job.outputs.requests)


def _gather_to_rank0(obj) -> list | None:
    """Every rank's ``obj`` on rank 0 only (None elsewhere): the power samples can be large."""
    import torch.distributed as tdist

    if not (tdist.is_available() and tdist.is_initialized()):
        return [obj]
    out = [None] * tdist.get_world_size() if tdist.get_rank() == 0 else None
    tdist.gather_object(obj, out, dst=0)
    return out


def _scenario(job: LaunchedJob, ctx: dist.RankContext, prompts: list[str]):
    """(backend or None, its load time or None, monitor, scenario) of the job, monitor started
    (the idle baseline is taken, and logged, after the first warm-up: Scenario.point)."""
    return _start_scenario(job, ctx, prompts)


def _start_scenario(job: LaunchedJob, ctx: dist.RankContext, prompts: list[str]):
    from energysweep.backends import load_backend

    if job.key.scenario == SERVING:
        return _serving(job, ctx, prompts)
    if job.key.scenario == "training":
        from energysweep.scenarios.training import TrainingScenario

        # Training loads a trainable copy of the model per grid point (inside its windows'
        # set-up): no job-level load.
        monitor = JobMonitor(job, ctx)
        with phase_clock.during(JobPhase.LOAD):  # tokenizer, training samples, parameter count
            training = TrainingScenario(job, ctx, prompts, monitor)
        if ctx.rank == 0:
            progress.say("training loads its model at each batch size (no job-level load)")
        monitor.start()
        return None, None, monitor, training
    from energysweep.backends.base import NotLoaded
    from energysweep.scenarios.inference import InferenceScenario

    refused = _refused_before_load(job, ctx)
    t_load = time.time()
    with phase_clock.during(JobPhase.LOAD):
        backend = NotLoaded(refused) if refused else load_backend(job, ctx)
    load_s = None if refused else time.time() - t_load
    if ctx.rank == 0:
        progress.say(
            f"model not loaded: {refused[:1500]}"
            if refused
            else f"model loaded in {load_s:.1f} s ({job.key.model})"
        )
    monitor = JobMonitor(job, ctx, backend=backend)
    with phase_clock.during(JobPhase.LOAD):  # the parameter count
        scenario = InferenceScenario(job, ctx, backend, prompts, monitor)
    monitor.start(backend.synchronize)
    return backend, load_s, monitor, scenario


def _refused_before_load(job: LaunchedJob, ctx: dist.RankContext) -> str:
    """Why the job's GPU setting cannot be in effect on some rank's GPUs, agreed across ranks
    before the model loads (the launcher's record: refused, or not read back when set); empty
    when it may be. Every point would then fail its settings check (Scenario.check_settings)
    without a window, so the model is not loaded: on a GPU node that load is the GPUs' minutes.
    Only under torchrun, where a rank's GPUs are its device's (an engine launched directly
    names its GPUs once it has loaded)."""
    if job.gpu is None or job.placement.launch_mode != "torchrun":
        return ""
    from energysweep.measure.monitor import refused_settings

    mine = refused_settings(job, hw_nvml.gpu_uuids(ctx.device, ctx.local_rank))
    problems = sorted({p for rank in dist.gather(mine) for p in rank})
    if not problems:
        return ""
    return (
        f"GPU setting ({job.gpu.label()}) is not in effect, so no point of this job can be "
        f"measured: {'; '.join(problems)}"
    )


def _serving(job: LaunchedJob, ctx: dist.RankContext, prompts: list[str]):
    """The serving client: its first server is up and warmed up before the idle baseline (the
    engine loaded and idle, as the other scenarios measure it with the model loaded)."""
    from functools import partial

    from energysweep.launch.server import server_for_job
    from energysweep.scenarios.serving.client import ServedGpus
    from energysweep.scenarios.serving.scenario import ServingScenario

    make_server = partial(
        server_for_job, job, ctx.model_dir, ctx.layout, ctx.device.startswith("cuda")
    )
    monitor = JobMonitor(job, ctx, backend=ServedGpus(ctx.layout.world_size))
    with phase_clock.during(JobPhase.LOAD):  # the tokenizer, the parameter count
        scenario = ServingScenario(job, ctx, prompts, monitor, make_server)
    t0 = time.time()
    with phase_clock.during(JobPhase.SERVER_START):
        scenario.start_server(job.batch_sizes[0])
    monitor.start()
    return None, time.time() - t0, monitor, scenario


def _flat(rows_by_rank: list[list[dict]]) -> list[dict]:
    return [r for rows in rows_by_rank for r in rows]


def _measure(job: LaunchedJob, ctx: dist.RankContext, scenario: Scenario) -> int | None:
    """Every point of the job; rank 0 writes the shards and the job table (its row count)."""
    job_tables = []  # rank 0: every shard of the job, for the job table
    for bs in job.batch_sizes:
        for rep, rows in enumerate(scenario.point(bs)):
            with phase_clock.during(JobPhase.WRITE):
                gathered = dist.gather(rows)
                if ctx.rank == 0:
                    # A serving client's rows are final (one process measures every GPU).
                    rows = _flat(gathered) if scenario.rows_final else combine_ranks(gathered)
                    for line in progress.window_lines(rows):
                        progress.say(line)
                    table = shards.to_table(rows)
                    tables_io.write_atomic(table, job.outputs.shard(bs, rep))
                    job_tables.append(table)
    phase_clock.switch(JobPhase.TEARDOWN)  # the last window is behind: the rest is teardown
    if ctx.rank != 0:
        return None
    # The same rows in one file: what the merge reads (one file per job, not per window).
    job_table = shards.concat(job_tables)
    tables_io.write_atomic(job_table, job.outputs.job_table)
    return job_table.num_rows


def _timing(monitor, scenario, load_s, window_ns, startups) -> dict:
    """job.json ``timing``: rank 0's wall time, split into phases that add up to it."""
    # The process's life up to now (energysweep.measure.phase_clock); its phases add up to it.
    phases = phase_clock.CLOCK.totals()
    wall_s = phase_clock.CLOCK.wall_s()
    return {
        "rank0_wall_s": wall_s,
        "phases_s": phases,
        "model_load_s": load_s,
        **monitor.idle_timing(),
        "window_s": window_ns[0] / 1e9,
        "window_fraction": (window_ns[0] / 1e9) / wall_s if wall_s else None,
        "warmup": scenario.warmups,  # each point's, on rank 0 (measure.warmup)
        "cooldown_skipped": scenario.cooldown_skipped,  # why, or None where they ran
        "backend_startup": startups if any(startups) else None,
        # Serving: each server's start, warm-up and stop, each load run's ramp, window
        # and drain (bench/serving_overhead.py reads them).
        "serving": getattr(scenario, "timing", None),
    }


def _fail_closed(job: LaunchedJob, ctx: dist.RankContext, gpus: list[str]) -> None:
    """measurement.require_energy, checked on every rank before the model is loaded."""
    from energysweep.validity.require import check_job

    check_job(
        job.measurement,
        ctx.device,
        gpus,
        ctx.local_rank,
        ctx.rank,
        ctx.host,
        gather=dist.gather,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="the launched job (JobDir.spec_file)")
    args = parser.parse_args(argv)
    job = LaunchedJob.load(args.spec)
    ctx, audits, seeds = _start_ranks(job)
    gpus = _gpus_measured(job, ctx)
    # Emulated node: this rank's (a serving client: its server's) activity is the GPUs' load.
    owner = hw_nvml.attach(gpus, pids=_gpu_load(job))
    _fail_closed(job, ctx, gpus)
    from energysweep.energy.sampler import write_power
    from energysweep.measure.provenance import job_environment
    from energysweep.scenarios.prompts import load_prompts
    from energysweep.tables.generations import write_generations
    from energysweep.tables.job_record import write_job_record

    prompts = load_prompts(None if job.workload.prompts == "builtin" else job.workload.prompts)
    phase_clock.switch(JobPhase.OTHER)  # the ranks are up: what follows is the job's own
    backend, load_s, monitor, scenario = _scenario(job, ctx, prompts)
    # The heap as it stands (imports, model, engine) goes to the garbage collector's permanent
    # generation: a full collection over it takes ~0.2 s with torch and transformers loaded, a
    # pause inside a window when the collector starts one there, and once per batch size in
    # training (its trainer's close). Trainers built later stay collectable.
    gc.freeze()
    job_table_rows = _measure(job, ctx, scenario)  # ends in the teardown phase
    samples = _gather_to_rank0(monitor.finish())
    generations = dist.gather(scenario.generations)
    window_ns = dist.gather(scenario.window_ns_total)
    # Engine start-up per rank (vLLM: import, engine init, compile), taken before any window.
    startups = dist.gather(getattr(backend, "startup", None))
    scenario.close()  # serving: stops the last server, writes requests.parquet
    monitor.close()
    if owner is not None:
        owner.close()  # the emulated GPU's ground truth (emulated/<host>/truth-*.parquet)
    if backend is not None:
        backend.close()  # collective: engine backends gather and write requests.parquet here
    writer = backend if backend is not None else scenario
    if ctx.rank == 0:
        if job_table_rows is None or samples is None:  # rank 0 holds both (_measure, gather)
            raise RuntimeError("rank 0 holds no job table or no power samples")
        if not getattr(writer, "writes_requests", False):
            _write_no_requests(job)
        write_generations(generations, job.outputs.generations)
        write_power([s for rank in samples for s in rank], job.outputs.power, monitor.sampler_hz)
        environment = job_environment(
            monitor.env_start,
            monitor.env_end,
            job.job_id,
            job.config_hash,
            job.code_version,
            seeds,
        )
        # Last: its timing covers the whole job (the teardown above included).
        timing = _timing(monitor, scenario, load_s, window_ns, startups)
        write_job_record(job, audits, environment, timing, job_table_rows)
    dist.barrier()
    dist.destroy()
    return 0


def entry(argv: list[str] | None = None) -> int:
    """``python -m energysweep.run``: :func:`main`, bound to its launcher's life.

    Every rank exits at once when :func:`main` returns or fails, its output flushed, without the
    interpreter's teardown. A rank that fails prints its traceback first: teardown could block on
    a process group whose peers are stuck, and the launcher (torchrun) stops the other ranks as
    soon as one exits non-zero. A rank that succeeded has written, closed and synchronised all it
    owns (main: the engine and server closed, the last barrier passed), and teardown would only
    cost time outside any window: unloading torch, transformers and vLLM took 0.8 s per PyTorch
    job and 1.9 s per vLLM job between main's return and the rank's exit (issue 30's note).
    """
    procs.die_with_parent()  # a rank never outlives its launcher (torchrun, the measure step)
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # every way out: the rank's error is in the job's log
        traceback.print_exc()
        code = 1
    logging.shutdown()  # handlers flushed and closed, as the interpreter's exit would
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(entry())
