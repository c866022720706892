"""The background power sampler and the power.parquet it feeds (fake pynvml at the boundary)."""

from __future__ import annotations

import pyarrow.parquet as pq
import pynvml as real
import pytest

from energysweep.energy import sampler
from energysweep.job.spec import JobDir
from energysweep.tables import power as power_tbl

import fake_pynvml


def test_samples_by_uuid(fake_nvml):
    mod = fake_nvml(fake_pynvml.h100s(3))
    g = mod.fake_gpus[2]
    g.power_mw = 412_345
    s = sampler.PowerSampler([g.uuid], 10, "j1", rank=3, host="node7")
    assert s.active
    s.sample_once()
    g.energy_mj += 100
    s.sample_once()
    rows = s.stop()
    assert [r["energy_counter_mj"] - g.energy_mj for r in rows] == [-100, 0]
    assert {(r["gpu_uuid"], r["gpu_index"], r["power_mw"], r["status"]) for r in rows} == {
        (g.uuid, 2, 412_345, "measured")
    }
    assert {(r["job_id"], r["rank"], r["host"]) for r in rows} == {("j1", 3, "node7")}
    assert rows[0]["time_ns"] <= rows[1]["time_ns"]


def test_thread_start_stop_leaves_samples_and_releases_nvml(fake_nvml):
    mod = fake_nvml(fake_pynvml.h100s(1))
    s = sampler.PowerSampler([mod.fake_gpus[0].uuid], 50, "j1", rank=0, host="h")
    s.start()
    rows = s.stop()  # stop() always takes a last sample, whatever the timing
    assert len(rows) >= 1 and all(r["status"] == "measured" for r in rows)
    with pytest.raises(real.NVMLError_Uninitialized):  # the sampler's nvmlInit was undone
        mod.nvmlDeviceGetCount()


def test_read_errors_become_rows(fake_nvml):
    mod = fake_nvml(fake_pynvml.h100s(1))
    g = mod.fake_gpus[0]
    s = sampler.PowerSampler([g.uuid], 10, "j1", rank=0, host="h")
    g.supports_energy = False
    mod.nvmlDeviceGetPowerUsage = lambda handle: (_ for _ in ()).throw(
        real.NVMLError(real.NVML_ERROR_GPU_IS_LOST)
    )
    s.sample_once()
    (r,) = s.stop()
    assert r["status"] == "error" and "GpuIsLost" in r["detail"]
    assert r["power_mw"] is None and r["energy_counter_mj"] is None


def test_unavailable_and_disabled_leave_a_status_row(fake_nvml):
    cpu = sampler.PowerSampler([], 10, "j1", rank=0, host="h")
    off = sampler.PowerSampler(["GPU-x"], 0, "j1", rank=1, host="h")
    fake_nvml(fake_pynvml.h100s(1), init_error=real.NVML_ERROR_LIBRARY_NOT_FOUND)
    nodriver = sampler.PowerSampler(["GPU-x"], 10, "j1", rank=2, host="h")
    rows = []
    for s in (cpu, off, nodriver):
        assert not s.active
        s.start()
        rows += s.stop()
    assert [(r["rank"], r["status"]) for r in rows] == [
        (0, "unavailable"),
        (1, "disabled"),
        (2, "unavailable"),
    ]
    assert "LibraryNotFound" in rows[2]["detail"]
    assert all(r["power_mw"] is None and r["time_ns"] is None for r in rows)


def test_power_file_always_written(tmp_path, fake_nvml):
    mod = fake_nvml(fake_pynvml.h100s(1))
    s = sampler.PowerSampler([mod.fake_gpus[0].uuid], 10, "j1", rank=0, host="h")
    s.sample_once()
    rows = s.stop() + sampler.PowerSampler([], 10, "j1", rank=1, host="h").stop()
    path = JobDir(str(tmp_path / "job")).power
    sampler.write_power(rows, path, 10)
    table = pq.read_table(path)
    assert table.schema.equals(power_tbl.SCHEMA, check_metadata=False)
    assert table.schema.metadata[b"sampler_hz"] == b"10"
    assert table.column("status").to_pylist() == ["measured", "unavailable"]
    sampler.write_power([], tmp_path / "empty.parquet", 10)  # a job with no rows still has a file
    assert pq.read_table(tmp_path / "empty.parquet").num_rows == 0
