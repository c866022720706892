"""The per-rank entry point a measure job executes (``torchrun ... -m energysweep.run --spec F``).

Flow on every rank: check the world against the layout, start the process group, audit the
processes, load the backend once, then for each batch size: warm up, measure ``repetitions``
windows, and let rank 0 write one shard per window. A failure at one batch size (OOM, error) is
recorded as that point's status and the job goes on; a crash of the job fails it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

from energysweep import dist, shards
from energysweep.energy import CpuTime, GpuReading, make_source, wall_ns
from energysweep.grid import BACKENDS, ParallelLayout


def _gpu_uuids(device: str) -> list[str]:
    """UUID of the GPU this rank computes on, from torch (never by index: NVML order differs)."""
    if not device.startswith("cuda"):
        return []
    import torch

    uuid = str(torch.cuda.get_device_properties(torch.device(device)).uuid)
    return [uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"]


def _seed(seed: int) -> None:
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _prompt_indices(iteration: int, batch_size: int, dp: int, dp_rank: int, n_prompts: int):
    """Prompt indices of one replica's batch: global batch ``iteration`` split contiguously."""
    global_batch = batch_size * dp
    start = iteration * global_batch + dp_rank * batch_size
    return [(start + j) % n_prompts for j in range(batch_size)]


def _base_row(spec: dict, ctx: dist.RankContext, bs: int, rep: int) -> dict:
    job = spec["job"]
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
        "launch_mode": BACKENDS[job["backend"]]["launch"],
        "batch_size": bs,
        "global_batch_size": bs * ctx.layout.dp,
        "repetition": rep,
        "phase": "generate",
        **{k: v for k, v in ctx.audit().items() if k != "world_size"},
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "slurm_partition": os.environ.get("SLURM_JOB_PARTITION"),
        "slurm_nodelist": os.environ.get("SLURM_JOB_NODELIST"),
        "allocated_gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
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


class Measurer:
    """Runs the windows of one job on one rank."""

    def __init__(self, spec: dict, ctx: dist.RankContext, backend, prompts: list[str]):
        self.spec = spec
        self.ctx = ctx
        self.backend = backend
        self.prompts = prompts
        self.wl = spec["workload"]
        self.energy = make_source(
            spec["measurement"]["energy_source"], ctx.device, _gpu_uuids(ctx.device)
        )
        self.cpu = CpuTime()
        self.window_ns_total = 0
        self.generations: list[dict] = []

    def _batches(self, bs: int, n: int) -> list[tuple[list[int], dict]]:
        out = []
        for it in range(n):
            idx = _prompt_indices(it, bs, self.ctx.layout.dp, self.ctx.coords.dp_rank,
                                  len(self.prompts))
            out.append((idx, self.backend.encode([self.prompts[i] for i in idx])))
        return out

    def _run(self, batches, record: list | None):
        n_new = self.wl["output_tokens"]
        tin = tout = 0
        for it, (idx, batch) in enumerate(batches):
            gen = self.backend.generate(batch, n_new)
            if gen is not None:
                if any(len(g) != n_new for g in gen):
                    raise RuntimeError(f"backend returned {[len(g) for g in gen]} tokens, not {n_new}")
                tin += self.backend.input_tokens(batch)
                tout += sum(len(g) for g in gen)
                if record is not None:
                    record += [{"iteration": it, "prompt_index": i, "token_ids": g}
                               for i, g in zip(idx, gen)]
        return tin, tout

    def point(self, bs: int) -> list[list[dict]]:
        """All windows of one batch size: a list (one per repetition) of this rank's rows."""
        reps = self.wl["repetitions"]
        windows: list[list[dict]] = []
        error = None
        try:
            batches = self._batches(bs, max(self.wl["iterations"], self.wl["warmup_iterations"]))
            self._run(batches[: self.wl["warmup_iterations"]], None)
            for rep in range(reps):
                record = [] if rep == 0 else None
                self.backend.synchronize()
                dist.barrier()
                start = wall_ns()
                self.energy.begin()
                self.cpu.begin()
                tin, tout = self._run(batches[: self.wl["iterations"]], record)
                self.backend.synchronize()
                dist.barrier()
                end = wall_ns()
                readings = self.energy.end()
                cpu_s = self.cpu.end()
                self.window_ns_total += end - start
                if record:
                    self.generations += [
                        {"batch_size": bs, "dp_rank": self.ctx.coords.dp_rank, **r} for r in record
                    ]
                base = _base_row(self.spec, self.ctx, bs, rep)
                windows.append(
                    [
                        {**base, **_window_cols(start=start, end=end,
                                                iters=self.wl["iterations"], tin=tin, tout=tout),
                         **_reading_cols(r), "cpu_time_s": cpu_s}
                        for r in readings
                    ]
                )
        except Exception as exc:  # recorded per point; the job continues with the next batch size
            status = "oom" if self.backend.is_oom(exc) else "error"
            error = (status, f"{type(exc).__name__}: {exc}")
            traceback.print_exc()
        # Every rank must agree whether the point failed, or the shards would disagree.
        errors = [e for e in dist.gather(error) if e is not None]
        if errors:
            status = "oom" if any(s == "oom" for s, _ in errors) else "error"
            msg = "; ".join(sorted({m for _, m in errors}))[:2000]
            fail = GpuReading(None, None, None, None, None, "unavailable", "none",
                              f"grid point failed ({status}); nothing measured")
            windows = [
                [{**_base_row(self.spec, self.ctx, bs, rep),
                  **_window_cols(status=status, error=msg), **_reading_cols(fail),
                  "cpu_time_s": None}]
                for rep in range(reps)
            ]
        return windows


