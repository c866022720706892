"""The nodes of the Slurm job a measure job runs in, found from its job id.

A multi-node rule sets ``mpi``, so the Snakemake jobstep plugin runs the rule's code in the batch
script after removing every ``SLURM_*`` variable except the job id and a few others:
``SLURM_JOB_NODELIST`` and ``SLURM_NNODES`` are gone. The node list is still known to the
controller: ``squeue -h -j ID -o %N`` (or ``scontrol show job ID``), expanded by
``scontrol show hostnames``. ``SLURM_JOB_NODELIST`` is used first where it survives.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Mapping

QUERY_TIMEOUT_S = 30
# `NodeList=esnode[1-2]` in `scontrol show job`; not ReqNodeList/ExcNodeList (no word start).
_NODELIST = re.compile(r"(?:^|\s)NodeList=(\S+)")
_NO_NODES = {"", "(null)", "None assigned"}


class SlurmNodesError(RuntimeError):
    """The job's nodes could not be found; the message lists every source that was tried."""


Runner = Callable[[list[str]], subprocess.CompletedProcess]


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S, check=False
    )


def parse_show_job(text: str) -> str | None:
    """The ``NodeList=`` of ``scontrol show job`` output; None while no node is assigned."""
    match = _NODELIST.search(text)
    if not match or match.group(1) in _NO_NODES:
        return None
    return match.group(1)


def _nodelist_from(
    argv: list[str], run: Runner, tried: list[str], parse: Callable[[str], str | None]
) -> str | None:
    try:
        proc = run(argv)
    except (OSError, subprocess.TimeoutExpired) as exc:
        tried.append(f"`{' '.join(argv)}` failed: {type(exc).__name__}: {exc}")
        return None
    out = (proc.stdout or "").strip()
    if proc.returncode != 0:
        err = (proc.stderr or "").strip().splitlines()
        tried.append(f"`{' '.join(argv)}` exited {proc.returncode}: {err[-1] if err else ''}")
        return None
    nodelist = parse(out)
    if not nodelist:
        tried.append(f"`{' '.join(argv)}` printed no node list: {out[:200]!r}")
    return nodelist


def expand_hostnames(nodelist: str, run: Runner = _run) -> list[str]:
    """``scontrol show hostnames NODELIST``: ``esnode[1-2]`` -> ``["esnode1", "esnode2"]``."""
    argv = ["scontrol", "show", "hostnames", nodelist]
    try:
        proc = run(argv)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmNodesError(f"`{' '.join(argv)}` failed: {type(exc).__name__}: {exc}") from exc
    hosts = (proc.stdout or "").split()
    if proc.returncode != 0 or not hosts:
        raise SlurmNodesError(
            f"`{' '.join(argv)}` exited {proc.returncode} with no host names: "
            f"{(proc.stderr or '').strip()[-300:]}"
        )
    return hosts


def job_nodes(env: Mapping[str, str] | None = None, run: Runner = _run) -> list[str]:
    """Host names of this Slurm job's nodes, in Slurm's order (the first is the head node).

    Looks at ``SLURM_JOB_NODELIST``, then asks the controller by ``SLURM_JOB_ID``
    (``squeue``, then ``scontrol show job``). Raises :class:`SlurmNodesError` naming every
    source it looked at when none gives a node list.
    """
    env = os.environ if env is None else env
    tried: list[str] = []
    nodelist = env.get("SLURM_JOB_NODELIST") or None
    if nodelist is None:
        tried.append("SLURM_JOB_NODELIST is not set (the jobstep plugin removes it for mpi rules)")
        job_id = env.get("SLURM_JOB_ID")
        if not job_id:
            tried.append("SLURM_JOB_ID is not set")
            raise SlurmNodesError(
                "a multi-node layout must run inside a Slurm job (snakemake --profile "
                "profiles/slurm); cannot find its nodes: " + "; ".join(tried)
            )
        nodelist = _nodelist_from(
            ["squeue", "-h", "-j", job_id, "-o", "%N"],
            run,
            tried,
            lambda out: out.splitlines()[0].strip() if out else None,
        ) or _nodelist_from(["scontrol", "show", "job", job_id], run, tried, parse_show_job)
        if nodelist is None:
            raise SlurmNodesError(
                f"cannot find the nodes of Slurm job {job_id}: " + "; ".join(tried)
            )
    return expand_hostnames(nodelist, run)


def job_fields(job_id: str | None, run: Runner = _run) -> dict[str, str]:
    """``scontrol show job ID`` as field -> value (``Account``, ``TresFreq``, ...); empty when
    not a Slurm job or Slurm does not answer."""
    if not job_id:
        return {}
    try:
        proc = run(["scontrol", "show", "job", job_id])
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if proc.returncode != 0:
        return {}
    return dict(re.findall(r"(?:^|\s)([A-Za-z/]+)=(\S*)", proc.stdout or ""))


def job_tres_freq(job_id: str | None, run: Runner = _run) -> str | None:
    """The frequencies a Slurm job asked for (``TresFreq``, e.g. ``gpu:medium``; sbatch
    --gpu-freq), or None (none asked, not a Slurm job, no answer)."""
    return job_fields(job_id, run).get("TresFreq") or None


def restore_job_identity(env: dict, run: Runner = _run) -> dict:
    """``env`` with ``SLURM_JOB_ACCOUNT`` back where the job step lost it (the Slurm jobstep
    plugin keeps only the job id and cluster of the ``SLURM_*`` variables before its ``srun``,
    and Slurm does not set the account in a step): every row names its account."""
    if env.get("SLURM_JOB_ID") and not env.get("SLURM_JOB_ACCOUNT"):
        account = job_fields(env["SLURM_JOB_ID"], run).get("Account")
        if account and account != "(null)":
            env = {**env, "SLURM_JOB_ACCOUNT": account}
    return env
