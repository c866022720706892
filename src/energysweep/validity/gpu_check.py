"""The real-GPU acceptance: ``make gpu-check`` on one GPU node, in about 6 minutes.

1. Preflight of this node (first GPU): counter refresh period, read latency, idle power and its
   spread, Zeus against NVML; printed beside the emulator profile's values
   (hw/emulated/profiles.py).
2. A short sweep at publishable settings (config/gpu-check.yaml: the schema's measurement
   defaults, a 1.1B Llama of TinyLlama's shape with random weights, pytorch backend, inference
   and training, ``energy_source: cross-check``), with an independent reader of the counter
   running beside it in a process of its own (scripts/gpu_check/counter_reader.py: pynvml at
   ~100 Hz, none of energysweep's energy code).
3. A table (energysweep.validity.gpu_check_figures): our window energy and Zeus's against the
   independent reading, idle power against it, the shared-GPU check, valid points and the
   reasons of the others, the jobs' window fraction. All of it goes to ``--out``
   (results/gpu-check.json); the sweep's files stay in ``--workdir`` (results/gpu-check/).

``--emulated`` runs the same on the emulated node (the CI test of this command; the model is
then the default tiny one, and no point is ever valid: ``emulated``). It exits non-zero when the
sweep failed or the reader covered no window, after writing what it has.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from energysweep.validity import gpu_check_figures as figs

SWEEP_CONFIG = "config/gpu-check.yaml"
WORKFLOW_PARTS = ("Snakefile", "rules", "scripts", "config", "profiles", "report", "src", "envs")
READER = "scripts/gpu_check/counter_reader.py"
EMULATED_ENV = "ENERGYSWEEP_EMULATED_NVML"  # energysweep.hw.emulated.ENV


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


def profile_table(measured: dict, profile_key: str) -> str:
    """This node's figures beside the emulator profile's (one line each)."""
    from energysweep.hw.emulated.profiles import PROFILES

    p = PROFILES[profile_key]
    rows = [
        ("counter refresh period (s)", measured["counter_period_s"], p.counter_period_s),
        ("energy read latency (s)", measured["read_latency_s"], p.read_latency_s),
        ("idle power (W)", measured["idle_w"], p.idle_w),
        ("idle power std (W)", measured["idle_std_w"], None),
        ("Zeus / NVML energy", measured["zeus_nvml_ratio"], 1.0),
    ]
    lines = [f"{'':32} {'measured':>12} {profile_key + ' profile':>18}"]
    for name, got, want in rows:
        fmt = lambda x: "-" if x is None else f"{x:.6g}"  # noqa: E731
        lines.append(f"{name:32} {fmt(got):>12} {fmt(want):>18}")
    return "\n".join(lines)


def prepare_workflow(workflow: Path, wf: Path, emulated: bool) -> dict:
    """A copy of the workflow in ``wf`` with the check's config (device cuda, or emulated with
    the default tiny model at batch 4: a 1.1B model at batch 64 on CPU ranks would not finish
    in time); returns the config."""
    import yaml

    shutil.rmtree(wf, ignore_errors=True)
    wf.mkdir(parents=True)
    for name in WORKFLOW_PARTS:
        src = workflow / name
        if src.is_dir():
            shutil.copytree(src, wf / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            shutil.copy2(src, wf / name)
    config = yaml.safe_load((workflow / SWEEP_CONFIG).read_text())
    config["measurement"]["device"] = "emulated" if emulated else "cuda"
    if emulated:  # CPU ranks: the default tiny model, and a batch they get through in time
        for model in config["models"]:
            model.pop("spec", None)
        config["workload"]["batch_sizes"] = [4]
    # It replaces config/config.yaml in the copy: given with --configfile, it would be merged
    # over the Snakefile's configfile, whose demo settings (0.5 s windows) would then count.
    (wf / "config" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return config


def _stop(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to ``proc``'s process group, SIGKILL ``grace_s`` later (it was started in a
    session of its own)."""
    if proc.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_sweep(wf: Path, workdir: Path, emulated: bool, timeout_s: float) -> dict:
    """The sweep, with the independent reader polling beside it; what happened."""
    env = {k: v for k, v in os.environ.items() if k != EMULATED_ENV}
    env["SLURM_CONF"] = "/dev/null"  # the local profile: no Slurm (Makefile NO_SLURM)
    samples = workdir / "samples.csv"
    reader_argv = [sys.executable, str(wf / READER), "record", "--out", str(samples),
                   "--max-s", str(timeout_s + 60)]  # fmt: skip
    if emulated:  # each job has its own emulated node: the reader finds them under the shards
        reader_argv += ["--emulated-root", str(wf / "results" / "shards"), "--gpus", "1"]
    reader_log = open(workdir / "reader.log", "w")  # noqa: SIM115 - closed below
    reader = subprocess.Popen(
        reader_argv, env=env, stdout=reader_log, stderr=subprocess.STDOUT, start_new_session=True
    )
    # Targets first: --resources takes every word after it. One GPU job at
    # a time (gpu=1): the reader's counter is then one job's.
    argv = [sys.executable, "-m", "snakemake", "results/summary.csv", "results/energy.parquet",
            "--profile", "profiles/local", "--resources", "gpu=1"]  # fmt: skip
    t0 = time.monotonic()
    sweep = None
    try:
        with open(workdir / "sweep.log", "w") as log:
            print("sweep:", " ".join(argv), file=log, flush=True)
            sweep = subprocess.Popen(
                argv, cwd=wf, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                rc = sweep.wait(timeout=timeout_s)
                error = None if rc == 0 else f"snakemake exited {rc}"
            except subprocess.TimeoutExpired:
                rc, error = None, f"the sweep ran past --timeout {timeout_s:g} s and was stopped"
    finally:  # also on SIGTERM (main): nothing of the check outlives it
        if sweep is not None:
            _stop(sweep, 20)
        _stop(reader, 10)
        reader_log.close()
    seconds = time.monotonic() - t0
    return {"rc": rc, "error": error, "seconds": seconds, "log": str(workdir / "sweep.log")}


def sweep_figures(wf: Path, workdir: Path, emulated: bool) -> dict:
    """The check's figures from the sweep's tables and the reader's samples."""
    import pandas as pd

    from energysweep.job.files import JobDir
    from energysweep.validity.verdict import REASONS

    results = wf / "results"
    jobs = [json.loads(p.read_text()) for p in JobDir.find(results / "shards", "job_json")]
    if not jobs:
        raise RuntimeError("no job of the sweep finished (job.json): see the sweep's log")
    # Every published job's table (what the merge reads), so that a sweep stopped by --timeout
    # after a job still gives that job's figures.
    tables = JobDir.find(results / "shards", "job_table")
    energy = pd.concat([pd.read_parquet(p) for p in tables], ignore_index=True)
    iv = figs.intervals(energy, jobs, emulated)
    iv.to_csv(workdir / "intervals.csv", index=False)
    argv = [sys.executable, str(wf / READER), "energy",
            "--samples", str(workdir / "samples.csv"),
            "--intervals", str(workdir / "intervals.csv"),
            "--out", str(workdir / "read.csv")]  # fmt: skip
    subprocess.run(argv, check=True, timeout=300)
    read = pd.read_csv(workdir / "read.csv", dtype={"source": str}, keep_default_na=False)
    read = read.replace("", None)
    out = {"energy": figs.energy_figures(read), "jobs": figs.job_figures(jobs)}
    if (results / "summary.csv").exists():
        shutil.copy2(results / "summary.csv", workdir / "summary.csv")
        summary = pd.read_csv(results / "summary.csv")
        out["verdict"] = figs.verdict_figures(summary, set(REASONS))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflow", default=".", help="the energysweep checkout")
    parser.add_argument("--out", default="results/gpu-check.json")
    parser.add_argument("--workdir", default="results/gpu-check", help="the sweep's files")
    parser.add_argument("--seconds", type=float, default=10.0, help="preflight polling time")
    parser.add_argument("--timeout", type=float, default=330.0, help="the sweep's limit in s")
    parser.add_argument("--no-sweep", action="store_true", help="preflight figures only")
    parser.add_argument("--emulated", action="store_true", help="on the emulated node (a test)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminated)  # stop the sweep and the reader on the way out
    with tempfile.TemporaryDirectory(prefix="gpu-check-node-") as state:  # removed at the end
        if args.emulated and EMULATED_ENV not in os.environ:
            from energysweep.hw import emulated
            from energysweep.hw.emulated.node_config import section_defaults

            node = emulated.prepare(state, section_defaults(), time.time_ns())
            os.environ.update(emulated.job_env(state, node, dict(os.environ)))
        return _report(args)


def _terminated(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the clean-up short
    raise SystemExit(f"gpu-check: stopped by signal {signum}")


def _node(seconds: float) -> dict:
    """The preflight's figures beside the profile's, printed; its error instead where it
    failed (the check goes on to the sweep: one run on a lent GPU must say as much as it can)."""
    try:
        measured = node_figures(seconds)
    except (Exception, SystemExit) as exc:
        print(f"gpu-check: the preflight failed: {exc}", file=sys.stderr, flush=True)
        return {"preflight_error": f"{type(exc).__name__}: {exc}"}
    key = profile_for(measured["gpu"])
    print(f"GPU {measured['gpu']}: measured on {os.uname().nodename}, against profile {key}")
    try:
        print(profile_table(measured, key), flush=True)
    except Exception as exc:  # a profile without one of these figures: say so, go on
        print(f"(no comparison with profile {key}: {exc!r})", flush=True)
    return {"node": measured, "profile": key}


def _report(args) -> int:
    """Preflight, then the sweep and its figures; print the tables; write the JSON."""
    t0 = time.monotonic()
    workflow = Path(args.workflow).resolve()
    workdir = Path(args.workdir).resolve()
    out, rc = {"emulated": args.emulated}, 0
    out.update(_node(args.seconds))
    if "preflight_error" in out:
        rc = 1  # the sweep still runs: its table says more than the preflight would
    if not args.no_sweep:
        workdir.mkdir(parents=True, exist_ok=True)
        out["config"] = prepare_workflow(workflow, workdir / "workflow", args.emulated)
        out["sweep"] = sweep = run_sweep(workdir / "workflow", workdir, args.emulated, args.timeout)
        try:
            out.update(sweep_figures(workdir / "workflow", workdir, args.emulated))
        except Exception as exc:  # a sweep that failed part-way: say what is missing
            out["figures_error"] = f"{type(exc).__name__}: {exc}"
        text = figs.table(out)
        print(text)
        (workdir / "table.txt").write_text(text + "\n")
        if sweep["error"]:  # the log's end, where Snakemake says which job failed and why
            tail = Path(sweep["log"]).read_text(errors="replace")[-6000:]
            print(f"--- the end of {sweep['log']} ---\n{tail}", file=sys.stderr)
        for problem in (sweep["error"], out.get("figures_error")):
            if problem:
                print(f"gpu-check: {problem} (log: {sweep['log']})", file=sys.stderr)
                rc = 1
        if out.get("energy", {}).get("ours_vs_independent", {}).get("n", 0) == 0:
            print("gpu-check: no window has an independent reading", file=sys.stderr)
            rc = 1
    out["elapsed_s"] = time.monotonic() - t0
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, default=str))
    print(f"written to {path} ({out['elapsed_s']:.0f} s)")
    return rc


if __name__ == "__main__":
    sys.exit(main())
