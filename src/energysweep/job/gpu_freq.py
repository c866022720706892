"""Slurm's ``--gpu-freq`` vocabulary: parse a ``gpu.clock`` value, resolve a word to a clock.

Pure (no NVML): the config check uses it when the workflow loads, and
:mod:`energysweep.gpu_setting.control` on the node. A word resolves exactly as Slurm's
gpu/nvml plugin resolves it (:func:`nearest`): the supported clocks sorted from high to low,
``high`` the first, ``highm1`` the second, ``medium`` the middle one (index ``(n - 1) // 2``),
``low`` the last; a number above or below the range is clamped, one in between rounds up to the
next supported clock.
A side left out is ``high`` (Slurm's default ``GpuFreqDef``, ``high,memory=high``).
"""

from __future__ import annotations

from dataclasses import dataclass

CLOCK_WORDS = ("low", "medium", "high", "highm1")


class ClockSyntaxError(ValueError):
    """A ``gpu.clock`` value outside Slurm's ``--gpu-freq`` vocabulary."""


@dataclass(frozen=True)
class ClockSpec:
    """A parsed ``gpu.clock``: SM (graphics) and memory values, each a word or MHz digits."""

    sm: str
    mem: str
    text: str


def parse_clock(text) -> ClockSpec:
    """Parse a ``gpu.clock`` value (a string in ``--gpu-freq`` form, or an integer MHz).

    Comma-separated parts, at most one of each: a graphics (SM) value and ``memory=<value>``;
    a value is a word of :data:`CLOCK_WORDS` or a positive number of MHz.

    Raises:
        ClockSyntaxError: naming the accepted vocabulary.
    """
    raw = str(text).strip()
    found: dict[str, str] = {}
    for part in raw.split(","):
        side, _, value = part.strip().rpartition("=")
        side = {"": "sm", "memory": "memory"}.get(side, "?")
        ok = side != "?" and (value in CLOCK_WORDS or _is_mhz(value))
        if not ok or side in found:
            raise ClockSyntaxError(
                f"{text!r} is not a clock Slurm's --gpu-freq knows; use one of "
                f"{', '.join(CLOCK_WORDS)} or a number of MHz, optionally with "
                "',memory=<word or MHz>' (e.g. 'medium', '1410', 'low,memory=high')"
            )
        found[side] = value
    return ClockSpec(sm=found.get("sm", "high"), mem=found.get("memory", "high"), text=raw)


def _is_mhz(value: str) -> bool:
    return value.isascii() and value.isdigit() and 0 < int(value) < 100_000


def nearest(value: str, supported: list[int]) -> int:
    """The supported clock ``value`` resolves to, by Slurm's rule (module docstring)."""
    clocks = sorted({int(c) for c in supported}, reverse=True)
    if not clocks:
        raise ValueError("the GPU lists no supported clocks")
    words = {
        "high": clocks[0],
        "highm1": clocks[1] if len(clocks) > 1 else clocks[0],
        "medium": clocks[(len(clocks) - 1) // 2],
        "low": clocks[-1],
    }
    if value in words:
        return words[value]
    mhz = int(value)
    if mhz >= clocks[0]:
        return clocks[0]
    if mhz <= clocks[-1]:
        return clocks[-1]
    return min(c for c in clocks if c >= mhz)  # exact, else the next one up
