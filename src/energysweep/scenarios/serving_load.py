"""One load run against a server: arrivals, the steady-state window, and what each request saw.

A load run sends requests at one load point and brackets one energy window on its steady state:

- **arrivals**: ``rate`` points draw inter-arrival times from vLLM's own load generator
  (``vllm.benchmarks.serve.get_request``: Poisson, or gamma with ``burstiness``);
  ``concurrency`` points keep exactly C requests in flight (a closed loop: a client sends its
  next request when its last one finished, as ``vllm bench serve --max-concurrency`` does);
- **requests**: vLLM's streaming request function (``vllm.benchmarks.lib.
  endpoint_request_func``, OpenAI completions API) times each request: send time, time to first
  token, every inter-token latency, end-to-end latency, and the server's token counts;
- **ramp**: the window opens once ``ramp_requests`` requests have finished (by then the server has
  admitted, run and retired that many, so its batch has filled and turned over once);
- **window**: it closes when it has lasted ``min_window_s`` *and* at least ``min_requests``
  requests finished inside it; no request is sent after it closed;
- **drain**: the requests still in flight are awaited (bounded by their own timeout) and recorded,
  outside the window.

``on_open``/``on_close`` are called at the window's edges (they read the energy counters, the
server's CPU time and its /metrics counters); nothing else runs between them but the load.
:func:`window_stats` then counts what happened inside the window from the request records:
requests finished, tokens emitted (each token placed at the time its chunk arrived), prompt
tokens of requests whose first token came inside it, and latency percentiles.

The request sender and the arrival generator are arguments, so the loop is tested without a
server (tests/unit/test_serving_load.py); :func:`vllm_sender` and :func:`vllm_arrivals` are the
real ones.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np

RATE, CONCURRENCY = "rate", "concurrency"
# Arrivals drawn per call of the arrival generator (get_request normalises each chunk's total
# delay to chunk / rate, so the mean rate is exact per chunk).
ARRIVAL_CHUNK = 256


@dataclass(frozen=True)
class LoadPoint:
    """One load level: ``rate`` requests/s (``burstiness`` 1 = Poisson) or ``concurrency`` C."""

    mode: str
    level: float
    burstiness: float | None = None

    def __post_init__(self):
        if self.mode not in (RATE, CONCURRENCY):
            raise ValueError(f"load mode {self.mode!r}: expected {RATE} or {CONCURRENCY}")
        if not self.level > 0:
            raise ValueError(f"load level must be > 0, got {self.level}")

    @property
    def key(self) -> str:
        """The point's ``load`` key: ``rate=2`` / ``rate=2,burstiness=0.5`` / ``concurrency=4``."""
        level = f"{self.level:g}"
        if self.mode == CONCURRENCY:
            return f"{CONCURRENCY}={int(self.level)}"
        if self.burstiness is not None and self.burstiness != 1:
            return f"{RATE}={level},burstiness={self.burstiness:g}"
        return f"{RATE}={level}"


@dataclass
class RequestRecord:
    """What one request saw, on the client's monotonic clock (seconds)."""

    index: int
    send_s: float
    prompt_tokens: int
    success: bool = False
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    latency_s: float | None = None
    output_tokens: int = 0
    error: str = ""

    @property
    def end_s(self) -> float | None:
        return None if self.latency_s is None else self.send_s + self.latency_s

    @property
    def first_token_s(self) -> float | None:
        return None if self.ttft_s is None else self.send_s + self.ttft_s

    @property
    def tpot_s(self) -> float | None:
        """(e2e - TTFT) / (n - 1), as vLLM's benchmark computes it; None for n < 2."""
        if not self.success or self.output_tokens < 2 or self.ttft_s is None:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)

    def token_times(self) -> list[float]:
        """When each output token arrived: one per streamed chunk; a chunk that carried several
        tokens (the server's count exceeds the chunks) puts the rest at the last chunk."""
        if not self.success or self.ttft_s is None:
            return []
        times = [self.send_s + self.ttft_s]
        for gap in self.itl_s:
            times.append(times[-1] + gap)
        extra = self.output_tokens - len(times)
        return times + [times[-1]] * extra if extra > 0 else times[: max(self.output_tokens, 1)]


@dataclass
class LoadRun:
    """A finished load run: its records, the window's edges (monotonic s) and edge readings."""

    point: LoadPoint
    records: list[RequestRecord]
    first_send_s: float
    open_s: float | None
    close_s: float | None
    last_end_s: float
    opened: object = None
    closed: object = None
    wall_offset_ns: int = 0  # wall ns = monotonic s * 1e9 + this

    def wall_ns(self, t: float) -> int:
        return int(round(t * 1e9)) + self.wall_offset_ns

    @property
    def ramp_s(self) -> float | None:
        return None if self.open_s is None else self.open_s - self.first_send_s

    @property
    def drain_s(self) -> float | None:
        return None if self.close_s is None else max(0.0, self.last_end_s - self.close_s)


