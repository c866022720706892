"""gpu_shared and edge_read_slow: who else computed on a measured GPU, and slow edge reads.

The rank's process probe (energysweep.measure.gpu_processes) over a fake NVML process list, the
merge's overlap finder (energysweep.aggregate.overlap), and the verdict's reasons
(energysweep.validity.shared) over shard rows.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
from jobspec import validated_config

from energysweep.aggregate import overlap, summarize, windows
from energysweep.measure.gpu_processes import ProcessProbe
from energysweep.tables import shards
from energysweep.validity import recheck
from energysweep.validity import verdict as validity

import fake_pynvml
from tests_rows import row

LOOSE = {
    "counter_period_s": 0.1,
    "min_counter_periods": 1,
    "min_iterations": 1,
    "min_steady_state_s": 0.1,
    "min_ok_repetitions": 1,
    "max_ci_half_width": 10,
    "require_timeline": False,
    "min_batch_fill": 0,
}


def test_probe_tells_the_jobs_processes_from_a_foreign_one(fake_nvml):
    mod = fake_nvml(fake_pynvml.h100s(2))
    gpu = mod.fake_gpus[1]
    # A child of this process (the job's tree) and a process that is not the job's: a sibling
    # started by another parent (here: this test's own parent stands for "another job").
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        probe = ProcessProbe([gpu.uuid], own=lambda p: p in (os.getpid(), child.pid))
        gpu.compute_pids = [os.getpid(), child.pid]
        before = probe.read()
        after = probe.read()
        assert probe.columns(gpu.uuid, before, after) == {
            "gpu_processes_status": "ok",
            "gpu_processes_foreign": None,
        }
        foreign = os.getppid()
        gpu.compute_pids = [os.getpid(), foreign]
        cols = probe.columns(gpu.uuid, before, probe.read())
        assert cols["gpu_processes_status"] == "shared"
        assert cols["gpu_processes_foreign"] == f"pid {foreign} at end"
        # The default rule: this process's tree is the job's, its parent is not.
        tree = ProcessProbe([gpu.uuid])
        gpu.compute_pids = [child.pid, foreign]
        lists = tree.read()
        assert tree.columns(gpu.uuid, lists, lists)["gpu_processes_foreign"] == (
            f"pid {foreign} at start+end"
        )
        # A GPU whose process list cannot be read says why (not ok, not shared).
        gpu.compute_pids = None
        cols = tree.columns(gpu.uuid, tree.read(), tree.read())
        assert cols["gpu_processes_status"].startswith("unavailable (")
        probe.close()
        tree.close()
    finally:
        child.kill()
        child.wait()


def _frame(rows):
    return shards.to_table(rows).to_pandas()


def _verdict(frame):
    summary = summarize(windows(frame))
    thresholds = validity.Thresholds.from_config(validated_config(validity=LOOSE)["validity"])
    table = recheck.recheck(frame, pd.DataFrame(columns=["job_id", "gpu_uuid", "time_ns"]), None, 0)
    return validity.annotate(summary, frame, table, thresholds, overlap.shared_windows(frame))


def test_merge_flags_windows_of_two_jobs_on_one_gpu_at_once():
    a = [row(job_id="a", repetition=k, window_start_ns=10**9 * (1 + 3 * k),
             window_end_ns=10**9 * (3 + 3 * k), gpu_uuid="GPU-a") for k in range(3)]  # fmt: skip
    # Job b (batch 8) on the same GPU: its window overlaps a's repetition 1 only.
    b = [row(job_id="b", batch_size=8, global_batch_size=8, requests=16, gpu_uuid="GPU-a",
             window_start_ns=int(5.5e9), window_end_ns=int(6.5e9))]  # fmt: skip
    # Job c on another GPU at the same time: no overlap.
    c = [row(job_id="c", batch_size=16, global_batch_size=16, requests=32, gpu_uuid="GPU-b",
             window_start_ns=int(5.5e9), window_end_ns=int(6.5e9))]  # fmt: skip
    frame = _frame(a + b + c)
    found = overlap.shared_windows(frame)
    assert sorted(zip(found["job_id"], found["repetition"], found["other_jobs"], strict=True)) == [
        ("a", 1, "b"),
        ("b", 0, "a"),
    ]
    s = _verdict(frame).set_index("batch_size")
    assert "gpu_shared" in s.at[4, "invalid_reasons"] and s.at[4, "gpu_shared_windows"] == 1
    assert "job(s) b in the same window" in s.at[4, "gpu_shared_detail"]
    assert "gpu_shared" in s.at[8, "invalid_reasons"]
    assert "gpu_shared" not in s.at[16, "invalid_reasons"] and s.at[16, "gpu_shared_windows"] == 0
    assert len(frame) == 5  # nothing dropped


def test_verdict_gpu_shared_from_the_process_list_and_edge_read_slow():
    frame = _frame(
        [
            row(repetition=0, gpu_processes_status="shared",
                gpu_processes_foreign="pid 4242 at start+end", gpu_edge_read_max_ms=3.0),
            row(repetition=1, gpu_edge_read_max_ms=185.0),
        ]
    )  # fmt: skip
    s = _verdict(frame)
    reasons = s["invalid_reasons"].iloc[0].split(";")
    assert "gpu_shared" in reasons and "edge_read_slow" in reasons
    assert s["gpu_shared_detail"].iloc[0] == "GPU-a: pid 4242 at start+end"
    assert s["edge_read_max_ms"].iloc[0] == 185.0
    # Every window of the point counts, not only the headline phase's: a slow edge read or a
    # foreign process in a prefill window (decode = generate - prefill; stages.csv) too.
    slow_prefill = row(phase="prefill", output_tokens=4, gpu_edge_read_max_ms=253.0)
    s = _verdict(_frame([row(gpu_edge_read_max_ms=3.0), slow_prefill]))
    assert "edge_read_slow" in s["invalid_reasons"].iloc[0].split(";")
    assert s["edge_read_max_ms"].iloc[0] == 253.0
    s = _verdict(_frame([row(gpu_edge_read_max_ms=3.0),
                         row(phase="prefill", output_tokens=4, gpu_processes_status="shared",
                             gpu_processes_foreign="pid 7 at start")]))  # fmt: skip
    assert "gpu_shared" in s["invalid_reasons"].iloc[0].split(";")
    assert s["gpu_shared_windows"].iloc[0] == 1
    # Healthy: neither reason, and both checked.
    s = _verdict(_frame([row(gpu_edge_read_max_ms=3.0)]))
    assert not {"gpu_shared", "edge_read_slow"} & set(s["invalid_reasons"].iloc[0].split(";"))
    assert "gpu_shared" not in s["validity_unchecked"].iloc[0]
    # A process list that could not be read: unchecked, with the reason.
    s = _verdict(_frame([row(gpu_processes_status="unavailable (NVML: Not Supported)")]))
    assert "gpu_shared" in s["validity_unchecked"].iloc[0]
    assert s["gpu_process_check"].iloc[0] == "unavailable (NVML: Not Supported)"
