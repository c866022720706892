"""The node's own energy, where the site measures it: Slurm's energy accounting, or IPMI.

Slurm gathers node energy when ``AcctGatherEnergyType`` is set (acct_gather_energy/ipmi,
/rapl, /gpu, /xcc, /pm_counters); the running step's figure is the ``ConsumedEnergyRaw`` field
``sstat`` shows (``sacct`` shows the same field once the job ended), in J, summed over the
step's nodes, refreshed every ``AcctGatherNodeFreq`` s. Where the site gathers nothing Slurm
reports 0, which is not a measurement: this module says "not gathered" instead. An IPMI device
readable by the job is detected and named, but energysweep reads no IPMI sensor itself (IPMI
DCMI gives power, not an energy counter): a site reads it through acct_gather_energy/ipmi.
Every command is an argv list with a timeout; no value passes through a shell.
"""

from __future__ import annotations

import os
import subprocess

NONE = "acct_gather_energy/none"
IPMI_DEVICES = ("/dev/ipmi0", "/dev/ipmi/0", "/dev/ipmidev/0")
TIMEOUT_S = 10


def _run(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout


def slurm_config() -> dict[str, str]:
    """``scontrol show config`` as key -> value (empty without a reachable controller)."""
    text = _run(["scontrol", "show", "config"]) or ""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def energy_gathering(config: dict[str, str]) -> tuple[str | None, float | None]:
    """(the energy plugin Slurm gathers node energy with, its sampling period in s), or
    (None, None) where it gathers none."""
    plugin = config.get("AcctGatherEnergyType") or NONE
    if plugin == NONE or "/" not in plugin:
        return None, None
    freq = (
        config.get("AcctGatherNodeFreq", "").split()[0] if config.get("AcctGatherNodeFreq") else ""
    )
    return plugin, float(freq) if freq.isdigit() and int(freq) > 0 else None


def step_energy_j(job_id: str, step_id: str) -> int | None:
    """Slurm's ConsumedEnergyRaw (J) of a running step, or None when it cannot be read."""
    text = _run(
        ["sstat", "--noheader", "--parsable2", "--format=ConsumedEnergyRaw",
         "-j", f"{job_id}.{step_id}"]
    )  # fmt: skip
    values = [v.strip() for v in (text or "").splitlines() if v.strip()]
    if not values or not values[0].isdigit():
        return None
    return int(values[0])


def ipmi_device() -> str | None:
    """The first IPMI device this process can open for reading, if any."""
    for path in IPMI_DEVICES:
        if os.path.exists(path) and os.access(path, os.R_OK):
            return path
    return None
