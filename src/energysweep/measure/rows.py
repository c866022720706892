"""Rows of the shard schema (:mod:`energysweep.tables.shards`): one per window, phase and GPU
of a rank."""

from __future__ import annotations

import os
import sys

from energysweep import dist
from energysweep.energy import GpuReading
from energysweep.hw import nvml as hw_nvml
from energysweep.job.spec import LaunchedJob
from energysweep.tables import shards
from energysweep.tables.phases import Phase
from energysweep.tables.status import EnergyStatus, Status


def base_row(
    job: LaunchedJob, ctx: dist.RankContext, bs: int, rep: int, phase: Phase = Phase.GENERATE
) -> dict:
    """Every column of a row that does not depend on the window's readings.

    Job-level measurements (idle baseline, host energy, parameters) default to not-measured;
    :func:`window_rows` fills them in.
    """
    not_measured = "not measured by this scenario"
    placement = job.placement
    launchers, gpu_workers = placement.processes
    return {
        "schema_version": shards.SCHEMA_VERSION,
        "job_id": job.job_id,
        "config_hash": job.config_hash,
        "code_version": job.code_version,
        # model, backend, scenario, tp, pp, dp and the GPU setting axes (unset where not swept).
        **job.key.columns(),
        "world_size": ctx.layout.world_size,
        "launch_mode": placement.launch_mode,
        "launcher_processes": launchers,
        "gpu_workers": gpu_workers,
        "batch_size": bs,
        "global_batch_size": bs * ctx.layout.dp,
        "load": shards.BATCH_LOAD,
        "repetition": rep,
        "phase": str(phase),
        "min_window_s": float(job.measurement.min_window_s),
        **{k: v for k, v in ctx.audit().items() if k != "world_size"},
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "slurm_step_id": os.environ.get("SLURM_STEP_ID"),
        "slurm_partition": os.environ.get("SLURM_JOB_PARTITION"),
        "slurm_account": os.environ.get("SLURM_JOB_ACCOUNT"),
        "slurm_node": os.environ.get("SLURMD_NODENAME"),
        "slurm_nodelist": os.environ.get("SLURM_JOB_NODELIST"),
        "allocated_gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "idle_window_s": None,
        "idle_gpu_power_w": None,
        "idle_gpu_power_status": EnergyStatus.NOT_MEASURED,
        "idle_settle_s": None,
        "gpu_processes_status": "not-applicable (no window measured)",
        "gpu_processes_foreign": None,
        "gpu_edge_read_max_ms": None,
        "host_energy_mj": None,
        "host_dram_energy_mj": None,
        "host_energy_status": EnergyStatus.NOT_MEASURED,
        "host_energy_detail": not_measured,
        "idle_host_power_w": None,
        "idle_host_power_status": EnergyStatus.NOT_MEASURED,
        "model_parameters": None,
        "model_parameters_method": EnergyStatus.UNAVAILABLE,
        "flops_estimate": None,
        "loss": None,
        "node_energy_mj": None,
        "node_energy_status": EnergyStatus.NOT_MEASURED,
        "node_energy_method": "none",
        "node_energy_detail": not_measured,
        **not_serving(job.key.scenario),
    }


def not_serving(scenario: str) -> dict:
    """The serving columns of a row that is no serving window (the scenario serving fills them)."""
    return {
        "load_mode": shards.BATCH_LOAD,
        **dict.fromkeys(shards.SERVING_NULLABLE),
        "serving_status": f"not-applicable ({scenario}: fixed batches, no load generator)",
    }


def reading_cols(r: GpuReading) -> dict:
    return {
        "gpu_uuid": r.gpu_uuid,
        "gpu_index": r.gpu_index,
        "gpu_pci_bus_id": r.gpu_pci_bus_id,
        "gpu_name": r.gpu_name,
        "gpu_energy_mj": r.energy_mj,
        "gpu_energy_status": r.status,
        # On the emulated node both say "emulated:" (hw.nvml.label): every row says so.
        "gpu_energy_method": hw_nvml.label(r.method),
        "gpu_energy_detail": r.detail or None,
        "energy_source": hw_nvml.label(r.source),
        "gpu_energy_mj_zeus": r.energy_mj_zeus,
        "gpu_energy_zeus_status": r.zeus_status,
        "gpu_edge_read_max_ms": r.edge_read_ms,
    }


