"""Job-level measurement on one rank: energy sources, power timeline, idle baseline, snapshots."""

from __future__ import annotations

import time

from energysweep import dist
from energysweep.energy import GpuReading, make_source, wall_ns
from energysweep.energy.node import NodeSource
from energysweep.gpu_setting.probe import SettingsProbe
from energysweep.hw import nvml as hw_nvml
from energysweep.job.spec import LaunchedJob
from energysweep.measure.phase_clock import during
from energysweep.tables.phases import JobPhase
from energysweep.tables.status import EnergyStatus

# The power timeline goes on this long after the last window: the re-check integrates the power
# reading validity.power_average_s (at most 1 s) past each window's end.
SAMPLER_TAIL_S = 1.2


def _power_w(energy_mj: float | None, duration_s: float) -> float | None:
    return energy_mj / 1e3 / duration_s if energy_mj is not None and duration_s > 0 else None


class JobMonitor:
    """Job-level measurement on one rank: sources, environment, power timeline, idle baseline.

    Owns the rank's GPU energy source (``measurement.energy_source``) and host source (RAPL on
    local rank 0, ``measurement.host_energy_source``); the measurers read windows through them.
    The GPUs are the rank's own device, or those an engine backend names (``gpu_uuids()``: a
    TensorRT-LLM replica process measures every GPU its engine workers use).
    """

    def __init__(
        self,
        job: LaunchedJob,
        ctx: dist.RankContext,
        clock=time.perf_counter,
        sleep=time.sleep,
        backend=None,
    ):
        from energysweep.energy.rapl import make_host_source
        from energysweep.energy.sampler import PowerSampler

        self.job = job
        self.ctx = ctx
        self.m = job.measurement
        self.clock = clock
        self.sleep = sleep
        # Backend hooks (energysweep.backends.base.Backend): None = look the GPUs up by device.
        named = backend.gpu_uuids() if backend is not None else None
        self.gpu_uuids: list[str] = (
            named if named is not None else hw_nvml.gpu_uuids(ctx.device, ctx.local_rank)
        )
        self.energy = make_source(self.m.energy_source, ctx.device, self.gpu_uuids)
        if backend is not None:
            self.energy = backend.wrap_energy_source(self.energy)
        self.host = make_host_source(self.m.host_energy_source, ctx.local_rank)
        # The job's GPU power limit and clocks, read back around every window.
        self.settings = SettingsProbe(job.gpu, self.gpu_uuids)
        # The node's energy where Slurm gathers it (the boundary ladder's node rung).
        self.node = NodeSource(ctx.rank)
        self.sampler_hz = float(self.m.sampler_hz)
        self.sampler = PowerSampler(self.gpu_uuids, self.sampler_hz, job.job_id, ctx.rank, ctx.host)
        self.idle_window_s: float | None = None
        self.idle_ns: list[int | None] = [None, None]
        # uuid -> (power W or None, status); None key: the status of GPU-less readings.
        self.idle_gpu: dict[str | None, tuple[float | None, str]] = {}
        self.idle_host: tuple[float | None, str] = (None, EnergyStatus.NOT_MEASURED)
        self.env_start: list[dict] = []
        self.env_end: list[dict] = []

    def _rank_snapshot(self, with_host: bool) -> dict:
        from energysweep.measure import provenance as envinfo

        out = {
            "rank": self.ctx.rank,
            "host": self.ctx.host,
            "local_rank": self.ctx.local_rank,
            "gpus": hw_nvml.gpu_snapshot(self.gpu_uuids),
        }
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
        with during(JobPhase.IDLE_BASELINE):
            self.measure_idle(synchronize or self.synchronize)

    def measure_idle(self, synchronize) -> None:
        """Idle power of every GPU (and host) of this rank, before any window of the job."""
        seconds = float(self.m.idle_baseline_s)
        if seconds <= 0:
            self.idle_gpu = {None: (None, EnergyStatus.SKIPPED)}
            self.idle_host = (None, EnergyStatus.SKIPPED)
            return
        nothing = not self.energy.available and not self.host.available
        synchronize()
        dist.barrier()
        if nothing:  # no source could read it: do not spend the time
            status = EnergyStatus.UNAVAILABLE
            self.idle_gpu = {None: (None, status)}
            self.idle_host = (None, status if self.ctx.local_rank == 0 else EnergyStatus.NOT_READ)
            dist.barrier()
            return
        t0 = self.clock()
        # Wall-clock bounds (job.json timing): energysweep.validity.verdict checks the idle power
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
        self.idle_gpu = {r.gpu_uuid: (_power_w(r.energy_mj, duration), r.status) for r in readings}
        self.idle_gpu.setdefault(
            None, (None, readings[0].status if readings else EnergyStatus.UNAVAILABLE)
        )
        self.idle_host = (_power_w(host.energy_mj, duration), host.status)

    def job_cols(self, reading: GpuReading) -> dict:
        """Idle-baseline columns of a row for ``reading``'s GPU."""
        power, status = self.idle_gpu.get(reading.gpu_uuid, self.idle_gpu.get(None, (None, "")))
        return {
            "idle_window_s": self.idle_window_s,
            "idle_gpu_power_w": power,
            "idle_gpu_power_status": status or EnergyStatus.UNAVAILABLE,
            "idle_host_power_w": self.idle_host[0],
            "idle_host_power_status": self.idle_host[1],
        }

    def finish(self) -> list[dict]:
        """Stop the sampler and take the end snapshot (collective); returns this rank's samples."""
        if self.sampler.active:  # the re-check integrates the lagging power past the last edge
            self.sleep(SAMPLER_TAIL_S)
        samples = self.sampler.stop()
        self.env_end = dist.gather(self._rank_snapshot(with_host=False))
        return samples

    def close(self) -> None:
        self.energy.close()
        self.host.close()
        self.settings.close()
