"""Job-level measurement on one rank: energy sources, power timeline, idle baseline, snapshots."""

from __future__ import annotations

import time
from collections.abc import Callable

from energysweep import dist
from energysweep.energy import GpuReading, make_source, ticks, wall_ns
from energysweep.energy.node import NodeSource
from energysweep.gpu_setting.probe import SettingsProbe, launched_record, refusals
from energysweep.hw import nvml as hw_nvml
from energysweep.job.spec import LaunchedJob
from energysweep.measure.gpu_processes import ProcessProbe
from energysweep.measure.phase_clock import during
from energysweep.tables.phases import JobPhase
from energysweep.tables.status import EnergyStatus

# The power timeline goes on this long after the last window: the re-check integrates the power
# reading validity.power_average_s (at most 1 s) past each window's end.
SAMPLER_TAIL_S = 1.2
# Before the idle baseline the GPU settles: its power (energy counter between refreshes) over the
# two halves of the trailing SETTLE_TRAILING_S agrees within SETTLE_TOLERANCE (or SETTLE_MIN_W),
# waited for at most SETTLE_MAX_S (issue 27: a training job's idle window read 81 W rising to
# 122 W as the context and model came up on an H200).
SETTLE_TRAILING_S = 1.0
SETTLE_TOLERANCE = 0.01
SETTLE_MIN_W = 1.0
SETTLE_MAX_S = 20.0


def _power_w(energy_mj: float | None, duration_s: float) -> float | None:
    return energy_mj / 1e3 / duration_s if energy_mj is not None and duration_s > 0 else None


def _steady(history: list[tuple[int, float]], now: float) -> bool:
    """Whether the refreshes ``history`` (counter mJ, time s) span the trailing interval with
    the same power over its two halves."""
    start = now - SETTLE_TRAILING_S
    trail = [(e, t) for e, t in history if t >= start]
    if len(trail) < 3 or history[0][1] > start:
        return False
    (e0, t0), (e2, t2) = trail[0], trail[-1]
    e1, t1 = min(trail, key=lambda p: abs(p[1] - (t0 + t2) / 2))
    if not t0 < t1 < t2:
        return False
    p1, p2 = (e1 - e0) / (t1 - t0) / 1e3, (e2 - e1) / (t2 - t1) / 1e3
    return abs(p1 - p2) <= max(SETTLE_MIN_W, SETTLE_TOLERANCE * (p1 + p2) / 2)


