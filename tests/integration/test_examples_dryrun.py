"""Every example sweep validates and dry-runs here (no GPU, no engine installed), and each measure
job asks the scheduler for exactly tp*pp*dp GPUs."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from energysweep.sweep import config as es_config
from energysweep.util import slurm_status

from conftest import test_env, workflow_copy

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.name for p in (ROOT / "config" / "examples").glob("*.yaml"))
PROFILE = (
    "profiles/slurm"
    if (ROOT / "profiles" / "slurm" / "config.yaml").exists()
    else ("profiles/local")
)


@pytest.fixture(scope="module")
def wf(tmp_path_factory):
    return workflow_copy(tmp_path_factory.mktemp("examples"))


def snakemake(wf: Path, *args: str) -> tuple[int, str]:
    """Run snakemake in ``wf``; return its exit code and stdout + stderr."""
    proc = subprocess.run(
        ["snakemake", *args],
        cwd=wf,
        env=test_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc.returncode, proc.stdout + proc.stderr


def dry_run(wf: Path, example: str) -> str:
    rc, out = snakemake(
        wf, "-n", "--profile", PROFILE, "--configfile", f"config/examples/{example}"
    )
    assert rc == 0, out[-4000:]
    return out


def measure_jobs(out: str) -> list[dict]:
    """(wildcards, resources) of every `rule measure` block of a dry run."""
    jobs = []
    for block in out.split("rule measure:")[1:]:
        wc = re.search(r"^\s*wildcards: (.*)$", block, re.M).group(1)
        res = re.search(r"^\s*resources: (.*)$", block, re.M).group(1)
        jobs.append(
            {
                "wildcards": dict(kv.split("=", 1) for kv in wc.split(", ")),
                "resources": dict(kv.split("=", 1) for kv in res.split(", ") if "=" in kv),
            }
        )
    return jobs


def gpus_asked(res: dict) -> int:
    """GPUs a job asks for in all: `gpu` on one node, or gres gpu:G on each of `nodes` nodes."""
    nodes = int(res.get("nodes", 1))
    if "gres" in res:
        return int(res["gres"].split(":")[-1]) * nodes
    assert nodes == 1, res
    return int(res["gpu"])


def test_examples_exist():
    assert {"vllm-dgx2.yaml", "trtllm-dgx2.yaml", "mixed-backends.yaml"} <= set(EXAMPLES)


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_validates(example, monkeypatch):
    """Schema + semantic checks, as the workflow runs them under conda (engines not here)."""
    monkeypatch.chdir(ROOT)
    cfg = es_config.load(ROOT / "config" / "examples" / example, use_conda=True)
    grid = es_config.build_grid(cfg, ROOT)
    assert grid.jobs


@pytest.mark.timeout(900)
@pytest.mark.parametrize("example", EXAMPLES)
def test_example_dry_runs_with_gpus_per_layout(wf, example):
    cfg = yaml.safe_load((ROOT / "config" / "examples" / example).read_text())
    out = dry_run(wf, example)
    jobs = measure_jobs(out)
    grid = es_config.build_grid(es_config.validate_schema(cfg), ROOT)
    assert len(jobs) == len(grid.jobs) > 0
    for job in jobs:
        wc, res = job["wildcards"], job["resources"]
        world = int(wc["tp"]) * int(wc["pp"]) * int(wc["dp"])
        assert gpus_asked(res) == world, (wc, res)
    backends = {j["wildcards"]["backend"] for j in jobs}
    assert backends == set(cfg["backends"])
    for b in set(cfg["backends"]) - {"pytorch"}:
        # An engine environment missing here is a warning in a dry run, naming its conda env
        # (the workflow copy has no .venv-vllm; TensorRT-LLM is never installed here).
        assert "warning (dry run): config key " in out and f"backend {b!r}" in out
        assert f"envs/{b}.yaml" in out


def test_trtllm_example_runs_a_replica_over_two_nodes_and_skips_multi_node_dp(wf):
    out = dry_run(wf, "trtllm-dgx2.yaml")
    by_layout = {
        (
            j["wildcards"]["model"],
            j["wildcards"]["tp"],
            j["wildcards"]["pp"],
            j["wildcards"]["dp"],
        ): j["resources"]
        for j in measure_jobs(out)
    }
    res = by_layout[("llama-3.1-70b", "8", "4", "1")]
    assert int(res["nodes"]) == 2 and gpus_asked(res) == 32
    # mpi launch: the allocation holds one task per MPI rank (tp*pp), 16 per node.
    assert int(res["tasks"]) == 32 and res["mpi"] == "srun", res
    # tp8 x pp2 x dp2 = 32 GPUs: two single-node replicas on two nodes is not a launch mode.
    assert ("llama-3.1-70b", "8", "2", "2") not in by_layout
    cfg = es_config.validate_schema(
        yaml.safe_load((ROOT / "config" / "examples" / "trtllm-dgx2.yaml").read_text())
    )
    skipped = es_config.build_grid(cfg, ROOT).skipped
    reason = next(
        s["reason"]
        for s in skipped
        if (s["model"], s["tp"], s["pp"], s["dp"]) == ("llama-3.1-70b", "8", "2", "2")
    )
    assert "mpi" in reason and "dp=2" in reason


def test_a_missing_engine_fails_validation_outside_a_dry_run(wf):
    """The same grid, really run without conda and without the vLLM environment: refused
    before any job, naming the backend, the key and the fix."""
    rc, out = snakemake(
        wf,
        # The target first: --configfile takes every following word as a config file.
        "results/grid/jobs.tsv",
        "--profile",
        "profiles/local",
        "--configfile",
        "config/examples/vllm-dgx2.yaml",
    )
    # The workflow copy has no .venv-vllm, the default vLLM environment.
    assert rc != 0
    assert "config key environments.vllm: backend 'vllm' runs its ranks with" in out
    assert "does not exist" in out and "make vllm-env" in out and "envs/vllm.yaml" in out
    assert not (wf / "results" / "grid" / "jobs.tsv").exists()


def test_lint_runs_without_the_engine_environment(wf):
    """`snakemake --lint` executes nothing: a missing engine environment is only a warning."""
    rc, out = snakemake(wf, "--lint", "--configfile", "config/examples/vllm-dgx2.yaml")
    assert rc == 0, out[-4000:]
    assert "warning (dry run): config key environments.vllm" in out


def test_multi_node_torchrun_jobs_get_one_task_per_node(wf):
    """PyTorch over two nodes: one task per node, each a torchrun of 16 ranks."""
    jobs = measure_jobs(dry_run(wf, "dgx2-pytorch.yaml"))
    multi = [j for j in jobs if int(j["resources"].get("nodes", 1)) > 1]
    assert multi
    for job in multi:
        assert int(job["resources"]["tasks"]) == int(job["resources"]["nodes"]), job
        assert job["resources"]["gres"] == "gpu:16", job


def test_slurm_dry_run_with_device_auto_keeps_gpu_freq(wf):
    """``measurement.device: auto`` is decided on the job's node, never on the host that loads the
    workflow (a login node without GPUs, like this one): the clock axis stays in the grid and its
    sbatch keeps ``--gpu-freq`` (a node without a GPU then records the point's error there)."""
    cfg = {
        "backends": ["pytorch"],
        "scenarios": ["inference"],
        "parallel": {"tp": [1], "pp": [1], "dp": [1]},
        "workload": {"batch_sizes": [1], "repetitions": 1},
        "gpu": {"clock": ["medium"], "power_limit_w": [None, 300]},
    }
    (wf / "config" / "auto-clock.yaml").write_text(yaml.safe_dump(cfg))
    rc, out = snakemake(
        wf, "-n", "--profile", "profiles/slurm", "--configfile", "config/auto-clock.yaml"
    )
    assert rc == 0, out[-4000:]
    jobs = measure_jobs(out)
    full = es_config.validate_schema(
        {**yaml.safe_load((ROOT / "config" / "config.yaml").read_text()), **cfg}
    )
    assert full["measurement"]["device"] == "auto"  # the default, as the dry run had it
    assert sorted(j["wildcards"]["power_limit_w"] for j in jobs) == ["300", "unset"], out[-3000:]
    for job in jobs:
        assert job["wildcards"]["gpu_clock"] == "medium"
        assert "--gpu-freq=medium" in job["resources"]["slurm_extra"], job
    skipped = es_config.build_grid(full, ROOT).skipped
    assert not [s for s in skipped if "no GPU to set" in s["reason"]]


def test_serving_jobs_are_started_before_the_other_jobs(wf):
    """A serving job is a sweep's longest one-GPU job (a server start per batch cap, a ramp per
    rate): the serve rule's priority starts it first, so the shorter jobs run beside it rather
    than after it (issue 30). The measure jobs keep the default priority."""
    cfg = {"backends": ["pytorch", "vllm"], "scenarios": ["inference", "serving"]}
    (wf / "config" / "serving-first.yaml").write_text(yaml.safe_dump(cfg))
    rc, out = snakemake(
        wf, "-n", "--profile", "profiles/local", "--configfile", "config/serving-first.yaml"
    )
    assert rc == 0, out[-4000:]
    blocks = {rule: [b.split("\n\n")[0] for b in out.split(f"rule {rule}:")[1:]]
              for rule in ("serve", "measure")}  # fmt: skip
    assert len(blocks["serve"]) == 1 and len(blocks["measure"]) >= 2, out[-4000:]
    assert all(re.search(r"^\s*priority: 1$", b, re.M) for b in blocks["serve"]), blocks["serve"]
    assert not any("priority:" in b for b in blocks["measure"]), blocks["measure"]


def test_a_bad_slurm_status_cap_fails_before_any_job(wf):
    """ENERGYSWEEP_SLURM_STATUS_MAX_S (energysweep.util.slurm_status) is read when the workflow
    loads: a value that is no positive number stops it there, naming the variable and the fix.
    (Every Slurm test runs with it set: tests/conftest.py, test_env.)"""
    env = {**test_env(), slurm_status.ENV: "soon"}
    proc = subprocess.run(
        ["snakemake", "-n", "--profile", "profiles/slurm"],
        cwd=wf, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert f"{slurm_status.ENV}='soon' is not a positive number of seconds" in out, out[-3000:]
