"""Preflight: can this node measure energy? One short job per node, before the reservation.

Checks, each with a status (``ok``, ``fail``, ``warn``, ``unavailable``, ``skipped``) and the
figures behind it:

- ``nvml``: NVML loads (driver version);
- ``gpus``: every allocated GPU (``CUDA_VISIBLE_DEVICES``, and torch's CUDA devices where torch
  sees any) is found in NVML by UUID, so the sweep's by-UUID energy rows can be written;
- per GPU ``counter``: the energy counter advances while polled for ``seconds``; its observed
  update period and the read latency of one counter read;
- per GPU ``idle_power``: mean and standard deviation of the power reading over the same time
  (stable when the deviation is at most ``validity.max_idle_std_w``);
- per GPU ``clocks``: SM clock against its maximum, and the clock event (throttle) reasons;
- ``rapl``: host energy readable through powercap;
- ``zeus``: where Zeus is installed, its energy for the same interval against NVML's.

The verdict is ``gpu_energy`` and ``host_energy`` (ok or not, and why). The node's JSON goes to
``results/preflight/<host>.json``; the exit status is non-zero only when the energy that
``measurement.require_energy`` asks for is unavailable (``auto``: GPU energy when this node has
a GPU). A node without a GPU says so plainly.

Run: ``python -m energysweep.validity.preflight --out results/preflight --require auto`` (the
Snakemake target ``preflight`` runs it once per node slot and prints the verdicts:
``make preflight``).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path

from energysweep.hw import nvml as hw_nvml
from energysweep.job.sections import schema_defaults
from energysweep.tables.io import write_json_atomic
from energysweep.tables.power import CLOCK_EVENT_REASONS, reason_names
from energysweep.validity.require import REQUIRE

OK, FAIL, WARN, UNAVAILABLE, SKIPPED = "ok", "fail", "warn", "unavailable", "skipped"
# Seconds each GPU's counter and idle power are polled.
PROBE_SECONDS = 3.0
EMULATED_NOTE = "these readings test the method, they measure no hardware"


def probe_gpu(
    handle, seconds: float, max_idle_std_w: float, throttle_mask: int, clock=time.monotonic
) -> dict:
    """Counter, idle power and clocks of one GPU, polled for ``seconds``."""
    out: dict = {}
    changes, latencies, powers = [], [], []
    try:
        last = hw_nvml.energy_mj(handle)
    except Exception as exc:
        out["counter"] = {"status": FAIL, "detail": f"no energy counter: {type(exc).__name__}"}
        last = None
    start = clock()
    first = last
    next_power = start
    while clock() - start < seconds:
        if last is not None:
            t0 = time.perf_counter()
            value = hw_nvml.energy_mj(handle)
            latencies.append(time.perf_counter() - t0)
            if value != last:
                changes.append(clock())
                last = value
        if clock() >= next_power:  # power at 10 Hz, as the sampler reads it
            powers.append(hw_nvml.power_mw(handle) / 1e3)
            next_power += 0.1
        time.sleep(0.001)
    elapsed = clock() - start
    if last is not None and first is not None:
        out["counter"] = _counter_result(changes, latencies, elapsed, last - first)
    if powers:
        out["idle_power"] = _idle_power_result(powers, max_idle_std_w)
    out["clocks"] = _clocks_result(handle, throttle_mask)
    return out


def _counter_result(changes: list, latencies: list, elapsed: float, energy_mj: float) -> dict:
    """The counter check: did it move, how often (median update period), how fast to read."""
    periods = [b - a for a, b in zip(changes, changes[1:], strict=False)]
    period = sorted(periods)[len(periods) // 2] if periods else None
    c = {
        "advanced": bool(changes),
        "changes": len(changes),
        "polled_s": elapsed,
        "energy_mj": energy_mj,
        "update_period_s": period,
        "read_latency_us": 1e6 * sum(latencies) / len(latencies) if latencies else None,
    }
    if not changes:
        c.update(
            status=FAIL,
            detail=f"the energy counter did not move in {elapsed:.1f} s "
            "(stuck counter: windows would read 0 J)",
        )
    elif period is None:
        c.update(
            status=WARN,
            detail="counter moved once: update period not measurable; poll longer (--seconds)",
        )
    else:
        c.update(status=OK, detail=f"advances every {period * 1e3:.0f} ms")
    return c


def _idle_power_result(powers: list[float], max_idle_std_w: float) -> dict:
    """Idle power's mean and spread; unstable above ``max_idle_std_w``."""
    mean = sum(powers) / len(powers)
    std = (sum((p - mean) ** 2 for p in powers) / len(powers)) ** 0.5
    stable = std <= max_idle_std_w
    return {
        "status": OK if stable else WARN,
        "mean_w": mean,
        "std_w": std,
        "samples": len(powers),
        "detail": f"{mean:.1f} W +/- {std:.2f} W"
        + ("" if stable else f" (std > {max_idle_std_w} W: unstable)"),
    }


