"""The vectorized ``windows()``/``summarize()`` give what the per-window loops gave.

``aggregate_reference`` holds the loops they replaced (one pandas group per window and per
point). Both run on random frames that vary everything the counting rules look at: statuses of
windows, GPU, Zeus, idle and host energy; nulls; GPUs reported twice; several hosts with ranks
that did not read RAPL; prefill, generate and training windows; a point measured by two jobs;
1 to 6 repetitions (odd and even, for the bootstrap CI of the median).
"""

from __future__ import annotations

import aggregate_reference as reference
import numpy as np
import pandas as pd
import pytest

from energysweep import aggregate
from energysweep.aggregate import bootstrap
from energysweep.tables import shards

from tests_rows import row


def _pick(rng, values, p=None):
    return values[rng.choice(len(values), p=p)]


def _window_rows(rng, base: dict, n_ranks: int, scale: float = 1.0) -> list[dict]:
    """One window's rows; ``scale`` shortens it and its energy (a prefill window)."""
    status = _pick(rng, ["ok", "oom", "error"], p=[0.8, 0.1, 0.1])
    failed = status != "ok"
    start = int(rng.integers(1, 10**12)) * 1000
    end = start + int(scale * rng.integers(1e9, 5e9))
    window = {
        **base,
        "status": status,
        "error": None if not failed else _pick(rng, ["OOM", "boom", ""]),
        "window_start_ns": None if failed and rng.random() < 0.7 else start,
        "window_end_ns": None if failed and rng.random() < 0.7 else end,
        "iterations": None if failed and rng.random() < 0.5 else int(rng.integers(1, 9)),
        "requests": int(rng.integers(1, 64)),
        "input_tokens": int(rng.integers(1, 5000)),
        "output_tokens": None if failed and rng.random() < 0.5 else int(rng.integers(1, 5000)),
        "model_parameters": _pick(rng, [None, 1000, 7_000_000]),
        "model_parameters_method": _pick(rng, ["counted", "config", "unavailable"]),
        "flops_estimate": _pick(rng, [None, 2.5e12]),
        "loss": _pick(rng, [None, 2.0 + rng.random()]),
        "config_hash": _pick(rng, ["h1", "h2"]),
        "code_version": "v",
    }
    hosts = int(rng.integers(1, 3))
    rows = []
    for rank in range(n_ranks):
        host = f"node{rank % hosts}"
        no_gpu = rng.random() < 0.1
        # Some ranks re-report another rank's GPU (a launcher and a worker): counted once.
        gpu = rank if rng.random() < 0.8 else int(rng.integers(0, n_ranks))
        estatus = _pick(rng, ["measured", "short-window", "unavailable"], p=[0.75, 0.15, 0.1])
        host_status = (
            _pick(rng, ["measured", "unavailable"], p=[0.8, 0.2])
            if rank < hosts
            else _pick(rng, ["not-read", "measured"], p=[0.9, 0.1])
        )
        idle_status = _pick(rng, ["measured", "short-window", "skipped", "unavailable"])
        zeus_status = _pick(rng, ["not-requested", "measured", "short-window", "unavailable"])
        rows.append(
            {
                **window,
                "rank": rank,
                "local_rank": rank // hosts,
                "pid": 100 + rank if rng.random() < 0.9 else 100,
                "host": host,
                "device": "cpu" if no_gpu else f"cuda:{rank // hosts}",
                "gpu_uuid": None if no_gpu else f"GPU-{gpu}",
                "gpu_index": None if no_gpu else gpu,
                "gpu_energy_mj": (
                    None
                    if no_gpu or estatus == "unavailable" or rng.random() < 0.05
                    else scale * float(rng.uniform(1e5, 1e6))
                ),
                "gpu_energy_status": "unavailable" if no_gpu else estatus,
                "gpu_energy_method": _pick(
                    rng, ["nvml-total-energy-counter", "zeus"], p=[0.9, 0.1]
                ),
                "gpu_energy_detail": _pick(rng, [None, None, "flagged", "no GPU in use", ""]),
                "energy_source": _pick(rng, ["nvml", "cross-check"], p=[0.8, 0.2]),
                "gpu_energy_mj_zeus": (
                    float(rng.uniform(1e3, 1e6)) if zeus_status != "not-requested" else None
                ),
                "gpu_energy_zeus_status": zeus_status,
                "idle_gpu_power_w": float(rng.uniform(20, 80)) if rng.random() < 0.8 else None,
                "idle_gpu_power_status": idle_status,
                "host_energy_mj": (
                    float(rng.uniform(1e3, 1e5)) if host_status == "measured" else None
                ),
                "host_dram_energy_mj": (
                    float(rng.uniform(1e2, 1e4)) if rng.random() < 0.9 else None
                ),
                "host_energy_status": host_status,
                "host_energy_detail": _pick(rng, [None, "zones package-0", "RAPL not readable"]),
                "idle_host_power_w": float(rng.uniform(5, 50)) if rng.random() < 0.8 else None,
                "idle_host_power_status": _pick(rng, ["measured", "not-read", "skipped"]),
                "cpu_time_s": float(rng.uniform(0, 9)) if rng.random() < 0.9 else None,
            }
        )
    return rows


