"""vLLM's load generator as the serving client uses it, and the client's own safeguards.

- :func:`vllm_arrivals`: arrival times from ``vllm.benchmarks.serve.get_request``;
- :func:`vllm_sender`: one request through ``vllm.benchmarks.lib.endpoint_request_func``
  (streamed OpenAI completions), as a :class:`.load.RequestRecord`;
- :func:`greedy_tokens`: the token ids a server generates for prompts, unstreamed (vLLM's
  ``return_token_ids``), for the comparison with the offline backends;
- :func:`client_session`: the HTTP session of the client's requests (a connection pool that
  never sends on a connection the server is closing);
- :class:`Watchdog`: the client's bound on its own stalls;
- :class:`ServedGpus`: which GPUs the client measures (every GPU of the job);
- :class:`RunningServer`: what the client asks of the job's engine server.
"""

from __future__ import annotations

import faulthandler
import os
import subprocess
import sys
import threading
import time
from typing import Protocol

import numpy as np

from energysweep.scenarios.serving.load import Arrivals, RequestRecord, Sender


class _ServerOptions(Protocol):
    max_num_seqs: int


class RunningServer(Protocol):
    """What the client asks of its engine server (energysweep.launch.server.Server, which the
    scenario may not import: it is built by the launcher's side and handed over)."""

    name: str
    options: _ServerOptions
    proc: subprocess.Popen | None
    env: dict[str, str]

    @property
    def base_url(self) -> str: ...
    def check(self) -> None: ...
    def pids(self) -> list[int]: ...
    def stop(self, grace_s: float) -> list[int]: ...
    def print_log(self) -> None: ...


def import_load_generator() -> None:
    """Import vLLM's load generator (:func:`vllm_arrivals`, :func:`vllm_sender`): ~5 s on this
    machine kind (2.7 s for the request functions, which import vLLM, and 2.4 s for
    ``vllm.benchmarks.serve``), once per process."""
    import vllm.benchmarks.lib.endpoint_request_func  # noqa: F401
    import vllm.benchmarks.serve  # noqa: F401


class BackgroundImport:
    """:func:`import_load_generator` in a thread of its own, started as a server boots
    (ServingScenario.start_server): the server's processes import vLLM one after another, so the
    client's imports run beside them instead of in the warm-up and the first load run's ramp.
    The boot is polled meanwhile (a server that dies while booting is seen at once); :meth:`wait`
    joins it and raises what the import raised."""

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="load-generator-import", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            import_load_generator()
        except BaseException as exc:  # raised in the caller's thread by wait()
            self.error = exc

    def wait(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error


# uvicorn, under vLLM's API server and trtllm-serve, closes a connection idle for
# VLLM_HTTP_TIMEOUT_KEEP_ALIVE seconds (vLLM's default; uvicorn's own default is the same).
SERVER_KEEPALIVE_S = 5.0
KEEPALIVE_ENV = "VLLM_HTTP_TIMEOUT_KEEP_ALIVE"


def server_keepalive_s(env: dict[str, str]) -> float:
    """How long the server keeps an idle connection open: its environment's
    ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``, else :data:`SERVER_KEEPALIVE_S`."""
    try:
        return float(env[KEEPALIVE_ENV])
    except (KeyError, ValueError):
        return SERVER_KEEPALIVE_S


def client_session(request_timeout_s: float, server_keepalive: float):
    """The aiohttp session of a load run, a warm-up or a /metrics sampler.

    No limit on connections (the open loop bounds what is in flight itself). An idle connection
    is reused only within a fifth of the server's keep-alive, then closed by the client: aiohttp
    keeps one for 15 s by default, and a request written as the server closes its connection
    fails (aiohttp's "Server disconnected", "Connection reset by peer" or "Can not write request
    body"; a POST is not retried). Against a real vLLM server 3 of 30 bursts of 4 requests sent
    4.97-5.03 s after the last failed so; none with this pool (docs/serving.md).
    """
    import aiohttp

    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=request_timeout_s),
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=server_keepalive / 5),
    )


def vllm_arrivals(seed: int) -> Arrivals:
    """Arrival times from ``vllm.benchmarks.serve.get_request`` (seeded: it draws from numpy's
    global generator)."""
    from vllm.benchmarks.serve import get_request

    np.random.seed(seed)

    async def arrivals(n: int, rate: float, burstiness: float):
        async for _ in get_request([None] * n, rate, burstiness):
            yield None

    return arrivals


