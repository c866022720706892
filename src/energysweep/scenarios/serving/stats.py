"""What happened inside a load run's window, counted from its request records."""

from __future__ import annotations

from collections import Counter

import numpy as np

from energysweep.scenarios.serving.load import LoadRun, RequestRecord


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def queued(run: LoadRun, t: float, capacity: int) -> int:
    """Requests waiting at time ``t``: those in flight beyond what the engine runs at once."""
    in_flight = sum(
        r.send_s <= t and (r.finished_s is None or r.finished_s > t) for r in run.records
    )  # a request cancelled in the drain was still in flight before it
    return max(0, in_flight - capacity)


def window_stats(
    run: LoadRun, slo_ttft_s: float | None, slo_tpot_s: float | None, capacity: int
) -> dict:
    """What happened inside ``run``'s window, from its request records.

    A request counts as *completed* in the window if it ended inside it, its prompt tokens count
    if its first token came inside it, and each output token counts where it arrived. Latency
    percentiles are over the requests completed in the window. A request meets the SLO when its
    TTFT and TPOT are within them (a TPOT of a one-token request counts as 0, as vLLM's goodput
    does). At a request rate, ``load_sustained`` is the share of the window's arrivals the server
    took on instead of queueing: 1 - (growth of the queue over the window) / (requests sent in
    it), the queue being the requests in flight beyond ``capacity`` (batch cap x dp); a server
    that keeps up ends the window with the queue it started with. Arrivals the client dropped
    (too many requests in flight already) count as offered and not taken on.
    """
    lo, hi = run.open_s, run.close_s
    if lo is None or hi is None:
        raise ValueError("the load run has no window")

    def inside(t):
        return t is not None and lo <= t <= hi

    done = [r for r in run.records if r.success and inside(r.end_s)]
    tokens_out = sum(sum(lo <= t <= hi for t in r.token_times()) for r in run.records)
    tokens_in = sum(r.prompt_tokens for r in run.records if r.success and inside(r.first_token_s))
    ttfts = [r.ttft_s for r in done if r.ttft_s is not None]
    tpots = [r.tpot_s for r in done if r.tpot_s is not None]
    itls = [g for r in done for g in r.itl_s]
    e2es = [r.latency_s for r in done if r.latency_s is not None]
    met = sum(
        (slo_ttft_s is None or (r.ttft_s is not None and r.ttft_s <= slo_ttft_s))
        and (slo_tpot_s is None or (r.tpot_s or 0.0) <= slo_tpot_s)
        for r in done
    )
    duration = hi - lo
    sent = sum(inside(r.send_s) for r in run.records)
    dropped = sum(inside(t) for t in run.dropped_s)
    growth = queued(run, hi, capacity) - queued(run, lo, capacity)
    return {
        "window_s": duration,
        "requests": len(done),
        "input_tokens": tokens_in,
        "output_tokens": tokens_out,
        "requests_sent": len(run.records),
        "request_errors": sum(not r.success and not r.cancelled for r in run.records),
        "requests_cancelled": sum(r.cancelled for r in run.records),
        "arrival_rate_rps": (sent + dropped) / duration,
        "achieved_rate_rps": len(done) / duration,
        "load_sustained": (
            (1.0 - (max(0, growth) + dropped) / (sent + dropped)) if sent + dropped else None
        ),
        "requests_dropped": len(run.dropped_s),
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


def failures(records: list[RequestRecord], most: int = 3) -> str | None:
    """The failed requests of a run (cancelled ones are not failures), for the job's log: how
    many failed, and the ``most`` commonest errors, each by its last line and how many requests
    it failed; None when none failed. Every error is whole in requests.parquet."""
    failed = [r for r in records if not r.success and not r.cancelled]
    if not failed:
        return None
    counts = Counter(
        ((r.error or "request failed").strip().splitlines() or ["request failed"])[-1]
        for r in failed
    )
    common = counts.most_common(most)
    shown = "; ".join(f"{n}x {error}" for error, n in common)
    more = f"; {len(counts) - most} other error(s)" if len(counts) > most else ""
    return f"{len(failed)} request(s) failed: {shown}{more}"
