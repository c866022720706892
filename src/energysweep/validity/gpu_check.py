"""Calibration on a real GPU: ``make gpu-check`` measures what the emulated node's profile assumes.

One command on a GPU node: the preflight of this node (counter refresh period, read latency,
idle power and its spread, Zeus against NVML), then a short sweep (tiny model, one GPU, 5 s
windows, ``energy_source: cross-check``) whose re-check gives the power timeline / counter ratio.
It prints each measured figure beside the emulator profile's value (hw/emulated/profiles.py),
so the profile can be corrected from real numbers, and writes them to ``results/gpu-check.json``.

``--emulated`` runs the same on the emulated node (a test of this command; the figures then
come back as the profile's own).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The short sweep's config, in the workflow (measurement.device is set here).
SWEEP_CONFIG = "config/gpu-check.yaml"
WORKFLOW_PARTS = ("Snakefile", "rules", "scripts", "config", "profiles", "report", "src", "envs")


def profile_for(gpu_name: str) -> str:
    """The emulator profile of a GPU model (h100-sxm unless it is an A100 or an H200)."""
    if "H200" in gpu_name:
        return "h200-sxm"
    return "a100-sxm" if "A100" in gpu_name else "h100-sxm"


def node_figures(seconds: float) -> dict:
    """This node's preflight (first GPU): counter period, read latency, idle power, Zeus ratio."""
    from energysweep.hw import nvml as hw_nvml
    from energysweep.job.sections import schema_defaults
    from energysweep.validity import preflight

    validity = schema_defaults("validity")  # no config here: the schema's thresholds
    report = preflight.run(
        seconds=seconds,
        require="gpu",
        max_idle_std_w=validity["max_idle_std_w"],
        throttle_reasons=validity["throttle_reasons"],
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        torch_uuids=hw_nvml.torch_uuids,
    )
    if not report["gpus"]:
        raise SystemExit(f"gpu-check needs a GPU: {report['gpu_energy']['detail']}")
    g = report["gpus"][0]
    zeus = report["checks"].get("zeus", {}).get("zeus_nvml_ratio") or {}
    return {
        "gpu": g["name"],
        "counter_period_s": g.get("counter", {}).get("update_period_s"),
        "read_latency_s": (g.get("counter", {}).get("read_latency_us") or 0) / 1e6 or None,
        "idle_w": g.get("idle_power", {}).get("mean_w"),
        "idle_std_w": g.get("idle_power", {}).get("std_w"),
        "zeus_nvml_ratio": zeus.get(g["uuid"]),
        "preflight": report,
    }


def sweep_figures(workflow: Path, emulated: bool, timeout_s: float) -> dict:
    """A short cross-check sweep in a copy of the workflow: the re-check's timeline/counter
    ratio (median over windows) and Zeus/NVML."""
    import pandas as pd
    import yaml

    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        wf = Path(tmp)
        for name in WORKFLOW_PARTS:
            src = workflow / name
            if src.is_dir():
                shutil.copytree(src, wf / name, ignore=shutil.ignore_patterns("__pycache__"))
            elif src.exists():
                shutil.copy2(src, wf / name)
        config = yaml.safe_load((workflow / SWEEP_CONFIG).read_text())
        config["measurement"]["device"] = "emulated" if emulated else "cuda"
        (wf / SWEEP_CONFIG).write_text(yaml.safe_dump(config))
        argv = ["snakemake", "--profile", "profiles/local", f"--configfile={SWEEP_CONFIG}"]
        proc = subprocess.run(argv, cwd=wf, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0:
            raise SystemExit(f"the gpu-check sweep failed:\n{proc.stderr[-4000:]}")
        v = pd.read_parquet(wf / "results" / "validation.parquet")
        s = pd.read_csv(wf / "results" / "summary.csv")
    windows = v[v["scope"] == "window"]["timeline_counter_ratio"].dropna()
    return {
        "timeline_counter_ratio": float(windows.median()) if len(windows) else None,
        "zeus_nvml_energy_ratio_sweep": float(s["zeus_nvml_energy_ratio"].median()),
    }


def table(measured: dict, profile_key: str) -> str:
    """Measured figures beside the profile's (one line each)."""
    from energysweep.hw.emulated.profiles import PROFILES

    p = PROFILES[profile_key]
    rows = [
        ("counter refresh period (s)", measured["counter_period_s"], p.counter_period_s),
        ("energy read latency (s)", measured["read_latency_s"], p.read_latency_s),
        ("idle power (W)", measured["idle_w"], p.idle_w),
        ("idle power std (W)", measured["idle_std_w"], None),
        ("timeline / counter (re-check)", measured.get("timeline_counter_ratio"), 1.0),
        ("Zeus / NVML energy", measured["zeus_nvml_ratio"], 1.0),
    ]
    lines = [f"{'':32} {'measured':>12} {profile_key + ' profile':>18}"]
    for name, got, want in rows:
        fmt = lambda x: "-" if x is None else f"{x:.6g}"  # noqa: E731
        lines.append(f"{name:32} {fmt(got):>12} {fmt(want):>18}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflow", default=".", help="the energysweep checkout")
    parser.add_argument("--out", default="results/gpu-check.json")
    parser.add_argument("--seconds", type=float, default=10.0, help="preflight polling time")
    parser.add_argument("--no-sweep", action="store_true", help="preflight figures only")
    parser.add_argument("--emulated", action="store_true", help="on the emulated node (a test)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpu-check-node-") as state:  # removed at the end
        if args.emulated and "ENERGYSWEEP_EMULATED_NVML" not in os.environ:
            from energysweep.hw import emulated
            from energysweep.hw.emulated.node_config import section_defaults

            node = emulated.prepare(state, section_defaults(), time.time_ns())
            os.environ.update(emulated.job_env(state, node, dict(os.environ)))
        return _report(args)


def _report(args) -> int:
    """Measure (this node, then the short sweep), print beside the profile, write the JSON."""
    measured = node_figures(args.seconds)
    if not args.no_sweep:
        measured.update(sweep_figures(Path(args.workflow).resolve(), args.emulated, 1800))
    key = profile_for(measured["gpu"])
    print(f"GPU {measured['gpu']}: measured on {os.uname().nodename}, against profile {key}")
    print(table(measured, key))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(measured, indent=2, default=str))
    print(f'written to {out}: record it in docs/emulated-node.md, "Real GPU calibration"')
    return 0


if __name__ == "__main__":
    sys.exit(main())
