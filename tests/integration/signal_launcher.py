"""A measure job's launcher in a process of its own, for a test that signals it.

It runs what ``scripts/measure.py`` runs (``energysweep.launch.job.run_job``) for one job on the
emulated GPU node: one rank, inference, the tiny model, a power limit of 350 W and clocks
``low``; the test sets ``ENERGYSWEEP_TEST_FAULT`` so the rank hangs in its point, with the
setting applied, until the launcher is signalled.

Around the job's GPU guard (``energysweep.launch.gpu_guard.applied``, which it calls unchanged)
it hands over to the test through files in HANDSHAKE, so that the test, in its own process,
is the one that sets and reads the node:

- ``state``: the emulated node's state directory (what the guard writes the GPUs through);
- then it waits for ``site-set``: the test gave the GPUs the site's own setting;
- ``restored``: the guard's block is over (it put back what it found, or did not);
- then it waits for ``read``: the test has read the node, before the job's staging directory
  (the node's state with it) is removed.

Usage: python signal_launcher.py MODEL_DIR OUT_DIR HANDSHAKE_DIR
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

from jobspec import job_spec, limits

from energysweep.hw import emulated
from energysweep.job.layout import ParallelLayout
from energysweep.job.spec import JobDir
from energysweep.launch import gpu_guard
from energysweep.launch.job import run_job

WAIT_S = 120
EMULATED = {"profile": "h100-sxm", "allow_privileged": True}


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {WAIT_S} s")
        time.sleep(0.05)


def main(model: str, out: str, handshake: str) -> int:
    hs = Path(handshake)
    guard = gpu_guard.applied

    @contextlib.contextmanager
    def handed_over(request, directory, gpus, env, log):
        (hs / "state").write_text(env[emulated.ENV])
        wait_for(hs / "site-set")
        try:
            with guard(request, directory, gpus, env, log) as record:
                yield record
        finally:
            (hs / "restored").touch()
            wait_for(hs / "read")

    gpu_guard.applied = handed_over
    spec = job_spec(
        ParallelLayout(),
        "inference",
        power_limit_w="350",
        gpu_clock="low",
        gpu={"power_limit_w": [350], "clock": ["low"]},
        parallel={"gpus_per_node": 8},
        measurement={"device": "emulated", "emulated": EMULATED},
    )
    with open(Path(out).with_suffix(".log"), "w") as log:
        run_job(spec, JobDir(out), model, limits(), log, cpus=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