def refused_settings(job: LaunchedJob, gpu_uuids: list[str]) -> list[str]:
    """What the launcher's record says of the job's GPU setting on ``gpu_uuids`` that can never be
    in effect (refused, or not read back when set: energysweep.gpu_setting.probe.refusals); empty:
    nothing. Read from the record alone: no NVML session, no GPU read."""
    return refusals(launched_record(job.gpu), gpu_uuids)


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
        clock=None,
        sleep=None,
        backend=None,
    ):
        from energysweep.energy.rapl import make_host_source
        from energysweep.energy.sampler import PowerSampler

        self.job = job
        self.ctx = ctx
        self.m = job.measurement
        # A virtual clock and sleep (tests) drive the GPU source too; None: real time.
        self.clock = clock or time.perf_counter
        self.sleep = sleep or time.sleep
        # Backend hooks (energysweep.backends.base.Backend): None = look the GPUs up by device.
        named = backend.gpu_uuids() if backend is not None else None
        self.gpu_uuids: list[str] = (
            named if named is not None else hw_nvml.gpu_uuids(ctx.device, ctx.local_rank)
        )
        self.energy = make_source(self.m.energy_source, ctx.device, self.gpu_uuids, clock, sleep)
        if backend is not None:
            self.energy = backend.wrap_energy_source(self.energy)
        self.host = make_host_source(self.m.host_energy_source, ctx.local_rank)
        # The job's GPU power limit and clocks, read back around every window.
        self.settings = SettingsProbe(job.gpu, self.gpu_uuids)
        # Who else computes on the rank's GPUs, read around every window (gpu_shared).
        self.processes = ProcessProbe(self.gpu_uuids)
        # The node's energy where Slurm gathers it (the boundary ladder's node rung).
        self.node = NodeSource(ctx.rank)
        self.sampler_hz = float(self.m.sampler_hz)
        self.sampler = PowerSampler(self.gpu_uuids, self.sampler_hz, job.job_id, ctx.rank, ctx.host)
        self.idle_window_s: float | None = None
        self.idle_ns: list[int | None] = [None, None]
        # Seconds waited for the GPUs to settle before the idle baseline, and whether they did.
        self.idle_settle_s: float | None = None
        self.idle_settled: bool | None = None
        # uuid -> (power W or None, status); None key: the status of GPU-less readings.
        self.idle_gpu: dict[str | None, tuple[float | None, str]] = {
            None: (None, EnergyStatus.NOT_MEASURED)
        }
        self._idle_done = False
        # Set by start(): before it, no idle baseline.
        self._synchronize: Callable[[], None] | None = None
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
        """Environment snapshot and power sampler (collective: every rank calls it). The idle
        baseline comes later, in the state the windows run in (:meth:`ensure_idle`).

        Args:
            synchronize: waits for the rank's device (``backend.synchronize``); default: CUDA sync.
        """
        self.env_start = dist.gather(self._rank_snapshot(with_host=True))
        self.sampler.start()
        self._synchronize = synchronize or self.synchronize

    def ensure_idle(self) -> None:
        """The job's idle baseline, once, before its first window: the scenario calls it after
        a point's warm-up (model loaded, warmed up, as the windows run). Collective."""
        if self._idle_done or self._synchronize is None:
            return
        self._idle_done = True
        with during(JobPhase.IDLE_BASELINE):  # the settling wait and the baseline itself
            self.measure_idle(self._synchronize)

    def measure_idle(self, synchronize) -> None:
        """Idle power of every GPU (and host) of this rank: once the GPUs have settled
        (:meth:`settle`), the counter's energy over exactly the interval it covers."""
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
        self.idle_settle_s, self.idle_settled = self.settle()
        dist.barrier()
        # The counters' refreshes are awaited before the start edge and after the end edge
        # (energy/ticks.py): outside the interval, whose energy the aligned edges give exactly.
        self.energy.prepare()
        # Wall-clock bounds (job.json timing): energysweep.validity.verdict checks the idle power
        # timeline between them for stability.
        self.idle_ns = [wall_ns(), None]
        t0 = self.clock()
        self.energy.begin()
        self.host.begin()
        self.sleep(seconds)
        host = self.host.end()
        duration = self.clock() - t0
        self.idle_ns[1] = wall_ns()
        readings = self.energy.end()
        dist.barrier()
        # Each GPU's energy covers its source's own edges (NVML: the calls of begin() and end()),
        # not this clock's: a rank descheduled between the two counted energy past the sleep
        # (CI run 107: 0.21 s, the idle power 4% high). Divided by the source's interval.
        windows = [r.window_s for r in readings if r.window_s is not None]
        self.idle_window_s = max(windows) if windows else duration
        self.idle_gpu = {
            r.gpu_uuid: (_power_w(r.energy_mj, r.window_s or duration), r.status) for r in readings
        }
        self.idle_gpu.setdefault(
            None, (None, readings[0].status if readings else EnergyStatus.UNAVAILABLE)
        )
        self.idle_host = (_power_w(host.energy_mj, duration), host.status)

    def settle(self) -> tuple[float | None, bool | None]:
        """Wait until this rank's GPUs draw steady power (module constants); (seconds waited,
        settled), or (None, None) where no counter can be read."""
        if not self.gpu_uuids or not self.energy.available:
            return None, None
        try:
            hw_nvml.init()
        except hw_nvml.NVMLError:
            return None, None
        try:
            handles = [hw_nvml.handle_by_uuid(u) for u in self.gpu_uuids]
            history: list[list[tuple[int, float]]] = [[] for _ in handles]
            t0 = self.clock()
            while True:
                _, seen = ticks.refreshes(
                    lambda: [hw_nvml.energy_mj(h) for h in handles],
                    1,
                    self.clock,
                    self.sleep,
                    timeout_s=ticks.TIMEOUT_S,
                )
                for h, new in zip(history, seen, strict=True):
                    h += new
                now = self.clock()
                if not all(seen):  # a counter that does not refresh cannot show a steady power
                    return now - t0, False
                if all(_steady(h, now) for h in history):
                    return now - t0, True
                if now - t0 >= SETTLE_MAX_S:
                    return now - t0, False
        except hw_nvml.NVMLError:
            return None, None
        finally:
            hw_nvml.shutdown()

    def idle_timing(self) -> dict:
        """The idle baseline's entries of job.json's ``timing``: its length and bounds, and the
        wait for the GPUs to settle before it."""
        return {
            "idle_baseline_s": self.idle_window_s,
            "idle_start_ns": self.idle_ns[0],
            "idle_end_ns": self.idle_ns[1],
            "idle_settle_s": self.idle_settle_s,
            "idle_settled": self.idle_settled,
        }

    def job_cols(self, reading: GpuReading) -> dict:
        """Idle-baseline columns of a row for ``reading``'s GPU."""
        power, status = self.idle_gpu.get(reading.gpu_uuid, self.idle_gpu.get(None, (None, "")))
        return {
            "idle_window_s": self.idle_window_s,
            "idle_gpu_power_w": power,
            "idle_gpu_power_status": status or EnergyStatus.UNAVAILABLE,
            "idle_settle_s": self.idle_settle_s,
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
        self.processes.close()
