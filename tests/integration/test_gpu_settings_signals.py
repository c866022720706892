"""GPU-setting restore seen from outside: a measure job's launcher, in a process of its own with
a power limit and clocks applied on the emulated GPU node, gets SIGTERM (scancel, Slurm's
TIMEOUT), SIGINT (Ctrl-C) or SIGHUP (a closed terminal); this test process, not the guard's, gives
the GPU the site's own setting before the job and reads the node (the emulated NVML state the
guard writes through) while the job runs and after the signal. Each must see the site's values
back (energysweep.launch.gpu_guard; docs/gpu-settings.md).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from energysweep.hw import emulated, nvml
from energysweep.hw.emulated.profiles import profile
from energysweep.job.gpu_freq import nearest, parse_clock

from conftest import ROOT

pytestmark = [pytest.mark.integration]
PROFILE = "h100-sxm"  # signal_launcher.EMULATED
WAIT_S = 300


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from energysweep.sweep.tinymodel import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


def _read_node(state: str) -> tuple[int, int, int]:
    """(power limit mW, app memory MHz, app SM MHz) of GPU 0, read by this process's own NVML
    module on the node whose state directory is ``state``."""
    node = emulated.module_from_env(nvml._REAL, environ={emulated.ENV: state})
    node.nvmlInit()
    try:
        h = node.nvmlDeviceGetHandleByIndex(0)
        return (
            node.nvmlDeviceGetPowerManagementLimit(h),
            node.nvmlDeviceGetApplicationsClock(h, nvml._REAL.NVML_CLOCK_MEM),
            node.nvmlDeviceGetApplicationsClock(h, nvml._REAL.NVML_CLOCK_SM),
        )
    finally:
        node.nvmlShutdown()


def _set_site(state: str, site: tuple[int, int, int]) -> None:
    node = emulated.module_from_env(nvml._REAL, environ={emulated.ENV: state})
    node.nvmlInit()
    try:
        h = node.nvmlDeviceGetHandleByIndex(0)
        node.nvmlDeviceSetPowerManagementLimit(h, site[0])
        node.nvmlDeviceSetApplicationsClocks(h, site[1], site[2])
    finally:
        node.nvmlShutdown()


def _until(what: str, check, proc: subprocess.Popen, log: Path):
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if proc.poll() is not None:
            return None
        time.sleep(0.05)
    raise AssertionError(f"{what} did not happen within {WAIT_S} s:\n{_text(log)[-3000:]}")


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


@pytest.mark.timeout(2 * WAIT_S)
@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name
)
def test_a_signalled_launcher_puts_the_site_setting_back_seen_from_another_process(
    model, tmp_path, sig
):
    prof = profile(PROFILE)
    sm = prof.supported_sm_mhz()
    site = (450_000, prof.mem_mhz[0], sm[len(sm) // 2])  # the site's own, not the defaults
    job = (350_000, prof.mem_mhz[0], nearest(parse_clock("low").sm, sm))
    hs, out = tmp_path / "handshake", tmp_path / "job"
    hs.mkdir()
    log = out.with_suffix(".log")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests" / "integration")]),
        "ENERGYSWEEP_TEST_FAULT": '{"action": "hang"}',  # the rank waits in its point
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    argv = [sys.executable, str(ROOT / "tests/integration/signal_launcher.py"), str(model)]
    proc = subprocess.Popen(
        [*argv, str(out), str(hs)], env=env, start_new_session=True, stderr=subprocess.PIPE
    )
    try:
        state = _until("the node's preparation", lambda: _text(hs / "state"), proc, log)
        assert state, proc.communicate(timeout=60)[1].decode()[-3000:]
        _set_site(state, site)
        assert _read_node(state) == site
        (hs / "site-set").touch()
        # The job's setting on the GPU, and its rank up (the launcher waits on its ranks).
        assert _until("the job's setting", lambda: _read_node(state) == job, proc, log)
        assert _until("the rank", lambda: "rank(s) up" in _text(log), proc, log), _text(log)
        os.kill(proc.pid, sig)
        _until("the restore", lambda: (hs / "restored").exists(), proc, log)
        seen = _read_node(state)  # this process, the guard's either restored it or not
        (hs / "read").touch()
        _, err = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
    text = _text(log)
    assert seen == site, (sig.name, seen, site, text[-3000:], err.decode()[-2000:])
    assert "gpu settings restored: ok (read back as they were)" in text, text[-3000:]
    assert f"interrupted (got {sig.name})" in err.decode(), err.decode()[-3000:]
    assert proc.returncode != 0  # interrupted: nothing published
    assert not (out / "job.json").exists()
