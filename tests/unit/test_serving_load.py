"""The serving client's load runs, windows and probes, without a server: a fake sender and
arrival generator drive energysweep.scenarios.serving.load's real loop."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from energysweep.scenarios.serving.load import (
    CONCURRENCY,
    RATE,
    LoadPoint,
    LoadRun,
    RequestRecord,
    run_load,
)
from energysweep.scenarios.serving.probes import (
    QueueSamples,
    ServerCpuTime,
    parse_metrics,
    queue_time_mean_s,
)
from energysweep.scenarios.serving.stats import queued, request_phase, window_stats


def test_load_point_keys_and_checks():
    assert LoadPoint(RATE, 2.0).key == "rate=2"
    assert LoadPoint(RATE, 0.5, 1.0).key == "rate=0.5"
    assert LoadPoint(RATE, 4.0, 0.5).key == "rate=4,burstiness=0.5"
    assert LoadPoint(CONCURRENCY, 8.0).key == "concurrency=8"
    with pytest.raises(ValueError, match="load mode"):
        LoadPoint("batch", 1.0)
    with pytest.raises(ValueError, match="> 0"):
        LoadPoint(RATE, 0.0)


class FakeServer:
    """Sends take ``latency`` s each, at most ``slots`` at once (the rest wait): 4 tokens."""

    def __init__(self, latency: float, slots: int):
        self.latency = latency
        self.sem = asyncio.Semaphore(slots)
        self.in_flight = self.max_in_flight = 0
        self.sent_at: list[float] = []

    async def send(self, i: int, prompt: list[int]) -> RequestRecord:
        t0 = time.perf_counter()
        self.sent_at.append(t0)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        async with self.sem:
            await asyncio.sleep(self.latency)
        self.in_flight -= 1
        lat = time.perf_counter() - t0
        return RequestRecord(i, t0, len(prompt), True, lat * 0.4, [lat * 0.2] * 3, lat, 4)


def even_arrivals(n: int, rate: float, burstiness: float):
    async def gen():
        for _ in range(n):
            await asyncio.sleep(1.0 / rate)
            yield None

    return gen()


def _run(point, server, capacity=64, **kw):
    edges = []

    def on_open():
        edges.append(("open", time.perf_counter()))
        return "opened"

    def on_close():
        edges.append(("close", time.perf_counter()))
        return "closed"

    run = asyncio.run(run_load(point, [[1, 2, 3]], server.send, even_arrivals, on_open,
                               on_close, capacity=capacity, **kw))  # fmt: skip
    return run, edges


def test_rate_run_ramps_then_holds_the_window_then_drains():
    server = FakeServer(latency=0.02, slots=8)
    run, edges = _run(LoadPoint(RATE, 100.0), server, ramp_requests=5, min_window_s=0.3,
                      min_requests=10)  # fmt: skip
    assert [e[0] for e in edges] == ["open", "close"]
    assert run.opened == "opened" and run.closed == "closed"
    # The window opened once 5 requests had finished: after the ramp, never before.
    ends = sorted(r.finished_s for r in run.records)
    assert ends[4] <= run.open_s < ends[5]
    assert run.close_s - run.open_s >= 0.3 and run.ramp_s > 0
    # Nothing is sent after the window closed; every request sent is awaited (the drain).
    assert max(r.send_s for r in run.records) <= run.close_s
    assert len(run.records) == len(server.sent_at) and all(r.success for r in run.records)
    assert [r.index for r in run.records] == list(range(len(run.records)))
    assert run.last_end_s >= run.close_s and run.drain_s >= 0


def test_concurrency_run_keeps_exactly_c_requests_in_flight():
    server = FakeServer(latency=0.01, slots=64)
    run, _ = _run(LoadPoint(CONCURRENCY, 6.0), server, ramp_requests=6, min_window_s=0.2,
                  min_requests=6)  # fmt: skip
    assert server.max_in_flight == 6
    assert len(run.records) > 30


def test_an_overloaded_run_drains_the_running_requests_and_cancels_the_queue():
    server = FakeServer(latency=0.05, slots=2)  # 40 requests/s at most, offered 200
    run, _ = _run(LoadPoint(RATE, 200.0), server, capacity=2, ramp_requests=2,
                  min_window_s=0.3, min_requests=4)  # fmt: skip
    cancelled = [r for r in run.records if r.cancelled]
    assert len(cancelled) > 10 and all(not r.success and r.error for r in cancelled)
    # The two earliest requests in flight at the close (the running ones) ended normally.
    at_close = sorted((r for r in run.records if r.send_s <= run.close_s < r.finished_s),
                      key=lambda r: r.index)  # fmt: skip
    assert all(r.success for r in at_close[:2])
    # Behind them only what the engine admitted while they ended; the queue is cancelled.
    assert sum(r.success for r in at_close[2:]) <= 2 and len(at_close) > 10
    assert run.drain_s < 1.0  # not the 2+ s the queue would take to serve
    st = window_stats(run, None, None, capacity=2)
    assert st["requests_cancelled"] == len(cancelled) and st["request_errors"] == 0
    assert st["load_sustained"] < 0.5
    # A closed loop leaves its last requests to the drain too.
    server = FakeServer(latency=0.05, slots=2)
    run, _ = _run(LoadPoint(CONCURRENCY, 12.0), server, capacity=2, ramp_requests=2,
                  min_window_s=0.2, min_requests=2)  # fmt: skip
    in_flight = [r for r in run.records if r.send_s <= run.close_s < r.finished_s]
    assert len(in_flight) >= 8 and server.max_in_flight == 12
    assert sum(r.cancelled for r in run.records) >= len(in_flight) - 4


def test_the_window_waits_for_its_minimum_requests():
    server = FakeServer(latency=0.05, slots=1)  # 20 requests/s at most
    run, _ = _run(LoadPoint(CONCURRENCY, 1.0), server, ramp_requests=1, min_window_s=0.01,
                  min_requests=5)  # fmt: skip
    inside = [r for r in run.records if run.open_s < r.finished_s <= run.close_s]
    assert len(inside) >= 5 and run.close_s - run.open_s >= 0.2


def _record(i, send, ttft, gaps, ok=True, prompt=10, done=None):
    lat = ttft + sum(gaps)
    rec = RequestRecord(i, send, prompt, ok, ttft if ok else None, list(gaps), lat if ok else None,
                        1 + len(gaps) if ok else 0, "" if ok else "boom")  # fmt: skip
    rec.finished_s = send + lat if done is None else done
    return rec


def test_window_stats_count_what_happened_inside_the_window():
    recs = [
        _record(0, 0.0, 0.5, [0.5, 0.5]),  # tokens at 0.5, 1.0, 1.5; ends at 1.5
        _record(1, 1.2, 0.2, [0.2, 0.2]),  # tokens at 1.4, 1.6, 1.8; ends at 1.8 (inside)
        _record(2, 2.5, 0.4, [1.0]),  # first token 2.9 (after the window), ends 3.9
        _record(3, 1.1, 0, [], ok=False, done=1.3),  # failed
    ]
    run = LoadRun(LoadPoint(RATE, 2.0), recs, 0.0, 1.0, 2.0, 3.9)
    st = window_stats(run, slo_ttft_s=0.3, slo_tpot_s=None, capacity=4)
    assert st["requests"] == 2 and st["window_s"] == 1.0
    assert st["output_tokens"] == 2 + 3  # 1.0, 1.5 of request 0; 1.4, 1.6, 1.8 of request 1
    assert st["input_tokens"] == 10  # only request 1's first token came inside
    assert st["request_errors"] == 1 and st["requests_sent"] == 4
    assert st["arrival_rate_rps"] == 2.0 and st["achieved_rate_rps"] == 2.0
    assert st["slo_met_requests"] == 1  # request 0's TTFT 0.5 s misses 0.3 s
    assert st["ttft_p50_s"] == pytest.approx(0.35) and st["e2e_p99_s"] == pytest.approx(1.5, 0.01)
    assert st["tpot_p50_s"] == pytest.approx(0.35)  # (1.5-0.5)/2 and (0.6-0.2)/2
    assert st["load_sustained"] == 1.0  # never more than 4 in flight: no queue
    assert [request_phase(run, r) for r in recs] == ["ramp", "window", "drain", "window"]


def test_load_sustained_is_the_share_of_arrivals_the_server_took_on():
    # 40 arrivals in a 1 s window, a server finishing 10 of them: 30 more are queued at the end.
    recs = [_record(i, 0.5 + i * 0.025, 0.01, [0.01], done=None) for i in range(40)]
    for k, r in enumerate(recs):
        r.finished_s = 0.6 + k * 0.1  # one every 100 ms
        r.latency_s = r.finished_s - r.send_s
    run = LoadRun(LoadPoint(RATE, 40.0), recs, 0.5, 0.5, 1.5, recs[-1].finished_s)
    assert queued(run, 0.5, capacity=2) == 0
    st = window_stats(run, None, None, capacity=2)
    assert st["load_sustained"] == pytest.approx(1 - (queued(run, 1.5, 2) - 0) / 40)
    assert st["load_sustained"] < 0.5


def test_parse_metrics_sums_label_sets_and_skips_comments():
    text = (
        "# HELP vllm:num_requests_running Number of requests\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 3.0\n'
        'vllm:num_requests_waiting{engine="0"} 7.0\n'
        "vllm:request_queue_time_seconds_sum 1.5\n"
        "vllm:request_queue_time_seconds_count 3.0\n"
        "other_metric 9\n"
    )
    wanted = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting",
              "queue_time_sum": "vllm:request_queue_time_seconds_sum",
              "queue_time_count": "vllm:request_queue_time_seconds_count"}  # fmt: skip
    got = parse_metrics(text, wanted)
    assert got == {"running": 5.0, "waiting": 7.0, "queue_time_sum": 1.5, "queue_time_count": 3.0}
    later = {**got, "queue_time_sum": 3.5, "queue_time_count": 7.0}
    assert queue_time_mean_s(got, later) == pytest.approx(0.5)
    assert queue_time_mean_s(got, None) is None and queue_time_mean_s(got, got) is None


def test_queue_samples_are_summarised_over_the_window_only():
    q = QueueSamples()
    for t, run, wait in ((0.5, 9, 9), (1.0, 2, 0), (1.5, 4, 2), (2.5, 9, 9)):
        q.add(t, {"running": run, "waiting": wait})
    q.add(1.2, {"running": 1})  # incomplete sample: not kept
    w = q.window(1.0, 2.0)
    assert w == {"achieved_concurrency": 3.0, "queue_waiting_mean": 1.0,
                 "queue_waiting_max": 2, "queue_samples": 2}  # fmt: skip
    assert q.window(3.0, 4.0)["achieved_concurrency"] is None


def test_server_cpu_time_counts_the_named_processes():
    cpu = ServerCpuTime(lambda: [os.getpid()])
    cpu.begin()
    t0 = time.process_time()
    while time.process_time() - t0 < 0.2:
        pass
    assert cpu.end() >= 0.1
    assert ServerCpuTime(lambda: []).end() == 0


def test_a_stalled_server_is_not_sent_unbounded_requests(monkeypatch):
    import energysweep.scenarios.serving.load as sl

    monkeypatch.setattr(sl, "MIN_IN_FLIGHT", 10)
    monkeypatch.setattr(sl, "IN_FLIGHT_PER_SLOT", 2)
    server = FakeServer(latency=0.3, slots=1)  # ~3 requests/s, offered 200
    run, _ = _run(LoadPoint(RATE, 200.0), server, capacity=1, ramp_requests=1,
                  min_window_s=0.3, min_requests=1)  # fmt: skip
    assert server.max_in_flight == 10 and len(run.dropped_s) > 50
    st = window_stats(run, None, None, capacity=1)
    # Dropped arrivals are offered load the server did not take.
    assert st["arrival_rate_rps"] > 100 and st["load_sustained"] < 0.2
    assert st["requests_dropped"] == len(run.dropped_s)
