"""One GPU's power timeline in one job: the trapezoid integral and statistics over windows.

The re-check (energysweep.validity.recheck) integrates each GPU's sampled power
(``power.parquet``) over each window, power linearly interpolated at the window edges, and
reads the counter's observed update period, a counter that stopped moving, the clock event
reasons and the power's spread from the same samples. Each window's status says whether the
samples could answer.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from energysweep.tables.status import Status

# Status of a re-check row.
OK = Status.OK
NO_COUNTER = "no-counter-energy"  # the window has no counter figure to compare (CPU, failed)
NO_TIMELINE = "no-timeline"  # no power samples of this GPU in the job
NOT_COVERED = "timeline-not-covering"  # samples do not span the window
FEW_SAMPLES = "too-few-samples"  # fewer than 2 samples inside the window


def _slice_reduce(ufunc, values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``ufunc.reduce(values[lo[i]:hi[i]])`` for every i (empty slices give values' 0th or a
    filler: callers mask them)."""
    if not len(lo):
        return np.zeros(0, dtype=values.dtype)
    padded = np.append(values, values[:1] if len(values) else [0])  # hi may equal len(values)
    idx = np.empty(2 * len(lo), dtype=np.int64)
    idx[0::2], idx[1::2] = lo, np.maximum(hi, lo)
    # reduceat reduces [idx[k], idx[k+1]); for pairs (lo, hi) with lo < hi that is the slice.
    return ufunc.reduceat(padded, idx)[0::2]


