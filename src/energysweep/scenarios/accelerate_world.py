"""Training through HuggingFace Accelerate, checked: Accelerate must see exactly the DP world.

The ``Accelerator`` is created inside :func:`make_accelerator` (never at import), with ``cpu=True``
on CPU: without it Accelerate does not join the torchrun world and every rank silently trains alone
(``DistributedType.NO``). :func:`audit_accelerator` gathers what Accelerate sees on every rank and
fails the job (:class:`energysweep.dist.LayoutMismatch`) unless it is exactly the layout's DP world.
"""

from __future__ import annotations

import torch

from energysweep import dist
from energysweep.job.layout import ParallelLayout


def accelerate_view(accelerator, rank: int) -> dict:
    """What Accelerate believes about this process (gathered for :func:`check_accelerate_world`)."""
    dtype = accelerator.distributed_type
    return {
        "rank": rank,
        "num_processes": int(accelerator.num_processes),
        "process_index": int(accelerator.process_index),
        "distributed_type": str(getattr(dtype, "value", dtype)),
        "device": str(accelerator.device),
    }


def same_device(a: str, b: str) -> bool:
    """Same device type, and same index for accelerators (Accelerate names CPU ``cpu:0``)."""
    da, db = torch.device(a), torch.device(b)
    return da.type == db.type and (da.type == "cpu" or (da.index or 0) == (db.index or 0))


def check_accelerate_world(views: list[dict], layout: ParallelLayout, devices: list[str]) -> None:
    """Fail unless Accelerate sees exactly the layout's data-parallel world on every rank.

    Args:
        views: :func:`accelerate_view` of every rank, in rank order.
        layout: the job's layout (tp = pp = 1 on this path).
        devices: the torch device each rank computes on, in rank order.

    Raises:
        LayoutMismatch: naming the expected and observed world sizes (the CPU-without-``cpu=True``
            mistake reads "expects world size 2 ... observed world size 1 (NO)").
    """
    expected = layout.dp
    observed = sorted({v["num_processes"] for v in views})
    types = sorted({v["distributed_type"] for v in views})
    problems = []
    if observed != [expected]:
        problems.append(
            f"layout {layout} expects Accelerate world size {expected} (one process per DP "
            f"replica) but Accelerate observed world size {'/'.join(map(str, observed))} "
            f"(distributed_type {'/'.join(types)}) on ranks {[v['rank'] for v in views]}"
        )
    elif expected > 1 and "NO" in types:
        problems.append(f"layout {layout} has dp={expected} but Accelerate reports NO distribution")
    indices = [v["process_index"] for v in views]
    if not problems and indices != [v["rank"] for v in views]:
        problems.append(f"Accelerate process indices {indices} differ from the torchrun ranks")
    bad_dev = [
        (v["rank"], v["device"], d)
        for v, d in zip(views, devices, strict=True)
        if not same_device(v["device"], d)
    ]
    if bad_dev:
        problems.append(
            "Accelerate placed ranks on other devices than the job chose (rank, accelerate, job): "
            f"{bad_dev}"
        )
    if problems:
        raise dist.LayoutMismatch(
            "; ".join(problems)
            + ". On CPU, create Accelerator(cpu=True) (or set ACCELERATE_USE_CPU=1): otherwise "
            "every rank trains the whole batch alone. Refusing to train."
        )


def make_accelerator(device: str):
    """The job's Accelerator, created here and not at import (it starts Accelerate's state).

    ``cpu=True`` on CPU is what makes Accelerate join the torchrun world over gloo; without it
    every rank reports ``DistributedType.NO`` and trains alone (:func:`audit_accelerator` fails
    such a job).
    """
    from accelerate import Accelerator

    return Accelerator(cpu=device == "cpu")


def audit_accelerator(accelerator, ctx: dist.RankContext) -> dict:
    """Gather Accelerate's view from every rank and fail unless it is the layout's world.

    Returns this rank's view. Raises :class:`energysweep.dist.LayoutMismatch` on every rank alike
    (the views are all-gathered), so no rank is left waiting in a collective.
    """
    view = accelerate_view(accelerator, ctx.rank)
    gathered = dist.gather((view, ctx.device))
    check_accelerate_world([v for v, _ in gathered], ctx.layout, [d for _, d in gathered])
    return view
