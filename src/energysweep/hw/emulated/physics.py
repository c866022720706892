"""The emulated GPU's physics and its sensors, as pure functions (numpy, no I/O, no clock).

True power (docs/emulated-node.md, "Power model"):
- activity ``u`` in [0, 1] is the owning processes' CPU busy fraction over a sample interval;
- ``P = idle + u * (busy - idle) * (f / f_max) ** 3``: dynamic power scales with the SM clock
  ``f`` as f * V^2 with V roughly proportional to f in the DVFS range (the usual cubic
  approximation); ``f`` is the highest clock allowed by locked/application clocks and a
  throttle episode (half the maximum);
- the enforced power limit caps P: where P would exceed it, the clock drops until P equals the
  limit and ``SW_POWER_CAP`` is set;
- below ``IDLE_ACTIVITY`` the GPU is idle: idle clock and ``GPU_IDLE``.
Power is constant over each sample interval, so the energy integral is exact (the ground truth).

Sensors: the energy counter and the power reading refresh at ticks ``epoch + k * period +
jitter_k`` (jitter a fixed pseudo-random function of (seed, GPU, k)). The counter shows
``gain * E(tick - delay) + offset * t + noise_k`` at the latest tick (a sensor that is not the
truth; profiles.py fits the figures to an H200); the power reading is the mean true power over
the sampled part (the last ``coverage`` of each refresh period) of the ticks within the
averaging window, times its own gain.
"""

from __future__ import annotations

import numpy as np

from energysweep.hw.emulated.profiles import Profile

# Below this activity the GPU counts as idle (idle clock, GPU_IDLE).
IDLE_ACTIVITY = 0.02
# A throttle episode (HW_SLOWDOWN) allows at most this fraction of the maximum SM clock.
THROTTLE_CLOCK_FRACTION = 0.5
# Clock event reason bits (NVML nvmlClocksEventReason*; a unit test checks them against pynvml).
GPU_IDLE = 0x1
APPLICATIONS_CLOCKS_SETTING = 0x2
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SUPPORTED_REASONS = GPU_IDLE | APPLICATIONS_CLOCKS_SETTING | SW_POWER_CAP | HW_SLOWDOWN


def true_power(prof: Profile, activity, cap_mhz, limit_w, slowdown, idle_w=None):
    """(power W, SM clock MHz, reason bits) for each sample (numpy-broadcast arguments).

    Args:
        idle_w: the idle floor (default the profile's idle without a CUDA context; an owner
            passes :func:`owned_idle_w`).
        activity: busy fraction(s) in [0, 1] (clipped).
        cap_mhz: highest SM clock allowed by locked and application clocks.
        limit_w: the enforced power limit.
        slowdown: whether a throttle episode holds (bool or bool array).
    """
    u = np.clip(np.asarray(activity, dtype=float), 0.0, 1.0)
    slowdown = np.asarray(slowdown, dtype=bool)
    cap = np.asarray(cap_mhz, dtype=float)
    f = np.where(slowdown, np.minimum(cap, prof.max_sm_mhz * THROTTLE_CLOCK_FRACTION), cap)
    idle = prof.idle_w if idle_w is None else idle_w
    dyn_max = prof.busy_w - idle
    power = idle + dyn_max * u * (f / prof.max_sm_mhz) ** 3
    limit = np.maximum(np.asarray(limit_w, dtype=float), idle)
    capped = power > limit
    with np.errstate(divide="ignore", invalid="ignore"):
        f_at_limit = prof.max_sm_mhz * np.cbrt((limit - idle) / (dyn_max * u))
    f = np.where(capped, np.minimum(f, f_at_limit), f)
    power = np.where(capped, limit, power)
    busy = u >= IDLE_ACTIVITY
    clock = np.where(busy, _to_supported(prof, f), prof.idle_sm_mhz)
    reasons = (
        np.where(~busy, GPU_IDLE, 0)
        | np.where(busy & capped, SW_POWER_CAP, 0)
        | np.where(slowdown, HW_SLOWDOWN, 0)
        | np.where(busy & ~capped & (cap < prof.max_sm_mhz), APPLICATIONS_CLOCKS_SETTING, 0)
    )
    return power, clock, reasons.astype(np.int64)


def owned_idle_w(prof: Profile) -> float:
    """Idle power of a GPU with a CUDA context up (its owner's): the H200 idles at 79 W
    without one and 124 W with one (profiles.py); profiles without the figure idle alike."""
    return prof.idle_w if prof.context_idle_w is None else prof.context_idle_w


def _to_supported(prof: Profile, f):
    """The highest supported clock at or below ``f`` (clocks step down from the maximum)."""
    steps = np.ceil((prof.max_sm_mhz - np.asarray(f, dtype=float)) / prof.sm_step_mhz - 1e-9)
    return np.clip(prof.max_sm_mhz - steps * prof.sm_step_mhz, prof.min_sm_mhz, prof.max_sm_mhz)