def _serving_columns(rng, offered: float) -> dict:
    """A serving window's columns, nulls included where a real one has them."""
    queue = rng.random() < 0.8  # a server whose /metrics is parsed
    return {
        "load": f"rate={offered:g}", "load_mode": "rate", "offered_load": offered,
        "burstiness": 1.0, "requests_sent": int(rng.integers(10, 400)),
        "request_errors": int(rng.choice([0, 0, 0, 2])),
        "requests_cancelled": int(rng.choice([0, 0, 30])),
        "requests_dropped": int(rng.choice([0, 0, 0, 500])),
        "arrival_rate_rps": float(rng.uniform(1, 100)),
        "achieved_rate_rps": float(rng.uniform(1, 100)),
        "achieved_concurrency": float(rng.uniform(0, 8)) if queue else None,
        "load_sustained": float(rng.uniform(0.2, 1.0)),
        "slo_met_requests": int(rng.integers(0, 50)), "ramp_s": float(rng.uniform(0, 2)),
        "drain_s": float(rng.uniform(0, 5)),
        "queue_waiting_mean": float(rng.uniform(0, 9)) if queue else None,
        "queue_waiting_max": float(rng.integers(0, 20)) if queue else None,
        "queue_time_mean_s": float(rng.uniform(0, 1)) if queue else None,
        **{f"{m}_p{q}_s": float(rng.uniform(0.001, 2)) for m in ("ttft", "tpot", "itl", "e2e")
           for q in (50, 99)},
        "serving_status": "ok" if queue else "queue-unavailable (not parsed)",
    }  # fmt: skip


def random_energy(seed: int) -> pd.DataFrame:
    """Shard rows of a random sweep, as ``aggregate()`` hands them to ``windows()``."""
    rng = np.random.default_rng(seed)
    rows = []
    for job in range(12):
        scenario = "training" if job % 5 == 4 else "serving" if job % 5 == 3 else "inference"
        tp, pp, dp = (int(rng.choice([1, 2, 4])) for _ in range(3))
        point = {
            # Jobs 0 and 1 measure the same layout: one point, two jobs' windows.
            "job_id": f"job{job}",
            "model": _pick(rng, ["m-a", "m-b"]) if job > 1 else "m-a",
            "backend": _pick(rng, ["pytorch", "vllm"]) if job > 1 else "pytorch",
            "scenario": scenario,
            "tp": tp if job > 1 else 1,
            "pp": pp if job > 1 else 1,
            "dp": dp if job > 1 else 2,
        }
        ranks = point["tp"] * point["pp"] * point["dp"]
        phases = {"training": ["train"], "serving": ["serve"]}.get(
            scenario, ["generate", "prefill"]
        )
        prefill = rng.random() < 0.7
        for bs in rng.choice([1, 2, 4, 8], size=2, replace=False):
            for rep in range(int(rng.integers(1, 7))):
                for phase in phases:
                    if phase == "prefill" and not (prefill and rng.random() < 0.9):
                        continue
                    base = {**point, "batch_size": int(bs), "repetition": rep, "phase": phase}
                    if scenario == "serving":
                        base.update(_serving_columns(rng, float(rng.choice([2, 8]))))
                    scale = 0.02 if phase == "prefill" else 1.0
                    rows += [row(**r) for r in _window_rows(rng, base, ranks, scale)]
    order = rng.permutation(len(rows))  # shards arrive in any order
    return shards.to_table([rows[i] for i in order]).to_pandas()