def window_cols(
    status=Status.OK, error=None, start=None, end=None, iters=None, req=None, tin=None, tout=None
) -> dict:
    return {
        "status": status,
        "error": error,
        "window_start_ns": start,
        "window_end_ns": end,
        "iterations": iters,
        "requests": req,
        "input_tokens": tin,
        "output_tokens": tout,
    }


def count_parameters(model_dir: str) -> int | None:
    """Parameters of the checkpoint's model, built from its config.json on the meta device.

    No weights are read and no backend internals are needed (TP/PP shards, engines that hide
    their model), and tied weights count once. None if transformers cannot build the model.
    Local files only: a path that is not a checkpoint here is never looked up on the Hub (a rank
    on a node without internet would otherwise wait out the Hub client's retries, ~23 s).
    """
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        return int(sum(p.numel() for p in model.parameters()))
    except Exception as exc:  # recorded as model_parameters_method; the job goes on
        print(f"model parameters not counted: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None


def model_parameters(job: LaunchedJob, model_dir: str) -> tuple[int | None, str]:
    """Parameters of one replica: from the checkpoint, else models[].dims.

    Every rank counts (the same config.json, the same number) rather than waiting in a
    collective while rank 0 alone imports and builds the model: such a one-sided wait at
    start-up would have to fit within ``limits.collective_timeout_s``.
    """
    counted = count_parameters(model_dir)
    if counted:
        return counted, "counted"
    declared = (job.model_entry.dims or {}).get("num_parameters")
    if declared:
        return int(declared), "config"
    return None, EnergyStatus.UNAVAILABLE


def window_rows(
    job: LaunchedJob,
    ctx: dist.RankContext,
    bs: int,
    rep: int,
    phase: Phase,
    w: dict,
    monitor,
    params: tuple[int | None, str],
) -> list[dict]:
    """This rank's rows of one measured window ``w`` (one per GPU reading).

    Args:
        w: :func:`energysweep.measure.window.measure_window`'s dict plus the window's token
            counts ``tin`` and ``tout``.
        monitor: the rank's :class:`energysweep.measure.monitor.JobMonitor` (idle baseline).
        params: (model parameters, how they were found), :func:`model_parameters`.
    """
    base = base_row(job, ctx, bs, rep, phase)
    win = window_cols(
        start=w["start"], end=w["end"], iters=w["iterations"], tin=w["tin"], tout=w["tout"]
    )
    host = w["host"]
    before, after = w["settings"]
    node = w["node"]
    node_cols = (
        {
            "node_energy_mj": node.energy_mj,
            "node_energy_status": node.status,
            "node_energy_method": node.method,
            "node_energy_detail": node.detail,
        }
        if node is not None
        else {}
    )
    host_cols = {
        "host_energy_mj": host.energy_mj,
        "host_dram_energy_mj": host.dram_energy_mj,
        "host_energy_status": host.status,
        "host_energy_detail": host.detail or None,
        "model_parameters": params[0],
        "model_parameters_method": params[1],
    }
    return [
        {
            **base,
            **win,
            **reading_cols(r),
            **monitor.job_cols(r),
            **monitor.settings.columns(r.gpu_uuid, before, after),
            **monitor.processes.columns(r.gpu_uuid, *w.get("processes", (None, None))),
            **host_cols,
            **node_cols,
            "cpu_time_s": w["cpu_s"],
        }
        for r in w["readings"]
    ]


def failed_rows(
    job: LaunchedJob,
    ctx: dist.RankContext,
    bs: int,
    rep: int,
    status: str,
    msg: str,
    phases: list[Phase],
    monitor,
    params: tuple[int | None, str],
) -> list[dict]:
    """This rank's rows of a failed point's repetition ``rep``: one per phase, nothing measured."""
    fail = GpuReading(
        None,
        None,
        None,
        None,
        None,
        EnergyStatus.UNAVAILABLE,
        "none",
        f"grid point failed ({status}); nothing measured",
    )
    return [
        {
            **base_row(job, ctx, bs, rep, phase),
            **window_cols(status=status, error=msg),
            **reading_cols(fail),
            **monitor.job_cols(fail),
            **monitor.settings.point_columns(),
            "host_energy_status": EnergyStatus.UNAVAILABLE,
            "host_energy_detail": "grid point failed; nothing measured",
            "node_energy_status": EnergyStatus.UNAVAILABLE,
            "node_energy_detail": "grid point failed; nothing measured",
            "model_parameters": params[0],
            "model_parameters_method": params[1],
            "cpu_time_s": None,
        }
        for phase in phases
    ]
