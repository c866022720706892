"""A measure job's progress lines (energysweep.measure.progress): one per step, with figures."""

from __future__ import annotations

from energysweep.measure import progress


def _row(rank: int, uuid: str | None, mj: float | None, **kw) -> dict:
    row = {
        "batch_size": 8, "repetition": 1, "phase": "generate", "load": "batch", "status": "ok",
        "error": None, "window_start_ns": 1_000_000_000, "window_end_ns": 6_020_000_000,
        "iterations": 32, "output_tokens": 4096, "rank": rank, "gpu_uuid": uuid,
        "gpu_energy_mj": mj, "gpu_energy_status": "measured", "gpu_energy_detail": None,
    }  # fmt: skip
    return {**row, **kw}


def test_a_window_line_sums_distinct_gpus():
    rows = [_row(0, "GPU-a", 300_000.0), _row(1, "GPU-b", 200_000.0)]
    (line,) = progress.window_lines(rows)
    assert line == (
        "batch size 8 rep 1 generate: window 5.02 s, 32 iterations, 4096 output tokens, "
        "GPU energy 500.0 J over 2 GPUs"
    )


def test_a_window_without_energy_says_why_and_a_failed_point_its_error():
    rows = [
        _row(0, None, None, gpu_energy_status="unavailable", gpu_energy_detail="no GPU\nmore"),
        _row(0, None, None, phase="prefill", status="oom", error="OutOfMemoryError: bs 8\n..."),
    ]
    assert progress.window_lines(rows) == [
        "batch size 8 rep 1 generate: window 5.02 s, 32 iterations, 4096 output tokens, "
        "GPU energy null (unavailable: no GPU)",
        "batch size 8 rep 1 prefill: oom: OutOfMemoryError: bs 8",
    ]
    serving = progress.window_lines([_row(0, "GPU-a", 1e6, phase="serve", load="rate=3")])
    assert serving[0].startswith("batch size 8 rep 1 serve rate=3: window 5.02 s")
    train = progress.window_lines([_row(0, "GPU-a", 1e6, phase="train", output_tokens=None)])
    assert train == [
        "batch size 8 rep 1 train: window 5.02 s, 32 iterations, GPU energy 1000.0 J over 1 GPU"
    ]


def test_idle_line():
    gpu = {"GPU-5f0c8a2e-1111": (122.4, "measured"), None: (None, "measured")}
    assert progress.idle_line(5.0, gpu, (None, "unavailable")) == (
        "idle baseline: 5.00 s, GPU power GPU-5f0c8a2e… 122.4 W (rank 0's GPUs), "
        "host power null (unavailable)"
    )
    assert progress.idle_line(None, {None: (None, "skipped")}, (None, "skipped")) == (
        "idle baseline: not measured (skipped)"
    )


def test_say_prefixes_the_time(capsys):
    progress.say("model loaded in 1.0 s")
    out = capsys.readouterr().out
    assert out.endswith(" energysweep: model loaded in 1.0 s\n") and out[2] == ":"
