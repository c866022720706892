"""The per-rank entry point a measure job executes (``torchrun ... -m energysweep.run --spec F``).

Flow on every rank: check the world against the layout, start the process group, audit the
processes, load the backend once. Then the :class:`JobMonitor` snapshots the environment, starts
the power sampler and measures the idle baseline, and the :class:`Measurer`, for each batch size,
warms up and measures ``repetitions`` x (cooldown, generate window, cooldown, prefill window);
rank 0 writes one shard per repetition, and at the end all of them again as the job table (one
file, what the merge reads). A failure at one batch size (OOM, error) is recorded as that
point's status and the job goes on; a crash of the job fails it.

Window rule (README, Methodology): a window starts and ends after a device sync and a barrier
across ranks; it repeats the batch until it lasts at least ``measurement.min_window_s`` *and*
ran at least ``workload.iterations`` iterations. All ranks stop after the same iteration: the
decision uses the shortest elapsed time over ranks, exchanged at chunk boundaries (usually once).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

from energysweep import dist, faults, procs
from energysweep.energy import (
    STATUS_NOT_MEASURED,
    STATUS_NOT_READ,
    STATUS_UNAVAILABLE,
    CpuTime,
    GpuReading,
    make_source,
    wall_ns,
)
from energysweep.grid import ParallelLayout, expected_processes, launch_mode
from energysweep.tables import io as tables_io
from energysweep.tables import shards

PHASE_GENERATE = "generate"
PHASE_PREFILL = "prefill"
PHASE_TRAIN = "train"  # energysweep.training's windows
# Batches pre-encoded per point: prompts cycle with period n_prompts / gcd(n_prompts, global
# batch); a long window reuses them (encoding never happens inside a window).
MAX_ENCODED_BATCHES = 128


def _gpu_uuids(device: str) -> list[str]:
    """UUID of the GPU this rank computes on, from torch (never by index: NVML order differs)."""
    if not device.startswith("cuda"):
        return []
    import torch

    uuid = str(torch.cuda.get_device_properties(torch.device(device)).uuid)
    return [uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"]


def _seed(seed: int) -> dict:
    """Seed every RNG a rank uses; returns what was set (recorded in job.json)."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    return {"seed": seed, "python_random": seed, "numpy": seed, "torch": seed, "cuda": seed}


def _prompt_indices(iteration: int, batch_size: int, dp: int, dp_rank: int, n_prompts: int):
    """Prompt indices of one replica's batch: global batch ``iteration`` split contiguously."""
    global_batch = batch_size * dp
    start = iteration * global_batch + dp_rank * batch_size
    return [(start + j) % n_prompts for j in range(batch_size)]


def _base_row(spec: dict, ctx: dist.RankContext, bs: int, rep: int,
              phase: str = PHASE_GENERATE) -> dict:
    """Every column of a row that does not depend on the window's readings.

    Job-level measurements (idle baseline, host energy, parameters) default to not-measured;
    :class:`Measurer` fills them in.
    """
    job = spec["job"]
    not_measured = "not measured by this scenario"
    gpn = spec.get("gpus_per_node")
    launchers, gpu_workers = expected_processes(job["backend"], ctx.layout, gpn)
    return {
        "schema_version": shards.SCHEMA_VERSION,
        "job_id": spec["job_id"],
        "config_hash": spec["config_hash"],
        "code_version": spec["code_version"],
        "model": job["model"],
        "backend": job["backend"],
        "scenario": job["scenario"],
        "tp": ctx.layout.tp,
        "pp": ctx.layout.pp,
        "dp": ctx.layout.dp,
        "world_size": ctx.layout.world_size,
        "launch_mode": launch_mode(job["backend"], ctx.layout, gpn),
        "launcher_processes": launchers,
        "gpu_workers": gpu_workers,
        "batch_size": bs,
        "global_batch_size": bs * ctx.layout.dp,
        "repetition": rep,
        "phase": phase,
        "min_window_s": float(spec["measurement"].get("min_window_s", 0.0)),
        **{k: v for k, v in ctx.audit().items() if k != "world_size"},
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "slurm_partition": os.environ.get("SLURM_JOB_PARTITION"),
        "slurm_nodelist": os.environ.get("SLURM_JOB_NODELIST"),
        "allocated_gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "idle_window_s": None,
        "idle_gpu_power_w": None,
        "idle_gpu_power_status": STATUS_NOT_MEASURED,
        "host_energy_mj": None,
        "host_dram_energy_mj": None,
        "host_energy_status": STATUS_NOT_MEASURED,
        "host_energy_detail": not_measured,
        "idle_host_power_w": None,
        "idle_host_power_status": STATUS_NOT_MEASURED,
        "model_parameters": None,
        "model_parameters_method": STATUS_UNAVAILABLE,
        "flops_estimate": None,
        "loss": None,
    }


