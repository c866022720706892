"""What a measure job is doing, one line per step, for its rule log.

A GPU job runs for minutes; a person watching a long sweep (``tail -f logs/measure/...log``)
should see where it is: the ranks up, the model loaded (and how long it took), each point's
warm-up, the idle baseline with its power, each window with its duration and GPU energy, a
failed point with its reason. Rank 0 writes them (the ranks' stdout is the rule log,
energysweep.launch.procs), one line per step and never one per iteration, each prefixed with the
wall time and ``energysweep:`` so they stand out from the engines' own output.
"""

from __future__ import annotations

import time

PREFIX = "energysweep:"


def say(message: str) -> None:
    """Print one progress line (``HH:MM:SS energysweep: message``) to this process's stdout."""
    print(f"{time.strftime('%H:%M:%S')} {PREFIX} {message}", flush=True)


def _watts(power_w: float | None, status: str) -> str:
    return f"{power_w:.1f} W" if power_w is not None else f"null ({status or 'unavailable'})"


def _first_line(text, limit: int) -> str:
    """The first line of ``text`` (None: empty), cut at ``limit`` characters."""
    lines = str(text).splitlines() if text is not None else []
    return lines[0][:limit] if lines else ""


def idle_line(window_s: float | None, gpu: dict, host: tuple) -> str:
    """The idle baseline's line from a monitor's ``idle_window_s``, ``idle_gpu`` and
    ``idle_host`` (energysweep.measure.monitor.JobMonitor): its duration, and each of this
    rank's GPUs' power (null with its status where it was not measured)."""
    if window_s is None:
        statuses = sorted({str(status) for _, status in gpu.values() if status})
        return f"idle baseline: not measured ({', '.join(statuses) or 'skipped'})"
    # The monitor keeps a None entry (a row without a GPU) beside its GPUs': not a GPU.
    named = {u: v for u, v in gpu.items() if u is not None} or gpu
    gpus = ", ".join(
        f"{_short(uuid)} {_watts(power, status)}" for uuid, (power, status) in named.items()
    )
    return (
        f"idle baseline: {window_s:.2f} s, GPU power {gpus or 'none'} (rank 0's GPUs), "
        f"host power {_watts(host[0], host[1])}"
    )


def _short(uuid: str | None) -> str:
    return "no GPU" if uuid is None else (uuid[:12] + "…" if len(uuid) > 13 else uuid)


def window_lines(rows: list[dict]) -> list[str]:
    """One line per window of one repetition's combined rows (every rank's, rank 0, after
    energysweep.measure.combine.combine_ranks): duration, iterations, tokens, and the GPU
    energy summed over the distinct GPUs measured (null with its status where any GPU has none);
    a failed point's line gives its status and error."""
    lines = []
    windows: dict[tuple, list[dict]] = {}
    for r in rows:
        key = (r["batch_size"], r["repetition"], r["phase"], r["load"])
        windows.setdefault(key, []).append(r)
    for (bs, rep, phase, load), group in windows.items():
        what = f"batch size {bs} rep {rep} {phase}" + (f" {load}" if load != "batch" else "")
        first = group[0]
        if first["status"] != "ok":
            lines.append(f"{what}: {first['status']}: {_first_line(first['error'], 300)}")
            continue
        start, end = first["window_start_ns"], first["window_end_ns"]
        duration = f"{(end - start) / 1e9:.2f} s" if start is not None and end is not None else "?"
        tokens = first["output_tokens"]
        lines.append(
            f"{what}: window {duration}, {first['iterations']} iterations, "
            + (f"{tokens} output tokens, " if tokens is not None else "")
            + f"GPU energy {_energy(group)}"
        )
    return lines


def _energy(group: list[dict]) -> str:
    by_gpu = {r["gpu_uuid"]: r for r in group}
    missing = [r for r in by_gpu.values() if r["gpu_energy_mj"] is None]
    if missing:
        r = missing[0]
        detail = _first_line(r["gpu_energy_detail"], 200)
        return f"null ({r['gpu_energy_status']}{': ' + detail if detail else ''})"
    joules = sum(r["gpu_energy_mj"] for r in by_gpu.values()) / 1e3
    return f"{joules:.1f} J over {len(by_gpu)} GPU{'s' if len(by_gpu) > 1 else ''}"
