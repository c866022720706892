"""The figures of ``make gpu-check`` from a finished sweep, and the table it prints.

Pure functions over the sweep's published tables (energy.parquet, summary.csv, every job.json)
and the independent reader's interval energies (scripts/gpu_check/counter_reader.py ``energy``):

- our window energy and Zeus's against the independent reading of the same counter, in signed %
  of it (median / p90 / max of |error|, mean signed error);
- each job's idle power against the independent reading over its stamped idle interval;
- the shared-GPU check (points flagged ``gpu_shared``; "not checked" where the verdict has no
  such reason);
- how many points are valid and, for the others, how often each reason was given;
- the job's window fraction: wall time inside measured windows / the job's wall time.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

WINDOW_COLUMNS = [
    "job_id",
    "scenario",
    "phase",
    "batch_size",
    "repetition",
    "gpu_uuid",
    "window_start_ns",
    "window_end_ns",
    "gpu_energy_mj",
    "gpu_energy_mj_zeus",
]


def intervals(energy: pd.DataFrame, jobs: list[dict], emulated: bool) -> pd.DataFrame:
    """One row per measured window and per job's idle interval and GPU, for the reader's
    ``energy`` command: source (the job id on the emulated node, each job's own; empty on a
    real node), gpu_uuid, start_ns, end_ns, kind, and our figures (``ours_j``, ``zeus_j``)."""
    ok = energy[(energy["status"] == "ok") & energy["gpu_uuid"].notna()]
    w = ok[WINDOW_COLUMNS].drop_duplicates(["job_id", "gpu_uuid", "window_start_ns"])
    win = pd.DataFrame(
        {
            "kind": "window",
            "job_id": w["job_id"],
            "scenario": w["scenario"],
            "phase": w["phase"],
            "batch_size": w["batch_size"],
            "repetition": w["repetition"],
            "gpu_uuid": w["gpu_uuid"],
            "start_ns": w["window_start_ns"].astype("int64"),
            "end_ns": w["window_end_ns"].astype("int64"),
            "ours_j": w["gpu_energy_mj"] / 1e3,
            "zeus_j": w["gpu_energy_mj_zeus"] / 1e3,
        }
    )
    idle_w = ok.drop_duplicates(["job_id", "gpu_uuid"]).set_index(["job_id", "gpu_uuid"])
    rows = []
    for job in jobs:
        t = job.get("timing") or {}
        a, b = t.get("idle_start_ns"), t.get("idle_end_ns")
        if a is None or b is None:
            continue
        for (job_id, uuid), r in idle_w.loc[
            idle_w.index.get_level_values(0) == job["job_id"]
        ].iterrows():
            power = r.get("idle_gpu_power_w")
            rows.append(
                {
                    "kind": "idle",
                    "job_id": job_id,
                    "scenario": r["scenario"],
                    "gpu_uuid": uuid,
                    "start_ns": int(a),
                    "end_ns": int(b),
                    "ours_j": None if pd.isna(power) else float(power) * (b - a) / 1e9,
                }
            )
    out = pd.concat([win, pd.DataFrame(rows)], ignore_index=True)
    out.insert(0, "source", out["job_id"] if emulated else "")
    return out


def _stats(errors_pct: pd.Series) -> dict:
    e = errors_pct.dropna().astype(float)
    if e.empty:
        return {"n": 0, "median_abs_pct": None, "p90_abs_pct": None, "max_abs_pct": None,
                "mean_signed_pct": None}  # fmt: skip
    a = e.abs()
    return {
        "n": int(len(e)),
        "median_abs_pct": float(a.median()),
        "p90_abs_pct": float(np.percentile(a, 90)),
        "max_abs_pct": float(a.max()),
        "mean_signed_pct": float(e.mean()),
    }


def _pct(ours: pd.Series, ref: pd.Series) -> pd.Series:
    ours, ref = pd.to_numeric(ours, errors="coerce"), pd.to_numeric(ref, errors="coerce")
    return (ours - ref) / ref * 100


def energy_figures(read: pd.DataFrame) -> dict:
    """Ours and Zeus's window energy, and idle power, against the independent reading."""
    win = read[read["kind"] == "window"]
    idle = read[read["kind"] == "idle"]
    missing = int(pd.to_numeric(win["independent_j"], errors="coerce").isna().sum())
    idle_rows = []
    for r in idle.itertuples():
        seconds = (r.end_ns - r.start_ns) / 1e9
        ind = pd.to_numeric(pd.Series([r.independent_j]), errors="coerce").iloc[0]
        ours = pd.to_numeric(pd.Series([r.ours_j]), errors="coerce").iloc[0]
        idle_rows.append(
            {
                "job_id": r.job_id,
                "scenario": r.scenario,
                "seconds": seconds,
                "ours_w": None if pd.isna(ours) else ours / seconds,
                "independent_w": None if pd.isna(ind) else ind / seconds,
                "error_pct": None if pd.isna(ours) or pd.isna(ind) else (ours - ind) / ind * 100,
            }
        )
    return {
        "windows": int(len(win)),
        "windows_without_independent_reading": missing,
        "ours_vs_independent": _stats(_pct(win["ours_j"], win["independent_j"])),
        "zeus_vs_independent": _stats(_pct(win["zeus_j"], win["independent_j"])),
        "idle": idle_rows,
        "idle_vs_independent": _stats(pd.Series([r["error_pct"] for r in idle_rows])),
    }


