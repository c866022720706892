"""Background power timeline: one daemon thread per rank samples that rank's GPUs.

Each sample holds NVML's power reading (``nvmlDeviceGetPowerUsage``, mW; a ~1 s moving average
on Ampere-except-GA100 and newer) and the cumulative energy counter (mJ), with a wall-clock
timestamp in ns, so the timeline lines up with the shards' ``window_start_ns``/``window_end_ns``.
The window energies never come from this timeline (they are counter deltas at the window
edges); it exists to show ramps, throttling and idle periods, and to audit the windows.

Decision: a sampler per *rank* for the GPUs that rank measures (the same GPUs as its energy
source), rather than one per node: a rank knows its GPU by UUID without a node-local exchange,
and a GPU shared by two ranks shows up under both ranks (rows carry ``rank``; dedupe by
``gpu_uuid`` + ``time_ns`` if needed). NVML calls go through ctypes, which releases the GIL, so
the thread does not stall the rank's Python; the overhead is measured in
bench/sampler_overhead.py.

Rank 0 gathers every rank's samples and writes them to ``job.outputs.power`` (``JobDir.power``,
``power.parquet`` beside ``job.json``). The file is always written: without a GPU (or with
``measurement.sampler_hz: 0``) it holds one row per rank with ``status`` saying why and null
measurements.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa

from energysweep.hw import nvml as hw_nvml
from energysweep.tables.power import SCHEMA as POWER_SCHEMA
from energysweep.tables.status import EnergyStatus


class PowerSampler:
    """Samples the given GPUs at ``hz`` on a daemon thread between start() and stop()."""

    def __init__(self, gpu_uuids: list[str], hz: float, job_id: str, rank: int, host: str):
        self.hz = float(hz)
        self.base = {"job_id": job_id, "host": host, "rank": rank}
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._status_rows: list[dict] = []
        self._gpus: list[tuple[str, int, object]] = []
        self.thread_cpu_s = 0.0
        if self.hz <= 0:
            self._status_rows.append(
                self._status(EnergyStatus.DISABLED, "measurement.sampler_hz is 0")
            )
            return
        if not gpu_uuids:
            self._status_rows.append(self._status(EnergyStatus.UNAVAILABLE, "no GPU in use"))
            return
        try:
            hw_nvml.init()
        except Exception as exc:  # NVMLError subclasses: missing driver, no permission
            self._status_rows.append(
                self._status(
                    EnergyStatus.UNAVAILABLE, f"NVML unavailable: {type(exc).__name__}: {exc}"
                )
            )
            return
        try:
            for uuid in gpu_uuids:
                handle = hw_nvml.handle_by_uuid(uuid)
                self._gpus.append((uuid, hw_nvml.device_index(handle), handle))
        except Exception as exc:
            hw_nvml.shutdown()
            self._gpus = []
            self._status_rows.append(
                self._status(
                    EnergyStatus.UNAVAILABLE, f"GPU not found by NVML: {type(exc).__name__}"
                )
            )

    def _status(self, status: str, detail: str) -> dict:
        return {
            **self.base,
            "gpu_uuid": None,
            "gpu_index": None,
            "time_ns": None,
            "power_mw": None,
            "energy_counter_mj": None,
            "clock_event_reasons": None,
            "status": status,
            "detail": detail,
        }

    @property
    def active(self) -> bool:
        return bool(self._gpus)

    def sample_once(self) -> None:
        """Append one sample per GPU (errors become rows with status ``error``)."""
        now = time.time_ns()
        for uuid, index, handle in self._gpus:
            row = {**self.base, "gpu_uuid": uuid, "gpu_index": index, "time_ns": now}
            try:
                row["power_mw"] = hw_nvml.power_mw(handle)
                row["status"], row["detail"] = EnergyStatus.MEASURED, None
            except Exception as exc:
                row["power_mw"] = None
                row["status"], row["detail"] = EnergyStatus.ERROR, f"{type(exc).__name__}: {exc}"
            try:
                row["energy_counter_mj"] = hw_nvml.energy_mj(handle)
            except Exception:
                row["energy_counter_mj"] = None  # pre-Volta: power only
            try:  # why clocks are below maximum (energysweep.validity.verdict flags throttling)
                row["clock_event_reasons"] = hw_nvml.clock_event_reasons(handle)
            except Exception:
                row["clock_event_reasons"] = None
            self.samples.append(row)

    def _loop(self) -> None:
        period = 1.0 / self.hz
        next_t = time.monotonic()
        cpu0 = time.thread_time()
        while not self._stop.is_set():
            self.sample_once()
            next_t += period
            # A slow NVML call must not make the thread spin to catch up.
            next_t = max(next_t, time.monotonic())
            self._stop.wait(next_t - time.monotonic())
        # The thread's own CPU time: a direct bound on what it takes from the rank.
        self.thread_cpu_s = time.thread_time() - cpu0

    def start(self) -> None:
        if self.active and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="power-sampler", daemon=True)
            self._thread.start()

    def stop(self) -> list[dict]:
        """Stop the thread (one last sample marks the end) and return every row of this rank."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=10)
            self._thread = None
            self.sample_once()
        if self._gpus:
            hw_nvml.shutdown()
            self._gpus = []
        return self._status_rows + self.samples


def power_table(rows: list[dict], hz: float) -> pa.Table:
    """Rows of every rank as a table of :data:`POWER_SCHEMA` (sampler_hz in the metadata)."""
    table = pa.Table.from_pylist(rows, schema=POWER_SCHEMA)
    return table.replace_schema_metadata({"sampler_hz": str(hz)})


def write_power(rows: list[dict], path: str | Path, hz: float) -> None:
    from energysweep.tables.io import write_atomic

    write_atomic(power_table(rows, hz), path)
