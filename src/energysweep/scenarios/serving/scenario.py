"""The ``serving`` scenario: energy per request of an OpenAI-compatible server under load.

One process (the client, our code) runs the whole job. Per batch cap (the engine's
``max_num_seqs``; a change of cap restarts the server, its cost recorded in job.json):

1. start the engine's server with the layout's tp/pp/dp (energysweep.launch.server), wait for it to
   be healthy (bounded), warm it up with ``workload.warmup_iterations`` rounds of cap x dp
   concurrent requests, and ask it once, unstreamed, for the greedy tokens of the first cap
   prompts (``generations.parquet``: they must equal the offline engine's);
2. per repetition, for every load level in ascending order: a cooldown, then one load run
   (:mod:`.load`): ramp, a window on the steady state bracketed by the energy counters,
   the server's CPU time and its /metrics counters (:mod:`.edges`, read off the event loop, so
   the load goes on and every request is timed while the counters are awaited), then the
   drain;
3. stop the server (every one of its processes) and copy its log into the rule's log.

The idle baseline is measured once per job with the first server up, warmed up and idle. A grid
point is (batch cap, load); each repetition of it is one window: one shard row per GPU of the
job (the client measures all of them; the server's processes compute on them). Every request goes to
``requests.parquet`` with its phase (warmup, ramp, window, drain). Any failure (the server does
not start, dies, stops answering; the client stalls) fails the job with the server's log.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

from energysweep.job.sections import Serving
from energysweep.job.spec import LaunchedJob
from energysweep.measure.phase_clock import during, switch
from energysweep.scenarios.base import Scenario
from energysweep.scenarios.serving.client import (
    BackgroundImport,
    RunningServer,
    Watchdog,
    client_session,
    greedy_tokens,
    server_keepalive_s,
    vllm_arrivals,
    vllm_sender,
)
from energysweep.scenarios.serving.edges import WindowEdges
from energysweep.scenarios.serving.load import CONCURRENCY, RATE, LoadPoint, run_load
from energysweep.scenarios.serving.probes import (
    QueueSamples,
    ServerCpuTime,
    metrics_names,
    metrics_url,
    parse_metrics,
    queue_time_mean_s,
    server_count,
)
from energysweep.scenarios.serving.stats import failures, request_phase, window_stats
from energysweep.tables import requests
from energysweep.tables.phases import JobPhase, Phase
from energysweep.util.http import http_get


def load_points(serving: Serving) -> list[LoadPoint]:
    """The sweep's load levels, ascending: ``serving.request_rates`` or ``serving.concurrency``."""
    if serving.request_rates:
        rates = sorted(serving.request_rates)
        return [LoadPoint(RATE, float(r), serving.burstiness) for r in rates]
    if serving.concurrency is None:
        raise ValueError("config key serving: set request_rates or concurrency")
    return [LoadPoint(CONCURRENCY, float(c)) for c in sorted(serving.concurrency)]


def _raise_on_sigterm(signum, _frame):
    raise SystemExit(128 + signum)  # unwinds through stop_server (no server outlives the client)


