"""The engine's OpenAI-compatible server of a serving job: its command, environment and lifetime.

One server per batch cap of a job, on 127.0.0.1 and a port from :mod:`energysweep.launch.ports`:

- **command**: the backend's registry record's template (energysweep.job.backends
  ``server_argv``: vLLM's ``python -m vllm.entrypoints.openai.api_server``, TensorRT-LLM's
  ``trtllm-serve`` from the same environment) filled by :func:`server_argv`: tp/pp/dp from the
  layout, the batch cap as ``max_num_seqs``, and a model name unique to the job;
- **environment**: the job's, so the server carries the job's process mark; on CPU each worker
  is bound to its own slice of the job's cores (vLLM's CPU build cannot bind tp/pp/dp workers on a
  one-NUMA-node machine by itself); the kernel sends the server SIGTERM if the client dies;
- **its processes**: the client is a child subreaper (:func:`energysweep.launch.procs.
  become_subreaper`), so every process of the server stays the client's descendant even when its
  parent dies (vLLM's engine processes overwrite their environment, mark included, with their
  titles, and a SIGKILLed API server leaves them running);
- **start**: refused at once if the port is taken; then /health is polled, bounded by
  ``limits.server_start_timeout_s``, and the server must list the model under this job's name (a
  server of another job on the port is never measured). A server that exits before it is healthy
  fails at once with its log;
- **stop**: SIGTERM to the API server (it stops its engine), SIGKILL after the grace period to
  every process left; then the ``/dev/shm`` files its processes had mapped (seen while it
  started, once healthy, and as it stops; a named semaphore by its inode, cleanup.shm_in_use)
  are removed (vLLM's CPU build leaves its tp/pp shared-memory segments behind, and an engine
  it force-kills as it shuts down, its executor's named semaphore ``sem.mp-*``);
- its output goes to its own log file, copied into the rule's log when it stops.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from energysweep.job.backends import backend
from energysweep.job.layout import ParallelLayout
from energysweep.job.sections import Engine
from energysweep.job.spec import LaunchedJob
from energysweep.launch import cleanup, procs
from energysweep.util.http import http_get

HOST = "127.0.0.1"
POLL_S = 0.25  # /health poll period while a server starts


class ServerFailed(RuntimeError):
    """The server did not start, died, or stopped answering; the message holds its log tail."""


@dataclass(frozen=True)
class ServerOptions:
    """What a server command is built from (one job, one batch cap)."""

    backend: str
    python: str
    model_dir: str
    layout: ParallelLayout
    max_num_seqs: int
    max_model_len: int
    dtype: str
    seed: int
    engine: Engine
    on_gpu: bool = False


def server_argv(o: ServerOptions, port: int, name: str) -> list[str]:
    """The server's command: the backend's template (energysweep.job.backends
    ``BackendInfo.server_argv``, plus its ``server_argv_if`` tokens whose condition holds), each
    token filled on its own (one argv element each: never a shell string)."""
    info = backend(o.backend)
    if not info.server_argv:
        raise ValueError(f"backend {o.backend} has no server command: it serves nothing")
    values = {
        "python": o.python, "bin": str(Path(o.python).parent), "model_dir": o.model_dir,
        "name": name, "host": HOST, "port": str(port), "dtype": o.dtype, "seed": str(o.seed),
        "max_num_seqs": str(o.max_num_seqs), "max_model_len": str(o.max_model_len),
        "tp": str(o.layout.tp), "pp": str(o.layout.pp), "dp": str(o.layout.dp),
        "gpu_memory_utilization": str(o.engine.gpu_memory_utilization),
        "cpu_kvcache_bytes": str(o.engine.cpu_kvcache_bytes),
    }  # fmt: skip
    conditions = {"enforce_eager": bool(o.engine.enforce_eager), "on_cpu": not o.on_gpu,
                  "on_gpu": o.on_gpu}  # fmt: skip
    tokens = list(info.server_argv)
    for cond, extra in info.server_argv_if:
        tokens += extra if conditions[cond] else ()
    return [t.format_map(values) for t in tokens]


def cpu_bind(workers: int, cpus: list[int]) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND``: one ``|``-separated core list per worker in vLLM's
    [DP, PP, TP] rank order (ours: tp innermost), each worker a contiguous slice of ``cpus``
    (shared round-robin only when there are fewer cores than workers)."""
    cpus = sorted(cpus)
    if len(cpus) < workers:
        return "|".join(str(cpus[i % len(cpus)]) for i in range(workers))
    per, extra = divmod(len(cpus), workers)
    out, start = [], 0
    for w in range(workers):
        part = cpus[start : start + per + (1 if w < extra else 0)]
        start += len(part)
        out.append(f"{part[0]}-{part[-1]}" if len(part) > 1 else str(part[0]))
    return "|".join(out)


