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
  requests finished inside it. The load goes on at its level until the close edge's counters
  are read (they wait for the GPU counters' next refreshes, after the edge: the edge correction
  then sees the window's own power, not the drain's), then no request is sent;
- **drain**: the earliest ``capacity`` requests still in flight (those the engine was running,
  first come first served) are awaited; the rest, still queued, are cancelled (recorded, never
  counted as errors): all outside the window.

``on_open``/``on_close`` are the window's edges (they wait for the energy counters' refreshes and
read them, the server's CPU time and its /metrics counters). They run in a worker thread, so the
event loop goes on sending requests and timing what the server sends back while they wait; each
stamps its edge (``mark``) on the load's clock, and that stamp is the window's edge for
everything: requests, tokens, rates, SLO hits, queue samples and energy. The window lasts at
least ``min_window_s`` from the open stamp.
:func:`.stats.window_stats` then counts what happened inside the window from the
request records: requests finished, tokens emitted (each token placed at the time its chunk
arrived), prompt tokens of requests whose first token came inside it, latency percentiles.

The request sender and the arrival generator are arguments, so the loop is tested without a
server (tests/unit/test_serving_load.py); the real ones are in :mod:`.client`, the window's
statistics in :mod:`.stats`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

RATE, CONCURRENCY = "rate", "concurrency"
# Arrivals drawn per call of the arrival generator (get_request normalises each chunk's total
# delay to chunk / rate, so the mean rate is exact per chunk).
ARRIVAL_CHUNK = 256
# An open loop sends at most this many requests in flight per request the engine runs at once
# (and at least MIN_IN_FLIGHT); arrivals beyond are dropped and counted as offered load the
# server did not take: a stalled server is not sent thousands of connections.
IN_FLIGHT_PER_SLOT = 64
MIN_IN_FLIGHT = 1024


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
    generated_tokens: int = 0  # output tokens the server returned
    error: str = ""
    finished_s: float | None = None  # when the client saw it end, success or failure
    cancelled: bool = False  # still queued when the window's running requests had ended

    @property
    def end_s(self) -> float | None:
        return None if self.latency_s is None else self.send_s + self.latency_s

    @property
    def first_token_s(self) -> float | None:
        return None if self.ttft_s is None else self.send_s + self.ttft_s

    @property
    def tpot_s(self) -> float | None:
        """(e2e - TTFT) / (n - 1), as vLLM's benchmark computes it; None for n < 2."""
        if not self.success or self.generated_tokens < 2:
            return None
        if self.ttft_s is None or self.latency_s is None:
            return None
        return (self.latency_s - self.ttft_s) / (self.generated_tokens - 1)

    def token_times(self) -> list[float]:
        """When each output token arrived: one per streamed chunk; a chunk that carried several
        tokens (the server's count exceeds the chunks) puts the rest at the last chunk."""
        if not self.success or self.ttft_s is None:
            return []
        times = [self.send_s + self.ttft_s]
        for gap in self.itl_s:
            times.append(times[-1] + gap)
        extra = self.generated_tokens - len(times)
        return times + [times[-1]] * extra if extra > 0 else times[: max(self.generated_tokens, 1)]


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
    dropped_s: list[float] = field(default_factory=list)  # arrivals not sent (in-flight bound)

    def wall_ns(self, t: float) -> int:
        return int(round(t * 1e9)) + self.wall_offset_ns

    @property
    def ramp_s(self) -> float | None:
        return None if self.open_s is None else self.open_s - self.first_send_s

    @property
    def drain_s(self) -> float | None:
        return None if self.close_s is None else max(0.0, self.last_end_s - self.close_s)


class _Window:
    """The ramp/window state machine, advanced at every request's end.

    The edges' work (``on_open``/``on_close``: waiting for counter refreshes, reading counters)
    runs in a worker thread, never on the event loop: requests go on being sent, served and
    timed while it runs. Each edge function calls its ``mark`` once, at the edge itself; the
    window is [open mark, close mark], for the requests as for the energy.
    """

    def __init__(
        self, ramp_requests: int, min_window_s: float, min_requests: int, clock, on_open, on_close
    ):
        self.ramp = max(1, ramp_requests)
        self.min_window_s = min_window_s
        self.min_requests = max(1, min_requests)
        self.clock = clock
        self.on_open, self.on_close = on_open, on_close
        self.ends: list[float] = []  # when each request finished (client's clock)
        self.in_window = 0
        self.open_s: float | None = None
        self.close_s: float | None = None
        self.opened: object = None  # what the edges' work returned
        self.closed: object = None
        self.closing = False  # the window is due to close: its close edge is being read
        self.closed_event = asyncio.Event()  # the close edge is read: nothing more is sent
        self._edges: list[asyncio.Future] = []
        self._timer: asyncio.TimerHandle | None = None

    def request_done(self, t: float) -> None:
        self.ends.append(t)
        if not self._edges and len(self.ends) >= self.ramp:
            self._edges.append(asyncio.ensure_future(self._open()))
        elif self.open_s is not None and self.close_s is None:
            self.in_window += 1
            self.check()

    async def _edge(self, work) -> tuple[float, object]:
        """Runs ``work(mark)`` in a worker thread; the clock at its mark, and its result."""
        marks: list[float] = []

        def mark() -> None:
            marks.append(self.clock())

        result = await asyncio.get_running_loop().run_in_executor(None, work, mark)
        if len(marks) != 1:
            raise RuntimeError(f"a window edge marked {len(marks)} times (expected once)")
        return marks[0], result

    async def _open(self) -> None:
        try:
            open_s, self.opened = await self._edge(self.on_open)
        except BaseException:
            self.closed_event.set()  # no window: stop sending (run_load raises the error)
            raise
        self.open_s = open_s
        self.in_window = sum(t >= open_s for t in self.ends)  # ended while the edge was read
        wait = max(0.0, self.min_window_s - (self.clock() - open_s))
        self._timer = asyncio.get_running_loop().call_later(wait, self.check)
        self.check()

    def check(self) -> None:
        if self.closing or self.closed_event.is_set() or self.open_s is None:
            return
        long_enough = self.clock() - self.open_s >= self.min_window_s
        if long_enough and self.in_window >= self.min_requests:
            self.closing = True
            self._edges.append(asyncio.ensure_future(self._close()))

    async def _close(self) -> None:
        try:
            self.close_s, self.closed = await self._edge(self.on_close)
        finally:
            self.closed_event.set()  # the load stops once the close edge is read

    async def edges_done(self) -> None:
        """Awaits the edges' work (an edge's error is raised here)."""
        if self._timer is not None:
            self._timer.cancel()
        await asyncio.gather(*self._edges)


