"""Preflight and fail-closed mode at the NVML boundary (fake pynvml), and for real on this CPU."""

from __future__ import annotations

import json

import pynvml as real
import pytest
from jobspec import job_spec, validated_config

from energysweep.validity import preflight, require

import fake_pynvml

FAST = 0.3  # seconds of counter / idle polling per GPU
# The validity thresholds preflight checks against: the schema's defaults.
VALIDITY = validated_config()["validity"]


def run_preflight(require_energy: str, **kw) -> dict:
    """preflight.run with the schema's thresholds and FAST polling."""
    v = VALIDITY
    return preflight.run(FAST, require_energy, v["max_idle_std_w"], v["throttle_reasons"], **kw)


def gpus(n=1, period=0.02):
    out = fake_pynvml.h100s(n)
    for g in out:
        g.counter_period_s = period
        g.clock_event_reasons = real.nvmlClocksEventReasonGpuIdle
    return out


def test_healthy_node_passes_with_measured_period(fake_nvml, tmp_path):
    mod = fake_nvml(gpus(2))
    r = run_preflight("gpu", cuda_visible_devices="1", rapl_root=tmp_path, zeus=False)
    assert r["pass"] and r["has_gpu"] and r["required"] == "gpu"
    (g,) = r["gpus"]
    assert g["uuid"] == mod.fake_gpus[1].uuid and g["index"] == 1
    assert g["counter"]["status"] == "ok"
    assert 0.015 <= g["counter"]["update_period_s"] <= 0.03
    assert g["counter"]["read_latency_us"] > 0
    assert g["idle_power"]["status"] == "ok" and g["idle_power"]["mean_w"] == 300.0
    assert g["clocks"]["status"] == "ok" and g["clocks"]["clock_event_reason_names"] == "gpu_idle"
    assert r["checks"]["rapl"]["status"] == "unavailable"  # an empty powercap tree
    assert r["checks"]["zeus"] == {"status": "skipped", "detail": "not requested"}
    out = preflight.write_report(r, tmp_path / "pf")
    assert json.loads(out.read_text())["gpus"][0]["uuid"] == g["uuid"]
    assert "PASSED" in preflight.verdict([r])


def test_stuck_counter_fails(fake_nvml, tmp_path):
    mod = fake_nvml(gpus(1))
    mod.fake_gpus[0].counter_stuck = True
    r = run_preflight("auto", rapl_root=tmp_path, zeus=False)
    assert not r["pass"] and r["required"] == "gpu"
    assert r["gpus"][0]["counter"]["status"] == "fail"
    assert "not advancing" in r["gpu_energy"]["detail"]


def test_missing_uuid_fails(fake_nvml, tmp_path):
    mod = fake_nvml(gpus(1))
    missing = "GPU-99999999-1111-2222-3333-000000000099"
    r = run_preflight(
        "gpu", torch_uuids=[mod.fake_gpus[0].uuid, missing], rapl_root=tmp_path, zeus=False
    )
    assert not r["pass"] and r["checks"]["gpus"]["status"] == "fail"
    assert r["checks"]["gpus"]["missing_uuids"] == [missing]


def test_throttling_is_reported(fake_nvml, tmp_path):
    mod = fake_nvml(gpus(1))
    mod.fake_gpus[0].clock_event_reasons = (
        real.nvmlClocksEventReasonHwSlowdown | real.nvmlClocksEventReasonSwPowerCap
    )
    r = run_preflight("gpu", rapl_root=tmp_path, zeus=False)
    clocks = r["gpus"][0]["clocks"]
    assert clocks["status"] == "fail" and clocks["detail"] == "throttled: hw_slowdown"


def test_no_driver_says_so_and_exit_depends_on_requirement(fake_nvml, tmp_path):
    fake_nvml(gpus(1), init_error=real.NVML_ERROR_LIBRARY_NOT_FOUND)
    r = run_preflight("auto", rapl_root=tmp_path)
    assert r["pass"] and not r["has_gpu"] and r["required"] == "none"
    assert "NVMLError_LibraryNotFound" in r["gpu_energy"]["detail"]
    assert "no GPU that NVML can read" in preflight.verdict([r])
    assert not run_preflight("gpu", rapl_root=tmp_path)["pass"]


def test_fail_closed_checks_every_rank(fake_nvml):
    mod = fake_nvml(gpus(2))
    m = job_spec(measurement={"require_energy": "auto", "energy_source": "auto"}).measurement
    assert require.rank_problem(m, "cpu", [], 0) is None  # auto on CPU: nothing required
    assert require.rank_problem(m, "cuda:0", [mod.fake_gpus[0].uuid], 0) is None
    missing = require.rank_problem(m, "cuda:0", ["GPU-00000000-0000-0000-0000-00000000dead"], 0)
    assert "NVMLError_NotFound" in missing
    reports = [
        {"rank": 0, "host": "n0", "problem": None},
        {"rank": 1, "host": "n1", "problem": "GPU energy (auto) unavailable"},
    ]
    with pytest.raises(require.EnergyRequired, match="rank 1 on n1: GPU energy"):
        require.check_job(
            m, "cuda:0", [mod.fake_gpus[0].uuid], 0, 0, "n0", gather=lambda _: reports
        )
    gpu = job_spec(measurement={"require_energy": "gpu", "energy_source": "auto"}).measurement
    assert "device=cpu" in require.rank_problem(gpu, "cpu", [], 0)
    host = job_spec(
        measurement={"require_energy": "host", "host_energy_source": "auto"}
    ).measurement
    assert "RAPL" in require.rank_problem(host, "cpu", [], 0)
    assert require.rank_problem(host, "cpu", [], 1) is None  # local rank 0 reads the node


def test_require_energy_contradiction_is_a_config_error():
    from energysweep.sweep import config as es_config

    cfg = {
        "models": [{"name": "t", "path": "builtin:tiny"}],
        "measurement": {"require_energy": "gpu", "energy_source": "none"},
    }
    es_config.validate_schema(cfg)
    with pytest.raises(es_config.ConfigError, match="measurement.require_energy is gpu"):
        es_config.check(cfg)


@pytest.mark.timeout(60)
def test_preflight_on_this_machine_for_real(tmp_path, capsys):
    """No fake: on a machine without NVML auto passes and says so, gpu fails; on one with an
    NVIDIA driver (a GPU node), requiring GPU energy passes."""
    try:
        real.nvmlInit()
        real.nvmlShutdown()
    except real.NVMLError:
        pass
    else:
        assert preflight.main(["--out", str(tmp_path), "--require", "gpu", "--seconds", "1"]) == 0
        return
    assert preflight.main(["--out", str(tmp_path), "--seconds", "0.2"]) == 0
    text = capsys.readouterr().out
    assert "no GPU that NVML can read" in text and "PASSED" in text
    assert len(list(tmp_path.glob("*.json"))) == 1
    assert preflight.main(["--out", str(tmp_path), "--require", "gpu", "--seconds", "0.2"]) == 1
