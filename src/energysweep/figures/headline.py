"""The report's first screen: the sweep's answer, before anything else.

Per scenario and batch size the most energy-efficient *valid* configuration with its energy per
token and 95% CI; how many points are valid or invalid and the most frequent reasons; the GPU
setting banner (each setting's power limit and SM clock as a percentage of each GPU model's
default, as read back). Where no GPU energy was measured (a CPU run) it says so - every point
is ``no_gpu_energy`` - and names the CPU-time leaders instead, which are not energy.

:func:`headline_html` is a pure function (prepared summary in, an HTML fragment out); the
report includes the fragment in its opening page (report/workflow.rst).
"""

from __future__ import annotations

import html
from collections import Counter

import pandas as pd

from energysweep.figures.style import layout_name

# Snakemake's report centres its opening page vertically in a scroll box, which cuts off the top
# of a description taller than the window (no scrolling reaches it): start it at the top instead.
STYLE = (
    "<style>div.h-screen.items-center:has(#es-headline){align-items:flex-start}"
    "#es-headline table{font-size:0.8em}#es-headline h2{margin-top:0}</style>"
)
METRIC = {
    "inference": ("energy_per_output_token_j", "J per output token"),
    "training": ("energy_per_train_token_j", "J per training token"),
}
CPU_METRIC = {
    "inference": ("cpu_s_per_output_token", "CPU s per output token"),
    "training": ("cpu_s_per_train_token", "CPU s per training token"),
}


def _e(x) -> str:
    return html.escape(str(x))


def _config(r) -> str:
    return (
        f"{r['model']} · {r['backend']} · {layout_name(r['tp'], r['pp'], r['dp'])} · "
        f"GPU setting: {r.get('gpu_setting', 'node default')}"
    )


def _ci(r, column: str) -> str:
    lo, hi = r.get(f"{column}_ci_low"), r.get(f"{column}_ci_high")
    if pd.notna(lo) and pd.notna(hi):
        return f"95% CI {lo:.4g}–{hi:.4g}"
    return "no CI (" + _e(r.get("ci_status", "fewer than 2 ok repetitions")) + ")"


def _leaders(s: pd.DataFrame, metrics: dict, valid_only: bool) -> str:
    """One table per scenario: per batch size the row with the lowest metric."""
    out = []
    for scenario, (column, unit) in metrics.items():
        rows = s[s["scenario"].eq(scenario)] if len(s) else s
        if rows.empty or column not in rows:
            continue
        lines = []
        for bs, g in rows.groupby("batch_size", sort=True):
            pool = g[g[column].notna() & (g["valid_point"] if valid_only else True)]
            if pool.empty:
                why = _top_reasons(g, 2) or "nothing measured"
                lines.append(f"<tr><td>{bs}</td><td colspan=3>no valid point ({_e(why)})</td></tr>")
                continue
            r = pool.loc[pool[column].idxmin()]
            lines.append(
                f"<tr><td>{bs}</td><td><b>{r[column]:.4g}</b> {unit}</td>"
                f"<td>{_ci(r, column)}</td><td>{_e(_config(r))}</td></tr>"
            )
        out.append(
            f"<h3>{_e(scenario)}</h3><table class=es-headline><tr><th>batch size</th>"
            f"<th>{'most energy-efficient valid' if valid_only else 'lowest'}</th>"
            f"<th>uncertainty</th><th>configuration</th></tr>{''.join(lines)}</table>"
        )
    return "".join(out)


def _top_reasons(s: pd.DataFrame, n: int = 3) -> str:
    counts = Counter(
        code for text in s["invalid_reasons_text"] for code in str(text).split(";") if code
    )
    return ", ".join(f"{code} ({k})" for code, k in counts.most_common(n))


def _banner(s: pd.DataFrame) -> str:
    """Each GPU model's settings as read back, as a percentage of that model's default."""
    if "power_limit_pct_of_default" not in s or s["power_limit_pct_of_default"].isna().all():
        settings = sorted(set(s.get("gpu_setting", pd.Series(["node default"]))))
        return (
            "<p><b>GPU setting:</b> "
            + _e(", ".join(settings))
            + " — no GPU read back (no power limit or clock to give as % of default)</p>"
        )
    items = []
    models = s["gpu_model"].fillna("GPU") if "gpu_model" in s else pd.Series("GPU", index=s.index)
    for (model, label), g in s.groupby([models, "gpu_setting"], sort=True):
        pl, sm = g["power_limit_pct_of_default"].median(), g["sm_clock_pct_of_default"].median()
        parts = [f"power limit {pl:.0f}%" if pd.notna(pl) else "power limit not read back"]
        parts.append(f"SM clock {sm:.0f}%" if pd.notna(sm) else "SM clock not read back")
        items.append(f"<li>{_e(model)} — {_e(label)}: {', '.join(parts)} of default</li>")
    return (
        "<p><b>GPU settings (read back, % of each GPU's default):</b></p><ul>"
        + "".join(items)
        + "</ul>"
    )


def headline_html(s: pd.DataFrame) -> str:
    """The first screen as an HTML fragment, from prepared rows (figures.data.prepare)."""
    n = len(s)
    valid = int(s["valid_point"].sum()) if n else 0
    parts = [STYLE, '<div class="es-headline" id="es-headline"><h2>What this sweep found</h2>']
    counts = f"<p><b>{n}</b> points: <b>{valid}</b> valid, <b>{n - valid}</b> invalid"
    reasons = _top_reasons(s) if n else ""
    parts.append(counts + (f" (top reasons: {_e(reasons)})" if reasons else "") + ".</p>")
    gpu_energy = n and any(
        METRIC[sc][0] in s and s.loc[s["scenario"].eq(sc), METRIC[sc][0]].notna().any()
        for sc in METRIC
    )
    if not gpu_energy:
        every = n and all("no_gpu_energy" in str(t) for t in s["invalid_reasons_text"])
        parts.append(
            "<p><b>No GPU energy was measured</b>"
            + (f": every point ({n} of {n}) is <code>no_gpu_energy</code>" if every else "")
            + ", so no configuration can be called energy-efficient. What was measured: CPU "
            "time per token (<i>not energy</i>); its leaders:</p>"
        )
        parts.append(_leaders(s, CPU_METRIC, valid_only=False))
    else:
        parts.append(_leaders(s, METRIC, valid_only=True))
    parts.append(_banner(s))
    parts.append("</div>")
    return "\n".join(parts)