Sender = Callable[[int, list[int]], Awaitable[RequestRecord]]
Arrivals = Callable[[int, float, float], AsyncIterator[None]]
# A window edge's work: blocking, run in a worker thread; calls its argument once, at the edge.
Edge = Callable[[Callable[[], None]], object]


async def run_load(
    point: LoadPoint,
    prompts: list[list[int]],
    send: Sender,
    arrivals: Arrivals,
    on_open: Edge,
    on_close: Edge,
    *,
    ramp_requests: int,
    min_window_s: float,
    min_requests: int,
    capacity: int,
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
        on_open, on_close: the window's edges (:data:`Edge`: run in a worker thread, each calls
            its ``mark`` at the edge); their results are kept.
        ramp_requests: requests that must finish before the window opens.
        min_window_s, min_requests: the window's shortest length and fewest finished requests.
        capacity: requests the engine runs at once (batch cap x dp): the drain's bound.
        progress: called as requests finish (a liveness heartbeat).
    """
    wall_offset = time.time_ns() - int(round(clock() * 1e9))
    win = _Window(ramp_requests, min_window_s, min_requests, clock, on_open, on_close)
    records: list[RequestRecord] = []
    tasks: dict[int, asyncio.Task] = {}  # in flight, by index (= send order)

    async def one(i: int) -> None:
        prompt = prompts[i % len(prompts)]
        sent = clock()
        try:
            rec = await send(i, prompt)
        except asyncio.CancelledError:  # cancelled in the drain: never ran inside the window
            rec = RequestRecord(i, sent, len(prompt), error="cancelled at drain", cancelled=True)
        rec.finished_s = clock()
        records.append(rec)
        tasks.pop(i, None)
        if not rec.cancelled:
            win.request_done(rec.finished_s)
        if progress is not None:
            progress()

    def launch(i: int) -> asyncio.Task:
        task = tasks[i] = asyncio.create_task(one(i))
        return task

    first_send = clock()
    dropped: list[float] = []
    if point.mode == CONCURRENCY:
        await _closed_loop(int(point.level), launch, win)
    else:
        bound = max(MIN_IN_FLIGHT, IN_FLIGHT_PER_SLOT * capacity)
        await _open_loop(point, arrivals, _bounded(launch, tasks, bound, dropped, clock), win)
    await win.edges_done()
    await _drain(tasks, capacity)
    records.sort(key=lambda r: r.index)
    last_end = max([r.finished_s for r in records] or [first_send])
    return LoadRun(
        point,
        records,
        first_send,
        win.open_s,
        win.close_s,
        last_end,
        win.opened,
        win.closed,
        wall_offset,
        dropped,
    )


def _bounded(launch, in_flight: dict, bound: int, dropped: list[float], clock):
    """``launch`` as an open loop offers it: an arrival while ``bound`` requests are in flight
    is not sent; its time goes to ``dropped`` (offered load the server did not take on)."""

    def offer(i: int) -> None:
        if len(in_flight) < bound:
            launch(i)
        else:
            dropped.append(clock())

    return offer


async def _drain(tasks: dict[int, asyncio.Task], capacity: int) -> None:
    """Await the ``capacity`` earliest requests in flight when the window closed, then cancel
    the rest. Engines schedule first come, first served, so those are the requests that were
    running; the rest were queued behind them and produced nothing inside the window. An
    overloaded server's queue is dropped instead of served for minutes."""
    running = [tasks[i] for i in sorted(tasks)[:capacity]]
    if running:
        await asyncio.gather(*running)
    rest = list(tasks.values())
    for task in rest:
        task.cancel()
    if rest:
        await asyncio.gather(*rest)


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
    """Concurrency points: ``clients`` requests in flight until the window closes (a request in
    flight then is left to the drain)."""
    counter = iter(range(1 << 62))
    closed = asyncio.ensure_future(win.closed_event.wait())

    async def client() -> None:
        while not win.closed_event.is_set():
            task = launch(next(counter))
            await asyncio.wait([task, closed], return_when=asyncio.FIRST_COMPLETED)

    try:
        await asyncio.gather(*(client() for _ in range(clients)))
    finally:
        closed.cancel()
