"""Launch modes as data: which processes each backend's job consists of, and the audit of them."""

from __future__ import annotations

import inspect

import pytest
from jobspec import job_spec

from energysweep import dist
from energysweep.job.backends import BACKENDS, LAUNCH_MODES
from energysweep.job.layout import ParallelLayout, split_contiguous
from energysweep.job.placement import Placement
from energysweep.launch import ports
from energysweep.sweep.grid import expand_grid


def test_every_backend_names_known_launch_modes():
    for name, caps in BACKENDS.items():
        assert caps.launch in LAUNCH_MODES, name
        assert caps.launch_multi_node in LAUNCH_MODES, name


@pytest.mark.parametrize(
    "backend,layout,gpus_per_node,mode,procs",
    [
        ("pytorch", ParallelLayout(tp=4), 16, "torchrun", (4, 4)),
        ("vllm", ParallelLayout(tp=4), 16, "torchrun", (4, 4)),
        ("vllm", ParallelLayout(tp=2, dp=2), 16, "torchrun", (4, 4)),
        ("tensorrt-llm", ParallelLayout(tp=4), 16, "direct", (1, 4)),
        ("tensorrt-llm", ParallelLayout(tp=2, pp=2, dp=2), 16, "direct", (2, 8)),
        ("tensorrt-llm", ParallelLayout(tp=4, pp=2), 4, "mpi", (1, 8)),
        ("pytorch", ParallelLayout(tp=8, dp=4), 16, "torchrun", (32, 32)),
    ],
)
def test_modes_and_expected_processes(backend, layout, gpus_per_node, mode, procs):
    assert Placement(layout, backend, gpus_per_node).launch_mode == mode
    assert Placement(layout, backend, gpus_per_node).processes == procs
    launchers, workers = procs
    # One GPU worker per GPU in every mode.
    assert workers == layout.world_size
    placement = Placement(layout, backend, gpus_per_node)
    assert len({placement.coords(r) for r in range(launchers)}) == launchers


def test_grid_skips_what_a_backend_cannot_launch():
    grid = expand_grid(
        {"m": None},
        ["pytorch", "vllm", "tensorrt-llm"],
        ["inference"],
        tp=[8],
        pp=[2],
        dp=[2],
        max_gpus_per_job=32,
        gpus_per_node=16,
    )
    assert sorted(j.backend for j in grid.jobs) == ["pytorch", "vllm"]
    (skip,) = grid.skipped
    assert skip["backend"] == "tensorrt-llm" and "mpi" in skip["reason"]
    # Without gpus_per_node (callers that do not know the nodes) nothing is skipped for launch.
    assert (
        len(expand_grid({"m": None}, ["tensorrt-llm"], ["inference"], [8], [2], [2], 32).jobs) == 1
    )


# ----------------------------------------------------------------------- the process audit
def audit(rank, pid, dp_rank, pp_rank=0, tp_rank=0):
    return {
        "rank": rank,
        "host": "n1",
        "pid": pid,
        "dp_rank": dp_rank,
        "pp_rank": pp_rank,
        "tp_rank": tp_rank,
    }


def test_audit_direct_counts_one_process_per_replica():
    placement = Placement(ParallelLayout(tp=4, dp=2), "tensorrt-llm", 8)
    dist.check_world([audit(0, 10, 0), audit(1, 11, 1)], placement)
    with pytest.raises(
        dist.LayoutMismatch, match=r"expects 2 distinct .*8 GPU workers.*observed 1"
    ):
        dist.check_world([audit(0, 10, 0)], placement)


def test_audit_torchrun_still_counts_every_rank():
    placement = Placement(ParallelLayout(tp=2), "vllm", 8)
    with pytest.raises(dist.LayoutMismatch, match="expects 2 distinct"):
        dist.check_world([audit(0, 10, 0)], placement)
    dist.check_world([audit(0, 10, 0), audit(1, 11, 0, tp_rank=1)], placement)


def test_init_names_expected_and_observed_world(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(dist.LayoutMismatch, match=r"expects world size 4 .*started world size 1"):
        dist.init(Placement(ParallelLayout(tp=4), "vllm", 8), "cpu", timeout_s=60)
    # A TensorRT-LLM TP=4 replica is one process: world 1 is right, no process group needed.
    trt = Placement(ParallelLayout(tp=4), "tensorrt-llm", 8)
    assert dist.init(trt, "cpu", timeout_s=60) == (0, 0, 1)


def test_context_of_a_replica_process(monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    job = job_spec(layout=ParallelLayout(tp=8), backend="tensorrt-llm")
    ctx = dist.make_context(
        job.placement, "cuda:0", model_dir="/m", dtype=job.dtype, seed=job.seed,
        max_input_tokens=job.workload.max_input_tokens,
    )  # fmt: skip
    assert (ctx.coords.dp_rank, ctx.coords.is_writer, ctx.mesh) == (0, True, None)


def test_dist_functions_need_the_placement():
    """Nothing in dist guesses "torchrun on one node" when the placement is forgotten."""
    for fn in (dist.init, dist.make_context, dist.check_world):
        params = inspect.signature(fn).parameters
        required = [p for p in params.values() if p.default is inspect.Parameter.empty]
        assert "placement" in params and params["placement"] in required, fn.__name__
        assert "backend" not in params and "gpus_per_node" not in params, fn.__name__


# ---------------------------------------------------------------- DP split and port assignment
def test_dp_split_is_contiguous_and_order_preserving():
    parts = [list(split_contiguous(33, 4, r)) for r in range(4)]
    assert [len(p) for p in parts] == [9, 8, 8, 8]
    assert [i for p in parts for i in p] == list(range(33))  # gathered in rank order
    # Fewer items than replicas: the last rank gets none and still takes part (empty share).
    assert [len(split_contiguous(3, 4, r)) for r in range(4)] == [1, 1, 1, 0]


def test_ports_per_job_never_collide_between_kinds():
    job = 987654
    assert ports.rendezvous_port(job) != ports.vllm_port(job)
    assert ports.vllm_port(job) < ports.PORT_BASE <= ports.rendezvous_port(job)
    assert ports.vllm_port(job) != ports.vllm_port(job + 1)


def test_mixed_backends_make_one_summary_table():
    """The same grid point on three backends: one shard schema, one summary, a backend column."""
    import pandas as pd

    from energysweep import aggregate
    from energysweep.tables import shards

    from tests_rows import row

    rows = []
    for i, (backend, mode, procs) in enumerate(
        [("pytorch", "torchrun", 2), ("vllm", "torchrun", 2), ("tensorrt-llm", "direct", 1)]
    ):
        for r in range(2):  # two GPUs; the direct launcher reports both from one process
            rows.append(
                row(
                    job_id=f"j{i}",
                    backend=backend,
                    launch_mode=mode,
                    tp=2,
                    world_size=2,
                    rank=min(r, procs - 1),
                    pid=100 * i + min(r, procs - 1),
                    tp_rank=min(r, procs - 1),
                    is_writer=r == 0,
                    gpu_uuid=f"GPU-{r}",
                    gpu_index=r,
                )
            )
    table = shards.to_table(rows)  # one schema for every backend
    summary = aggregate.summarize(aggregate.windows(table.to_pandas()))
    assert isinstance(summary, pd.DataFrame)
    assert sorted(summary["backend"]) == ["pytorch", "tensorrt-llm", "vllm"]
    assert summary["energy_per_output_token_j"].notna().all()
    # Same GPUs, same energy, same tokens: the same figure whatever the process structure.
    assert summary["energy_per_output_token_j"].nunique() == 1