# Seeds 0-2: together they reach every branch the comparison is for
# (test_random_frames_cover_the_cases); three more seeds cost ~8 s of `make test` (issue 28).
@pytest.mark.parametrize("seed", range(3))
def test_windows_and_summary_match_the_per_window_loops(seed, tmp_path):
    energy = random_energy(seed)
    # aggregate() hands windows() only the columns it reads (WINDOW_COLUMNS).
    got = aggregate.windows(energy[aggregate.WINDOW_COLUMNS])
    want = reference.windows(energy)
    assert list(got.columns) == list(want.columns)
    # Dtypes differ where the loop's apply() inferred them (int32 vs int64, object vs str).
    pd.testing.assert_frame_equal(got, want, check_dtype=False, check_exact=True)
    got_s, want_s = aggregate.summarize(want), reference.summarize(want)
    pd.testing.assert_frame_equal(got_s, want_s, check_exact=True)
    got_s.to_csv(tmp_path / "got.csv", index=False)
    want_s.to_csv(tmp_path / "want.csv", index=False)
    assert (tmp_path / "got.csv").read_text() == (tmp_path / "want.csv").read_text()
    assert aggregate.unexplained_nulls(got_s) == aggregate.unexplained_nulls(want_s)


def test_random_frames_cover_the_cases():
    """The frames above do reach the branches they are meant to compare."""
    w = reference.windows(pd.concat([random_energy(s) for s in range(3)], ignore_index=True))
    assert {"measured", "short-window", "partial", "unavailable"} <= set(w["gpu_energy_status"])
    assert {"measured", "partial", "unavailable"} <= set(w["host_energy_status"])
    assert {"ok", "oom", "error"} <= set(w["status"])
    assert (w["n_gpus"] < w["n_ranks"]).any() and (w["n_hosts"] > 1).any()
    assert w["gpu_energy_j"].notna().any() and w["host_energy_j"].notna().any()
    s = reference.summarize(w)
    assert {"ok", "partial"} <= set(s["status"]) and (s["repetitions_ok"] >= 4).any()
    assert s["energy_per_output_token_j_ci_low"].notna().any()
    assert s["prefill_decode_status"].str.split(",").map(lambda v: "ok" in v).any()
    assert s["decode_energy_per_output_token_j"].notna().any()
    serving = s[s["load_mode"] == "rate"]
    assert len(serving) and serving["energy_per_total_token_j"].notna().any()
    assert serving["queue_waiting_mean"].isna().any() and serving["request_errors"].gt(0).any()


def test_bootstrap_ci_groups_equals_bootstrap_ci():
    rng = np.random.default_rng(7)
    g = rng.integers(0, 40, size=300)
    values = rng.normal(size=300)
    values[rng.random(300) < 0.1] = np.nan
    lo, hi = bootstrap.bootstrap_ci_groups(g, values, 41)
    for k in range(41):
        want = aggregate.bootstrap_ci(values[g == k])
        np.testing.assert_array_equal([lo[k], hi[k]], want)


def test_empty_inputs():
    empty = shards.SCHEMA.empty_table().to_pandas()
    w = aggregate.windows(empty)
    assert w.empty and list(w.columns) == list(reference.windows(empty).columns)
    assert aggregate.summarize(w).empty and reference.summarize(w).empty
