"""Layout -> processes: the argv and environment a measure job starts, and running it.

Launch modes (energysweep.placement.Placement says which a job uses):
- ``torchrun`` one node:   ``torchrun --standalone --nproc-per-node N -m energysweep.run``
  (standalone picks a free port, so concurrent jobs on one node never collide);
- ``torchrun`` many nodes: ``srun --nodes K --ntasks-per-node 1 torchrun --nnodes K
  --nproc-per-node G --rdzv-backend c10d --rdzv-endpoint HEAD:PORT --rdzv-id JOBID``, the port
  derived from the Slurm job id (the default 29400 collides when jobs share a head node);
- ``direct`` (TensorRT-LLM on one node): one process per DP replica, the engine spawns its tp*pp
  GPU workers; dp == 1 is ``python -m energysweep.run``; dp > 1 is ``torchrun --standalone
  --nproc-per-node DP -m energysweep.launch --replica-gpus TP*PP``, which gives each replica its
  own disjoint GPU set (CUDA_VISIBLE_DEVICES) before anything touches CUDA, then execs the run;
- ``mpi`` (TensorRT-LLM, a replica larger than a node, dp == 1): ``srun --mpi=pmix --nodes K
  --ntasks-per-node TP*PP/K trtllm-llmapi-launch python -m energysweep.run``; MPI ranks == tp*pp.
vLLM runs under ``torchrun`` like PyTorch, even with one rank: every rank is one vLLM engine with
``distributed_executor_backend="external_launcher"``, which reads RANK/LOCAL_RANK/MASTER_* from
torchrun. Which mode a backend uses is data (energysweep.backends.registry).

Ports: concurrent jobs on one node must never share one. torchrun --standalone picks a free port;
a multi-node rendezvous and vLLM's ``VLLM_PORT`` are derived from the Slurm job id (distinct jobs
running together have nearby ids, hence distinct ports), or are a free port outside Slurm.

Everything is an argv list: no value ever passes through a shell.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

from energysweep import procs
from energysweep.backends.registry import BACKENDS
from energysweep.envinfo import code_version
from energysweep.grid import ParallelLayout
from energysweep.jobspec import launched, output_paths, restage
from energysweep.placement import Placement
from energysweep.ports import free_port, rendezvous_port, vllm_port
from energysweep.slurm import expand_hostnames, job_nodes


def backend_env(
    backend: str, slurm_job_id: str | None = None, engine: dict | None = None
) -> dict[str, str]:
    """Environment variables a backend's processes need, beyond the common ones.

    Args:
        engine: the config section ``engine`` (engine jobs' spec), None for its defaults.
    """
    if backend == "vllm":
        engine = engine or {}
        return {
            "VLLM_PORT": str(vllm_port(slurm_job_id) if slurm_job_id else free_port()),
            # external_launcher runs the engine core inside each rank (vLLM sets this itself for
            # that executor; set here so the job's environment record says so).
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            # KV cache of a rank on CPUs, in GiB (read by vLLM's CPU platform only). Unset, the
            # CPU build reserves gpu_memory_utilization x host RAM per rank: OOM kills at tp=2.
            "VLLM_CPU_KVCACHE_SPACE": str(int(engine.get("cpu_kvcache_gib", 1))),
            # vLLM binds OpenMP threads only in its own multiprocessing executor; under
            # external_launcher each rank uses OMP_NUM_THREADS (build_env), so say so.
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        }
    return {}


def replica_visible_devices(
    visible: str | None, local_rank: int, gpus_per_replica: int, local_replicas: int
) -> str:
    """CUDA_VISIBLE_DEVICES of DP replica ``local_rank`` on its node: a contiguous, disjoint slice.

    Args:
        visible: the job's CUDA_VISIBLE_DEVICES (set by Slurm for the allocation), or None for
            all GPUs of the machine (numbered 0..N-1).
        local_rank: the replica's index on this node.
        gpus_per_replica: tp*pp.
        local_replicas: replicas on this node.
    """
    devices = (
        [d.strip() for d in visible.split(",") if d.strip()]
        if visible is not None
        else [str(i) for i in range(gpus_per_replica * local_replicas)]
    )
    need = gpus_per_replica * local_replicas
    if len(devices) < need:
        raise ValueError(
            f"{local_replicas} replicas of {gpus_per_replica} GPUs need {need} GPUs, "
            f"CUDA_VISIBLE_DEVICES={visible!r} has {len(devices)}"
        )
    start = local_rank * gpus_per_replica
    return ",".join(devices[start : start + gpus_per_replica])


def build_argv(
    layout: ParallelLayout,
    backend: str,
    spec_path: str,
    gpus_per_node: int,
    python: str = sys.executable,
    slurm_job_id: str | None = None,
    head_node: str | None = None,
) -> list[str]:
    """The command that starts every process of one job."""
    entry = ["-m", "energysweep.run", "--spec", str(spec_path)]
    placement = Placement(layout, backend, gpus_per_node)
    mode = placement.launch_mode
    if mode == "direct":
        if layout.dp == 1:
            # One replica: one process; the engine spawns its tp*pp GPU workers itself.
            return [python, *entry]
        return [
            python, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(layout.dp),
            "-m", "energysweep.launch", "--replica-gpus", str(layout.ranks_per_replica),
            "--spec", str(spec_path),
        ]
    nodes = placement.nodes
    if mode == "mpi":
        if placement.unsupported():
            raise ValueError(f"{backend} cannot run {layout} on nodes of {gpus_per_node} GPUs")
        # The launcher script of the same environment as the interpreter: rank 0 runs our
        # entry point, the other MPI ranks serve as the engine's workers.
        launcher = str(Path(python).with_name("trtllm-llmapi-launch"))
        return [
            "srun", "--mpi=pmix", "--nodes", str(nodes),
            "--ntasks-per-node", str(layout.ranks_per_replica // nodes), "--kill-on-bad-exit=1",
            launcher, python, *entry,
        ]
    if layout.world_size == 1 and not BACKENDS[backend].torchrun_always:
        # One process: no launcher; run.py sees WORLD_SIZE unset, i.e. 1.
        return [python, *entry]
    if nodes == 1:
        return [
            python, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(layout.world_size), *entry,
        ]
    if placement.unsupported():
        raise ValueError(f"{layout} ({layout.world_size} ranks) does not fill {nodes} nodes evenly")
    if not slurm_job_id or not head_node:
        raise ValueError("a multi-node layout needs a Slurm job id and head node")
    per_node = layout.world_size // nodes
    return [
        "srun", "--nodes", str(nodes), "--ntasks-per-node", "1", "--kill-on-bad-exit=1",
        python, "-m", "torch.distributed.run",
        "--nnodes", str(nodes), "--nproc-per-node", str(per_node),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"{head_node}:{rendezvous_port(slurm_job_id)}",
        "--rdzv-id", str(slurm_job_id), *entry,
    ]


def build_env(
    layout: ParallelLayout,
    base: dict | None = None,
    threads: int | None = None,
    backend: str = "pytorch",
    slurm_job_id: str | None = None,
    engine: dict | None = None,
) -> dict:
    """Environment for the job's processes.

    ``threads`` is each rank's share of the job's cores (OMP_NUM_THREADS; the ranks also set
    torch's thread count from it), so the ranks of a job never oversubscribe its cores.
    """
    env = dict(os.environ if base is None else base)
    env.update(backend_env(backend, slurm_job_id, engine))
    # Checkpoints are local directories (config.check): never wait on the Hugging Face Hub.
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    # CUDA then numbers GPUs as NVML does; GPUs are still resolved by UUID for energy.
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["PYTHONUNBUFFERED"] = "1"
    # Ranks import this very package, also under a conda env where it is not installed.
    src = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(max(1, threads))
    return env


def head_node(nodelist: str) -> str:
    """First host of a Slurm nodelist (``scontrol show hostnames``)."""
    return expand_hostnames(nodelist)[0]


DEFAULT_LIMITS = {
    # Defaults of config `limits:` (config/config.schema.yaml); the measure step passes the
    # config's values.
    "job_timeout_s": 21600.0,
    "collective_timeout_s": 600.0,
    "kill_grace_s": 10.0,
}
# Signals that stop a running job as a whole: Slurm's scancel and TIMEOUT (SIGTERM), Ctrl-C
# (SIGINT), a closed terminal (SIGHUP).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class JobFailed(RuntimeError):
    """A measure job did not complete; nothing of it was published."""


class JobInterrupted(JobFailed):
    """The measure step got a stop signal (scancel, Slurm TIMEOUT, Ctrl-C) while the job ran."""


@contextlib.contextmanager
def _stop_signals_raise():
    """While the job runs, a stop signal raises :class:`JobInterrupted` (once) in this thread.

    Yields a function that disarms it: once the job is being stopped, a signal must not
    interrupt the teardown. Only the main thread can own signal handlers; elsewhere (a test
    calling run_job from a thread) the signals keep their handlers.
    """
    armed = [True]

    def disarm() -> None:
        armed[0] = False

    if threading.current_thread() is not threading.main_thread():
        yield disarm
        return

    def handler(signum, _frame):
        if armed[0]:
            armed[0] = False
            raise JobInterrupted(f"got {signal.Signals(signum).name}")

    old = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield disarm
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def run_job(spec: dict, spec_path: str | Path, log, cpus: int, gpus_per_node: int,
            timeout_s: float | None = None, limits: dict | None = None,
            python: str = sys.executable) -> None:
    """Write the spec, start the job's processes, and publish its outputs only if all succeeded.

    ``python`` is the interpreter of the backend's environment (energysweep.environments): the
    ranks, and torchrun itself, run in it.

    The ranks write into a hidden staging directory next to the outputs; the files move to their
    final names (job.json last) only after every process exited 0. A job that fails or is killed
    (scancel, SIGKILL of a rank, node failure) therefore leaves no shard under a name that
    aggregation reads.

    The job's processes are one unit (energysweep.procs): on a rank's failure, on the job
    timeout, or on a stop signal to this process (SIGTERM from scancel or Slurm's TIMEOUT,
    SIGINT from Ctrl-C), every one of them gets SIGTERM and, ``kill_grace_s`` later, SIGKILL;
    then the staging directory is removed and :class:`JobFailed` says why.

    Args:
        limits: ``job_timeout_s``, ``collective_timeout_s`` and ``kill_grace_s`` (config
            ``limits:``); missing keys take :data:`DEFAULT_LIMITS`. They are passed to the ranks
            in the spec but are not part of its settings hash: a limit changes no measurement.
        timeout_s: overrides ``limits["job_timeout_s"]``.

    Raises:
        JobFailed: the command exited non-zero, ran past the timeout, left outputs missing, or
            the step was interrupted (:class:`JobInterrupted`).
    """
    limits = {**DEFAULT_LIMITS, **(limits or {})}
    if timeout_s is not None:
        limits["job_timeout_s"] = timeout_s
    layout = ParallelLayout(spec["job"]["tp"], spec["job"]["pp"], spec["job"]["dp"])
    placement = Placement(layout, spec["job"]["backend"], gpus_per_node)
    # The code version is read where the job runs (energysweep.jobspec.launched).
    spec = launched(spec, limits, code_version())
    final = spec["outputs"]
    base = Path(spec_path).resolve().parent
    staging = base / f".staging-{spec['job_id']}"
    spec["outputs"] = restage(final, staging, base)
    slurm_id = os.environ.get("SLURM_JOB_ID")
    head = _head_node(placement, slurm_id, log) if placement.multi_node else None
    argv = build_argv(layout, spec["job"]["backend"], str(spec_path), gpus_per_node,
                      python=python, slurm_job_id=slurm_id, head_node=head)
    spec["launch_argv"] = argv
    base.mkdir(parents=True, exist_ok=True)
    Path(spec_path).write_text(json.dumps(spec, indent=2))
    ranks_here = layout.world_size // placement.nodes
    env = build_env(layout, threads=cpus // max(1, ranks_here), backend=spec["job"]["backend"],
                    slurm_job_id=slurm_id, engine=spec.get("engine"))
    what = f"job {spec['job']} ({spec_path})"
    print("launch:", json.dumps(argv), file=log, flush=True)
    proc = None
    try:
        with _stop_signals_raise() as disarm:
            try:
                proc = procs.start(argv, env, log, spec["job_id"])
                _wait(proc, float(limits["job_timeout_s"]), what, argv[0])
            except JobInterrupted as exc:
                raise JobInterrupted(
                    f"{what} interrupted ({exc}): stopped all its processes; nothing of it was "
                    "published"
                ) from None
            finally:
                disarm()
                # Also after a clean exit: a rank's helper or engine worker may linger.
                procs.stop(proc, spec["job_id"], float(limits["kill_grace_s"]), log)
        _publish(spec["outputs"], final, what)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _head_node(placement: Placement, slurm_id: str | None, log) -> str:
    """The first node of a multi-node job's Slurm allocation (its rendezvous host)."""
    # From the job id: the jobstep plugin strips SLURM_JOB_NODELIST from mpi rules.
    nodes = job_nodes()
    print(f"nodes: {' '.join(nodes)}", file=log, flush=True)
    if len(nodes) < placement.nodes:
        raise RuntimeError(f"{placement.layout} needs {placement.nodes} nodes; Slurm job "
                           f"{slurm_id} has {len(nodes)}: {nodes}")
    return nodes[0]


def _wait(proc, timeout: float, what: str, program: str) -> None:
    """Wait for the job's processes; JobFailed if they run past ``timeout`` or exit non-zero."""
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise JobFailed(
            f"{what} ran longer than limits.job_timeout_s={timeout:g} s: stopped all "
            "its processes; nothing of it was published"
        ) from None
    if rc != 0:
        raise JobFailed(
            f"{what} failed: {program} exited {rc} (the ranks' errors are above); "
            "nothing of it was published"
        )


def _publish(staged_outputs, final_outputs, what: str) -> None:
    """Move the staged outputs to their final names, job.json last (it marks a complete job)."""
    staged, targets = output_paths(staged_outputs), output_paths(final_outputs)
    missing = [s for s in staged if not Path(s).exists()]
    if missing:
        raise JobFailed(f"{what} exited 0 but did not write {missing}")
    pairs = sorted(zip(staged, targets, strict=True), key=lambda st: st[1].endswith("job.json"))
    # A stop signal now would leave some outputs published and not others: hold it until done.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        for src, dst in pairs:
            Path(dst).parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dst)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def replica_main(argv: list[str] | None = None) -> None:
    """``python -m energysweep.launch --replica-gpus N --spec F`` (one DP replica under torchrun).

    Restricts this process to its replica's GPUs, then replaces itself with energysweep.run (same
    pid, so torchrun still supervises it). CUDA_VISIBLE_DEVICES only works if set before CUDA
    initialises, hence a separate step before the run imports anything.
    """
    import argparse

    parser = argparse.ArgumentParser(description=replica_main.__doc__.splitlines()[0])
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
