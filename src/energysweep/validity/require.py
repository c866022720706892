"""Fail closed: a job that must measure energy checks it can, before it loads the model.

Config key ``measurement.require_energy``:
- ``gpu``: every rank reads its GPUs' energy once through the configured source
  (``measurement.energy_source``); a rank on CPU, a missing driver, a GPU NVML cannot find or
  one without an energy counter fails the job;
- ``host``: local rank 0 of every node reads RAPL once;
- ``none``: nothing is required (null rows say why, as always);
- ``auto``: ``gpu`` on ranks that have a GPU (CUDA, or an emulated one), ``none`` on CPU ranks.

The check is collective: every rank reports, and every rank raises :class:`EnergyRequired`
with all ranks' reasons, so no rank waits at a barrier for one that gave up.
"""

from __future__ import annotations

from energysweep.job.sections import Measurement
from energysweep.tables.status import EnergyStatus

REQUIRE = ("auto", "gpu", "host", "none")


class EnergyRequired(RuntimeError):
    """measurement.require_energy asked for energy that this job cannot read."""


def resolve(require: str, device: str, gpu_uuids=()) -> str:
    """What ``require`` means on a rank computing on ``device`` with ``gpu_uuids`` (``auto``
    resolved: a rank of the emulated node computes on a CPU but has a GPU)."""
    if require not in REQUIRE:
        raise ValueError(f"measurement.require_energy {require!r}: expected one of {REQUIRE}")
    if require == "auto":
        return "gpu" if device.startswith("cuda") or gpu_uuids else "none"
    return require


def rank_problem(
    measurement: Measurement, device: str, gpu_uuids: list[str], local_rank: int, host_root=None
) -> str | None:
    """Why this rank cannot read the required energy (None when it can or nothing is required).

    Reads each required source once (one window of zero length) and closes it.
    """
    from energysweep.energy import make_source

    need = resolve(measurement.require_energy, device, gpu_uuids)
    if need == "none":
        return None
    if need == "gpu":
        kind = measurement.energy_source
        try:
            source = make_source(kind, device, gpu_uuids)
        except Exception as exc:  # explicit sources raise with the reason
            return f"GPU energy ({kind}): {type(exc).__name__}: {exc}"
        try:
            source.begin()
            readings = source.end()
        except Exception as exc:
            return f"GPU energy ({kind}): reading failed: {type(exc).__name__}: {exc}"
        finally:
            source.close()
        # The probe is a window of ~0 s: its figure may be unresolved (short-window), yet the
        # counters were read; only a source that cannot read them fails.
        bad = [r for r in readings if r.energy_mj is None and r.status != EnergyStatus.SHORT_WINDOW]
        if bad or not readings:
            why = "; ".join(r.detail or r.status for r in bad) or "no GPU reported"
            return f"GPU energy ({kind}) unavailable on {device}: {why}"
        return None
    from energysweep.energy.rapl import POWERCAP, make_host_source

    if local_rank != 0:
        return None  # the node's counters are read by local rank 0
    try:
        source = make_host_source("rapl", 0, host_root or POWERCAP)
        source.begin()
        reading = source.end()
        source.close()
    except Exception as exc:
        return f"host energy (RAPL): {type(exc).__name__}: {exc}"
    if reading.energy_mj is None:
        return f"host energy (RAPL) unavailable: {reading.detail}"
    return None


def check_job(
    measurement: Measurement,
    device: str,
    gpu_uuids: list[str],
    local_rank: int,
    rank: int,
    host: str,
    gather=None,
) -> None:
    """Collective check on every rank; raises :class:`EnergyRequired` on all ranks if any fails.

    Args:
        gather: an all-gather (energysweep.dist.gather); default: this rank only.
    """
    problem = rank_problem(measurement, device, gpu_uuids, local_rank)
    reports = (gather or (lambda x: [x]))({"rank": rank, "host": host, "problem": problem})
    failed = [r for r in reports if r["problem"]]
    if failed:
        lines = [f"rank {r['rank']} on {r['host']}: {r['problem']}" for r in failed]
        raise EnergyRequired(
            f"measurement.require_energy is {measurement.require_energy}: "
            "this job cannot read the energy it must measure, so it stops before loading the "
            "model:\n  " + "\n  ".join(lines) + "\nFix the node (run `make preflight`), or set "
            "measurement.require_energy to none to record unavailable energy instead."
        )