def verdict_figures(summary: pd.DataFrame, reasons_known: set[str]) -> dict:
    """Valid points, reason counts, and the shared-GPU check from the summary."""
    reasons = summary["invalid_reasons"].fillna("").astype(str)
    counts: dict[str, int] = {}
    for text in reasons:
        for code in filter(None, text.split(";")):
            counts[code] = counts.get(code, 0) + 1
    valid = summary["valid"].astype(str).str.lower().isin(["true", "1"])
    shared = (
        {"checked": True, "points_flagged": counts.get("gpu_shared", 0)}
        if "gpu_shared" in reasons_known
        else {"checked": False, "points_flagged": None}
    )
    return {
        "points": int(len(summary)),
        "valid_points": int(valid.sum()),
        "invalid_reasons": dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))),
        "gpu_shared": shared,
    }


def job_figures(jobs: list[dict]) -> dict:
    """Each job's window fraction (wall in windows / the job's wall), warm-up and phases (where
    its rank-0 wall went: job.json ``timing.phases_s``), and the sweep's fraction (windows'
    total over the jobs' total)."""
    per_job, win, wall = [], 0.0, 0.0
    for job in jobs:
        t = job.get("timing") or {}
        w, total = t.get("window_s"), t.get("rank0_wall_s")
        per_job.append(
            {
                "job_id": job["job_id"],
                "scenario": (job.get("job") or {}).get("scenario"),
                "wall_s": total,
                "window_s": w,
                "window_fraction": w / total if w is not None and total else None,
                "warmup": t.get("warmup"),
                "phases_s": t.get("phases_s"),
            }
        )
        if w is not None and total:
            win, wall = win + w, wall + total
    return {"jobs": per_job, "window_fraction": win / wall if wall else None}


def _f(x, spec: str = ".3g") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec)


def table(fig: dict) -> str:
    """The printed table of the check (docs/emulated-node.md, "Real GPU calibration")."""
    lines = [f"{'window energy vs independent reader':40} {'n':>4} {'median':>8} {'p90':>8} "
             f"{'max':>8} {'mean±':>8}"]  # fmt: skip
    e = fig.get("energy") or {}
    for name, key in (
        ("energysweep (|error| %)", "ours_vs_independent"),
        ("Zeus (|error| %)", "zeus_vs_independent"),
        ("idle power (|error| %)", "idle_vs_independent"),
    ):
        s = e.get(key) or {}
        lines.append(
            f"{name:40} {_f(s.get('n'), 'd'):>4} {_f(s.get('median_abs_pct')):>8} "
            f"{_f(s.get('p90_abs_pct')):>8} {_f(s.get('max_abs_pct')):>8} "
            f"{_f(s.get('mean_signed_pct'), '+.3g'):>8}"
        )
    if e.get("windows_without_independent_reading"):
        lines.append(
            f"windows the reader did not cover: {e['windows_without_independent_reading']}"
        )
    for r in e.get("idle", []):
        lines.append(
            f"idle {r['scenario']:<10} ours {_f(r['ours_w'], '.1f')} W, independent "
            f"{_f(r['independent_w'], '.1f')} W over {_f(r['seconds'], '.2f')} s"
        )
    v = fig.get("verdict") or {}
    if not v:
        lines.append("verdict: no summary (the sweep did not finish): shared-GPU check and valid "
                     "points unknown")  # fmt: skip
    else:
        sh = v["gpu_shared"]
        lines.append(
            "shared-GPU check: "
            + (f"{sh['points_flagged']} point(s) gpu_shared" if sh["checked"] else "not checked")
        )
        reasons = ", ".join(f"{k} {n}" for k, n in v["invalid_reasons"].items()) or "none"
        lines.append(f"valid points: {v['valid_points']} of {v['points']}; reasons: {reasons}")
    j = fig.get("jobs") or {}
    if j:
        each = ", ".join(
            f"{x['scenario']} {_f(x['window_fraction'], '.0%')}" for x in j.get("jobs", [])
        )
        total = _f(j.get("window_fraction"), ".0%")
        lines.append(f"window fraction (wall in windows / job wall): {total} ({each})")
        for x in j.get("jobs", []):
            phases = x.get("phases_s") or {}
            spent = ", ".join(f"{k} {v:.1f}" for k, v in phases.items() if v >= 0.05)
            if spent:
                lines.append(f"  {x['scenario']} {_f(x['wall_s'], '.1f')} s: {spent}")
    return "\n".join(lines)