class _Window:
    """The ramp/window state machine, advanced at every request's end."""

    def __init__(self, ramp_requests: int, min_window_s: float, min_requests: int, clock,
                 on_open, on_close):
        self.ramp = max(1, ramp_requests)
        self.min_window_s = min_window_s
        self.min_requests = max(1, min_requests)
        self.clock = clock
        self.on_open, self.on_close = on_open, on_close
        self.finished = 0
        self.in_window = 0
        self.open_s: float | None = None
        self.close_s: float | None = None
        self.opened = self.closed = None
        self.closed_event = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None

    def request_done(self) -> None:
        self.finished += 1
        if self.close_s is not None:
            return
        if self.open_s is None:
            if self.finished >= self.ramp:
                self.open_s = self.clock()
                self.opened = self.on_open()
                self._timer = asyncio.get_running_loop().call_later(self.min_window_s, self.check)
            return
        self.in_window += 1
        self.check()

    def check(self) -> None:
        if self.close_s is not None or self.open_s is None:
            return
        long_enough = self.clock() - self.open_s >= self.min_window_s
        if long_enough and self.in_window >= self.min_requests:
            self.close_s = self.clock()
            self.closed_event.set()  # no request is sent after this
            self.closed = self.on_close()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


Sender = Callable[[int, list[int]], Awaitable[RequestRecord]]
Arrivals = Callable[[int, float, float], AsyncIterator[None]]


async def run_load(
    point: LoadPoint,
    prompts: list[list[int]],
    send: Sender,
    arrivals: Arrivals,
    on_open: Callable[[], object],
    on_close: Callable[[], object],
    *,
    ramp_requests: int,
    min_window_s: float,
    min_requests: int,
    clock=time.perf_counter,
    progress: Callable[[], None] | None = None,
) -> LoadRun:
    """Run one load point (module docstring) and return its records and window.

    Args:
        point: the load level.
        prompts: token-id prompts, used in turn (request i gets ``prompts[i % len]``).
        send: sends request ``i`` with its prompt and returns its record (never raises).
        arrivals: ``arrivals(n, rate, burstiness)`` yields once per arrival, sleeping between
            them (:func:`vllm_arrivals`); used by ``rate`` points.
        on_open, on_close: called at the window's edges; their results are kept.
        ramp_requests: requests that must finish before the window opens.
        min_window_s, min_requests: the window's shortest length and fewest finished requests.
        progress: called as requests finish (a liveness heartbeat).
    """
    wall_offset = time.time_ns() - int(round(clock() * 1e9))
    win = _Window(ramp_requests, min_window_s, min_requests, clock, on_open, on_close)
    records: list[RequestRecord] = []
    tasks: set[asyncio.Task] = set()

    async def one(i: int) -> None:
        rec = await send(i, prompts[i % len(prompts)])
        records.append(rec)
        win.request_done()
        if progress is not None:
            progress()

    def launch(i: int) -> asyncio.Task:
        task = asyncio.create_task(one(i))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return task

    first_send = clock()
    if point.mode == CONCURRENCY:
        await _closed_loop(int(point.level), launch, win)
    else:
        await _open_loop(point, arrivals, launch, win)
    win.cancel()
    if tasks:
        await asyncio.gather(*list(tasks))
    records.sort(key=lambda r: r.index)
    last_end = max([r.end_s for r in records if r.end_s is not None] or [first_send])
    return LoadRun(point, records, first_send, win.open_s, win.close_s, last_end, win.opened,
                   win.closed, wall_offset)


async def _open_loop(point: LoadPoint, arrivals: Arrivals, launch, win: _Window) -> None:
    """Rate points: send at the generator's arrival times until the window closes."""
    i = 0
    burstiness = 1.0 if point.burstiness is None else point.burstiness
    while not win.closed_event.is_set():
        async for _ in arrivals(ARRIVAL_CHUNK, point.level, burstiness):
            if win.closed_event.is_set():
                return
            launch(i)
            i += 1


