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


def profile(key: str) -> Profile:
    """The profile named ``key``; KeyError names the known ones."""
    try:
        return PROFILES[key]
    except KeyError:
        raise KeyError(f"unknown emulated GPU profile {key!r}; known: {sorted(PROFILES)}") from None
