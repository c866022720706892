"""Helpers shared by the bench/ scripts: a workflow copy, timed subprocesses, machine facts.

Every benchmark compares our pipeline with a floor measured side by side in the same run, so the
figure that counts is a ratio. This machine may be shared with other work: each timing records
wall time and the CPU time (user + system) of the process tree it started, which is far less
sensitive to other load than wall time.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
WORKFLOW_PARTS = ("Snakefile", "rules", "scripts", "config", "profiles", "report", "src", "envs")


def workflow_copy(dst: Path, root: Path = ROOT) -> Path:
    """Copy the workflow (not results/) to ``dst`` so a benchmark never touches the checkout's."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in WORKFLOW_PARTS:
        src = root / name
        if src.is_dir():
            shutil.copytree(src, dst / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            shutil.copy2(src, dst / name)
    # The default sweep's vLLM ranks use .venv-vllm beside the Snakefile (config
    # `environments.vllm`): link the checkout's, as built by `make vllm-env`.
    if (ROOT / ".venv-vllm").is_dir() and not (dst / ".venv-vllm").exists():
        (dst / ".venv-vllm").symlink_to(ROOT / ".venv-vllm", target_is_directory=True)
    return dst


def env() -> dict:
    """The README's environment: the venv first on PATH, the package importable."""
    e = dict(os.environ)
    e["PATH"] = f"{VENV_BIN}{os.pathsep}{e.get('PATH', '')}"
    e["PYTHONPATH"] = str(ROOT / "src")
    e.setdefault("OMP_NUM_THREADS", "1")
    return e


@dataclass
class Timing:
    wall_s: float
    cpu_s: float
    returncode: int
    output: str


def timed(
    argv: list[str],
    cwd: Path,
    timeout_s: float = 600,
    out_file: Path | None = None,
    extra_env: dict | None = None,
) -> Timing:
    """Run ``argv`` to completion; wall time and the CPU time of its whole process tree.

    CPU time comes from RUSAGE_CHILDREN, which counts every waited-for descendant (torchrun's
    ranks, Snakemake's job processes).
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    sink = open(out_file, "w") if out_file else subprocess.PIPE  # noqa: SIM115
    try:
        proc = subprocess.run(
            argv,
            cwd=cwd,
            env={**env(), **(extra_env or {})},
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout_s,
        )
    finally:
        if out_file:
            sink.close()
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    output = out_file.read_text(errors="replace") if out_file else proc.stdout
    return Timing(wall, cpu, proc.returncode, output)


def check(t: Timing, what: str) -> Timing:
    if t.returncode != 0:
        sys.exit(f"{what} failed (exit {t.returncode}):\n{t.output[-4000:]}")
    return t


def machine() -> str:
    """Cores, CPU model and load: the context a figure needs."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{os.cpu_count()} cores, {model}, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}, load average {load}, "
        f"{datetime.datetime.now().isoformat(timespec='seconds')}"
    )


BENCHMARK = '    benchmark:\n        f"benchmarks/measure/{PARAMS.wildcard_pattern}.tsv"\n'


def add_benchmark_directive(wf: Path) -> None:
    """Let Snakemake time each measure job: a `benchmark:` before the rule's `log:`."""
    smk = wf / "rules" / "measure.smk"
    text = smk.read_text()
    new, n = re.subn(r"(rule measure:\n(?:.*\n)*?)(    log:\n)", rf"\1{BENCHMARK}\2", text, count=1)
    if n != 1:
        sys.exit("could not find the measure rule's log: directive to add benchmark: before it")
    smk.write_text(new)


def benchmark_path(job_dir: str) -> str:
    """Where the added `benchmark:` directive writes a job's timings."""
    return f"benchmarks/measure/{job_dir.split('shards/', 1)[1]}.tsv"