def server_env(o: ServerOptions, base: dict, vllm_port: int | None) -> dict:
    """The server's environment: the job's (its mark included) less the backend's
    ``server_env_drop``, plus its ``server_env`` variables whose condition holds (its registry
    record, energysweep.job.backends)."""
    info = backend(o.backend)
    env = {k: v for k, v in base.items() if k not in info.server_env_drop}
    holds = {"always": True, "on_cpu": not o.on_gpu, "on_gpu": o.on_gpu,
             "engine_port": vllm_port is not None}  # fmt: skip
    wanted = [(name, value) for cond, name, value in info.server_env if holds[cond]]
    if wanted:
        values = {
            "engine_port": str(vllm_port),
            "cpu_kvcache_gib": f"{float(o.engine.cpu_kvcache_gib):g}",
            "cpu_bind": cpu_bind(o.layout.world_size, sorted(os.sched_getaffinity(0))),
        }
        env.update({name: value.format_map(values) for name, value in wanted})
    return env


def port_is_free(port: int) -> bool:
    """No socket listens on ``port``. Bound as the servers bind (uvicorn and trtllm-serve set
    SO_REUSEADDR): connections of the batch cap's previous server left in TIME_WAIT on the same
    port (a Slurm job's port is fixed) do not keep the next server out."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _suffix(title: str, tag: str) -> int:
    """The number after ``_<tag>`` in a vLLM process title (0 when absent)."""
    for part in (title.split() or [""])[0].split("_")[1:]:
        if part.startswith(tag) and part[len(tag) :].isdigit():
            return int(part[len(tag) :])
    return 0


def server_pids() -> list[int]:
    """Every live process of this client's server (none between servers): the client's
    descendants (module docstring). The load generator is no process of its own: it runs in the
    client's event loop (scenarios/serving/load.py), so it is never among them."""
    return procs.descendants(os.getpid())


class Server:
    """One running server (see the module docstring). Start it from the client process only."""

    def __init__(self, options: ServerOptions, port: int, name: str, log_path: Path,
                 base_env: dict, vllm_port: int | None = None, subreaper: bool = True):  # fmt: skip
        self.options = options
        self.port = port
        self.name = name
        self.log_path = Path(log_path)
        self.argv = server_argv(options, port, name)
        self.env = server_env(options, base_env, vllm_port)
        self.proc: subprocess.Popen | None = None
        # The serving client adopts its server's orphans (module docstring); a caller that is
        # no dedicated client (a test) may keep its own process as it is.
        self.subreaper = subreaper
        self.started_at: float | None = None
        self._shm: set[str] = set()

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> None:
        if not port_is_free(self.port):
            raise ServerFailed(
                f"port {self.port} on {HOST} is taken by another process: the "
                f"{self.options.backend} server cannot listen there"
            )
        if self.subreaper:
            procs.become_subreaper()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, preexec_fn=lambda: procs._set_pdeathsig(signal.SIGTERM),
            )  # fmt: skip
        self.started_at = time.monotonic()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_healthy(self, timeout_s: float) -> float:
        """Seconds from start to healthy; ServerFailed if it exits or times out first."""
        proc, started_at = self.proc, self.started_at
        if proc is None or started_at is None:
            raise ServerFailed(self.failure("was never started"))
        deadline = started_at + timeout_s
        while time.monotonic() < deadline:
            # What it maps while it starts, too: a server that dies before it is healthy has
            # made its engine's files by then (a semaphore, shared-memory blocks), and a process
            # SIGKILLed with its resource tracker leaves them behind (stop removes them).
            self._shm |= cleanup.shm_in_use(self.pids())
            if not self.alive():
                raise ServerFailed(self.failure(f"exited ({proc.returncode}) before healthy"))
            status, _ = http_get(f"{self.base_url}/health", timeout_s=2)
            if status == 200 and self._serves_our_model():
                self._shm |= cleanup.shm_in_use(self.pids())
                return time.monotonic() - started_at
            time.sleep(POLL_S)
        raise ServerFailed(
            self.failure(f"was not healthy within limits.server_start_timeout_s={timeout_s:g} s")
        )

    def _serves_our_model(self) -> bool:
        status, body = http_get(f"{self.base_url}/v1/models", timeout_s=2)
        with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
            return status == 200 and any(m["id"] == self.name for m in json.loads(body)["data"])
        return False

    def check(self, answer_within_s: float = 120.0) -> None:
        """ServerFailed unless the server process lives and /health answers 200. A server too
        busy to answer (an overload's backlog being aborted) gets ``answer_within_s``; an
        answer other than 200 (a dead engine) fails at once."""
        deadline = time.monotonic() + answer_within_s
        while True:
            if not self.alive():
                code = self.proc.returncode if self.proc is not None else None
                raise ServerFailed(self.failure(f"died (exit code {code})"))
            status, body = http_get(f"{self.base_url}/health", timeout_s=10)
            if status == 200:
                return
            if status != 0 or time.monotonic() > deadline:
                said = f"{status or 'nothing'} {body[:200]}"
                raise ServerFailed(self.failure(f"is unhealthy: /health answered {said}"))

    def pids(self) -> list[int]:
        """Every live process of the server: the client's descendants (module docstring)."""
        return server_pids()

    def stop(self, grace_s: float) -> list[int]:
        """Stop every process of the server (module docstring); the pids that needed SIGKILL."""
        if self.proc is None:
            return []
        self._shm |= cleanup.shm_in_use(self.pids())
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and (self.alive() or self.pids()):
            time.sleep(0.05)
            procs.reap()
        killed = self.pids()
        for pid in killed:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
            procs.reap()
        procs.reap()
        for name in sorted(self._shm):
            with contextlib.suppress(OSError):
                (cleanup.SHM / name).unlink()
        return killed

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no server log)"
        return "\n".join(text[-lines:])

    def failure(self, what: str) -> str:
        tail = self.log_tail()
        hint = "" if self.options.on_gpu else backend(self.options.backend).cpu_error_hint(tail)
        return (
            f"the {self.options.backend} server ({' '.join(self.argv[:3])} ... port {self.port}) "
            f"{what}.{' ' + hint if hint else ''} Its log ({self.log_path.name}) ends:\n{tail}"
        )

    def print_log(self, out=sys.stdout) -> None:
        """Copy the server's whole log into the rule's log, delimited."""
        head = f"----- server log (port {self.port}, max_num_seqs {self.options.max_num_seqs})"
        try:
            body = self.log_path.read_text(errors="replace").rstrip()
        except OSError:
            body = "(no server log)"
        print(f"{head} -----\n{body}\n----- end of server log -----", file=out, flush=True)

    def placement_record(self) -> dict:
        """Where the server runs, for job.json: the cores its workers were bound to and the
        Slurm job id in the API server's own environment (it runs inside that allocation)."""
        if self.proc is None:
            raise ServerFailed(self.failure("was never started"))
        environ = {}
        with contextlib.suppress(OSError, AttributeError):
            for item in Path(f"/proc/{self.proc.pid}/environ").read_bytes().split(b"\0"):
                key, _, value = item.decode(errors="replace").partition("=")
                environ[key] = value
        return {
            "cpus": sorted(os.sched_getaffinity(self.proc.pid)),
            "cpu_bind": self.env.get("VLLM_CPU_OMP_THREADS_BIND"),
            "slurm_job_id": environ.get("SLURM_JOB_ID"),
        }

    def gpu_pids(self) -> dict[int, list[int]]:
        """Per GPU of the job (index into its visible GPUs), the server processes computing on
        it (:func:`worker_gpu`); empty where the engine's processes cannot be told apart."""
        layout = self.options.layout
        titles = {pid: _cmdline(pid) for pid in self.pids()}
        out: dict[int, list[int]] = {}
        for pid, title in titles.items():
            gpu = worker_gpu(title, titles.get(_ppid(pid), ""), layout.tp, layout.pp)
            if gpu is not None:
                out.setdefault(gpu, []).append(pid)
        return out


