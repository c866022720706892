"""Multi-node layouts on a real 2-node Slurm cluster (``cluster/slurm-local.sh up --nodes 2``).

Each node is one slurmd in its own network namespace (own hostname and address on a private
bridge); ranks are CPU processes talking gloo across the bridge. The sweep runs through
``snakemake --profile profiles/slurm --profile profiles/slurm-ci``, as a user would on a cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from energysweep.hw.emulated.node import identity
from energysweep.launch import procs

from conftest import test_env, workflow_copy
from emulated_truth import (
    MULTINODE_FLAGGED_SHARE,
    SLURM_LONG_ERROR_PCT,
    SLURM_RANK_BIAS_S,
    SLURM_WORST_ERROR_S,
    against_truth,
    assert_matches_truth,
)

pytestmark = [pytest.mark.slurm, pytest.mark.integration]

SLURM = ["--profile", "profiles/slurm", "--profile", "profiles/slurm-ci"]
RUN_TIMEOUT_S = 900
# limits.collective_timeout_s of these sweeps: a job whose rank died must fail well before it (a
# peer that waited out a collective instead would take at least this long).
COLLECTIVE_TIMEOUT_S = 180
# Tiny on purpose (2 cores for every rank of every node): one repetition, short windows, no idle
# baseline or cooldown. Two iterations at batch size 2 record prompts 0-3 in the batches [0,1] and
# [2,3], exactly the two dp2 replicas' batches; batch size 4 gives the global batch of dp2 x 2.
TINY = {
    "scenarios": ["inference", "training"],
    "workload": {"batch_sizes": [2], "repetitions": 1, "iterations": 2, "warmup_iterations": 0},
    "training": {"steps": 1, "warmup_steps": 0},
    "measurement": {
        "min_window_s": 0.0,
        "idle_baseline_s": 0.0,
        "cooldown_s": 0.0,
        "prefill_pass": False,
    },
    "limits": {"collective_timeout_s": COLLECTIVE_TIMEOUT_S},
}
# The layout sweep runs on emulated GPU nodes with the 4 GPUs each node's GRES declares: every
# rank owns the GPU CUDA_VISIBLE_DEVICES names on its own node (docs/emulated-node.md).
EMULATED = {**TINY["measurement"], "device": "emulated", "emulated": {"node_gpus": 4}}
# gpus_per_node 1: tp2, pp2, dp2 each span 2 nodes with one rank per node; the cross product's
# tp1·pp1·dp1 runs on one node in the same sweep: the single-process reference.
# gpus_per_node 2: tp2×dp2 spans 2 nodes, 2 ranks per node.
ONE_PER_NODE = {
    "tp": [1, 2],
    "pp": [1, 2],
    "dp": [1, 2],
    "max_gpus_per_job": 2,
    "gpus_per_node": 1,
    "cpus_per_node": 4,
    "mem_mb_per_node": 8000,
}
TWO_PER_NODE = {
    "tp": [2],
    "pp": [1],
    "dp": [2],
    "max_gpus_per_job": 4,
    "gpus_per_node": 2,
    "cpus_per_node": 4,
    "mem_mb_per_node": 8000,
}
MULTI_NODE_LAYOUTS = {(2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 1, 2)}
# Losses of a layout vs one process on the same global batch (tests/integration/
# test_training_parallel.py holds single-node layouts to the same bound).
LOSS_TOL = 1e-4


def write_config(wf: Path, name: str, over: dict) -> str:
    (wf / "config" / name).write_text(yaml.safe_dump(over))
    return f"--configfile=config/{name}"


def start(wf: Path, profile: list[str], *args: str, timeout=RUN_TIMEOUT_S) -> subprocess.Popen:
    # `timeout -k`: a Snakemake that lost its jobs ignores SIGTERM (reference notes).
    argv = ["timeout", "-k", "20", str(timeout), "snakemake", *profile, *args]
    return subprocess.Popen(
        argv,
        cwd=wf,
        env=test_env(slurm=profile is SLURM),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def stop(proc: subprocess.Popen) -> None:
    """Stop a sweep still running: SIGTERM (timeout passes it on; Snakemake cancels its Slurm
    jobs), then SIGKILL."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def finish(proc: subprocess.Popen, timeout=RUN_TIMEOUT_S + 60) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-6000:]
    return out


