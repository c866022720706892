"""Resources per node, not per job (energysweep.job.placement.Placement.node_request), and the
refusal of layouts whose per-node request cannot fit (energysweep.sweep.config.check_node_fit)."""

from __future__ import annotations

import pytest

from energysweep.job.layout import ParallelLayout
from energysweep.job.placement import MEM_MB_PER_RANK, Placement
from energysweep.job.spec import JobKey
from energysweep.sweep.config import ConfigError, check_node_fit
from energysweep.sweep.grid import Grid


def test_single_node_job_asks_one_task_for_all_its_ranks():
    req = Placement(ParallelLayout(2, 1, 2), "pytorch", gpus_per_node=8).node_request
    assert (req.nodes, req.ranks_per_node, req.tasks_per_node) == (1, 4, 1)
    assert req.cpus_per_task == req.cpus_per_node == 4
    assert req.mem_mb_per_node == 4 * MEM_MB_PER_RANK


def test_multi_node_torchrun_asks_each_node_for_its_own_ranks():
    # The bug this replaces: threads = world size (16) became --cpus-per-task on every node.
    req = Placement(ParallelLayout(4, 2, 2), "pytorch", gpus_per_node=8).node_request
    assert (req.nodes, req.ranks_per_node, req.tasks_per_node) == (2, 8, 1)
    assert req.cpus_per_task == 8 and req.gpus_per_node == 8
    assert req.mem_mb_per_node == 8 * MEM_MB_PER_RANK


def test_mpi_mode_asks_one_cpu_per_mpi_rank():
    req = Placement(ParallelLayout(8, 2, 1), "tensorrt-llm", gpus_per_node=8).node_request
    assert (req.nodes, req.tasks_per_node, req.cpus_per_node, req.cpus_per_task) == (2, 8, 8, 1)


def _config(**parallel):
    return {
        "parallel": {"gpus_per_node": 8, "cpus_per_node": None, "mem_mb_per_node": None, **parallel}
    }


def _grid(*layouts):
    return Grid(jobs=[JobKey("m", "pytorch", "inference", *lay) for lay in layouts])


def test_layout_over_node_cpus_is_refused_naming_layout_and_limit():
    with pytest.raises(ConfigError) as err:
        check_node_fit(_config(cpus_per_node=4), _grid((1, 1, 1), (2, 2, 2)))
    msg = str(err.value)
    assert "parallel.cpus_per_node" in msg and "tp2-pp2-dp2" in msg
    assert "8 CPUs" in msg and "a node has 4" in msg
    assert "tp1-pp1-dp1" not in msg  # only the layouts that cannot fit


def test_spreading_over_more_nodes_fits():
    # The same 8 ranks on nodes of 2 GPUs: 4 nodes of 2 ranks each.
    check_node_fit(_config(gpus_per_node=2, cpus_per_node=4), _grid((2, 2, 2)))


def test_memory_limit_is_checked_and_unset_limits_are_not():
    with pytest.raises(ConfigError, match=r"parallel.mem_mb_per_node.*tp2-pp1-dp2"):
        check_node_fit(_config(mem_mb_per_node=3 * MEM_MB_PER_RANK), _grid((2, 1, 2)))
    check_node_fit(_config(), _grid((16, 4, 4)))


@pytest.mark.parametrize("backend,layout,gpn,nodes,tasks", [
    ("pytorch", ParallelLayout(2, 1, 2), 8, 1, None),
    ("pytorch", ParallelLayout(4, 2, 2), 8, 2, 2),
    ("tensorrt-llm", ParallelLayout(8, 2, 1), 8, 2, 16),
    ("vllm", ParallelLayout(2), None, 1, None),
])  # fmt: skip
def test_placement_nodes_and_slurm_tasks(backend, layout, gpn, nodes, tasks):
    placement = Placement(layout, backend, gpn)
    assert placement.nodes == nodes and placement.multi_node == (nodes > 1)
    assert placement.slurm_tasks == tasks
    assert placement.ranks_per_node * nodes == layout.world_size


def test_placement_refuses_an_unknown_backend():
    with pytest.raises(ValueError, match="unknown backend 'jax'"):
        Placement(ParallelLayout(), "jax")