def worker_gpu(title: str, parent_title: str, tp: int, pp: int) -> int | None:
    """The GPU (index into the job's visible GPUs) of a vLLM worker process, from its title
    ``VLLM::Worker[_PP<p>][_TP<t>]`` and its engine's ``VLLM::EngineCore[_DP<d>]`` (one engine
    per DP replica): ``(d * pp + p) * tp + t``; None for a process that is no worker."""
    if not title.startswith("VLLM::Worker"):
        return None
    p, t, d = _suffix(title, "PP"), _suffix(title, "TP"), _suffix(parent_title, "DP")
    return (d * pp + p) * tp + t


def server_for_job(job: LaunchedJob, model_dir: str, layout: ParallelLayout, on_gpu: bool,
                   cap: int, log_path: Path) -> Server:  # fmt: skip
    """The (unstarted) server of one batch cap of a serving job.

    Its interpreter is ``job.server_python`` (the backend's environment; the client may run
    in another); its port comes from the Slurm job id, else a free one; vLLM's internal ports
    from the job's ``VLLM_PORT`` block (energysweep.launch.argv.backend_env).
    """
    from energysweep.launch.ports import free_port, server_port

    if job.engine is None:
        raise ValueError(f"backend {job.key.backend} has no engine section: it runs no server")
    max_len = job.engine.max_model_len or (
        int(job.workload.max_input_tokens) + int(job.workload.output_tokens)
    )
    options = ServerOptions(
        backend=job.key.backend, python=job.server_python or sys.executable,
        model_dir=model_dir, layout=layout, max_num_seqs=int(cap), max_model_len=int(max_len),
        dtype=job.dtype, seed=int(job.seed), engine=job.engine, on_gpu=on_gpu,
    )  # fmt: skip
    slurm_id = os.environ.get("SLURM_JOB_ID")
    port = server_port(slurm_id) if slurm_id else free_port()
    vllm_port = int(os.environ["VLLM_PORT"]) if "VLLM_PORT" in os.environ else None
    name = f"energysweep-{job.job_id[:12]}"
    return Server(options, port, name, log_path, dict(os.environ), vllm_port)