def _slice_sum(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    cum = np.concatenate([[0], np.cumsum(values)])
    return cum[hi] - cum[lo]


class Timeline:
    """One GPU's samples in one job: integral and statistics over any set of intervals."""

    def __init__(
        self, time_ns: np.ndarray, power_mw: np.ndarray, counter_mj: np.ndarray, reasons: np.ndarray
    ):
        """Arrays of one GPU's samples, sorted by time (nulls as NaN)."""
        p = power_mw / 1e3
        keep = ~np.isnan(p)
        self.t_ns = time_ns[keep]
        self.t0 = self.t_ns[0] if len(self.t_ns) else 0
        self.t = (self.t_ns - self.t0) / 1e9  # seconds from the first sample: float precision
        self.p = p[keep]
        self.counter = counter_mj[keep]
        reasons = reasons[keep]
        self.has_reasons = ~np.isnan(reasons)
        self.reasons = np.nan_to_num(reasons).astype(np.int64)
        steps = np.diff(self.t) * (self.p[1:] + self.p[:-1]) / 2
        self.cum = np.concatenate([[0.0], np.cumsum(steps)])
        # Prefix sums for each interval's mean and variance of power in O(1).
        self.cum_p = np.concatenate([[0.0], np.cumsum(self.p)])
        self.cum_p2 = np.concatenate([[0.0], np.cumsum(self.p**2)])
        # The counter's update period, observed over the whole job: the median time between
        # changes (an upper bound at the sampling rate; the driver's period is a GPU property).
        counted = ~np.isnan(self.counter)
        c, tc = self.counter[counted], self.t[counted]
        changed = tc[1:][np.diff(c) != 0]
        self.period = float(np.median(np.diff(changed))) if len(changed) >= 2 else np.nan

    def _integral_to(self, x: np.ndarray) -> np.ndarray:
        """Energy (J) from the first sample to each ``x`` (within the samples' span)."""
        t, p = self.t, self.p
        k = np.clip(np.searchsorted(t, x, side="right") - 1, 0, len(t) - 2)
        px = p[k] + (p[k + 1] - p[k]) * (x - t[k]) / (t[k + 1] - t[k])
        return self.cum[k] + (x - t[k]) * (p[k] + px) / 2

    def windows(self, start_ns: np.ndarray, end_ns: np.ndarray, average_ns: int = 0) -> dict:
        """Re-check figures of every [start, end] at once; ``status`` says where they cannot
        be had.

        Args:
            average_ns: the span the power reading averages over (validity.power_average_s).
                A reading at t is the mean power over [t - W, t], so a window's energy is the
                integral of the readings over [start, end + W] less W times the mean of the
                readings at those two instants (the power before and after the window): exact
                where the power is flat outside the window. 0: the plain integral over [start,
                end]. The samples' statistics, reasons and counter are read over [start, end].
        """
        start_ns = np.asarray(start_ns, dtype=np.int64)
        end_ns = np.asarray(end_ns, dtype=np.int64)
        out = self._samples_in(start_ns, end_ns)
        out.update(self._energy(start_ns, end_ns + average_ns))
        if average_ns and len(self.t) >= 2:
            ends = (np.stack([start_ns, end_ns + average_ns]) - self.t0) / 1e9
            outside = np.interp(ends, self.t, self.p).mean(axis=0) * average_ns / 1e9
            out["timeline_energy_j"] = out["timeline_energy_j"] - outside
        return out

    def _samples_in(self, start_ns: np.ndarray, end_ns: np.ndarray) -> dict:
        """Samples, power spread, clock event reasons and counter movement within each window."""
        m = len(start_ns)
        lo = np.searchsorted(self.t_ns, start_ns, "left")  # samples are sorted: a slice each
        hi = np.searchsorted(self.t_ns, end_ns, "right")
        n_in = hi - lo
        out = {"samples": n_in, "observed_counter_period_s": np.full(m, self.period)}
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = (self.cum_p[hi] - self.cum_p[lo]) / n_in
            var = np.maximum((self.cum_p2[hi] - self.cum_p2[lo]) / n_in - mean**2, 0)
        out["power_std_w"] = np.where(n_in >= 2, np.sqrt(var), np.nan)
        # Per window: the OR of the clock event reasons, and whether the counter moved between
        # the first and last sample (reduceat over (lo, hi) pairs: one pass, no Python loop).
        has = n_in > 0
        reasons = np.full(m, None, dtype=object)
        n_reasons = _slice_sum(self.has_reasons.astype(np.int64), lo, hi)
        ored = _slice_reduce(np.bitwise_or, self.reasons, lo, hi)
        with_reasons = has & (n_reasons > 0)
        reasons[with_reasons] = ored[with_reasons].tolist()
        stuck = np.full(m, None, dtype=object)
        counted = ~np.isnan(self.counter)
        all_counted = _slice_sum(counted.astype(np.int64), lo, hi) == n_in
        simple = (n_in >= 2) & all_counted
        if simple.any():
            stuck[simple] = (self.counter[lo[simple]] == self.counter[hi[simple] - 1]).tolist()
        for i in np.flatnonzero((n_in >= 2) & ~all_counted):  # some samples lack the counter
            c = self.counter[lo[i] : hi[i]][counted[lo[i] : hi[i]]]
            if len(c) >= 2:
                stuck[i] = bool(c[-1] == c[0])
        out["clock_event_reasons"], out["counter_stuck"] = reasons, stuck
        return out

    def _energy(self, start_ns: np.ndarray, end_ns: np.ndarray) -> dict:
        """The trapezoid integral over each [start, end], its largest sample gap and status."""
        m = len(start_ns)
        lo = np.searchsorted(self.t_ns, start_ns, "left")
        hi = np.searchsorted(self.t_ns, end_ns, "right")
        n_in = hi - lo
        out = {}
        covered = (
            (len(self.t) >= 2)
            & (start_ns >= (self.t_ns[0] if len(self.t) else 0))
            & (end_ns <= (self.t_ns[-1] if len(self.t) else -1))
        )
        ok = covered & (n_in >= 2)
        energy = np.full(m, np.nan)
        gap = np.full(m, np.nan)
        if ok.any():
            a = (start_ns[ok] - self.t0) / 1e9
            b = (end_ns[ok] - self.t0) / 1e9
            energy[ok] = self._integral_to(b) - self._integral_to(a)
            diffs = np.diff(self.t)
            lo_ok, hi_ok = lo[ok], hi[ok]
            inner = np.zeros(len(a))
            multi = hi_ok - lo_ok >= 2
            if multi.any():  # the largest gap between consecutive samples inside each window
                inner[multi] = _slice_reduce(np.maximum, diffs, lo_ok[multi], hi_ok[multi] - 1)
            gap[ok] = np.maximum.reduce([self.t[lo_ok] - a, b - self.t[hi_ok - 1], inner])
        out["timeline_energy_j"], out["max_sample_gap_s"] = energy, gap
        status = np.where(ok, OK, np.where(covered, FEW_SAMPLES, NOT_COVERED)).astype(object)
        out["status"] = status
        detail = np.where(
            covered,
            [f"{k} power sample(s) inside the window" for k in n_in],
            "the power samples do not span the window",
        ).astype(object)
        detail[ok] = None
        out["detail"] = detail
        return out

    def window(self, start_ns: int, end_ns: int, average_ns: int = 0) -> dict:
        """:meth:`windows` of one interval."""
        one = self.windows(np.array([start_ns]), np.array([end_ns]), average_ns)
        return {k: v[0] for k, v in one.items()}


def timelines(power: pd.DataFrame) -> dict:
    """(job_id, gpu_uuid) -> :class:`Timeline`, built from one sort of all samples."""
    power = power[power["gpu_uuid"].notna() & power["time_ns"].notna()] if len(power) else power
    if not len(power):
        return {}
    job = pd.factorize(power["job_id"])
    gpu = pd.factorize(power["gpu_uuid"])
    t_ns = power["time_ns"].to_numpy(dtype=np.int64)
    order = np.lexsort((t_ns, gpu[0], job[0]))
    key = (job[0] * len(gpu[1]) + gpu[0])[order]
    cols = [t_ns[order]] + [
        power[c].to_numpy(dtype=float, na_value=np.nan)[order]
        for c in ("power_mw", "energy_counter_mj", "clock_event_reasons")
    ]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    ends = np.r_[starts[1:], len(key)]
    out = {}
    for a, b in zip(starts, ends, strict=True):
        k = key[a]
        out[(job[1][k // len(gpu[1])], gpu[1][k % len(gpu[1])])] = Timeline(*(c[a:b] for c in cols))
    return out
