"""Named GPU profiles of the emulated node: the figures an emulated GPU behaves by, with sources.

Every figure is a vendor datasheet value, a published measurement, or (where nothing is
published) an estimate that says so; ``make gpu-check`` prints a real GPU's measured counter
period, read latency and idle power beside these, so a profile can be corrected from real numbers
(docs/emulated-node.md, "Profiles").
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Profile:
    """One GPU model as the emulator presents it (units in the names)."""

    key: str
    name: str  # nvmlDeviceGetName
    architecture: str  # a pynvml NVML_DEVICE_ARCH_* constant name
    compute_capability: tuple[int, int]
    pci_device_id: int  # nvmlPciInfo_t.pciDeviceId (device id << 16 | vendor id 0x10DE)
    memory_total_bytes: int
    idle_w: float  # board power with nothing running (clocks at idle)
    busy_w: float  # board power at full activity and full clock, before the power limit
    default_limit_w: float  # nvmlDeviceGetPowerManagementDefaultLimit (= TDP)
    min_limit_w: float  # lower end of nvmlDeviceGetPowerManagementLimitConstraints
    max_limit_w: float  # upper end
    max_sm_mhz: int
    min_sm_mhz: int
    idle_sm_mhz: int
    sm_step_mhz: int  # spacing of nvmlDeviceGetSupportedGraphicsClocks
    mem_mhz: tuple[int, ...]  # nvmlDeviceGetSupportedMemoryClocks, highest first
    counter_period_s: float  # energy counter refresh
    counter_jitter_s: float  # +- spread of each refresh instant
    power_avg_window_s: float  # nvmlDeviceGetPowerUsage averages over this
    power_sample_coverage: float  # fraction of each refresh period the power sensor samples
    read_latency_s: float  # time one reading call (energy, power, field values) takes
    sources: dict[str, str] = field(default_factory=dict)
    # Measured behaviour (h200-sxm; the defaults keep a profile without measurements as it was).
    context_idle_w: float | None = None  # idle with a CUDA context up (None: idle_w)
    # Energy read latency as (quantile, seconds) pairs, sampled by inverse CDF (empty: fixed
    # read_latency_s); power, field and clock reads then take fast_read_latency_s.
    energy_read_latency_q: tuple[tuple[float, float], ...] = ()
    fast_read_latency_s: float | None = None
    # The sensors against the truth: counter = gain x E(t - delay) + offset x t + noise.
    counter_gain: float = 1.0
    counter_offset_w: float = 0.0
    counter_noise_mj: float = 0.0  # std of the white noise on each published counter value
    counter_delay_s: float = 0.0  # the counter published at a refresh shows E this much earlier
    average_gain: float = 1.0  # nvmlDeviceGetPowerUsage / true power (over its window)
    instant_gain: float = 1.0  # NVML_FI_DEV_POWER_INSTANT / true power
    memory_idle_w: float | None = None  # HBM power, reported apart (memory scope; None: absent)

    def supported_sm_mhz(self) -> list[int]:
        """Graphics clocks the GPU supports, highest first (what the real call returns)."""
        return list(range(self.max_sm_mhz, self.min_sm_mhz - 1, -self.sm_step_mhz))


_COMMON_SOURCES = {
    "counter_period_s": "ML.ENERGY measurements: the counter updates about every 100 ms on "
    "datacenter GPUs (NVIDIA publishes no figure for H100/H200)",
    "counter_jitter_s": "estimate (no published figure): a few ms of spread per refresh",
    "power_sample_coverage": "Part-time Power Measurements (arXiv 2312.02741, SC'24): on A100 "
    "and H100 only ~25% of runtime is sampled; emulated as the last 25% of each refresh period",
    "read_latency_s": "estimate (no published figure): make gpu-check measures it on a GPU",
}

PROFILES: dict[str, Profile] = {
    "h100-sxm": Profile(
        key="h100-sxm",
        name="NVIDIA H100 80GB HBM3",
        architecture="NVML_DEVICE_ARCH_HOPPER",
        compute_capability=(9, 0),
        pci_device_id=0x233010DE,
        memory_total_bytes=81559 * 2**20,
        idle_w=70.0,
        busy_w=700.0,
        default_limit_w=700.0,
        min_limit_w=200.0,
        max_limit_w=700.0,
        max_sm_mhz=1980,
        min_sm_mhz=345,
        idle_sm_mhz=345,
        sm_step_mhz=15,
        mem_mhz=(2619,),
        counter_period_s=0.1,
        counter_jitter_s=0.005,
        power_avg_window_s=1.0,
        power_sample_coverage=0.25,
        read_latency_s=0.0002,
        sources={
            **_COMMON_SOURCES,
            "name": "nvidia-smi product name of an H100 SXM5 80GB",
            "busy_w": "H100 SXM5 datasheet: max TDP 700 W",
            "default_limit_w": "H100 SXM5 datasheet: 700 W",
            "min_limit_w": "nvidia-smi -q power limits of H100 SXM5: min ~200 W",
            "idle_w": "ML.ENERGY / Zeus idle measurements: ~60-90 W",
            "max_sm_mhz": "H100 SXM5 datasheet: max boost 1980 MHz",
            "power_avg_window_s": "NVML docs (nvmlDeviceGetPowerUsage): a 1 s average on "
            "Ampere (except GA100) and newer",
        },
    ),
    "a100-sxm": Profile(
        key="a100-sxm",
        name="NVIDIA A100-SXM4-80GB",
        architecture="NVML_DEVICE_ARCH_AMPERE",
        compute_capability=(8, 0),
        pci_device_id=0x20B210DE,
        memory_total_bytes=81920 * 2**20,
        idle_w=55.0,
        busy_w=400.0,
        default_limit_w=400.0,
        min_limit_w=100.0,
        max_limit_w=400.0,
        max_sm_mhz=1410,
        min_sm_mhz=210,
        idle_sm_mhz=210,
        sm_step_mhz=15,
        mem_mhz=(1593,),
        counter_period_s=0.1,
        counter_jitter_s=0.005,
        # GA100 reports instantaneous power: the latest refresh period only.
        power_avg_window_s=0.1,
        power_sample_coverage=0.25,
        read_latency_s=0.0002,
        sources={
            **_COMMON_SOURCES,
            "name": "nvidia-smi product name of an A100 SXM4 80GB",
            "busy_w": "A100 SXM4 datasheet: max TDP 400 W",
            "default_limit_w": "A100 SXM4 datasheet: 400 W",
            "min_limit_w": "nvidia-smi -q power limits of A100 SXM4: min ~100 W",
            "idle_w": "ML.ENERGY / Zeus idle measurements: ~50-60 W",
            "max_sm_mhz": "A100 SXM4 datasheet: max boost 1410 MHz",
            "power_avg_window_s": "NVML docs (nvmlDeviceGetPowerUsage): GA100 returns "
            "instantaneous power (emulated as one refresh period)",
        },
    ),
}


# Fitted by bench/fit_h200_profile.py to ../shared/data/h200/ (one H200, driver 580.159.04;
# reference/real-gpu-h200.md); each figure is the script's output line named in its source.
_H200_FIT = "bench/fit_h200_profile.py on data/h200/"
H200_ENERGY_READ_LATENCY_Q = (
    (0.0, 0.002185),
    (0.1, 0.002211),
    (0.25, 0.002305),
    (0.5, 0.002647),
    (0.75, 0.003713),
    (0.9, 0.006281),
    (0.95, 0.008485),
    (0.99, 0.017429),
    (0.999, 0.028363),
    (1.0, 0.185475),
)

PROFILES["h200-sxm"] = Profile(
    key="h200-sxm",
    name="NVIDIA H200",
    architecture="NVML_DEVICE_ARCH_HOPPER",
    compute_capability=(9, 0),
    pci_device_id=0x233510DE,
    memory_total_bytes=143771 * 2**20,
    idle_w=79.0,
    context_idle_w=124.3,
    busy_w=715.0,
    default_limit_w=700.0,
    min_limit_w=200.0,
    max_limit_w=700.0,
    max_sm_mhz=1980,
    min_sm_mhz=345,
    idle_sm_mhz=345,
    sm_step_mhz=15,
    mem_mhz=(3201,),
    counter_period_s=0.0999,
    counter_jitter_s=0.0018,
    power_avg_window_s=1.0,
    power_sample_coverage=1.0,
    read_latency_s=0.002647,
    energy_read_latency_q=H200_ENERGY_READ_LATENCY_Q,
    fast_read_latency_s=0.000002,
    counter_gain=0.9967,
    counter_offset_w=0.0,
    counter_noise_mj=68.7,
    counter_delay_s=0.0071,
    average_gain=0.9877,
    instant_gain=1.0,
    memory_idle_w=41.0,
    sources={
        "name": "nvmlDeviceGetName of the measured H200 (reference/real-gpu-h200.md)",
        "memory_total_bytes": "the measured H200: 141 GB HBM3e (143771 MiB)",
        "idle_w": f"{_H200_FIT}: true_idle_w (counter over the 100 Hz reader's idle seconds "
        "with no CUDA context, 78.7 W, over counter_gain; nvidia-smi read 80 W)",
        "context_idle_w": f"{_H200_FIT}: true_context_idle_w (context up, nothing running: "
        "counter 123.9 W; averaged power 122.4 W); the step comes with the context",
        "busy_w": "the probe's 8192^2 bf16 matmuls: ~715 W sustained (transients to 930 W)",
        "default_limit_w": "the measured H200: 700 W default and max, 200 W min",
        "min_limit_w": "the measured H200: 200 W",
        "max_sm_mhz": "H200 SXM datasheet: max boost 1980 MHz (the sweep's windows read 1980)",
        "mem_mhz": "H200 SXM: HBM3e at 3201 MHz (estimate from the datasheet's 4.8 TB/s)",
        "counter_period_s": f"{_H200_FIT}: median refresh interval (177 refreshes; "
        "p10 98.1 ms, p90 101.8 ms)",
        "counter_jitter_s": f"{_H200_FIT}: half the p10-p90 spread of the refresh intervals",
        "power_avg_window_s": f"{_H200_FIT}: best replay of the probe's averaged power "
        "(rms 20.8 W; the 125 -> 715 W step read 227, 407, 517, 587 W at +0.5..+1.25 s)",
        "power_sample_coverage": f"{_H200_FIT}: best replay: the whole period is sampled",
        "read_latency_s": f"{_H200_FIT}: median nvmlDeviceGetTotalEnergyConsumption "
        "(the latency a config's read_latency_s replaces the distribution with)",
        "energy_read_latency_q": f"{_H200_FIT}: quantiles of 4,492 energy reads in a tight "
        "loop (median 2.6 ms, p90 6.3 ms, p99 17 ms, the first read 185 ms)",
        "fast_read_latency_s": "reference/real-gpu-h200.md: power, field and clock reads "
        "2-4 us median",
        "counter_gain": f"{_H200_FIT}: counter_gain = 1 / (integral of instant power over "
        "the counter, 1.0033 over the 17.5 s probe): the instant field taken as the truth",
        "counter_offset_w": "no figure: the traces hold no truth independent of the sensors",
        "counter_noise_mj": f"{_H200_FIT}: 1.4826 MAD of 348 per-refresh increments at "
        "steady context idle, / sqrt 2 (white noise on each published value)",
        "counter_delay_s": f"{_H200_FIT}: the counter's step against the load's CPU stamp at "
        "the two clean load-on edges (7.8, 6.3 ms; an upper bound, it holds kernel launch)",
        "average_gain": f"{_H200_FIT}: integral of averaged power over the counter (0.991) "
        "x counter_gain",
        "instant_gain": "the instant field is the emulator's truth (counter_gain's source)",
        "memory_idle_w": "reference/real-gpu-h200.md: nvidia-smi 'GPU Memory Power "
        "Readings' 41 W at idle (a constant: no figure under load)",
    },
)


def profile(key: str) -> Profile:
    """The profile named ``key``; KeyError names the known ones."""
    try:
        return PROFILES[key]
    except KeyError:
        raise KeyError(f"unknown emulated GPU profile {key!r}; known: {sorted(PROFILES)}") from None