def _clocks_result(handle, throttle_mask: int) -> dict:
    """SM clocks and clock event reasons; throttling (``throttle_mask``) fails."""
    clocks: dict = {}
    try:
        clocks["sm_clock_mhz"] = hw_nvml.sm_clock_mhz(handle)
        clocks["max_sm_clock_mhz"] = hw_nvml.max_sm_clock_mhz(handle)
    except Exception as exc:
        clocks["clock_error"] = f"{type(exc).__name__}: {exc}"
    try:
        mask = hw_nvml.clock_event_reasons(handle)
        clocks["clock_event_reasons"] = mask
        clocks["clock_event_reason_names"] = reason_names(mask)
        clocks["status"] = FAIL if mask & throttle_mask else OK
        clocks["detail"] = (
            f"throttled: {reason_names(mask & throttle_mask)}"
            if mask & throttle_mask
            else f"no throttling ({reason_names(mask) or 'no clock event reasons'})"
        )
    except Exception as exc:
        clocks.update(status=UNAVAILABLE, detail=f"clock event reasons: {type(exc).__name__}")
    return clocks


def _zeus_check(uuids: list[str], seconds: float) -> dict:
    """Zeus and NVML over the same window (the sweep's cross-check source), where Zeus is."""
    import importlib.util

    from energysweep.energy.crosscheck import CrossCheckSource, zeus_ratios
    from energysweep.energy.nvml import NvmlSource

    if importlib.util.find_spec("zeus") is None:
        return {"status": SKIPPED, "detail": "zeus is not installed"}
    try:
        from energysweep.energy.zeus import ZeusSource

        source = CrossCheckSource(NvmlSource(uuids), ZeusSource(uuids))
        source.begin()
        time.sleep(seconds)
        readings = source.end()
        source.close()
    except Exception as exc:
        return {"status": WARN, "detail": f"Zeus cannot measure here: {type(exc).__name__}: {exc}"}
    ratios, tolerance = zeus_ratios(readings, seconds)
    bad = [u for u, q in ratios.items() if q is None or abs(q - 1) > tolerance]
    return {
        "status": WARN if bad else OK,
        "zeus_nvml_ratio": ratios,
        "zeus_nvml_tolerance": tolerance,
        "detail": f"Zeus / NVML energy over {seconds:.1f} s: "
        + ", ".join("n/a" if q is None else f"{q:.3f}" for q in ratios.values())
        + (f" (differ by more than {tolerance:.0%})" if bad else ""),
    }


def _rapl_check(root=None) -> dict:
    from energysweep.energy.rapl import make_host_source
    from energysweep.hw.rapl import POWERCAP

    try:
        src = make_host_source("rapl", 0, root or POWERCAP)
        src.begin()
        time.sleep(0.2)
        r = src.end()
        src.close()
    except Exception as exc:
        return {"status": UNAVAILABLE, "detail": str(exc)}
    if r.energy_mj is None:
        return {"status": UNAVAILABLE, "detail": r.detail}
    return {"status": OK, "detail": r.detail, "energy_mj_0_2s": r.energy_mj}


