"""Shared fixtures. Integration fixtures that start processes or daemons bound every wait."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

# This session's own GPU claims and emulated process list (energysweep.launch.gpu_claims,
# hw/emulated/processes.py), for it and every process it starts: another test session on the
# machine claims the same emulated GPUs (they are named by host and index).
SESSION_DIR = Path(tempfile.mkdtemp(prefix="energysweep-tests-"))
os.environ.setdefault("ENERGYSWEEP_GPU_CLAIMS_DIR", str(SESSION_DIR / "gpu-claims"))
os.environ.setdefault("ENERGYSWEEP_EMULATED_PROCESSES_DIR", str(SESSION_DIR / "emulated-processes"))
# The tiny-model cache of every sweep's build_tiny_model step (energysweep.sweep.tinymodel): one
# per `make test` (both sessions' shared directory, below), never the user's ~/.cache. The first
# sweep builds the checkpoint and keeps it; the others copy it (0.1 s instead of 4.6 s).
os.environ.setdefault(
    "ENERGYSWEEP_MODEL_CACHE",
    str(Path(os.environ.get("ENERGYSWEEP_TEST_SHARED_DIR") or SESSION_DIR) / "model-cache"),
)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))
VENV_BIN = Path(sys.executable).parent

from energysweep.util import slurm_status  # noqa: E402

from slurm_fixtures import (  # noqa: E402,F401  (real local Slurm clusters, one mode at a time)
    order_multinode_last,
    slurm_cluster,
    slurm_multinode,
    slurm_switch,
    slurm_three_nodes,
)

# `make test` runs two pytest sessions side by side (Makefile): the Slurm tests, which mostly
# wait on the scheduler, with these modules beside them (-m "slurm or beside_slurm"), and all
# the others. These modules hold no timing bound (no emulated ground truth): the emulated
# truth tests keep the contention they were calibrated under (a third session side by side made
# their window edges miss by up to 76 ms, issue 28's note).
# The last three joined them to even the two sessions out (issue 28: CI run 46 had 1557 s
# without the Slurm tests, 1342 s with them), and so did the last seven (the dry runs, the
# default sweep's checks, which read the sweep this session runs beside the Slurm one, and the
# GPU-setting restore tests) once the Slurm tests saw their jobs end sooner
# (energysweep.util.slurm_status; CI run 99: 1306 s without the Slurm tests, 1170 s with them).
BESIDE_SLURM = {
    "test_bench_quick.py",
    "test_engine_backends_fake.py",
    "test_training_parallel.py",
    "test_serving_fake.py",
    "test_archive_reproduce.py",
    "test_examples_dryrun.py",
    "test_pipeline_local.py",
    "test_fail_closed.py",
    "test_merge_verify.py",
    "test_merged_dataset.py",
    "test_standin_engine.py",
    "test_gpu_settings_restore.py",
}


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in BESIDE_SLURM:
            item.add_marker(pytest.mark.beside_slurm)
    # Single-node and multi-node clusters cannot run at once: group tests by mode.
    order_multinode_last(items)
    # The tests that read local_run go last: test_slurm_pipeline's default sweep runs it while its
    # own Slurm sweep waits on the scheduler, never alone first (CI run 101: 111 s alone, where
    # beside the Slurm sweep it added ~60 s to it). The unit tests (one process, one core) go
    # first, beside the Slurm session's opening modules, which keep the other core busy: last,
    # they ran beside its multi-node failure tests, which mostly wait on the scheduler, and the
    # machine was ~45% idle for their ~150 s (CI run 117).
    items.sort(
        key=lambda item: (
            "local_run" in getattr(item, "fixturenames", ()),
            item.path.parent.name != "unit",
        )
    )


# The default sweep at a small workload, as `make run` runs it (report built by the same run).
# One run per session: test_pipeline_local checks its outputs, test_slurm_pipeline compares the
# same sweep through Slurm with it (schema, row counts).
SMALL = {
    "workload": {"batch_sizes": [1, 4], "repetitions": 2, "iterations": 1},
}
LOCAL_RUN_TIMEOUT_S = 600


def local_sweep(
    directory: Path,
    config: dict,
    name: str = "test.yaml",
    report: bool = True,
    timeout_s: float = LOCAL_RUN_TIMEOUT_S,
    extra_args: tuple[str, ...] = (),
) -> tuple[Path, str]:
    """A workflow copy in ``directory`` run with ``config`` (config/<name>) on the local
    profile, with the report unless ``report`` is False, and ``extra_args`` given to Snakemake:
    (workflow dir, config path)."""
    import subprocess

    import yaml

    wf = workflow_copy(directory)
    cfg = f"config/{name}"
    (wf / cfg).write_text(yaml.safe_dump(config))
    argv = ["snakemake", "--profile", "profiles/local", f"--configfile={cfg}"]
    if report:
        argv += ["--report", "results/report.html", "--report-after-run"]
    argv += list(extra_args)
    proc = subprocess.run(
        argv, cwd=wf, env=test_env(), capture_output=True, text=True, timeout=timeout_s
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return wf, cfg


# `make test` runs two pytest sessions side by side (the Slurm tests and the rest) and gives both
# one directory, $ENERGYSWEEP_TEST_SHARED_DIR: a sweep both sessions read runs once, in the
# session that needs it first, under a file lock; the other waits for it (bounded) and reads it.
SHARED_DIR_ENV = "ENERGYSWEEP_TEST_SHARED_DIR"
SHARED_WAIT_S = LOCAL_RUN_TIMEOUT_S + 300


def shared_sweep(tmp_path_factory, name: str, run) -> tuple[Path, str]:
    """``run(directory)``'s (workflow dir, config path), run once across the sessions that share
    $ENERGYSWEEP_TEST_SHARED_DIR (once in this session without it). A failed run is recorded:
    the other session fails with its error instead of running it again."""
    import fcntl
    import json
    import time

    shared = os.environ.get(SHARED_DIR_ENV)
    if not shared:
        return run(tmp_path_factory.mktemp(name))
    root = Path(shared)
    root.mkdir(parents=True, exist_ok=True)
    record = root / f"{name}.json"
    with open(root / f"{name}.lock", "w") as lock:
        deadline = time.monotonic() + SHARED_WAIT_S
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"the shared {name} sweep held its lock over {SHARED_WAIT_S} s")
                time.sleep(1)
        if record.exists():
            done = json.loads(record.read_text())
            if "error" in done:
                pytest.fail(f"the shared {name} sweep failed in the other session: {done['error']}")
            return Path(done["wf"]), done["cfg"]
        try:
            wf, cfg = run(root / name)
        except BaseException as exc:  # the other session must not wait for nor redo it
            record.write_text(json.dumps({"error": str(exc)[-4000:]}))
            raise
        record.write_text(json.dumps({"wf": str(wf), "cfg": cfg}))
        return wf, cfg


@pytest.fixture(scope="session")
def local_run(tmp_path_factory) -> tuple[Path, str]:
    """The default sweep (PyTorch, SMALL) on the local profile: (workflow dir, config path).
    Shared with the Slurm session of `make test` (shared_sweep)."""
    return shared_sweep(tmp_path_factory, "local", lambda d: local_sweep(d, SMALL))


# The default layouts (tp, pp, dp up to 2 GPUs; inference and training) on the emulated GPU node
# (measurement.device emulated, docs/emulated-node.md): GPU joules flow through every stage. One
# run per session (tests/integration/test_emulated_pipeline.py); short windows keep it cheap.
EMULATED = {
    "scenarios": ["inference", "training"],
    "workload": {"batch_sizes": [2], "repetitions": 2, "iterations": 1},
    "measurement": {
        "device": "emulated",
        "min_window_s": 0.5,
        "idle_baseline_s": 0.5,
        "cooldown_s": 0.1,
        "sampler_hz": 10,
        # The H200 fitted (its counter's gain and noise included), with two of its figures
        # fixed: an energy read of the H200's median 2.6 ms (its slow-read tail, up to 185 ms,
        # is issue 27's bracketed edge reads) and no publication delay (7 ms at most: it moves
        # a window's edge by the load step there). Both are in bench/energy_accuracy.py's table;
        # here they would hide the edge arithmetic's errors the truth bounds exist to catch.
        "emulated": {"profile": "h200-sxm", "read_latency_s": 0.0026, "counter_delay_s": 0.0},
    },
}


@pytest.fixture(scope="session")
def emulated_run(tmp_path_factory) -> tuple[Path, str]:
    """The default layouts on the emulated node, with the report: (workflow dir, config)."""
    return local_sweep(tmp_path_factory.mktemp("emulated"), EMULATED, "emulated.yaml")


@pytest.fixture(scope="session")
def vllm_offline(tmp_path_factory) -> Path:
    """The real offline vLLM sweep of test_vllm_real (once per session; test_serving_real
    compares the server's greedy tokens with it)."""
    from test_vllm_real import offline_run

    return offline_run(tmp_path_factory)


@pytest.fixture
def fake_nvml(monkeypatch):
    """Install a fake pynvml (real constants/errors) wherever energysweep imports it."""
    import fake_pynvml

    def install(gpus, init_error=None):
        mod = fake_pynvml.make_fake(gpus, init_error)
        monkeypatch.setitem(sys.modules, "pynvml", mod)
        import energysweep.energy.ticks as ticks
        import energysweep.hw.nvml as nvml

        monkeypatch.setattr(nvml, "pynvml", mod)
        # A fake counter changes when a test changes it (or every few ms): a window edge waits
        # for a refresh only briefly, then reads unaligned (tests of the alignment use the
        # emulated node's counter, test_energy_alignment.py).
        monkeypatch.setattr(ticks, "TIMEOUT_S", 0.02)
        return mod

    return install


@pytest.fixture
def snakemake_exe() -> str:
    exe = VENV_BIN / "snakemake"
    return str(exe) if exe.exists() else shutil.which("snakemake")


def workflow_copy(tmp_path: Path) -> Path:
    """A copy of the workflow (not results) in tmp_path, so tests never touch the checkout's.

    Its default config sweeps PyTorch only: the default sweep's vLLM jobs (real engine, in
    .venv-vllm) are what tests/integration/test_vllm_real.py runs; a test that wants vLLM names
    it in its own config, with ``environments.vllm`` (the copy has no .venv-vllm).
    """
    dst = tmp_path / "wf"
    dst.mkdir(parents=True)
    for name in ("Snakefile", "rules", "scripts", "config", "profiles", "report", "src", "envs"):
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dst / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            shutil.copy2(src, dst / name)
    default = dst / "config" / "config.yaml"
    text = default.read_text()
    assert "\nbackends: [pytorch, vllm]\n" in text, "config/config.yaml: backends line changed"
    default.write_text(text.replace("\nbackends: [pytorch, vllm]\n", "\nbackends: [pytorch]\n"))
    return dst


def test_env(slurm: bool = False) -> dict:
    """Environment for a snakemake (or rank) subprocess; ``slurm`` for runs that submit to Slurm.

    Snakemake imports its Slurm executor plugin at start-up, and the plugin runs
    ``scontrol show config``: with Slurm's client tools installed but no controller answering,
    that waits ~9 s; with no slurm.conf it asks DNS for ``_slurmctld._tcp`` (traffic off the
    machine). A run that uses no Slurm points scontrol at an empty config: it fails in
    milliseconds, offline (see docs/cluster-admins.md, "Snakemake start-up and Slurm").
    """
    env = dict(os.environ)
    if slurm:
        env.pop("SLURM_CONF", None)  # the cluster's /etc/slurm (the jobstep plugin needs it)
        # The test cluster answers in milliseconds: see a job's end within 1 s, not the Slurm
        # plugin's growing interval (up to ~40 s late; energysweep.util.slurm_status). Each
        # check is one sacct query.
        env[slurm_status.ENV] = "1"
    else:
        env["SLURM_CONF"] = os.devnull
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT / "src")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


