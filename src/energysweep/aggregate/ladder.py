"""The energy boundary ladder of every point: GPU, + host, node, idle-net, x PUE, gCO2e.

Per token (output tokens for inference, tokens trained on for training: ``ladder_token``), each
rung the median over the point's ok windows of that window's energy inside the boundary divided
by its tokens, with a ``*_method`` saying how it was obtained and a ``*_status`` (``measured``,
``estimated``, or why it is null; never 0 for something not measured):

1. ``boundary_gpu``: the GPUs' board energy (NVML counters, distinct GPU UUIDs);
2. ``boundary_gpu_host``: + the hosts' CPU packages and DRAM (RAPL), where RAPL was read;
3. ``boundary_node``: the nodes as Slurm's energy accounting measures them (energysweep.energy
   .node), where the site gathers it;
4. ``boundary_idle_net``: the widest measured boundary less its idle power x window time (the
   node has no idle baseline of its own: then GPU + host, else GPU);
5. ``facility_energy_estimate``: the widest measured *gross* boundary x PUE (config
   ``facility.pue``), with its band (``_low``/``_high``);
6. ``co2e_estimate_g``: rung 5 x grid carbon intensity (``facility.carbon_intensity_g_per_kwh``),
   with its band (low PUE x low intensity, high x high).
Rungs 5 and 6 are estimates, named so; their method names the boundary they scale and the
figures' provenance (source, year).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from energysweep.aggregate.windows import MEASURED
from energysweep.job.sections import Estimate, Facility
from energysweep.tables.phases import HEADLINE_PHASES, Phase
from energysweep.tables.shards import POINT_KEYS, WINDOW_KEYS

J_PER_KWH = 3.6e6
NODE_COLUMNS = [
    *WINDOW_KEYS,
    "status",
    "node_energy_mj",
    "node_energy_status",
    "node_energy_method",
    "node_energy_detail",
]
RUNGS = ("boundary_gpu", "boundary_gpu_host", "boundary_node", "boundary_idle_net")
ESTIMATES = ("facility_energy_estimate", "co2e_estimate_g")
# Summary column -> the status column that explains a null in it (aggregate.nulls).
NULL_STATUS: dict[str, tuple[str, ...]] = {
    **{f"{r}_j_per_token": (f"{r}_status",) for r in RUNGS},
    **{
        f"facility_energy_estimate_j_per_token{s}": ("facility_energy_estimate_status",)
        for s in ("", "_low", "_high")
    },
    **{f"co2e_estimate_g_per_token{s}": ("co2e_estimate_status",) for s in ("", "_low", "_high")},
}
BOUNDARY_NAMES = {
    "boundary_gpu": "GPU boards",
    "boundary_gpu_host": "GPU boards + host CPU/DRAM (RAPL)",
    "boundary_node": "nodes (Slurm energy accounting)",
}


def _node_per_window(rows: pd.DataFrame) -> pd.DataFrame:
    """Node energy (J) per window: the one row that read it (global rank 0)."""
    read = rows[rows["node_energy_status"].isin(MEASURED) & rows["node_energy_mj"].notna()]
    read = read.drop_duplicates(WINDOW_KEYS)
    return read[[*WINDOW_KEYS, "node_energy_mj", "node_energy_detail"]].assign(
        node_energy_j=read["node_energy_mj"] / 1e3
    )


def _per_window(win: pd.DataFrame, node_rows: pd.DataFrame) -> pd.DataFrame:
    """Each ok headline window's energy inside every boundary, per token."""
    w = win[win["phase"].isin(HEADLINE_PHASES) & win["status"].eq("ok")].copy()
    w = w.merge(_node_per_window(node_rows), on=WINDOW_KEYS, how="left")
    tokens = w["output_tokens"].where(w["phase"] != Phase.TRAIN.value, w["input_tokens"])
    tokens = tokens.astype(float).where(lambda t: t > 0)
    gpu = w["gpu_energy_j"].where(w["gpu_energy_status"].isin(MEASURED))
    host_ok = w["host_energy_status"].eq("measured")
    host = (w["host_energy_j"] + w["host_dram_energy_j"].fillna(0.0)).where(host_ok)
    gpu_host = gpu + host
    idle_host = w["host_energy_idle_adjusted_j"] + w["host_dram_energy_j"].fillna(0.0)
    idle_net = (w["gpu_energy_idle_adjusted_j"] + idle_host).where(host_ok)
    idle_net = idle_net.fillna(w["gpu_energy_idle_adjusted_j"].where(~host_ok))
    return w[POINT_KEYS].assign(
        boundary_gpu=gpu / tokens,
        boundary_gpu_host=gpu_host / tokens,
        boundary_node=w["node_energy_j"] / tokens,
        boundary_idle_net=idle_net.where(gpu.notna()) / tokens,
        _idle_of=np.where(host_ok, "GPU boards + host CPU/DRAM", "GPU boards"),
        _host_status=w["host_energy_status"].fillna("unavailable"),
        _node_detail=w["node_energy_detail"],
    )