def _finalize_window(rows_by_rank: list[list[dict]]) -> list[dict]:
    """Merge ranks' rows of one window; window totals are summed over writer ranks."""
    rows = [r for rank_rows in rows_by_rank for r in rank_rows]
    ok = [r for r in rows if r["status"] == "ok"]
    if ok:
        # Per-rank token counts are only non-zero on writers; the window total is their sum.
        per_rank = {r["rank"]: (r["input_tokens"], r["output_tokens"]) for r in ok}
        tin = sum(v[0] for v in per_rank.values())
        tout = sum(v[1] for v in per_rank.values())
        start = min(r["window_start_ns"] for r in ok)
        end = max(r["window_end_ns"] for r in ok)
        requests = ok[0]["global_batch_size"] * ok[0]["iterations"]
        for r in rows:
            r.update(input_tokens=tin, output_tokens=tout, window_start_ns=start,
                     window_end_ns=end, requests=requests)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="job spec JSON written by energysweep.launch")
    args = parser.parse_args(argv)
    spec = json.loads(Path(args.spec).read_text())
    t_start = time.time()
    job = spec["job"]
    layout = ParallelLayout(job["tp"], job["pp"], job["dp"])
    _, local_rank, _ = dist.env_world()
    device = dist.choose_device(spec["measurement"]["device"], local_rank)
    if device == "cpu":
        import torch

        # Ranks share the node's cores; without this every rank spawns one thread per core.
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    dist.init(layout, device)
    ctx = dist.make_context(
        layout, device, model_dir=spec["model_dir"], dtype=spec["dtype"], seed=spec["seed"],
        max_input_tokens=spec["workload"]["max_input_tokens"],
    )
    audits = dist.gather(ctx.audit())
    dist.check_world(audits, layout)
    _seed(spec["seed"])

    from energysweep.backends import load_backend
    from energysweep.prompts import load_prompts

    prompts = load_prompts(None if spec["workload"]["prompts"] == "builtin"
                           else spec["workload"]["prompts"])
    t_load = time.time()
    backend = load_backend(job["backend"], ctx)
    load_s = time.time() - t_load
    measurer = Measurer(spec, ctx, backend, prompts)
    outputs = spec["outputs"]
    for bs in spec["batch_sizes"]:
        windows = measurer.point(bs)
        for rep, rows in enumerate(windows):
            gathered = dist.gather(rows)
            if ctx.rank == 0:
                shards.write_shard(_finalize_window(gathered), outputs["shards"][str(bs)][rep])
    generations = dist.gather(measurer.generations)
    window_ns = dist.gather(measurer.window_ns_total)
    if ctx.rank == 0:
        import pyarrow as pa

        gens = sorted((g for rank_gens in generations for g in rank_gens),
                      key=lambda g: (g["batch_size"], g["iteration"], g["prompt_index"]))
        table = pa.Table.from_pylist(
            gens,
            schema=pa.schema([("batch_size", pa.int32()), ("dp_rank", pa.int16()),
                              ("iteration", pa.int32()), ("prompt_index", pa.int32()),
                              ("token_ids", pa.list_(pa.int32()))]),
        )
        shards.write_atomic(table, outputs["generations"])
        from energysweep.envinfo import snapshot

        wall_s = time.time() - t_start
        record = {
            "job_id": spec["job_id"],
            "job": job,
            "config_hash": spec["config_hash"],
            "code_version": spec["code_version"],
            "launch_argv": spec.get("launch_argv"),
            "processes": audits,
            "environment": snapshot(_gpu_uuids(device)),
            "seed": spec["seed"],
            "timing": {
                "rank0_wall_s": wall_s,
                "model_load_s": load_s,
                "window_s": window_ns[0] / 1e9,
                "window_fraction": (window_ns[0] / 1e9) / wall_s if wall_s else None,
            },
        }
        tmp = Path(outputs["job_json"]).with_suffix(".json.tmp")
        tmp.write_text(json.dumps(record, indent=2, default=str))
        os.replace(tmp, outputs["job_json"])
    measurer.energy.close()
    backend.close()
    dist.barrier()
    dist.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