def _reading_cols(r: GpuReading) -> dict:
    return {
        "gpu_uuid": r.gpu_uuid,
        "gpu_index": r.gpu_index,
        "gpu_pci_bus_id": r.gpu_pci_bus_id,
        "gpu_name": r.gpu_name,
        "gpu_energy_mj": r.energy_mj,
        "gpu_energy_status": r.status,
        "gpu_energy_method": r.method,
        "gpu_energy_detail": r.detail or None,
        "energy_source": r.source,
        "gpu_energy_mj_zeus": r.energy_mj_zeus,
        "gpu_energy_zeus_status": r.zeus_status,
    }


def _window_cols(status="ok", error=None, start=None, end=None, iters=None, req=None, tin=None,
                 tout=None) -> dict:
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


def _power_w(energy_mj: float | None, duration_s: float) -> float | None:
    return energy_mj / 1e3 / duration_s if energy_mj is not None and duration_s > 0 else None


def _count_parameters(model_dir: str) -> int | None:
    """Parameters of the checkpoint's model, built from its config.json on the meta device.

    No weights are read and no backend internals are needed (TP/PP shards, engines that hide
    their model), and tied weights count once. None if transformers cannot build the model.
    """
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(model_dir)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        return int(sum(p.numel() for p in model.parameters()))
    except Exception as exc:  # recorded as model_parameters_method; the job goes on
        print(f"model parameters not counted: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None


class JobMonitor:
    """Job-level measurement on one rank: sources, environment, power timeline, idle baseline.

    Owns the rank's GPU energy source (``measurement.energy_source``) and host source (RAPL on
    local rank 0, ``measurement.host_energy_source``); the measurers read windows through them.
    The GPUs are the rank's own device, or those an engine backend names (``gpu_uuids()``: a
    TensorRT-LLM replica process measures every GPU its engine workers use).
    """

    def __init__(self, spec: dict, ctx: dist.RankContext, clock=time.perf_counter,
                 sleep=time.sleep, backend=None):
        from energysweep.energy.rapl import make_host_source
        from energysweep.energy.sampler import PowerSampler

        self.spec = spec
        self.ctx = ctx
        self.m = spec["measurement"]
        self.clock = clock
        self.sleep = sleep
        if backend is not None and hasattr(backend, "gpu_uuids"):
            self.gpu_uuids = backend.gpu_uuids()
        else:
            self.gpu_uuids = _gpu_uuids(ctx.device)
        self.energy = make_source(self.m["energy_source"], ctx.device, self.gpu_uuids)
        if backend is not None and hasattr(backend, "wrap_energy_source"):
            self.energy = backend.wrap_energy_source(self.energy)
        self.host = make_host_source(self.m.get("host_energy_source", "auto"), ctx.local_rank)
        self.sampler_hz = float(self.m.get("sampler_hz", 0))
        self.sampler = PowerSampler(self.gpu_uuids, self.sampler_hz, spec["job_id"], ctx.rank,
                                    ctx.host)
        self.idle_window_s: float | None = None
        self.idle_ns: list[int | None] = [None, None]
        # uuid -> (power W or None, status); None key: the status of GPU-less readings.
        self.idle_gpu: dict[str | None, tuple[float | None, str]] = {}
        self.idle_host: tuple[float | None, str] = (None, STATUS_NOT_MEASURED)
        self.env_start: list[dict] = []
        self.env_end: list[dict] = []

    def _rank_snapshot(self, with_host: bool) -> dict:
        from energysweep import envinfo

        out = {"rank": self.ctx.rank, "host": self.ctx.host, "local_rank": self.ctx.local_rank,
               "gpus": envinfo.gpu_snapshot(self.gpu_uuids)}
        if with_host:
            out["host_info"] = envinfo.snapshot() if self.ctx.local_rank == 0 else None
        return out

    def synchronize(self) -> None:
        """Wait for this rank's device (the default edge sync where no backend gives one)."""
        if self.ctx.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize(torch.device(self.ctx.device))

    def start(self, synchronize=None) -> None:
        """Environment snapshot, power sampler, idle baseline (collective: every rank calls it).

        Args:
            synchronize: waits for the rank's device (``backend.synchronize``); default: CUDA sync.
        """
        self.env_start = dist.gather(self._rank_snapshot(with_host=True))
        self.sampler.start()
        self.measure_idle(synchronize or self.synchronize)

    def measure_idle(self, synchronize) -> None:
        """Idle power of every GPU (and host) of this rank, before any window of the job."""
        seconds = float(self.m.get("idle_baseline_s", 0))
        if seconds <= 0:
            self.idle_gpu = {None: (None, "skipped")}
            self.idle_host = (None, "skipped")
            return
        nothing = not self.energy.available and not self.host.available
        synchronize()
        dist.barrier()
        if nothing:  # no source could read it: do not spend the time
            status = STATUS_UNAVAILABLE
            self.idle_gpu = {None: (None, status)}
            self.idle_host = (None, status if self.ctx.local_rank == 0 else STATUS_NOT_READ)
            dist.barrier()
            return
        t0 = self.clock()
        # Wall-clock bounds (job.json timing): energysweep.validity checks the idle power
        # timeline between them for stability.
        self.idle_ns = [wall_ns(), None]
        self.energy.begin()
        self.host.begin()
        self.sleep(seconds)
        readings = self.energy.end()
        host = self.host.end()
        self.idle_ns[1] = wall_ns()
        duration = self.clock() - t0
        dist.barrier()
        self.idle_window_s = duration
        self.idle_gpu = {
            r.gpu_uuid: (_power_w(r.energy_mj, duration), r.status) for r in readings
        }
        self.idle_gpu.setdefault(None, (None, readings[0].status if readings else "unavailable"))
        self.idle_host = (_power_w(host.energy_mj, duration), host.status)

    def job_cols(self, reading: GpuReading) -> dict:
        """Idle-baseline columns of a row for ``reading``'s GPU."""
        power, status = self.idle_gpu.get(reading.gpu_uuid, self.idle_gpu.get(None, (None, "")))
        return {
            "idle_window_s": self.idle_window_s,
            "idle_gpu_power_w": power,
            "idle_gpu_power_status": status or STATUS_UNAVAILABLE,
            "idle_host_power_w": self.idle_host[0],
            "idle_host_power_status": self.idle_host[1],
        }

    def finish(self) -> list[dict]:
        """Stop the sampler and take the end snapshot (collective); returns this rank's samples."""
        samples = self.sampler.stop()
        self.env_end = dist.gather(self._rank_snapshot(with_host=False))
        return samples

    def close(self) -> None:
        self.energy.close()
        self.host.close()


class Measurer:
    """Runs the windows of one job on one rank."""

    def __init__(self, spec: dict, ctx: dist.RankContext, backend, prompts: list[str],
                 monitor: JobMonitor):
        self.spec = spec
        self.ctx = ctx
        self.backend = backend
        self.prompts = prompts
        self.wl = spec["workload"]
        self.m = spec["measurement"]
        self.monitor = monitor
        self.energy = monitor.energy
        self.host = monitor.host
        self.clock = monitor.clock
        self.sleep = monitor.sleep
        self.min_window_s = float(self.m.get("min_window_s", 0.0))
        self.collective_timeout_s = collective_timeout_s(spec)
        self.cpu = CpuTime()
        self.window_ns_total = 0
        self.generations: list[dict] = []
        self.params, self.params_method = self._parameters()

    def _parameters(self) -> tuple[int | None, str]:
        """Parameters of one replica: from the checkpoint, else models[].dims.

        Every rank counts (the same config.json, the same number) rather than waiting in a
        collective while rank 0 alone imports and builds the model: such a one-sided wait at
        start-up would have to fit within ``limits.collective_timeout_s``.
        """
        counted = _count_parameters(self.ctx.model_dir)
        if counted:
            return counted, "counted"
        declared = (self.spec.get("model_entry") or {}).get("dims", {}).get("num_parameters")
        if declared:
            return int(declared), "config"
        return None, STATUS_UNAVAILABLE

    def _batches(self, bs: int) -> list[tuple[list[int], dict]]:
        global_batch = bs * self.ctx.layout.dp
        n = len(self.prompts)
        cycle = n // math.gcd(n, global_batch)
        count = min(max(cycle, 1), MAX_ENCODED_BATCHES)
        out = []
        for it in range(count):
            idx = _prompt_indices(it, bs, self.ctx.layout.dp, self.ctx.coords.dp_rank, n)
            out.append((idx, self.backend.encode([self.prompts[i] for i in idx])))
        return out

    def _generate(self, batch, n_new: int):
        gen = self.backend.generate(batch, n_new)
        if gen is not None and any(len(g) != n_new for g in gen):
            raise RuntimeError(f"backend returned {[len(g) for g in gen]} tokens, not {n_new}")
        return gen

    def measured(self, step, min_iters: int, synchronize) -> dict:
        """The window rule (module docstring) around ``step(i)``, called once per iteration.

        Returns the window's edges (ns), its iteration count and its energy, host and CPU-time
        readings. The training measurer uses it with optimizer steps as iterations.
        """
        synchronize()
        dist.barrier()
        start = wall_ns()
        t0 = self.clock()
        self.energy.begin()
        self.host.begin()
        self.cpu.begin()
        it, target = 0, min_iters
        while True:
            while it < target:
                step(it)
                it += 1
            elapsed = min(dist.gather(self.clock() - t0))  # the same decision on every rank
            if elapsed >= self.min_window_s:
                break
            per_iter = elapsed / it
            more = (self.min_window_s - elapsed) / per_iter * 1.05 if per_iter > 0 else it
            target = it + max(1, math.ceil(more))
        synchronize()
        dist.barrier()
        end = wall_ns()
        readings = self.energy.end()
        host = self.host.end()
        cpu_s = self.cpu.end()
        self.window_ns_total += end - start
        return {"start": start, "end": end, "iterations": it, "readings": readings,
                "host": host, "cpu_s": cpu_s}

    def window(self, batches, n_new: int, record: list | None = None) -> dict:
        """One measured generate (or prefill: ``n_new`` 1) window over ``batches``."""
        min_iters = self.wl["iterations"]
        tokens = {"tin": 0, "tout": 0}

        def step(it: int) -> None:
            idx, batch = batches[it % len(batches)]
            gen = self._generate(batch, n_new)
            if gen is None:  # not its replica's writer
                return
            tokens["tin"] += self.backend.input_tokens(batch)
            tokens["tout"] += sum(len(g) for g in gen)
            if record is not None and it < min_iters:
                record.extend({"iteration": it, "prompt_index": i, "token_ids": g}
                              for i, g in zip(idx, gen, strict=True))

        w = self.measured(step, min_iters, self.backend.synchronize)
        return {**w, **tokens}

    def point_error(self, exc: BaseException, oom: bool) -> tuple[str, str, bool]:
        """What :meth:`agree_on_failure` needs of a point's exception: (status, message, fatal).

        Fatal: a collective failed (timed out, peer gone); the process group is then unusable.
        """
        traceback.print_exc()
        return ("oom" if oom else "error", f"{type(exc).__name__}: {exc}",
                dist.is_communication_failure(exc))

    def agree_on_failure(self, error: tuple[str, str, bool] | None, bs: int,
                         windows: list[list[dict]]) -> list[list[dict]]:
        """``windows``, or failed rows for every repetition if every rank's point failed.

        Collective on the agreement group (:func:`energysweep.dist.agree`), which every rank
        reaches once per point whatever happened in it. A point that failed on *every* rank (an
        OOM at this batch size, a bad batch) becomes that point's status and the job goes on. A
        point that failed on some ranks only, or in a collective, means the others are (or were)
        waiting in a collective the failed rank never joined: the ranks are out of step, so the
        job aborts (:class:`energysweep.dist.JobAborted`). A rank that does not arrive within
        ``limits.collective_timeout_s`` (stuck or dead) aborts the job too.

        Raises:
            energysweep.dist.JobAborted: naming the ranks, their errors and the batch size.
        """
        try:
            outcomes = dist.agree(error)
        except Exception as exc:
            mine = f"this rank's point failed: {error[1]}" if error else "this rank's point is done"
            raise dist.JobAborted(
                f"rank {self.ctx.rank}: the ranks did not agree on batch size {bs} within "
                f"limits.collective_timeout_s={self.collective_timeout_s:g} s; another rank is "
                f"stuck or dead ({type(exc).__name__}: {str(exc).splitlines()[0][:300]}); {mine}. "
                "Aborting the job"
            ) from exc
        failed = {rank: e for rank, e in enumerate(outcomes) if e is not None}
        if not failed:
            return windows
        msg = "; ".join(sorted({e[1] for e in failed.values()}))[:2000]
        if len(failed) < len(outcomes) or any(e[2] for e in failed.values()):
            raise dist.JobAborted(
                f"batch size {bs} failed on rank(s) {sorted(failed)} of {len(outcomes)}: {msg}. "
                "A failure on some ranks only, or in a collective, leaves the ranks' collectives "
                "out of step, so the job cannot go on (a failure every rank sees, such as an OOM "
                "at this batch size, is recorded as the point's status instead). Aborting the job"
            )
        status = "oom" if any(e[0] == "oom" for e in failed.values()) else "error"
        return [self._failed_rows(bs, rep, status, msg) for rep in range(self.wl["repetitions"])]

    def _rows(self, bs: int, rep: int, phase: str, w: dict) -> list[dict]:
        base = _base_row(self.spec, self.ctx, bs, rep, phase)
        win = _window_cols(start=w["start"], end=w["end"], iters=w["iterations"], tin=w["tin"],
                           tout=w["tout"])
        host = w["host"]
        host_cols = {
            "host_energy_mj": host.energy_mj,
            "host_dram_energy_mj": host.dram_energy_mj,
            "host_energy_status": host.status,
            "host_energy_detail": host.detail or None,
            "model_parameters": self.params,
            "model_parameters_method": self.params_method,
        }
        return [
            {**base, **win, **_reading_cols(r), **self.monitor.job_cols(r), **host_cols,
             "cpu_time_s": w["cpu_s"]}
            for r in w["readings"]
        ]

    def _failed_rows(self, bs: int, rep: int, status: str, msg: str) -> list[dict]:
        fail = GpuReading(None, None, None, None, None, STATUS_UNAVAILABLE, "none",
                          f"grid point failed ({status}); nothing measured")
        phases = [PHASE_GENERATE] + ([PHASE_PREFILL] if self.m.get("prefill_pass") else [])
        return [
            {**_base_row(self.spec, self.ctx, bs, rep, phase),
             **_window_cols(status=status, error=msg), **_reading_cols(fail),
             **self.monitor.job_cols(fail),
             "host_energy_status": STATUS_UNAVAILABLE,
             "host_energy_detail": "grid point failed; nothing measured",
             "model_parameters": self.params, "model_parameters_method": self.params_method,
             "cpu_time_s": None}
            for phase in phases
        ]

    def point(self, bs: int) -> list[list[dict]]:
        """All windows of one batch size: a list (one per repetition) of this rank's rows."""
        reps = self.wl["repetitions"]
        cooldown_s = float(self.m.get("cooldown_s", 0))
        windows: list[list[dict]] = []
        error = None
        try:
            faults.inject(self.ctx.rank, bs, "inference")  # test-only; off unless env var set
            batches = self._batches(bs)
            for it in range(self.wl["warmup_iterations"]):
                self._generate(batches[it % len(batches)][1], self.wl["output_tokens"])
            for rep in range(reps):
                record = [] if rep == 0 else None
                self.sleep(cooldown_s)
                w = self.window(batches, self.wl["output_tokens"], record)
                rows = self._rows(bs, rep, PHASE_GENERATE, w)
                if self.m.get("prefill_pass"):
                    self.sleep(cooldown_s)
                    rows += self._rows(bs, rep, PHASE_PREFILL, self.window(batches, 1))
                if record:
                    self.generations += [
                        {"batch_size": bs, "dp_rank": self.ctx.coords.dp_rank, **r} for r in record
                    ]
                windows.append(rows)
        except Exception as exc:  # agreed across ranks: the point's status, or the job aborts
            if getattr(self.backend, "fatal_point_errors", False):
                # A multi-rank engine (vLLM) cannot go on after an exception, and its other ranks
                # wait inside the engine's own collectives, not in the agreement: end the job now
                # (torchrun then stops every rank) rather than after collective_timeout_s.
                raise
            error = self.point_error(exc, self.backend.is_oom(exc))
        return self.agree_on_failure(error, bs, windows)

    def close(self) -> None:
        pass


def _sum_or_none(values) -> int | None:
    values = [v for v in values if v is not None]
    return sum(values) if values else None


def _finalize_window(rows_by_rank: list[list[dict]]) -> list[dict]:
    """Merge ranks' rows of one repetition; per phase, window totals are summed over ranks.

    Per-rank token counts are only non-zero on writers; the window total is their sum. The
    FLOPs estimate is 2 * parameters * (input + output tokens) of the window (all GPUs).
    """
    rows = [r for rank_rows in rows_by_rank for r in rank_rows]
    for phase in sorted({r["phase"] for r in rows}):
        phase_rows = [r for r in rows if r["phase"] == phase]
        ok = [r for r in phase_rows if r["status"] == "ok"]
        if not ok:
            continue
        per_rank = {r["rank"]: (r["input_tokens"], r["output_tokens"]) for r in ok}
        tin = _sum_or_none(v[0] for v in per_rank.values())
        tout = _sum_or_none(v[1] for v in per_rank.values())
        params = ok[0]["model_parameters"]
        flops = None
        if params is not None and phase in (PHASE_GENERATE, PHASE_PREFILL):
            flops = 2.0 * params * ((tin or 0) + (tout or 0))
        elif params is not None and phase == PHASE_TRAIN and tin is not None:
            flops = 6.0 * params * tin  # forward + backward: ~6 FLOPs per parameter per token
        update = {
            "input_tokens": tin,
            "output_tokens": tout,
            "window_start_ns": min(r["window_start_ns"] for r in ok),
            "window_end_ns": max(r["window_end_ns"] for r in ok),
            "requests": ok[0]["global_batch_size"] * ok[0]["iterations"],
            "flops_estimate": flops,
        }
        for r in phase_rows:
            r.update(update)
    return rows


def collective_timeout_s(spec: dict) -> float:
    """``limits.collective_timeout_s`` of the job (launch.run_job puts ``limits`` in the spec)."""
    limits = spec.get("limits") or {}
    return float(limits.get("collective_timeout_s") or dist.DEFAULT_COLLECTIVE_TIMEOUT_S)


def _start_ranks(spec: dict) -> tuple[dist.RankContext, list[dict], dict]:
    """Process group, rank context, audit of the world, seeds: (ctx, audits, seeds)."""
    job = spec["job"]
    layout = ParallelLayout(job["tp"], job["pp"], job["dp"])
    # The launch mode (torchrun / direct / mpi) decides what world the audit expects.
    where = {"backend": job["backend"], "gpus_per_node": spec.get("gpus_per_node")}
    _, local_rank, _ = dist.env_world()
    device = dist.choose_device(spec["measurement"]["device"], local_rank)
    if device == "cpu":
        import torch

        # Ranks share the node's cores; without this every rank spawns one thread per core.
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    dist.init(layout, device, timeout_s=collective_timeout_s(spec), **where)
    ctx = dist.make_context(
        layout, device, model_dir=spec["model_dir"], dtype=spec["dtype"], seed=spec["seed"],
        max_input_tokens=spec["workload"]["max_input_tokens"], extra={"spec": spec}, **where,
    )
    audits = dist.gather(ctx.audit())
    dist.check_world(audits, layout, **where)
    return ctx, audits, _seed(spec["seed"])


def _write_generations(generations: list[list[dict]], path: str) -> None:
    import pyarrow as pa

    gens = sorted((g for rank_gens in generations for g in rank_gens),
                  key=lambda g: (g["batch_size"], g["iteration"], g["prompt_index"]))
    table = pa.Table.from_pylist(
        gens,
        schema=pa.schema([("batch_size", pa.int32()), ("dp_rank", pa.int16()),
                          ("iteration", pa.int32()), ("prompt_index", pa.int32()),
                          ("token_ids", pa.list_(pa.int32()))]),
    )
    tables_io.write_atomic(table, path)


def _write_job_record(spec: dict, audits: list[dict], monitor: JobMonitor, seeds: dict,
                      timing: dict, job_table_rows: int | None = None) -> None:
    from energysweep.envinfo import job_environment

    record = {
        "job_id": spec["job_id"],
        "job": spec["job"],
        "config_hash": spec["config_hash"],
        "code_version": spec["code_version"],
        "launch_argv": spec.get("launch_argv"),
        "processes": audits,
        "environment": job_environment(monitor.env_start, monitor.env_end, spec["job_id"],
                                       spec["config_hash"], spec["code_version"], seeds),
        "measurement": spec["measurement"],
        "engine": spec.get("engine"),  # engine jobs only (config `engine:`)
        "seed": spec["seed"],
        "timing": timing,
        # What the merge checks the job table against (aggregate.merge).
        "job_table_rows": job_table_rows,
        "schema_version": shards.SCHEMA_VERSION,
    }
    tables_io.write_text_atomic(json.dumps(record, indent=2, default=str),
                             spec["outputs"]["job_json"])


def _write_no_requests(spec: dict) -> None:
    """An empty requests.parquet: this backend/scenario reports no per-request timings."""
    from energysweep.backends import request_log

    path = request_log.path_for(spec)
    if path is not None:
        request_log.write([], path)


def _gather_to_rank0(obj) -> list | None:
    """Every rank's ``obj`` on rank 0 only (None elsewhere): the power samples can be large."""
    import torch.distributed as tdist

    if not (tdist.is_available() and tdist.is_initialized()):
        return [obj]
    out = [None] * tdist.get_world_size() if tdist.get_rank() == 0 else None
    tdist.gather_object(obj, out, dst=0)
    return out


def power_path(outputs: dict) -> Path:
    """Where the job's power timeline goes: outputs["power"], else power.parquet by job.json."""
    from energysweep.tables.power import FILENAME

    return Path(outputs.get("power") or Path(outputs["job_json"]).with_name(FILENAME))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="job spec JSON written by energysweep.launch")
    args = parser.parse_args(argv)
    spec = json.loads(Path(args.spec).read_text())
    t_start = time.time()
    ctx, audits, seeds = _start_ranks(spec)
    # Fail closed (measurement.require_energy) before the model is loaded.
    from energysweep.require import check_job

    check_job(spec["measurement"], ctx.device, _gpu_uuids(ctx.device), ctx.local_rank, ctx.rank,
              ctx.host, gather=dist.gather)

    from energysweep.backends import load_backend
    from energysweep.energy.sampler import write_power
    from energysweep.prompts import load_prompts

    prompts = load_prompts(None if spec["workload"]["prompts"] == "builtin"
                           else spec["workload"]["prompts"])
    t_load = time.time()
    training = spec["job"]["scenario"] == "training"
    # Training loads a trainable copy of the model per grid point (energysweep.training).
    backend = None if training else load_backend(spec["job"]["backend"], ctx)
    # Training loads its model per grid point (inside its windows' set-up): no job-level load.
    load_s = None if training else time.time() - t_load
    monitor = JobMonitor(spec, ctx, backend=backend)
    if training:
        from energysweep.training import TrainingMeasurer

        measurer = TrainingMeasurer(spec, ctx, prompts, monitor)
        monitor.start()
    else:
        measurer = Measurer(spec, ctx, backend, prompts, monitor)
        monitor.start(backend.synchronize)
    outputs = spec["outputs"]
    job_tables = []  # rank 0: every shard of the job, for the job table
    job_table_rows = None
    for bs in spec["batch_sizes"]:
        for rep, rows in enumerate(measurer.point(bs)):
            gathered = dist.gather(rows)
            if ctx.rank == 0:
                table = shards.to_table(_finalize_window(gathered))
                tables_io.write_atomic(table, outputs["shards"][str(bs)][rep])
                job_tables.append(table)
    if ctx.rank == 0 and outputs.get("job_table"):
        # The same rows in one file: what the merge reads (one file per job, not per window).
        job_table = shards.concat(job_tables)
        tables_io.write_atomic(job_table, outputs["job_table"])
        job_table_rows = job_table.num_rows
    samples = _gather_to_rank0(monitor.finish())
    generations = dist.gather(measurer.generations)
    window_ns = dist.gather(measurer.window_ns_total)
    # Engine start-up per rank (vLLM: import, engine init, compile), taken before any window.
    startups = dist.gather(getattr(backend, "startup", None))
    if ctx.rank == 0:
        _write_generations(generations, outputs["generations"])
        write_power([s for rank in samples for s in rank], power_path(outputs), monitor.sampler_hz)
        wall_s = time.time() - t_start
        _write_job_record(spec, audits, monitor, seeds, {
            "rank0_wall_s": wall_s,
            "model_load_s": load_s,
            "idle_baseline_s": monitor.idle_window_s,
            "idle_start_ns": monitor.idle_ns[0],
            "idle_end_ns": monitor.idle_ns[1],
            "window_s": window_ns[0] / 1e9,
            "window_fraction": (window_ns[0] / 1e9) / wall_s if wall_s else None,
            "backend_startup": startups if any(startups) else None,
        }, job_table_rows)
    measurer.energy.close()  # a scenario's measurer may own its own source (closing is idempotent)
    measurer.close()
    monitor.close()
    if backend is not None:
        backend.close()  # collective: engine backends gather and write requests.parquet here
    if not getattr(backend, "writes_requests", False) and ctx.rank == 0:
        _write_no_requests(spec)
    dist.barrier()
    dist.destroy()
    return 0


def entry(argv: list[str] | None = None) -> int:
    """``python -m energysweep.run``: :func:`main`, bound to its launcher's life.

    A rank that fails exits at once, after printing its traceback: interpreter teardown could
    block on a process group whose peers are stuck, and the launcher (torchrun) stops the other
    ranks as soon as one exits non-zero.
    """
    procs.die_with_parent()  # a rank never outlives its launcher (torchrun, the measure step)
    try:
        return main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # every way out: the rank's error is in the job's log
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(entry())
