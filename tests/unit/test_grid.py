import pytest

from energysweep.job.layout import ModelDims, ParallelLayout, split_contiguous
from energysweep.sweep.grid import expand_grid

TINY = ModelDims(4, 2, 4, 128, 64)


def test_world_and_coords_tp_innermost():
    lay = ParallelLayout(tp=2, pp=2, dp=2)
    assert lay.world_size == 8
    c = lay.coords(5)  # (dp 1, pp 0, tp 1)
    assert (c.dp_rank, c.pp_rank, c.tp_rank) == (1, 0, 1)
    assert lay.tp_group(5) == [4, 5]
    assert lay.pp_group(5) == [5, 7]
    assert lay.writer_ranks() == [0, 4]
    assert [lay.coords(r).is_writer for r in range(8)] == [1, 0, 0, 0, 1, 0, 0, 0]


def test_every_rank_once():
    lay = ParallelLayout(tp=2, pp=3, dp=2)
    seen = {(c.dp_rank, c.pp_rank, c.tp_rank) for c in map(lay.coords, range(lay.world_size))}
    assert len(seen) == 12
    with pytest.raises(ValueError, match="outside world size"):
        lay.coords(12)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_degree(bad):
    with pytest.raises(ValueError, match="positive integer"):
        ParallelLayout(tp=bad)


def test_split_contiguous_matches_accelerate():
    assert [len(split_contiguous(33, 4, i)) for i in range(4)] == [9, 8, 8, 8]
    assert [list(split_contiguous(3, 2, i)) for i in range(2)] == [[0, 1], [2]]
    assert list(split_contiguous(1, 2, 1)) == []


def test_stage_layers_contiguous():
    lay = ParallelLayout(pp=3)
    assert [list(lay.stage_layers(7, s)) for s in range(3)] == [[0, 1, 2], [3, 4], [5, 6]]


def test_unrunnable_reasons():
    assert ParallelLayout(tp=2).unrunnable_reasons(TINY) == []
    reasons = ParallelLayout(tp=3).unrunnable_reasons(TINY)
    assert any("num_attention_heads=4" in r for r in reasons)
    assert ParallelLayout(tp=4).unrunnable_reasons(TINY) == [
        "tp=4 does not divide num_key_value_heads=2"
    ]
    assert ParallelLayout(pp=8).unrunnable_reasons(TINY) == ["pp=8 exceeds num_hidden_layers=4"]


def test_expand_grid_skips_with_reasons():
    grid = expand_grid({"tiny": TINY}, ["pytorch"], ["inference"], [1, 2, 3], [1, 8], [1, 2], 4)
    runnable = {(j.layout.tp, j.layout.pp, j.layout.dp) for j in grid.jobs}
    assert runnable == {(1, 1, 1), (1, 1, 2), (2, 1, 1), (2, 1, 2)}
    reasons = {(s["tp"], s["pp"], s["dp"]): s["reason"] for s in grid.skipped}
    assert "num_attention_heads" in reasons[("3", "1", "1")]
    assert "exceeds num_hidden_layers" in reasons[("1", "8", "1")]
    assert "max_gpus_per_job=4" in reasons[("1", "8", "1")]
    assert len(grid.jobs) + len(grid.skipped) == 3 * 2 * 2


def test_nodes():
    assert ParallelLayout(tp=8, dp=4).nodes(16) == 2
    assert ParallelLayout(tp=2).nodes(16) == 1