class ServingScenario(Scenario):
    """Runs the serving windows of one job in the client process (module docstring)."""

    name = "serving"
    prepare_what = "server start (when its batch cap changes) and warm-up"
    writes_requests = True  # close() writes requests.parquet
    rows_final = True  # the client measures every GPU of the job

    def __init__(self, job: LaunchedJob, ctx, prompts: list[str], monitor, make_server):
        """``make_server(cap, log_path)`` builds the (unstarted) server of a batch cap
        (energysweep.launch.server.server_for_job; run.py hands it over)."""
        super().__init__(job, ctx, None, prompts, monitor)
        self.make_server = make_server
        from transformers import AutoTokenizer

        if job.serving is None:
            raise ValueError("a serving job carries the config section serving")
        self.sv: Serving = job.serving
        self.limits = job.limits
        self.loads = load_points(self.sv)
        self.backend_name = job.key.backend
        tok = AutoTokenizer.from_pretrained(ctx.model_dir)
        enc = tok(prompts, truncation=True, max_length=int(self.wl.max_input_tokens))
        self.token_prompts = [list(ids) for ids in enc["input_ids"]]
        self.server: RunningServer | None = None
        self.metrics_url = ""  # the running server's (probes.metrics_url)
        self.server_cpu = ServerCpuTime(lambda: self.server.pids() if self.server else [])
        self.timing: dict = {"servers": [], "load_runs": []}
        self.request_rows: list[dict] = []
        self.watchdog = Watchdog(float(self.limits.client_stall_timeout_s))
        # The measure step stops a failed job with SIGTERM, then SIGKILL after kill_grace_s:
        # the server is stopped within half of it.
        self.stop_grace_s = float(self.limits.kill_grace_s) / 2
        self._run_index = 0
        signal.signal(signal.SIGTERM, _raise_on_sigterm)

    # ------------------------------------------------------------------ Scenario hooks
    def phases(self) -> list[Phase]:
        return [Phase.SERVE]

    def is_fatal(self, exc: BaseException) -> bool:
        return True  # no point can go on without its server, and a server fault ends the job

    def prepare(self, cap: int) -> None:
        if self.server is None or self.server.options.max_num_seqs != cap:
            # A later batch cap's server (the first one's is started in run.py, in the same
            # phase): its start is the server's, not the warm-up's it is called from.
            with during(JobPhase.SERVER_START):
                self.stop_server()
                self.start_server(cap)
        self.warm_up(cap)

    def repetition(self, cap: int, rep: int, cooldown_s: float) -> list[dict]:
        rows = []
        for point in self.loads:
            self.cool_down(cooldown_s)
            rows += self.measure_load(cap, rep, point)
        return rows

    def end_point(self) -> None:
        self.stop_server()

    def close(self) -> None:
        self.stop_server()
        self.watchdog.disarm()
        requests.write(self.request_rows, self.job.outputs.requests)

    # ------------------------------------------------------------------ the server
    def start_server(self, cap: int) -> None:
        """Start the server of batch cap ``cap`` and wait until it is healthy (bounded)."""
        log_path = Path(self.job.outputs.job_json).with_name(f"server-cap{cap}.log")
        server = self.make_server(cap, log_path)
        timeout = float(self.limits.server_start_timeout_s)
        print(f"serving: starting {server.argv}", flush=True)
        self.watchdog.arm(timeout + self.watchdog.seconds)
        self.server = server
        try:
            server.start()
            imports = BackgroundImport()  # the client's own imports, beside the server's boot
            start_s = server.wait_healthy(timeout)
            imports.wait()
        except BaseException:
            self.stop_server()  # whatever of it runs; its whole log goes into the rule's log
            raise
        self.watchdog.arm()
        wanted = metrics_names(self.backend_name)
        self.metrics_url = metrics_url(server.base_url, wanted) if wanted else ""
        self.timing["servers"].append({
            "batch_cap": cap, "port": server.port, "argv": server.argv, "pid": server.proc.pid,
            "start_s": start_s, "pids": server.pids(), "gpu_pids": server.gpu_pids(),
            "metrics_url": self.metrics_url or None,
            **server.placement_record(),
        })  # fmt: skip
        print(f"serving: server healthy after {start_s:.1f} s (pids {server.pids()})", flush=True)

    def stop_server(self) -> None:
        """Stop the running server (every process of it) and copy its log into the rule's log."""
        server, self.server = self.server, None
        if server is None:
            return
        t0 = time.monotonic()
        killed = server.stop(self.stop_grace_s)
        for rec in self.timing["servers"]:
            if server.proc is not None and rec["pid"] == server.proc.pid:
                rec.update({"stop_s": time.monotonic() - t0, "killed": killed})
        server.print_log()

    # ------------------------------------------------------------------ requests
    def _sender(self, session):
        """Sends one completion request to the job's server (vLLM's load generator)."""
        url = f"{self.live.base_url}/v1/completions"
        return vllm_sender(url, self.live.name, int(self.wl.output_tokens), session)

    def _session(self):
        timeout = float(self.limits.request_timeout_s)
        return client_session(timeout, server_keepalive_s(self.live.env))

    def warm_up(self, cap: int) -> None:
        """Warm-up rounds, then the greedy tokens of the first ``cap`` prompts (generations)."""
        t0 = time.monotonic()
        n = cap * self.ctx.layout.dp
        rounds = int(self.wl.warmup_iterations)

        async def go():
            async with self._session() as session:
                send = self._sender(session)
                for r in range(rounds):
                    recs = await asyncio.gather(
                        *(
                            send(i, self.token_prompts[i % len(self.token_prompts)])
                            for i in range(r * n, (r + 1) * n)
                        )
                    )
                    self._log_requests(cap, None, -1, recs, "warmup")
                    self.watchdog.arm()
                return await greedy_tokens(
                    session,
                    self.live.base_url,
                    self.live.name,
                    self.token_prompts[:cap],
                    int(self.wl.output_tokens),
                )

        tokens = asyncio.run(go())
        self.live.check()
        self.generations += [
            {"batch_size": cap, "dp_rank": 0, "iteration": 0, "prompt_index": i, "token_ids": t}
            for i, t in enumerate(tokens)
            if t is not None
        ]
        self.timing["servers"][-1]["warmup_s"] = time.monotonic() - t0

    @property
    def live(self) -> RunningServer:
        """The server of the current batch cap (started by :meth:`start_server`)."""
        if self.server is None:
            raise RuntimeError("no engine server is running")
        return self.server

    # ------------------------------------------------------------------ one load run
    def measure_load(self, cap: int, rep: int, point: LoadPoint) -> list[dict]:
        """One load run at ``point``: its window's rows (one per GPU reading)."""
        wanted = metrics_names(self.backend_name)

        def read_counters() -> dict | None:
            if wanted is None:
                return None
            status, text = http_get(self.metrics_url, timeout_s=5)
            return parse_metrics(text, wanted) if status == 200 else None

        queue = QueueSamples()
        edges = WindowEdges(self.monitor, self.server_cpu, read_counters)
        # job.json timing.phases_s: the edges move on to the window, then to the drain.
        previous = switch(JobPhase.RAMP)
        try:
            run = asyncio.run(self._load(point, cap, edges, queue, wanted))
        finally:
            edges.shutdown()
        self.live.check()
        settle_s = self._settle(read_counters)
        switch(previous)  # (after an exception, the point loop puts its phase back)
        if run.open_s is None or run.close_s is None:
            raise RuntimeError(f"load {point.key} at batch cap {cap}: no steady-state window")
        self.window_ns_total += run.closed["wall_ns"] - run.opened["wall_ns"]
        stats = window_stats(run, *self._slo(), capacity=cap * self.ctx.layout.dp)
        stats.update(queue.window(run.open_s, run.close_s) if wanted else {})
        if point.mode == CONCURRENCY:
            # Of the requests kept in flight, the share not waiting in the server's queue.
            waiting = stats.get("queue_waiting_mean")
            stats["load_sustained"] = None if waiting is None else 1.0 - waiting / point.level
        opened, closed = run.opened["metrics"], run.closed["metrics"]
        stats["queue_time_mean_s"], stats["queue_time_missing"] = queue_time_mean_s(opened, closed)
        stats["server_requests_completed"], stats["server_count_missing"] = server_count(
            opened, closed, wanted
        )
        self._log_requests(cap, point, rep, run.records, None, run)
        self.timing["load_runs"].append(
            {
                "batch_cap": cap,
                "load": point.key,
                "repetition": rep,
                "ramp_s": run.ramp_s,
                "window_s": stats["window_s"],
                "drain_s": run.drain_s,
                "settle_s": settle_s,
                # the server's CPU seconds (the rows' cpu_time_s) are over these reads
                "server_cpu_read_ns": list(self.server_cpu.read_ns),
            }
        )
        self.watchdog.arm()
        return self._window_rows(cap, rep, point, run, stats)

    def _settle(self, read_counters, bound_s: float = 60.0) -> float | None:
        """Wait until the server holds no request (the drain's cancelled ones aborted), so the
        next load run starts from an idle server; seconds it took (None without /metrics)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < bound_s:
            counters = read_counters()
            if counters is None:
                return None
            if counters.get("running", 0) + counters.get("waiting", 0) == 0:
                return time.monotonic() - t0
            time.sleep(0.1)
        print(f"serving: the server still holds requests {bound_s:g} s after the drain", flush=True)
        return time.monotonic() - t0

    def _slo(self) -> tuple[float | None, float | None]:
        slo = self.sv.slo
        return (
            slo.ttft_ms / 1e3 if slo.ttft_ms is not None else None,
            slo.tpot_ms / 1e3 if slo.tpot_ms is not None else None,
        )

    async def _load(self, point, cap, edges: WindowEdges, queue: QueueSamples, wanted):
        seed = int(self.job.seed) + self._run_index
        self._run_index += 1
        async with self._session() as session:
            send = self._sender(session)
            sampler = None
            if wanted is not None:
                sampler = asyncio.create_task(self._sample_queue(session, queue, wanted))
            try:
                return await run_load(
                    point,
                    self.token_prompts,
                    send,
                    vllm_arrivals(seed),
                    edges.open,
                    edges.close,
                    ramp_requests=int(self.sv.ramp_requests or cap * self.ctx.layout.dp),
                    min_window_s=self.min_window_s,
                    min_requests=int(self.wl.iterations),
                    capacity=cap * self.ctx.layout.dp,
                    progress=self.watchdog.arm,
                )
            finally:
                if sampler is not None:
                    sampler.cancel()

    async def _sample_queue(self, session, queue: QueueSamples, wanted: dict) -> None:
        period = 1.0 / float(self.sv.metrics_hz)
        url = self.metrics_url
        while True:
            t = time.perf_counter()
            try:
                async with session.get(url) as resp:
                    text = await resp.text()
                queue.add(t, parse_metrics(text, wanted))
            except Exception:  # a missed sample; the window's count says how many were taken
                pass
            await asyncio.sleep(max(0.0, period - (time.perf_counter() - t)))

    # ------------------------------------------------------------------ rows
    def _window_rows(self, cap, rep, point: LoadPoint, run, stats: dict) -> list[dict]:
        from energysweep.scenarios.serving.rows import serving_columns

        w = {
            "start": run.opened["wall_ns"],
            "end": run.closed["wall_ns"],
            "iterations": stats["requests"],
            "readings": run.closed["readings"],
            "host": run.closed["host"],
            "cpu_s": run.closed["cpu_s"],
            "settings": (run.opened["settings"], run.closed["settings"]),
            "processes": (run.opened["processes"], run.closed["processes"]),
            "node": run.closed["node"],
            "tin": stats["input_tokens"],
            "tout": stats["output_tokens"],
        }
        cols = serving_columns(point, run, stats, self.wl)
        rows = self._rows(cap, rep, Phase.SERVE, w)
        tokens = stats["input_tokens"] + stats["output_tokens"]
        flops = 2.0 * self.params * tokens if self.params is not None else None
        for r in rows:
            r.update(cols, flops_estimate=flops)
        return rows

    def _log_requests(self, cap, point, rep, records, phase, run=None) -> None:
        from energysweep.scenarios.serving.rows import request_rows

        failed = failures(records)
        if failed is not None:
            what = "warm-up" if point is None else f"load {point.key} (repetition {rep})"
            print(f"serving: batch cap {cap}, {what}: {failed}", flush=True)

        self.request_rows += request_rows(
            self.job,
            cap,
            point,
            rep,
            self._run_index,
            records,
            phase if run is None else (lambda rec: request_phase(run, rec)),
            run.wall_offset_ns if run is not None else None,
            self._slo(),
        )