def ladder(
    summary: pd.DataFrame, win: pd.DataFrame, node_rows: pd.DataFrame, facility: Facility | None
) -> pd.DataFrame:
    """The ladder's columns for every summary point (same index as ``summary``).

    Args:
        summary: one row per point (energysweep.aggregate.points.summarize).
        win: the windows (energysweep.aggregate.windows).
        node_rows: shard rows with :data:`NODE_COLUMNS`.
        facility: the config's ``facility`` section, typed (PUE and carbon intensity with
            provenance); None: neither is estimated.
    """
    per = _per_window(win, node_rows)
    by = per.groupby(POINT_KEYS, sort=False)
    med = by[list(RUNGS)].median().reset_index()
    first = by[["_idle_of", "_host_status"]].first().reset_index()
    ok_rows = node_rows[node_rows["status"].eq("ok")]
    node_why = (
        ok_rows.groupby(POINT_KEYS, sort=False)["node_energy_detail"].first().rename("_node_why")
    ).reset_index()
    out = summary[POINT_KEYS].merge(med, on=POINT_KEYS, how="left")
    out = out.merge(first, on=POINT_KEYS, how="left").merge(node_why, on=POINT_KEYS, how="left")
    out.index = summary.index
    cols = {
        "ladder_token": np.where(
            summary["scenario"].eq("training"), "training token", "output token"
        )
    }
    cols.update(_rungs(out, summary))
    cols.update(_estimates(out, facility))
    return pd.DataFrame(cols, index=summary.index)


def _rungs(out: pd.DataFrame, summary: pd.DataFrame) -> dict:
    no_gpu = "unavailable (no GPU energy: " + summary["gpu_energy_status"].astype(str) + ")"
    status = {
        "boundary_gpu": np.where(out["boundary_gpu"].notna(), "measured", no_gpu),
        "boundary_gpu_host": np.where(
            out["boundary_gpu_host"].notna(),
            "measured",
            np.where(
                out["boundary_gpu"].notna(),
                "unavailable (host RAPL: " + out["_host_status"].fillna("unavailable") + ")",
                no_gpu,
            ),
        ),
        "boundary_node": np.where(
            out["boundary_node"].notna(),
            "measured",
            "unavailable (" + out["_node_why"].fillna("no node energy reading") + ")",
        ),
        "boundary_idle_net": np.where(
            out["boundary_idle_net"].notna(),
            "measured",
            np.where(out["boundary_gpu"].notna(), "unavailable (no idle baseline)", no_gpu),
        ),
    }
    method = {
        "boundary_gpu": "NVML energy counters, summed over distinct GPU UUIDs",
        "boundary_gpu_host": "GPU counters + RAPL package and DRAM, each host once",
        "boundary_node": "Slurm ConsumedEnergy of the job step (sstat), all its nodes",
    }
    cols = {}
    for r in RUNGS:
        cols[f"{r}_j_per_token"] = out[r].to_numpy(dtype=float)
        if r == "boundary_idle_net":
            cols[f"{r}_method"] = (
                "(" + out["_idle_of"].fillna("GPU boards") + ") - idle power x window time"
            ).to_numpy()
        else:
            cols[f"{r}_method"] = method[r]
        cols[f"{r}_status"] = status[r]
    return cols


def _widest(out: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Per point the widest measured gross boundary's J/token and its name."""
    value = pd.Series(np.nan, index=out.index)
    name = pd.Series(None, index=out.index, dtype=object)
    for r in ("boundary_gpu", "boundary_gpu_host", "boundary_node"):  # narrow to wide
        has = out[r].notna()
        value[has], name[has] = out.loc[has, r], BOUNDARY_NAMES[r]
    return value, name


def _band(entry: Estimate, label: str) -> str:
    return f"{label} {entry.value:g} [{entry.low:g}-{entry.high:g}] ({entry.source}, {entry.year})"


def _estimates(out: pd.DataFrame, facility: Facility | None) -> dict:
    base, boundary = _widest(out)
    pue = facility.pue if facility is not None else None
    ci = facility.carbon_intensity_g_per_kwh if facility is not None else None
    n = len(out)
    cols: dict = {}
    if pue is None or pue.value is None:
        fac = {s: np.full(n, np.nan) for s in ("", "_low", "_high")}
        fac_status = np.full(n, "not estimated (facility.pue is not set)", dtype=object)
        fac_method = "none"
    else:
        fac = {
            s: base.to_numpy() * getattr(pue, k)
            for s, k in (("", "value"), ("_low", "low"), ("_high", "high"))
        }
        fac_status = np.where(base.notna(), "estimated", "unavailable (no measured boundary)")
        fac_method = (_band(pue, "PUE") + " x " + boundary.fillna("nothing measured")).to_numpy()
    for s, v in fac.items():
        cols[f"facility_energy_estimate_j_per_token{s}"] = v
    cols["facility_energy_estimate_method"] = fac_method
    cols["facility_energy_estimate_status"] = fac_status
    if ci is None or ci.value is None:
        co2 = {s: np.full(n, np.nan) for s in fac}
        co2_status = np.full(
            n, "not estimated (facility.carbon_intensity_g_per_kwh is not set)", dtype=object
        )
        co2_method = "none"
    else:
        co2 = {
            s: fac[s] / J_PER_KWH * getattr(ci, k)
            for s, k in (("", "value"), ("_low", "low"), ("_high", "high"))
        }
        co2_status = np.where(np.isnan(fac[""]), fac_status, "estimated")
        co2_method = _band(ci, "gCO2e/kWh") + " x facility energy"
    for s, v in co2.items():
        cols[f"co2e_estimate_g_per_token{s}"] = v
    cols["co2e_estimate_method"] = co2_method
    cols["co2e_estimate_status"] = co2_status
    return cols
