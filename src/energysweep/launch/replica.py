"""``python -m energysweep.launch.replica``: one DP replica of a ``direct`` job under torchrun."""

from __future__ import annotations

import os
import sys

from energysweep.launch.argv import replica_visible_devices


def replica_main(argv: list[str] | None = None) -> None:
    """``python -m energysweep.launch.replica --replica-gpus N --spec F`` (one DP replica).

    Restricts this process to its replica's GPUs, then replaces itself with energysweep.run (same
    pid, so torchrun still supervises it). CUDA_VISIBLE_DEVICES only works if set before CUDA
    initialises, hence a separate step before the run imports anything.
    """
    import argparse

    parser = argparse.ArgumentParser(description=(replica_main.__doc__ or "").splitlines()[0])
    parser.add_argument("--replica-gpus", type=int, required=True, help="GPUs per replica")
    parser.add_argument("--spec", required=True, help="job spec JSON")
    args = parser.parse_args(argv)
    os.environ["CUDA_VISIBLE_DEVICES"] = replica_visible_devices(
        os.environ.get("CUDA_VISIBLE_DEVICES"),
        int(os.environ.get("LOCAL_RANK", 0)),
        args.replica_gpus,
        int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
    )
    os.execv(sys.executable, [sys.executable, "-m", "energysweep.run", "--spec", args.spec])


if __name__ == "__main__":
    replica_main()