def temperature_c(prof: Profile, power_w) -> int:
    """A plausible die temperature for a power (32 C idle, 82 C at busy power)."""
    frac = (float(power_w) - prof.idle_w) / (prof.busy_w - prof.idle_w)
    return int(round(32 + 50 * min(max(frac, 0.0), 1.0)))


def cap_clock_mhz(prof: Profile, locked_max_mhz: int, app_sm_mhz: int) -> int:
    """The clock ceiling set by locked clocks and application clocks (0 = not set)."""
    cap = prof.max_sm_mhz
    for c in (locked_max_mhz, app_sm_mhz):
        if c:
            cap = min(cap, c)
    return cap


# ---------------------------------------------------------------------------- refresh ticks
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = (x + np.uint64(0x9E3779B97F4A7C15)) & _M64
        z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _M64
        z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _M64
        return z ^ (z >> np.uint64(31))


def tick_key(seed: int, uuid: str) -> int:
    """The jitter key of one GPU (a stable 63-bit hash of seed and UUID)."""
    import hashlib

    digest = hashlib.sha256(f"{seed}:{uuid}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def tick_ns(k, epoch_ns: int, period_ns: int, jitter_ns: int, key: int) -> np.ndarray:
    """Instant (wall ns) of refresh ``k`` (array): ``epoch + k * period + jitter_k``."""
    k = np.asarray(k, dtype=np.int64)
    if jitter_ns:
        with np.errstate(over="ignore"):
            h = _splitmix64(np.uint64(key) ^ k.astype(np.uint64))
        frac = (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)  # [0, 1)
        jitter = np.round((2 * frac - 1) * jitter_ns).astype(np.int64)
    else:
        jitter = np.zeros_like(k)
    return epoch_ns + k * period_ns + jitter


def last_tick(t_ns, epoch_ns: int, period_ns: int, jitter_ns: int, key: int):
    """(k, instant) of the latest refresh at or before each ``t_ns`` (jitter < period / 2)."""
    t = np.asarray(t_ns, dtype=np.int64)
    k0 = np.floor_divide(t - epoch_ns, period_ns)
    best_k = k0 - 1
    best_t = tick_ns(best_k, epoch_ns, period_ns, jitter_ns, key)
    for dk in (0, 1):
        k = k0 + dk
        tk = tick_ns(k, epoch_ns, period_ns, jitter_ns, key)
        take = tk <= t
        best_k = np.where(take, k, best_k)
        best_t = np.where(take, tk, best_t)
    return best_k, best_t


def noise_mj(k, key: int, sigma_mj: float) -> np.ndarray:
    """Sensor noise on the counter value published at refresh ``k`` (array): a standard normal
    (Box-Muller over two hashes of (key, k)) times ``sigma_mj``, the same for every reader."""
    k = np.asarray(k, dtype=np.int64)
    if not sigma_mj:
        return np.zeros(k.shape)
    with np.errstate(over="ignore"):
        h1 = _splitmix64(np.uint64(key) ^ (k.astype(np.uint64) * np.uint64(2) + np.uint64(1)))
        h2 = _splitmix64(h1)
    u1 = ((h1 >> np.uint64(11)).astype(np.float64) + 1.0) / float(1 << 53)  # (0, 1]
    u2 = (h2 >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return sigma_mj * np.sqrt(-2 * np.log(u1)) * np.cos(2 * np.pi * u2)


def latency_s(table, u: float) -> float:
    """The read latency at probability ``u`` in [0, 1] of a (quantile, seconds) table: the
    inverse CDF, linear between the table's quantiles."""
    qs = [q for q, _ in table]
    return float(np.interp(u, qs, [s for _, s in table]))


def power_reading_w(
    energy_mj_at,
    k,
    epoch_ns: int,
    period_ns: int,
    jitter_ns: int,
    key: int,
    window_ns: int,
    coverage: float,
):
    """The power reading (W) published at refresh ``k``: mean true power over the sampled part
    of the refreshes within the averaging window.

    Args:
        energy_mj_at: vectorised E(t) (mJ, true energy up to wall time t in ns).
        coverage: the sampled fraction of each refresh period, ending at its tick.
    """
    n = max(1, int(round(window_ns / period_ns)))
    ks = np.asarray(k, dtype=np.int64)[..., None] - np.arange(n)
    ends = tick_ns(ks, epoch_ns, period_ns, jitter_ns, key)
    span = int(round(coverage * period_ns))
    joules = (energy_mj_at(ends) - energy_mj_at(ends - span)) / 1e3
    return joules.sum(axis=-1) / (n * span / 1e9)