def sacct(job_ids) -> pd.DataFrame:
    out = subprocess.run(
        [
            "sacct",
            "-X",
            "-P",
            "-n",
            "-j",
            ",".join(sorted(job_ids)),
            "-o",
            "JobID,AllocTRES%120,State,NodeList%60",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    df = pd.DataFrame(
        [line.split("|") for line in out.strip().splitlines()],
        columns=["job_id", "tres", "state", "nodelist"],
    ).set_index("job_id")
    df["gpus"] = df["tres"].str.extract(r"gres/gpu=(\d+)")[0].astype(int)
    df["nodes"] = df["tres"].str.extract(r"node=(\d+)")[0].astype(int)
    return df


def layout_of(df: pd.DataFrame) -> pd.Series:
    return pd.Series(list(zip(df["tp"], df["pp"], df["dp"], strict=True)), index=df.index)


def generations(wf: Path, tp: int, pp: int, dp: int) -> pd.DataFrame:
    path = (
        wf
        / "results"
        / "shards"
        / "model~tiny-llama"
        / "backend~pytorch"
        / "scenario~inference"
        / f"tp~{tp}"
        / f"pp~{pp}"
        / f"dp~{dp}"
        / "generations.parquet"
    )
    g = pd.read_parquet(path)
    g["token_ids"] = g["token_ids"].map(list)
    return g.set_index(["batch_size", "iteration", "prompt_index"])["token_ids"].sort_index()


@pytest.mark.timeout(RUN_TIMEOUT_S + 300)
def test_multinode_sweep_matches_single_process(slurm_multinode, tmp_path):
    """dp2, tp2, pp2 (1 rank per node) and tp2×dp2 (2 per node), inference and training."""
    runs = []
    for name, par in (("one", ONE_PER_NODE), ("two", TWO_PER_NODE)):
        wf = workflow_copy(tmp_path / name)
        over = {**TINY, "parallel": par, "measurement": EMULATED}
        if name == "one":  # the reference needs the global batch of dp2 too
            over["workload"] = {**TINY["workload"], "batch_sizes": [2, 4]}
        runs.append((wf, start(wf, SLURM, write_config(wf, "mn.yaml", over))))
    rows = []
    try:
        for wf, proc in runs:
            finish(proc)
            e = pd.read_parquet(wf / "results" / "energy.parquet")
            e["wf"] = str(wf)
            rows.append(e)
    finally:  # a failed sweep must not leave the other one running past the test
        for _, proc in runs:
            stop(proc)
    e = pd.concat(rows, ignore_index=True)
    e["layout"] = layout_of(e)
    assert e["status"].eq("ok").all(), e[["layout", "scenario", "status", "error"]]
    multi = e[e["layout"].isin(MULTI_NODE_LAYOUTS)]
    covered = set(zip(multi["layout"], multi["scenario"], strict=True))
    assert covered == {(lay, s) for lay in MULTI_NODE_LAYOUTS for s in ("inference", "training")}

    jobs = multi.groupby(["layout", "scenario"])["slurm_job_id"].unique()
    assert all(len(ids) == 1 for ids in jobs), jobs
    acct = sacct(ids[0] for ids in jobs)
    for (layout, scenario), ids in jobs.items():
        tp, pp, dp = layout
        job = acct.loc[ids[0]]
        # Every multi-node job completed on 2 nodes with exactly tp·pp·dp GPUs in all.
        assert job["state"] == "COMPLETED", (layout, scenario, job)
        assert job["nodes"] == 2 and job["gpus"] == tp * pp * dp, (layout, scenario, job)
        rows_job = multi[multi["slurm_job_id"] == ids[0]]
        # Every rank recorded its own host: exactly 2 hosts, a contiguous block of ranks on each
        # (tp innermost, so a TP group never spans nodes), local ranks 0.. on each.
        per_node = tp * pp * dp // 2
        by_host = rows_job.groupby("host")["rank"].apply(lambda r: sorted(set(r)))
        assert sorted(by_host.index) == ["esnode1", "esnode2"], by_host
        assert sorted(map(tuple, by_host)) == [
            tuple(range(0, per_node)),
            tuple(range(per_node, 2 * per_node)),
        ], by_host
        local = rows_job.groupby("host")["local_rank"].apply(lambda r: sorted(set(r)))
        assert all(list(v) == list(range(per_node)) for v in local), local
        # allocated_gpus is per node: each host saw its own per_node GPUs; the job's count is
        # sacct's gres/gpu (asserted above), never the concatenation of the per-node lists.
        seen = rows_job.groupby("host")["allocated_gpus"].first().str.split(",").map(len)
        assert (seen == per_node).all(), seen
        # Each node's GPUs are its own: tp*pp*dp distinct UUIDs, none shared between hosts,
        # each the emulated GPU its rank's CUDA_VISIBLE_DEVICES entry names on its host.
        by_host_uuids = rows_job.groupby("host")["gpu_uuid"].apply(set)
        assert sum(map(len, by_host_uuids)) == rows_job["gpu_uuid"].nunique() == tp * pp * dp
        for r in rows_job.itertuples():
            index = int(r.allocated_gpus.split(",")[r.local_rank])
            assert r.gpu_uuid == identity(r.host, index).uuid, (layout, r.host, r.local_rank)

    # GPU joules on both nodes: every window's energy is the ground truth's (each node's owners
    # wrote their own truth), labelled emulated.
    assert e["gpu_energy_method"].eq("emulated:nvml-total-energy-counter").all()
    # The two workflows are one sweep's layouts (split by ranks per node): their windows are
    # held to the bounds together (the two-per-node one has two windows).
    truth = pd.concat([against_truth(wf) for wf, _ in runs], ignore_index=True)
    assert truth["gpu_energy_mj"].gt(0).all()
    assert_matches_truth(
        truth,
        SLURM_WORST_ERROR_S,
        SLURM_RANK_BIAS_S,
        SLURM_LONG_ERROR_PCT,
        MULTINODE_FLAGGED_SHARE,
    )
    assert set(against_truth(Path(multi["wf"].iloc[0]))["host"]) == {"esnode1", "esnode2"}

    # Same numbers as one process: the same tokens for the same prompts in the same batches
    # (inference), the same loss for the same global batch (training). Single-node layouts are
    # held to the same single process by test_pytorch_parallel / test_training_parallel.
    ref = e[e["layout"] == (1, 1, 1)]
    ref_wf = Path(ref["wf"].iloc[0])
    # each reference job (inference, training) ran on one node, whichever Slurm picked
    assert acct_single_node(ref) and (ref.groupby("slurm_job_id")["host"].nunique() == 1).all()
    ref_tokens = generations(ref_wf, 1, 1, 1).loc[2]  # batch size 2: batches [0,1], [2,3]
    ref_loss = ref[ref["scenario"] == "training"].groupby("batch_size")["loss"].first()
    for (layout, scenario), ids in jobs.items():
        tp, pp, dp = layout
        got = multi[multi["slurm_job_id"] == ids[0]]
        if scenario == "training":
            at2 = got[got["batch_size"] == 2]["loss"]  # 2 per replica: global batch 2·dp
            loss = at2.iloc[0]
            assert at2.nunique() == 1, at2  # every rank agrees on the global-batch loss
            assert abs(loss - ref_loss[2 * dp]) <= LOSS_TOL, (layout, loss, ref_loss)
        else:
            tokens = generations(Path(got["wf"].iloc[0]), *layout).loc[2]
            by_prompt = tokens.groupby(level="prompt_index").first()
            ref_by_prompt = ref_tokens.groupby(level="prompt_index").first()
            common = by_prompt.index.intersection(ref_by_prompt.index)
            assert list(common) == [0, 1, 2, 3], (layout, list(by_prompt.index))
            assert by_prompt[common].equals(ref_by_prompt[common]), layout


def acct_single_node(ref: pd.DataFrame) -> bool:
    job = sacct(ref["slurm_job_id"].unique()).iloc[0]
    return job["state"] == "COMPLETED" and job["nodes"] == 1


# A stand-in for TensorRT-LLM's `trtllm-llmapi-launch` (not installable here): like the real one
# it is started by `srun --mpi=pmix` once per MPI rank, runs the command in rank 0 and lets the
# other ranks serve as the engine's workers (here they only record what they were given).
FAKE_LAUNCHER = """#!/bin/sh
rank=${PMIX_RANK:-${SLURM_PROCID:-?}}
{
  printf 'rank=%s\\nhost=%s\\n' "$rank" "$(hostname)"
  env | grep -E '^(PMIX_RANK|PMIX_NAMESPACE|SLURM_PROCID|SLURM_STEP_NUM_TASKS|'\\
'SLURM_STEP_NUM_NODES|CUDA_VISIBLE_DEVICES)=' | sort
  printf 'argv=%s\\n' "$*"
} > "$FAKE_TRTLLM_RECORDS/rank$rank.txt"
[ "$rank" = 0 ] && exec "$@"
exit 0
"""
TRT_INIT = """import fake_engines
_m = fake_engines.make_tensorrt_llm()["tensorrt_llm"]
LLM = _m.LLM
SamplingParams = _m.SamplingParams
"""


def python_env_with_fake_launcher(root: Path) -> Path:
    """A Python environment whose bin/ holds a fake trtllm-llmapi-launch: this venv's packages
    (symlinked lib/, same pyvenv.cfg), so build_argv finds the launcher next to the interpreter
    as it would in a real TensorRT-LLM environment."""
    import shutil
    import sys

    venv = Path(sys.prefix)
    env = root / "trtllm-env"
    (env / "bin").mkdir(parents=True)
    shutil.copy(venv / "pyvenv.cfg", env / "pyvenv.cfg")
    (env / "lib").symlink_to(venv / "lib")
    (env / "bin" / "python3").symlink_to(Path(sys.executable).resolve())
    launcher = env / "bin" / "trtllm-llmapi-launch"
    launcher.write_text(FAKE_LAUNCHER)
    launcher.chmod(0o755)
    return env


@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
def test_tensorrt_llm_mpi_mode_across_two_nodes(slurm_multinode, tmp_path):
    """`srun --mpi=pmix --nodes 2 --ntasks-per-node 1 trtllm-llmapi-launch python -m
    energysweep.run` on the real cluster: argv, task count, one rank per node, PMIx environment."""
    root = Path(__file__).resolve().parents[2]
    wf = workflow_copy(tmp_path)
    env_dir = python_env_with_fake_launcher(tmp_path)
    fakes, records = tmp_path / "fakes", tmp_path / "records"
    (fakes / "tensorrt_llm").mkdir(parents=True)
    (fakes / "tensorrt_llm" / "__init__.py").write_text(TRT_INIT)
    (fakes / "fake_engines.py").write_text((root / "tests" / "fake_engines.py").read_text())
    records.mkdir()
    cfg = write_config(
        wf,
        "trt.yaml",
        {
            **TINY,
            "backends": ["tensorrt-llm"],
            "scenarios": ["inference"],
            "parallel": {
                "tp": [2],
                "pp": [1],
                "dp": [1],
                "max_gpus_per_job": 2,
                "gpus_per_node": 1,
                "cpus_per_node": 4,
            },
            "engine": {"max_model_len": 96},
        },
    )
    env = test_env(slurm=True)
    env["PYTHONPATH"] = f"{fakes}:{env['PYTHONPATH']}"
    env["FAKE_TRTLLM_RECORDS"] = str(records)
    python = env_dir / "bin" / "python3"
    proc = subprocess.run(
        ["timeout", "-k", "20", str(RUN_TIMEOUT_S), str(python), "-m", "snakemake", *SLURM, cfg],
        cwd=wf,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S + 60,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]

    e = pd.read_parquet(wf / "results" / "energy.parquet")
    assert e["launch_mode"].eq("mpi").all() and e["status"].eq("ok").all()
    # Our code ran once (MPI rank 0, one launcher) for tp*pp = 2 engine workers.
    assert e[["launcher_processes", "gpu_workers"]].drop_duplicates().values.tolist() == [[1, 2]]
    assert set(e["host"]) == {"esnode1"} and e["pid"].nunique() == 1
    job = sacct(e["slurm_job_id"].unique()).iloc[0]
    assert job["state"] == "COMPLETED" and job["nodes"] == 2 and job["gpus"] == 2, job

    ranks = {}
    for f in sorted(records.glob("rank*.txt")):
        kv = dict(line.split("=", 1) for line in f.read_text().splitlines())
        ranks[kv["rank"]] = kv
    assert sorted(ranks) == ["0", "1"], ranks
    assert {r["host"] for r in ranks.values()} == {"esnode1", "esnode2"}  # one rank per node
    for rank, kv in ranks.items():
        # PMIx started the ranks (srun --mpi=pmix), two tasks over two nodes, one GPU each.
        assert kv["PMIX_RANK"] == kv["SLURM_PROCID"] == rank, kv
        assert kv["SLURM_STEP_NUM_TASKS"] == "2" and kv["SLURM_STEP_NUM_NODES"] == "2", kv
        assert kv["PMIX_NAMESPACE"].startswith(f"slurm.pmix.{e['slurm_job_id'].iloc[0]}."), kv
        assert len(kv["CUDA_VISIBLE_DEVICES"].split(",")) == 1, kv
        argv = kv["argv"].split()
        assert argv[0] == str(python) and argv[1:4] == ["-m", "energysweep.run", "--spec"], argv
    spec = json.loads((next((wf / "results" / "shards").rglob("job.json"))).read_text())
    argv = spec["launch_argv"]
    assert argv[:8] == [
        "srun",
        "--mpi=pmix",
        "--nodes",
        "2",
        "--ntasks-per-node",
        "1",
        "--kill-on-bad-exit=1",
        str(env_dir / "bin" / "trtllm-llmapi-launch"),
    ]


@pytest.mark.timeout(300)
def test_layout_over_node_cpus_is_refused_before_submission(slurm_multinode, tmp_path):
    """tp2·pp2·dp2 with 8 GPUs per node puts 8 ranks on one 4-CPU node: it would stay PENDING
    (Reason=PartitionConfig) for ever. Refused at load time, naming it; nothing reaches Slurm."""
    wf = workflow_copy(tmp_path)
    cfg = write_config(
        wf,
        "big.yaml",
        {
            **TINY,
            "scenarios": ["inference"],
            "parallel": {
                "tp": [1, 2],
                "pp": [2],
                "dp": [2],
                "max_gpus_per_job": 8,
                "gpus_per_node": 8,
                "cpus_per_node": slurm_multinode.cpus_per_node,
            },
        },
    )
    before = set(sacct_all())
    proc = subprocess.run(
        ["timeout", "-k", "20", "240", "snakemake", *SLURM, cfg],
        cwd=wf,
        env=test_env(slurm=True),
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "parallel.cpus_per_node" in out and "tp2-pp2-dp2" in out, out[-3000:]
    assert "8 CPUs" in out and "a node has 4" in out, out[-3000:]
    assert "tp1-pp2-dp2" not in out.split("parallel.cpus_per_node")[1].split("\n")[0]
    assert set(sacct_all()) == before  # no job was submitted
    assert not (wf / "results" / "shards").exists()


def sacct_all() -> list[str]:
    """Every job id the accounting database knows (this cluster's short history)."""
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-a", "-S", "2020-01-01", "-o", "JobID"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return out.split()


def job_mark(job_dir: Path) -> str | None:
    """The job's process mark (its job id, ENERGYSWEEP_JOB_MARK), from the launcher's spec file."""
    spec = job_dir / ".spec.json"
    try:
        return json.loads(spec.read_text())["job_id"]
    except (OSError, ValueError, KeyError):
        return None  # not written yet, or being written


def job_processes(mark: str) -> list[str]:
    """Live processes carrying the job's mark, on any node (the nodes share this pid namespace),
    as "pid cmdline". The mark is inherited by every process of the job (ranks, torchrun, srun's
    tasks on the other node, engine workers), whatever its command line says."""
    found = []
    for pid in procs.marked(mark):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        found.append(f"{pid} {cmd[:200]}")
    return found


def slurm_elapsed_s(elapsed: str) -> int:
    """sacct's Elapsed ([D-]HH:MM:SS) in seconds."""
    days, _, hms = elapsed.rpartition("-")
    h, m, sec = (int(x) for x in hms.split(":"))
    return int(days or 0) * 86400 + h * 3600 + m * 60 + sec


@pytest.mark.timeout(RUN_TIMEOUT_S + 300)
def test_rank_killed_on_second_node_fails_job_cleanly_and_rerun_completes(
    slurm_multinode, tmp_path
):
    """dp2 over 2 nodes; rank 1 (on the second node) SIGKILLs itself mid-measurement."""
    wf = workflow_copy(tmp_path)
    cfg = write_config(
        wf,
        "kill.yaml",
        {
            **TINY,
            "scenarios": ["inference"],
            "parallel": {
                "tp": [1],
                "pp": [1],
                "dp": [2],
                "max_gpus_per_job": 2,
                "gpus_per_node": 1,
            },
        },
    )
    env = test_env(slurm=True)
    env["ENERGYSWEEP_TEST_FAULT"] = json.dumps(
        {"rank": 1, "batch_size": 2, "action": "kill", "scenario": "inference"}
    )
    job_dir = (
        wf / "results" / "shards" / "model~tiny-llama" / "backend~pytorch"
        / "scenario~inference" / "tp~1" / "pp~1" / "dp~2"
    )  # fmt: skip
    proc = subprocess.Popen(
        ["timeout", "-k", "20", str(RUN_TIMEOUT_S), "snakemake", *SLURM, cfg],
        cwd=wf,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    # While the job runs, the leftover check below must see its processes on both nodes (so it
    # can fire): poll the processes carrying the job's mark. Each node is a UTS namespace.
    mark, seen_nodes = None, set()
    while proc.poll() is None:
        mark = mark or job_mark(job_dir)
        for pid in procs.marked(mark) if mark else ():
            with contextlib.suppress(OSError):
                seen_nodes.add(os.readlink(f"/proc/{pid}/ns/uts"))
        time.sleep(0.2)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0, out[-3000:]
    assert mark, "the launcher never wrote the job's spec (no mark to look for)"
    assert len(seen_nodes) >= 2, f"the job's processes were seen on {len(seen_nodes)} node(s)"
    # Nothing published: no shard, job table or job.json under a final name.
    assert not list(job_dir.glob("bs~*/rep~*.parquet")) and not (job_dir / "job.json").exists()
    assert not (job_dir / "shards.parquet").exists()
    log = next((wf / "logs" / "measure").rglob("dp~2.log")).read_text()
    assert "nodes: esnode1 esnode2" in log, log[-3000:]
    # The killed job: FAILED in Slurm, on both nodes, and none of its processes left anywhere.
    failed = subprocess.run(
        [
            "sacct",
            "-X",
            "-n",
            "-P",
            "-S",
            "now-30minutes",
            "-o",
            "JobID,Comment%100,State,NodeList,Elapsed",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    mine = [line.split("|") for line in failed.splitlines() if "inference_1_1_2" in line]
    assert mine and mine[-1][2] == "FAILED" and mine[-1][3] == "esnode[1-2]", failed
    # No hang: the killed rank fails the job at once, not after a collective timed out.
    assert slurm_elapsed_s(mine[-1][4]) < COLLECTIVE_TIMEOUT_S, mine[-1]
    deadline = time.monotonic() + 30
    while job_processes(mark) and time.monotonic() < deadline:
        time.sleep(1)
    assert not job_processes(mark), job_processes(mark)

    # The rerun without the fault completes and publishes every shard.
    rerun = subprocess.run(
        ["timeout", "-k", "20", str(RUN_TIMEOUT_S), "snakemake", *SLURM, cfg],
        cwd=wf,
        env=test_env(slurm=True),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S + 60,
    )
    assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-5000:]
    e = pd.read_parquet(wf / "results" / "energy.parquet")
    assert e["status"].eq("ok").all() and set(e["host"]) == {"esnode1", "esnode2"}
    assert e["slurm_job_id"].nunique() == 1 and e["slurm_job_id"].iloc[0] != mine[-1][0]


@pytest.mark.timeout(RUN_TIMEOUT_S + 300)
def test_node_lost_mid_sweep_job_reruns_on_healthy_nodes(slurm_three_nodes, tmp_path):
    """3 nodes; a 2-node job starts, one of its nodes goes DOWN (as a node failure looks to the
    controller) and stays drained: the job is retried on the two healthy nodes and the sweep
    completes."""
    wf = workflow_copy(tmp_path)
    cfg = write_config(
        wf,
        "down.yaml",
        {
            **TINY,
            "scenarios": ["inference"],
            "parallel": {
                "tp": [1],
                "pp": [1],
                "dp": [2],
                "max_gpus_per_job": 2,
                "gpus_per_node": 1,
            },
        },
    )
    since = time.strftime("%Y-%m-%dT%H:%M:%S")
    sm = start(wf, SLURM, cfg)
    lost = None
    try:
        deadline = time.monotonic() + 300
        while lost is None and time.monotonic() < deadline and sm.poll() is None:
            out = subprocess.run(
                ["squeue", "-h", "-t", "RUNNING", "-o", "%i|%k|%N"],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout
            for line in out.splitlines():
                job_id, comment, nodelist = line.split("|")
                if "rule_measure" in comment:
                    hosts = subprocess.run(
                        ["scontrol", "show", "hostnames", nodelist],
                        capture_output=True,
                        text=True,
                        timeout=30,
                    ).stdout
                    lost = (job_id, hosts.split()[-1])
            time.sleep(0.5)
        assert lost, "the measure job never ran"
        # Let its ranks start, then take its second node away.
        time.sleep(5)
        # DOWN kills the job (NODE_FAIL); DRAIN keeps the node out afterwards (the cluster's
        # ReturnToService=2 would otherwise take it back as soon as its slurmd re-registers).
        for state in ("down", "drain"):
            subprocess.run(
                [
                    "scontrol",
                    "update",
                    f"nodename={lost[1]}",
                    f"state={state}",
                    "reason=energysweep test: node lost",
                ],
                check=True,
                timeout=30,
            )
        out = finish(sm)
    finally:
        if sm.poll() is None:
            sm.kill()
        if lost:
            subprocess.run(
                ["scontrol", "update", f"nodename={lost[1]}", "state=resume"],
                timeout=30,
                check=False,
            )
    e = pd.read_parquet(wf / "results" / "energy.parquet")
    assert e["status"].eq("ok").all(), out[-3000:]
    hosts = set(e["host"])
    assert len(hosts) == 2 and lost[1] not in hosts, (hosts, lost)
    acct = subprocess.run(
        ["sacct", "-X", "-D", "-n", "-P", "-S", since, "-o", "JobID,Comment%100,State"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    records = [line.split("|") for line in acct.splitlines() if "rule_measure" in line]
    # Slurm requeued the batch job (same id, profile slurm-requeue) after the node failed; its
    # last run completed on the healthy nodes.
    assert {r[0] for r in records} == {lost[0]}, acct
    assert records[-1][2] == "COMPLETED" and len(records) >= 2, acct
    assert any(r[2].split()[0] in ("NODE_FAIL", "REQUEUED") for r in records[:-1]), acct
