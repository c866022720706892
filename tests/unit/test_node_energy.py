"""Node energy (the ladder's node rung) from Slurm's accounting: ``scontrol show config`` and
``sstat`` are stand-in scripts on PATH printing what Slurm 22.05 prints; never 0 where the site
gathers nothing."""

from __future__ import annotations

import os
import stat

import pytest

from energysweep.energy.node import NodeSource

SLURM_ENV = {"SLURM_JOB_ID": "41", "SLURM_STEP_ID": "0"}


@pytest.fixture
def slurm_tools(tmp_path, monkeypatch):
    """Stand-ins for scontrol and sstat; ``counter`` holds the step's ConsumedEnergyRaw (J)."""
    counter = tmp_path / "energy_j"
    counter.write_text("1000")
    plugin = tmp_path / "plugin"
    plugin.write_text("acct_gather_energy/ipmi")
    freq = tmp_path / "freq"
    freq.write_text("0")  # Slurm's sampling period unknown: no short-window flag

    def tool(name, body):
        path = tmp_path / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)

    tool(
        "scontrol",
        f'echo "Configuration data as of 2026-11-24T10:00:00"\n'
        f'echo "AcctGatherEnergyType    = $(cat {plugin})"\n'
        f'echo "AcctGatherNodeFreq      = $(cat {freq}) sec"\n',
    )
    tool("sstat", f'[ "$5" = "41.0" ] || exit 1\ncat {counter}\n')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return counter, plugin, freq


def test_outside_slurm_node_energy_is_unavailable_with_the_reason():
    src = NodeSource(0, environ={})
    r = (src.begin(), src.end())[1]
    assert (r.energy_mj, r.status) == (None, "unavailable")
    assert r.detail.startswith("not a Slurm job step")


def test_a_site_that_gathers_nothing_is_unavailable_not_zero(slurm_tools):
    _, plugin, _ = slurm_tools
    plugin.write_text("acct_gather_energy/none")
    src = NodeSource(0, environ=SLURM_ENV)
    r = (src.begin(), src.end())[1]
    assert (r.energy_mj, r.status) == (None, "unavailable")
    assert "gathers no node energy (AcctGatherEnergyType=acct_gather_energy/none)" in r.detail


def test_step_energy_delta_over_the_window(slurm_tools):
    counter, _, freq = slurm_tools
    src = NodeSource(0, environ=SLURM_ENV)
    src.begin()
    counter.write_text("1450")
    r = src.end()
    assert (r.energy_mj, r.status, r.method) == (
        450_000.0,
        "measured",
        "slurm-sstat-consumed-energy",
    )
    assert "acct_gather_energy/ipmi, step 41.0" in r.detail
    freq.write_text("30")  # Slurm samples every 30 s: a 1 s window is mostly the counter's steps
    src = NodeSource(0, environ=SLURM_ENV)
    src.begin()
    r = src.end()
    assert r.status == "short-window" and "AcctGatherNodeFreq 30 s" in r.detail


def test_only_global_rank_0_reads_the_step(slurm_tools):
    r = NodeSource(3, environ=SLURM_ENV).end()
    assert (r.energy_mj, r.status) == (None, "not-read")