async def _closed_loop(clients: int, launch, win: _Window) -> None:
    """Concurrency points: ``clients`` requests in flight until the window closes."""
    counter = iter(range(1 << 62))

    async def client() -> None:
        while not win.closed_event.is_set():
            await launch(next(counter))

    await asyncio.gather(*(client() for _ in range(clients)))


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def window_stats(run: LoadRun, slo_ttft_s: float | None, slo_tpot_s: float | None) -> dict:
    """What happened inside ``run``'s window, from its request records.

    A request counts as *completed* in the window if it ended inside it, its prompt tokens count
    if its first token came inside it, and each output token counts where it arrived. Latency
    percentiles are over the requests completed in the window. A request meets the SLO when its
    TTFT and TPOT are within them (a TPOT of a one-token request counts as 0, as vLLM's goodput
    does).
    """
    lo, hi = run.open_s, run.close_s
    if lo is None or hi is None:
        raise ValueError("the load run has no window")

    def inside(t):
        return t is not None and lo <= t <= hi

    done = [r for r in run.records if r.success and inside(r.end_s)]
    tokens_out = sum(sum(lo <= t <= hi for t in r.token_times()) for r in run.records)
    tokens_in = sum(r.prompt_tokens for r in run.records if r.success and inside(r.first_token_s))
    ttfts = [r.ttft_s for r in done]
    tpots = [r.tpot_s for r in done if r.tpot_s is not None]
    itls = [g for r in done for g in r.itl_s]
    e2es = [r.latency_s for r in done]
    met = sum(
        (slo_ttft_s is None or r.ttft_s <= slo_ttft_s)
        and (slo_tpot_s is None or (r.tpot_s or 0.0) <= slo_tpot_s)
        for r in done
    )
    duration = hi - lo
    return {
        "window_s": duration,
        "requests": len(done),
        "input_tokens": tokens_in,
        "output_tokens": tokens_out,
        "requests_sent": len(run.records),
        "request_errors": sum(not r.success for r in run.records),
        "sent_in_window": sum(inside(r.send_s) for r in run.records),
        "arrival_rate_rps": sum(inside(r.send_s) for r in run.records) / duration,
        "achieved_rate_rps": len(done) / duration,
        "slo_met_requests": int(met),
        **{f"ttft_p{q}_s": _pct(ttfts, q) for q in (50, 99)},
        **{f"tpot_p{q}_s": _pct(tpots, q) for q in (50, 99)},
        **{f"itl_p{q}_s": _pct(itls, q) for q in (50, 99)},
        **{f"e2e_p{q}_s": _pct(e2es, q) for q in (50, 99)},
    }


def request_phase(run: LoadRun, rec: RequestRecord) -> str:
    """``ramp`` (sent before the window), ``window`` (sent in it), or ``drain`` (after it)."""
    if run.open_s is None or rec.send_s < run.open_s:
        return "ramp"
    if run.close_s is None or rec.send_s <= run.close_s:
        return "window"
    return "drain"


# ---------------------------------------------------------------- vLLM's load generator, real
def vllm_arrivals(seed: int) -> Arrivals:
    """Arrival times from ``vllm.benchmarks.serve.get_request`` (seeded: it draws from numpy's
    global generator)."""
    from vllm.benchmarks.serve import get_request

    np.random.seed(seed)

    async def arrivals(n: int, rate: float, burstiness: float):
        async for _ in get_request([None] * n, rate, burstiness):
            yield None

    return arrivals


def vllm_sender(api_url: str, model: str, output_tokens: int, session,
                extra_body: dict | None = None) -> Sender:
    """Sends one request through vLLM's streaming OpenAI-completions request function.

    Greedy (temperature 0) and exactly ``output_tokens`` new tokens (``ignore_eos`` plus
    ``min_tokens``), as the offline backends generate; the prompt is sent as token ids.
    """
    from vllm.benchmarks.lib.endpoint_request_func import ASYNC_REQUEST_FUNCS, RequestFuncInput

    request_func = ASYNC_REQUEST_FUNCS["vllm"]
    body = {"temperature": 0.0, "min_tokens": output_tokens, **(extra_body or {})}

    async def send(i: int, prompt: list[int]) -> RequestRecord:
        inp = RequestFuncInput(
            prompt=list(prompt), api_url=api_url, prompt_len=len(prompt),
            output_len=output_tokens, model=model, ignore_eos=True, extra_body=body,
        )
        try:
            out = await request_func(request_func_input=inp, session=session)
        except Exception as exc:  # the request function catches its own; be safe anyway
            return RequestRecord(i, time.perf_counter(), len(prompt),
                                 error=f"{type(exc).__name__}: {exc}")
        return RequestRecord(
            index=i, send_s=out.start_time, prompt_tokens=out.prompt_len or len(prompt),
            success=bool(out.success), ttft_s=out.ttft if out.success else None,
            itl_s=list(out.itl), latency_s=out.latency if out.success else None,
            output_tokens=int(out.output_tokens or 0),
            error=((out.error or "request failed")[-2000:]) if not out.success else "",
        )

    return send
