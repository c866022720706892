"""Energy per window against the emulated node's ground truth, for pipeline tests.

The bounds are per row: every window, and every rank's and every GPU's windows, not a median of
all rows (issue 31.2: a median let a broken edge, or a bug confined to rank >= 1, pass).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from energysweep.energy.ticks import SLOW_READ_S
from energysweep.hw.emulated import node_config
from energysweep.hw.emulated.profiles import profile
from energysweep.hw.emulated.truth import Truth


def against_truth(wf: Path) -> pd.DataFrame:
    """Every GPU row of every job of ``wf``'s results with the true energy of its window.

    Columns added: ``truth_mj`` (the owners' exact integral over the row's window edges),
    ``sensor_mj`` (what a perfect method reads off the job's emulated counter: the truth times
    the sensor's gain, plus its offset; hw/emulated/profiles.py), ``error_pct`` ((measured -
    sensor) / sensor in %), ``truth_error_pct`` (against the truth itself) and ``window_s``.
    """
    frames = []
    for job in sorted((Path(wf) / "results" / "shards").glob("**/job.json")):
        rows = pd.read_parquet(job.with_name("shards.parquet"))
        rows = rows[rows["gpu_uuid"].notna() & rows["gpu_energy_mj"].notna()]
        rows = rows.reset_index(drop=True)
        truth = Truth.read(job.with_name("emulated"))
        node = node_config.read(job.with_name("emulated"))
        rows["truth_mj"] = truth.windows(rows)
        dur_s = (rows["window_end_ns"] - rows["window_start_ns"]) / 1e9
        rows["sensor_mj"] = node.counter_gain * rows["truth_mj"] + node.counter_offset_w * dur_s
        rows["power_limit_w"] = profile(node.profile).max_limit_w
        frames.append(rows)
    out = pd.concat(frames, ignore_index=True)
    out["error_pct"] = 100 * (out["gpu_energy_mj"] - out["sensor_mj"]) / out["sensor_mj"]
    out["truth_error_pct"] = 100 * (out["gpu_energy_mj"] - out["truth_mj"]) / out["truth_mj"]
    out["window_s"] = (out["window_end_ns"] - out["window_start_ns"]) / 1e9
    out["window_w"] = out["sensor_mj"] / 1e3 / out["window_s"]
    return out


# The bounds, against what the job's emulated counter would read over the window (the truth
# times the sensor's gain: a gain is a property of the sensor no method can see; the sensor's
# noise stays in the error). The error of a window is counted in seconds of its own energy,
# (measured - sensor) / sensor x window length: the edges' share, which does not shrink with the
# window. Measured on this machine (2 cores, load average 12-15 from other sessions), h200-sxm
# with the counter visible by wall time (hw/emulated/node.py), 42 windows of 0.5-5.4 s:
# |error| median 1.8 / 3.1 ms, worst 11.6 / 18.9 ms (two runs); each rank's median signed
# error +1.0 to +1.8 ms (the
# emulated GPU follows the rank's CPU, busy at the barriers next to the edges: a small positive
# bias a real GPU would not have); windows >= 1 s within 0.87%. Each mutation of energy/nvml.py
# fails them: start-edge correction dropped (every rank's median +5.1 ms), end-edge correction
# dropped (median 29 ms, worst 71 ms), rank 1's end one refresh late (rank 1's median 58 ms).
WORST_ERROR_S = 0.025  # every window
# Windows that are not the mutations' canary above: the vLLM sweep's (0.06-0.14 s, shorter than
# a refresh, 2-3 a rank). With `make test`'s two sessions on the 2 cores, one 0.14 s window was
# 28.9 ms off and one rank's median -8.1 ms (CI runs of 2026-11-28). Their bound is half a
# refresh period (100 ms on every profile used): an edge one refresh off still fails. Not
# for test_emulated_pipeline: there the start-edge mutation's rank medians (+2.7 / +3.2 ms in a
# run of 2026-11-28) stay under RANK_BIAS_S and only its worst window (56.9 ms) fails it.
HALF_REFRESH_S = 0.05
# |median signed error| of each rank's windows, and of each GPU's: a systematic offset of one
# rank's edges. Not the start-edge mutation's canary here (above), and 3.5 ms was the noise's
# own size: CI run 72 (2026-11-29, the two sessions of `make test` starting at once) had rank 1's
# median +3.80 ms, its jobs' rank medians +0.6 to +5.8 ms, no window past 14.6 ms. At 8 ms it
# fails an offset the worst-window bound lets through (that run's windows with rank 1's energy
# 10 ms higher: every window within 25 ms, rank 1's median 13.8 ms) and every mutation above
# that moves one rank's edges by a refresh.
RANK_BIAS_S = 0.008
LONG_WINDOW_S = 1.0
LONG_ERROR_PCT = 1.5  # every window of at least LONG_WINDOW_S
# The Slurm tests' sweeps run on slurmd nodes in network namespaces, beside the other pytest
# session, and there the tight bounds do not hold yet: in the fresh-clone CI run a 0.68 s prefill
# window was 29.9 ms off and one GPU's median -3.7 ms; rerun alone, a 0.72 s prefill window was
# 95 ms off (about one counter refresh: an edge seen one refresh late, not explained yet). Until
# it is, they keep main's former per-window bound (0.45 s), a per-rank/GPU median of 50 ms, and
# check placement and the cluster's behaviour; the tight bounds, and the mutations they catch,
# are test_emulated_pipeline's.
# Explained (2026-11-28), for the failures of test_emulated_pipeline at these bounds (a 1.12 s
# pp=2 generate window -24.5 ms in CI, a 0.63 s one -52 ms before): the start edge extrapolated
# from the two refreshes its rank saw in `prepare`, across all of the barrier that then waited for
# the slower rank. The rank's polling stopped there, its emulated GPU fell to idle (the CI
# window's truth: ~130 W over the 200 ms before the edge, against 170-180 W while it polled; the
# other rank's did not fall), and prepare's power stood for the whole wait: extrapolated from the
# refreshes 2-3 periods before the edge, the start value is 8.1-10.9 J high on the recorded
# truth, and that window measured 10.1 J low. The start edge now watches the counters through the
# barrier (energy/ticks.py, Watch with latest; energysweep.dist.barrier): checked by
# test_the_start_edge_extrapolates_from_the_refreshes_before_the_barrier_ends (unit tests).
# That watch first polled between checks of a non-blocking barrier, and a rank left the barrier
# only when its read in flight returned: the emulated H200's reads take 2.6 ms median and up to
# 185 ms (its measured tail), so now and then one rank started its window tens of ms after the
# other (CI run 40: a 0.73 s pp=2 window -129 ms, 17.6% low; the 2-node sweep's GPU medians -66 and
# -68 ms). The barrier blocks again, a thread watches, and the edge is taken at the barrier's
# end (test_the_start_edge_is_the_barriers_end_not_a_read_in_flight); alone, rank medians +0.9 /
# +1.1 ms, worst 4.2 ms over 42 windows (2026-11-28).
# The Slurm sweeps keep their bounds below: after the fix, the 2-node sweep's four ranks still had
# medians of -9.8 to -12.1 ms over two 1.5-1.8 s windows (within 17.5 ms each), not explained.
# Read since (CI runs 42-43, 2026-11-28) as ranks late out of a barrier, taking their edges
# after the window's: the window's end is now the earliest end too, and the late rank's rows
# state their lateness (measure/combine.py combine_ranks; flagged rows below).
# With the blocking barrier (CI run 41, 2026-11-28): the 2-node sweep's 28 windows within
# 13.2 ms, GPU medians within 4.3 ms; the shared-node sweep's 48 within 29 ms, medians 2.4 ms.
# One run: the bounds stay until more runs show where they hold.
SLURM_WORST_ERROR_S = 0.45
SLURM_RANK_BIAS_S = 0.05  # one 2-node run: a GPU's median -32.7 ms (the same unexplained edge)
SLURM_LONG_ERROR_PCT = 10.0  # one refresh of a 1 s window's power
# Windows flagged edge_read_slow that a sweep may have (each still held to what its slow read
# explains), as a share of its windows, at least one: few, so that flags cannot hide the bounds.
FLAGGED_SHARE = 1 / 8
# The 2-node sweep's (slurmd in network namespaces, their ranks on the 2 cores the other pytest
# session shares), its two workflows' windows taken together: ranks leave a barrier 40-80 ms
# apart now and then. Two CI runs failed the 1 / 8 share with every flagged window explained: run
# 50, three slow reads; run 59 (2026-11-29), 3 of 18 windows (1 of the one-rank-per-node
# workflow's 16; both of the two-per-node workflow's 2, its ranks 40-80 ms late out of a barrier).
# A quarter keeps most windows under the bounds.
MULTINODE_FLAGGED_SHARE = 1 / 4


def slow_read_j(rows: pd.DataFrame) -> pd.Series:
    """What each window's slowest edge read (or start extrapolation) can move its energy by (J):
    that long at the GPU's power limit. The allowance of a window the verdict flags
    edge_read_slow."""
    return rows["gpu_edge_read_max_ms"].fillna(0) / 1e3 * rows["power_limit_w"]


def error_s(rows: pd.DataFrame) -> pd.Series:
    """Signed error of each window in seconds of its own energy."""
    return (rows["gpu_energy_mj"] - rows["sensor_mj"]) / rows["sensor_mj"] * rows["window_s"]


COLUMNS = ["job_id", "phase", "rank", "gpu_uuid", "window_s", "error_pct", "error_s",
           "gpu_edge_read_max_ms", "gpu_energy_detail"]  # fmt: skip


def unflagged(rows: pd.DataFrame, worst_s: float, flagged_share: float) -> pd.DataFrame:
    """The rows (with ``error_s``) the verdict does not flag edge_read_slow, after checking that
    each flagged one is off by no more than its slow read explains and that few are flagged."""
    # A window the verdict flags edge_read_slow (a slow read; a start value extrapolated past a
    # refresh the watch missed, energy/nvml.py; a rank late out of a barrier,
    # measure/combine.py) is off by no more than that time at the GPU's power limit, and is
    # not held to the bounds; few windows are flagged (2026-11-28: one of 42 in a CI run, a
    # rank off the CPU ~225 ms; one of 42 alone, a 165 ms span past a missed refresh; in a
    # 2-node sweep one of 2, a rank 65 ms late out of the end barrier).
    uncertain_s = rows["gpu_edge_read_max_ms"].fillna(0) / 1e3
    flagged = uncertain_s > SLOW_READ_S
    error_j = (rows["gpu_energy_mj"] - rows["sensor_mj"]).abs() / 1e3
    explained = error_j <= slow_read_j(rows) + worst_s * rows["window_w"]
    assert explained[flagged].all(), rows.loc[flagged & ~explained, COLUMNS].to_dict("records")
    windows = rows.groupby(["job_id", "phase", "window_start_ns"]).ngroups
    flagged_windows = rows[flagged].groupby(["job_id", "phase", "window_start_ns"]).ngroups
    allowed = max(1, int(windows * flagged_share))
    assert flagged_windows <= allowed, (
        f"{flagged_windows} of {windows} windows flagged, at most {allowed}",
        rows.loc[flagged, COLUMNS].to_dict("records"),
    )
    if flagged.any():
        print("flagged edge_read_slow, not held to the bounds:")
        print(rows.loc[flagged, COLUMNS].to_string())
    return rows[~flagged]


def assert_matches_truth(
    rows: pd.DataFrame,
    worst_s: float = WORST_ERROR_S,
    bias_s: float = RANK_BIAS_S,
    long_pct: float = LONG_ERROR_PCT,
    flagged_share: float = FLAGGED_SHARE,
) -> None:
    """Every window's energy is the sensor's reading of the ground truth within the bounds:
    each window, each window >= 1 s in %, and the bias of each rank and of each GPU; at most
    ``flagged_share`` of the windows (at least one) flagged edge_read_slow instead."""
    assert len(rows) and rows["truth_mj"].notna().all(), "a window has no ground truth"
    rows = rows.assign(error_s=error_s(rows))
    rows = unflagged(rows, worst_s, flagged_share)
    worst = rows.loc[rows["error_s"].abs().idxmax(), COLUMNS]
    by_rank = rows.groupby("rank")["error_s"].median()
    by_gpu = rows.groupby(["host", "gpu_uuid"])["error_s"].median()
    long = rows[rows["window_s"] >= LONG_WINDOW_S]
    print(
        f"{len(rows)} GPU windows of {rows['window_s'].min():.2f}-{rows['window_s'].max():.2f} s:"
        f" |error| median {1e3 * rows['error_s'].abs().median():.2f} ms"
        f" ({rows['error_pct'].abs().median():.3f}%), worst {1e3 * abs(worst['error_s']):.2f} ms"
        f" ({abs(worst['error_pct']):.3f}%); median signed error by rank (ms)"
        f" {(1e3 * by_rank).round(2).to_dict()}; {len(long)} windows >= {LONG_WINDOW_S} s,"
        f" worst {long['error_pct'].abs().max():.3f}%; against the truth itself: median"
        f" {rows['truth_error_pct'].median():+.3f}%"
    )
    print(rows[COLUMNS].sort_values("error_s").to_string())
    assert rows["error_s"].abs().max() <= worst_s, worst.to_dict()
    assert by_rank.abs().max() <= bias_s, by_rank.to_dict()
    assert by_gpu.abs().max() <= bias_s, by_gpu.to_dict()
    if len(long):
        assert long["error_pct"].abs().max() <= long_pct, long.loc[
            long["error_pct"].abs().idxmax(), COLUMNS
        ].to_dict()
