"""An emulated GPU node: NVML's real interface and behaviour over a known ground truth.

``measurement.device: emulated`` (docs/emulated-node.md) runs the ranks on CPUs while
energysweep.hw.nvml serves them, and preflight, this package's module in place of pynvml.
The launcher writes the node's settings into the job's state directory and names it in
:data:`ENV`; each rank *owns* its GPU (:func:`attach`): a thread samples the rank's CPU activity,
integrates true power exactly and publishes it to a per-GPU shared file, from which any process
of the job reads the counter, the power reading, clocks and event reasons as NVML would report
them. GPUs nobody owns read idle. Owners write the ground truth (hw/emulated/truth.py) for tests
and the benchmark; the measurement code never reads it.

Modules: profiles (GPU models and sources), node_config (config section, checks), physics (power
model and sensors, pure), state (the shared per-GPU file), node (identities and readings at a
time), owner (activity -> true power -> state + truth), api / api_readings / api_control (the
pynvml surface), truth (window lookups).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import energysweep.hw.emulated.node_config as _node_config
from energysweep.hw.emulated.api import CGROUP_ENV, EMULATED, make_module
from energysweep.hw.emulated.node import Node
from energysweep.hw.emulated.node_config import NodeSettings
from energysweep.hw.emulated.owner import FunctionActivity, Owner, PidActivity, ProcessActivity

__all__ = [
    "CGROUP_ENV",
    "EMULATED",
    "cuda_uuids",
    "ENV",
    "FunctionActivity",
    "Node",
    "NodeSettings",
    "Owner",
    "PidActivity",
    "ProcessActivity",
    "attach",
    "job_env",
    "make_module",
    "module_from_env",
    "prepare",
    "strip_state",
]

# The job's emulated state directory; set by the launcher for every process of the job.
ENV = "ENERGYSWEEP_EMULATED_NVML"


def prepare(directory: str | Path, section: dict, epoch_ns: int) -> NodeSettings:
    """Resolve ``measurement.emulated`` and write the node's settings into ``directory``."""
    resolved = _node_config.resolve(section, epoch_ns)
    _node_config.write(resolved, directory)
    return resolved


def job_env(directory: str | Path, node: NodeSettings, env: dict) -> dict:
    """The environment of a job on the emulated node: :data:`ENV`, and under device cgroups the
    allocation NVML may list (Slurm's GPU indices) with ``CUDA_VISIBLE_DEVICES`` renumbered
    from 0, as Slurm sets it when it constrains devices."""
    out = dict(env)
    out[ENV] = str(Path(directory).resolve())
    if node.device_cgroups:
        alloc = (
            out.get("SLURM_STEP_GPUS")
            or out.get("SLURM_JOB_GPUS")
            or out.get("CUDA_VISIBLE_DEVICES")
        )
        if alloc:
            indices = [x.strip() for x in alloc.split(",") if x.strip()]
            out[CGROUP_ENV] = ",".join(indices)
            out["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(indices)))
    return out


def node_from_env(environ=None, clock=None) -> Node:
    """The node of this process's job (:data:`ENV` names its state directory)."""
    environ = os.environ if environ is None else environ
    directory = environ[ENV]
    kwargs = {} if clock is None else {"clock": clock}
    return Node(_node_config.read(directory), directory, **kwargs)


def cuda_uuids(environ=None) -> list[str]:
    """UUIDs of the emulated CUDA devices of this process, in CUDA order, without NVML (as
    CUDA itself names them): ``CUDA_VISIBLE_DEVICES`` entries are indices (under device cgroups,
    into the job's allocation) or UUID prefixes; an invalid entry ends the list, as in CUDA."""
    environ = os.environ if environ is None else environ
    node = node_from_env(environ)
    listed = list(range(node.settings.gpus))
    if node.settings.device_cgroups and environ.get(CGROUP_ENV) is not None:
        listed = [int(x) for x in environ[CGROUP_ENV].split(",") if x.strip()]
    uuids = [node.gpus[i].uuid for i in listed]
    cvd = environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return uuids
    out = []
    for entry in (e.strip() for e in cvd.split(",")):
        matches = [u for u in uuids if entry.startswith("GPU-") and u.startswith(entry)]
        if entry.isdigit() and int(entry) < len(uuids):
            out.append(uuids[int(entry)])
        elif len(matches) == 1:
            out.append(matches[0])
        else:
            break
    return out


def module_from_env(real, environ=None):
    """The emulated pynvml of this process's job (the node is read at the first nvmlInit)."""
    return make_module(real, lambda: node_from_env(environ), environ=environ)


# How often an owner asks again which processes are its GPUs' load (PidActivity.refresh_s).
PIDS_REFRESH_S = 0.1


def attach(module, uuids: list[str], pids=None) -> Owner:
    """Make this process the owner of the emulated GPUs ``uuids`` and start sampling.

    Args:
        module: the emulated pynvml (its node and NVML numbering are used).
        pids: the processes whose CPU activity is the GPUs' load (default: this process).
    """
    node = module.emulated_driver.ensure_node()
    by_uuid = {g.uuid: g.index for g in node.gpus}
    indices = [by_uuid[u] for u in uuids]
    activity = PidActivity(pids, PIDS_REFRESH_S) if pids is not None else ProcessActivity()
    return Owner(node, indices, activity).start()


def strip_state(directory: str | Path) -> None:
    """Remove the shared state files (kept: settings and truth) before a job's outputs are
    published; the state is only meaningful while the job runs."""
    for path in Path(directory).rglob("gpu*.state"):
        path.unlink(missing_ok=True)
    for path in Path(directory).rglob("*.tmp"):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