def vllm_sender(
    api_url: str, model: str, output_tokens: int, session, extra_body: dict | None = None
) -> Sender:
    """Sends one request through vLLM's streaming OpenAI-completions request function.

    Greedy (temperature 0) and exactly ``output_tokens`` new tokens (``ignore_eos`` plus
    ``min_tokens``), as the offline backends generate; the prompt is sent as token ids.
    """
    from vllm.benchmarks.lib.endpoint_request_func import ASYNC_REQUEST_FUNCS, RequestFuncInput

    request_func = ASYNC_REQUEST_FUNCS["vllm"]
    body = {"temperature": 0.0, "min_tokens": output_tokens, **(extra_body or {})}

    async def send(i: int, prompt: list[int]) -> RequestRecord:
        inp = RequestFuncInput(
            prompt=list(prompt),
            api_url=api_url,
            prompt_len=len(prompt),
            output_len=output_tokens,
            model=model,
            ignore_eos=True,
            extra_body=body,
        )
        try:
            out = await request_func(request_func_input=inp, session=session)
        except Exception as exc:  # the request function catches its own; be safe anyway
            return RequestRecord(
                i, time.perf_counter(), len(prompt), error=f"{type(exc).__name__}: {exc}"
            )
        return RequestRecord(
            index=i,
            send_s=out.start_time,
            prompt_tokens=out.prompt_len or len(prompt),
            success=bool(out.success),
            ttft_s=out.ttft if out.success else None,
            itl_s=list(out.itl),
            latency_s=out.latency if out.success else None,
            generated_tokens=int(out.output_tokens or 0),
            error=((out.error or "request failed")[-2000:]) if not out.success else "",
        )

    return send


async def greedy_tokens(session, base_url: str, model: str, prompts: list[list[int]],
                        output_tokens: int) -> list[list[int] | None]:  # fmt: skip
    """Token ids the server generates for each prompt, greedy and unstreamed (vLLM's
    ``return_token_ids``); None where the server gives no token ids."""
    out = []
    for prompt in prompts:
        body = {
            "model": model, "prompt": prompt, "max_tokens": output_tokens,
            "min_tokens": output_tokens, "ignore_eos": True, "temperature": 0.0,
            "return_token_ids": True,
        }  # fmt: skip
        async with session.post(f"{base_url}/v1/completions", json=body) as resp:
            data = await resp.json(content_type=None)
        choice = (data.get("choices") or [{}])[0]
        out.append(list(choice["token_ids"]) if choice.get("token_ids") else None)
    return out


class Watchdog:
    """The client's own bound on a stall: if it is not re-armed within ``seconds`` (a hung event
    loop, a deadlock, a blocking call), every thread's traceback goes to the rule's log and the
    process exits 1 (``faulthandler``: works even while a C call holds the GIL); the measure step
    then stops the server with the rest of the job."""

    def __init__(self, seconds: float):
        self.seconds = float(seconds)

    def arm(self, seconds: float | None = None) -> None:
        faulthandler.dump_traceback_later(seconds or self.seconds, exit=True, file=sys.stderr)

    def disarm(self) -> None:
        faulthandler.cancel_dump_traceback_later()


class ServedGpus:
    """The backend hooks of energysweep.measure.monitor.JobMonitor for a serving client: it
    measures every GPU of the job, which the server's workers use: the first ``n_gpus`` (the
    layout's tp x pp x dp) of CUDA_VISIBLE_DEVICES, as the engine places its workers (outside
    Slurm every GPU of the node is visible; the job's are the first)."""

    def __init__(self, n_gpus: int):
        self.n_gpus = n_gpus

    def gpu_uuids(self) -> list[str]:
        """The job's GPUs by UUID; empty where NVML cannot be read (the source says why)."""
        from energysweep.hw import nvml as hw_nvml

        try:
            hw_nvml.init()
        except hw_nvml.NVMLError as exc:
            print(f"serving: no GPU energy: NVML: {exc}", flush=True)
            return []
        try:
            visible = hw_nvml.resolve_visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"))
        finally:
            hw_nvml.shutdown()
        return visible[: self.n_gpus]

    @staticmethod
    def wrap_energy_source(source):
        source.load_goes_on_after_end()  # the load runs until the end edge's counters are read
        return source