test_env.__test__ = False  # a helper, not a test

SHM = Path("/dev/shm")


def shm_in_use() -> set[str]:
    """Names in /dev/shm that a live process maps or holds open, read from /proc as a person
    would (independent of energysweep.launch.cleanup). By inode too: a named semaphore
    (sem_open: sem.mp-*) is mapped under the temporary name it was made as, deleted since."""
    used, inodes = set(), set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[5].startswith("/dev/shm/"):
                    used.add(parts[5].removeprefix("/dev/shm/").removesuffix(" (deleted)"))
                    inodes.add(int(parts[4]))
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("/dev/shm/"):
                    used.add(target.removeprefix("/dev/shm/").removesuffix(" (deleted)"))
                    inodes.add(fd.stat().st_ino)
        except OSError:
            continue
    return used | {e.name for e in os.scandir(SHM) if e.inode() in inodes}


def shm_left_since(before: set[str]) -> set[str]:
    """Entries of /dev/shm new since ``before`` that no live process maps or holds open: what
    a run left behind. `make test` runs two sessions side by side, so a new entry another
    session's live engine uses is not a leftover; one unused in two looks 1 s apart is (a
    segment is briefly neither mapped nor open while its creator goes from one to the other)."""
    left = set(os.listdir(SHM)) - before - shm_in_use()
    if left:
        time.sleep(1)
        left &= set(os.listdir(SHM)) - shm_in_use()
    return left


VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


def vllm_python() -> str:
    """The vLLM environment's interpreter; `make test` builds it first, so missing is a failure
    (never a skip): run `make vllm-env`."""
    assert VLLM_PYTHON.is_file(), f"{VLLM_PYTHON} is missing: run `make vllm-env`"
    return str(VLLM_PYTHON)