def run(
    seconds: float,
    require: str,
    max_idle_std_w: float,
    throttle_reasons,
    *,
    cuda_visible_devices: str | None = None,
    torch_uuids=None,
    rapl_root=None,
    zeus: bool = True,
) -> dict:
    """All checks on this node; returns the report (see the module docstring).

    Args:
        require: ``measurement.require_energy``; ``max_idle_std_w`` and ``throttle_reasons``:
            the ``validity`` thresholds of the same names.
        torch_uuids: the CUDA devices' UUIDs, or a function returning them (called only where
            NVML works); each must be found in NVML.
        zeus: also compare Zeus with NVML where Zeus is installed.
    """
    mask = sum(CLOCK_EVENT_REASONS[n] for n in throttle_reasons)
    report: dict = {
        "host": socket.gethostname(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "require_energy": require,
        "emulated_gpu_profile": hw_nvml.emulated_profile(),  # None unless device emulated
        "checks": {},
        "gpus": [],
    }
    checks = report["checks"]
    checks["rapl"] = _rapl_check(rapl_root)
    gpu_problem = None
    try:
        hw_nvml.init()
    except Exception as exc:
        checks["nvml"] = {"status": UNAVAILABLE, "detail": f"{type(exc).__name__}: {exc}"}
        gpu_problem = f"NVML cannot be loaded ({type(exc).__name__}): no GPU or no driver"
    if gpu_problem is None:
        try:
            checks["nvml"] = {
                "status": OK,
                "driver": hw_nvml.driver_version(),
                "detail": f"{hw_nvml.device_count()} GPU(s) visible to NVML",
            }
            gpu_problem = _probe_gpus(
                report, seconds, max_idle_std_w, mask, cuda_visible_devices, torch_uuids, zeus
            )
        finally:
            hw_nvml.shutdown()
    report["has_gpu"] = bool(report["gpus"])
    report["gpu_energy"] = {
        "ok": gpu_problem is None,
        "detail": gpu_problem or "every allocated GPU's counter advances",
    }
    rapl = checks["rapl"]
    report["host_energy"] = {"ok": rapl["status"] == OK, "detail": rapl["detail"]}
    has_gpu = report["has_gpu"] or report["emulated_gpu_profile"] is not None
    need = require if require != "auto" else ("gpu" if has_gpu else "none")
    report["required"] = need
    report["pass"] = {
        "gpu": report["gpu_energy"]["ok"],
        "host": report["host_energy"]["ok"],
        "none": True,
    }[need]
    return report


def _probe_gpus(report, seconds, max_idle_std_w, mask, cvd, torch_uuids, zeus) -> str | None:
    checks = report["checks"]
    try:
        allocated = hw_nvml.resolve_visible_gpus(cvd)
        missing = []
    except ValueError as exc:
        checks["gpus"] = {"status": FAIL, "detail": str(exc)}
        return f"allocated GPUs cannot be resolved: {exc}"
    nvml_uuids = set(hw_nvml.all_uuids())
    if callable(torch_uuids):  # only where NVML works: importing torch takes seconds
        torch_uuids = torch_uuids()
    if torch_uuids:
        missing = [u for u in torch_uuids if u not in nvml_uuids]
        allocated = [u for u in torch_uuids if u in nvml_uuids]
    if missing:
        checks["gpus"] = {
            "status": FAIL,
            "missing_uuids": missing,
            "detail": f"{len(missing)} CUDA device(s) not found in NVML by UUID: "
            + ", ".join(missing),
        }
    elif not allocated:
        checks["gpus"] = {"status": UNAVAILABLE, "detail": "no GPU allocated to this job"}
        return "no GPU allocated to this job"
    else:
        checks["gpus"] = {
            "status": OK,
            "uuids": allocated,
            "detail": f"{len(allocated)} allocated GPU(s) found in NVML by UUID",
        }
    gpus = []
    for uuid in allocated:
        h = hw_nvml.handle_by_uuid(uuid)
        ident = hw_nvml.identity(h)
        g = {
            "uuid": uuid,
            "index": ident["index"],
            "name": ident["name"],
            "pci_bus_id": ident["pci"],
        }
        g.update(probe_gpu(h, seconds, max_idle_std_w, mask))
        gpus.append({**g, "handle": h})
    if not zeus:
        checks["zeus"] = {"status": SKIPPED, "detail": "not requested"}
    else:
        checks["zeus"] = (
            _zeus_check(allocated, min(seconds, 1.0))
            if gpus
            else {"status": SKIPPED, "detail": "no GPU"}
        )
    report["gpus"] = [{k: v for k, v in g.items() if k != "handle"} for g in gpus]
    if missing:
        return checks["gpus"]["detail"]
    stuck = [g["uuid"] for g in report["gpus"] if g.get("counter", {}).get("status") == FAIL]
    if stuck:
        return f"energy counter not advancing on {', '.join(stuck)}"
    return None


def verdict(reports: list[dict]) -> str:
    """One screen: a line per node and check, then the overall verdict."""
    lines = []
    for r in reports:
        lines.append(
            f"== {r['host']} (require_energy {r['require_energy']} -> {r['required']}): "
            f"{'PASS' if r['pass'] else 'FAIL'}"
        )
        if r.get("emulated_gpu_profile"):  # docs/emulated-node.md
            lines.append(f"   EMULATED GPU node ({r['emulated_gpu_profile']}): {EMULATED_NOTE}")
        if not r["has_gpu"]:
            lines.append(
                f"   This node has no GPU that NVML can read: {r['gpu_energy']['detail']}."
                " GPU energy from it is recorded as unavailable (null), never 0."
            )
        for name, c in r["checks"].items():
            lines.append(f"   {name:<8} {c['status']:<11} {c.get('detail', '')}")
        for g in r["gpus"]:
            lines.append(f"   GPU {g['index']} {g['uuid']} ({g['name']})")
            for name in ("counter", "idle_power", "clocks"):
                if name in g:
                    lines.append(
                        f"     {name:<10} {g[name].get('status', ''):<11} "
                        f"{g[name].get('detail', '')}"
                    )
        lines.append(
            f"   GPU energy: {'ok' if r['gpu_energy']['ok'] else 'NOT AVAILABLE'}"
            f" ({r['gpu_energy']['detail']}); host energy: "
            f"{'ok' if r['host_energy']['ok'] else 'not available'}"
        )
    passed = all(r["pass"] for r in reports)
    lines.append(f"Preflight {'PASSED' if passed else 'FAILED'}: {len(reports)} node(s).")
    return "\n".join(lines)


def write_report(report: dict, out_dir: str | Path, name: str | None = None) -> Path:
    out = Path(out_dir) / f"{name or report['host']}.json"
    write_json_atomic(report, out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Energy measurement preflight of this node.")
    parser.add_argument("--out", default="results/preflight", help="directory for <host>.json")
    # Without a config, the schema's defaults (read from the schema, where they are written).
    measurement, validity = schema_defaults("measurement"), schema_defaults("validity")
    parser.add_argument(
        "--require",
        default=measurement["require_energy"],
        choices=list(REQUIRE),
        help="measurement.require_energy: what must be measurable",
    )
    parser.add_argument(
        "--seconds", type=float, default=PROBE_SECONDS, help="counter/idle polling time"
    )
    parser.add_argument(
        "--max-idle-std-w", type=float, default=validity["max_idle_std_w"], help="validity key"
    )
    args = parser.parse_args(argv)
    report = run(
        args.seconds,
        args.require,
        args.max_idle_std_w,
        validity["throttle_reasons"],
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        torch_uuids=hw_nvml.torch_uuids,
    )
    write_report(report, args.out)
    print(verdict([report]))
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
