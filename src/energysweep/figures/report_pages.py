"""Self-contained HTML pages for the Snakemake report: the summary table and the environment.

Each page is one file with inline CSS and a few lines of inline JavaScript (sort by a column,
filter rows): the report embeds it as a data URI, so it can load nothing from elsewhere.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

import pandas as pd
import yaml

from energysweep.aggregate.nulls import TOKEN_HEADLINE
from energysweep.tables.io import write_text_atomic
from energysweep.tables.shards import POINT_KEYS

# Shown first, in this order; every other summary column follows.
LEADING_COLUMNS = [
    *POINT_KEYS,
    "valid",
    "invalid_reasons",
    "status",
    "repetitions_ok",
    *TOKEN_HEADLINE,
    "energy_per_train_token_j",
    "train_tokens_per_s",
    "energy_per_output_token_idle_adjusted_j",
    "gpu_energy_status",
    "gpu_energy_detail",
    "host_energy_per_output_token_j",
    "host_energy_status",
    "cpu_time_s",
    "device",
]

_STYLE = """
body{font-family:system-ui,sans-serif;font-size:13px;margin:12px;color:#222}
h1{font-size:17px}h2{font-size:14px;margin-top:18px}
table{border-collapse:collapse;font-size:12px}
th,td{border:1px solid #ccc;padding:2px 6px;white-space:nowrap;text-align:left}
th{background:#eef;position:sticky;top:0;cursor:pointer}
td.num{text-align:right;font-variant-numeric:tabular-nums}
td.null{color:#999}tr.invalid td{background:#fde8e8}
.wrap{overflow:auto;max-height:80vh}.meta{color:#555}
pre{background:#f6f6f6;padding:8px;overflow:auto;max-height:60vh}
.emulated{background:#b00020;color:#fff;padding:10px;font-size:15px}
"""

# Sort on header click (numbers numerically, nulls last) and filter rows by a substring.
_SCRIPT = """
function esSort(th){const t=th.closest('table'),i=[...th.parentNode.children].indexOf(th);
const asc=th.dataset.dir!=='asc';th.dataset.dir=asc?'asc':'desc';
const rows=[...t.tBodies[0].rows];const v=r=>r.cells[i].dataset.v;
rows.sort((a,b)=>{const x=v(a),y=v(b);if(x===y)return 0;if(x==='')return 1;if(y==='')return -1;
const p=parseFloat(x),q=parseFloat(y);const c=(!isNaN(p)&&!isNaN(q))?p-q:x.localeCompare(y);
return asc?c:-c});rows.forEach(r=>t.tBodies[0].appendChild(r));}
function esFilter(box){const f=box.value.toLowerCase();
document.querySelectorAll('table.es tbody tr').forEach(r=>{
r.style.display=r.textContent.toLowerCase().includes(f)?'':'none'});}
"""


def _cell(value) -> tuple[str, str, str]:
    """(display text, sort value, css class) of one cell; nulls shown as an em dash."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return "—", "", "null"
    if isinstance(value, bool):
        return str(value), str(value), ""
    if isinstance(value, int | float):
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        return text, repr(float(value)), "num"
    return str(value), str(value), ""


def table_html(frame: pd.DataFrame, row_class=None) -> str:
    """A sortable HTML table of ``frame`` (escaped); ``row_class(row)`` may mark rows."""
    head = "".join(
        f'<th onclick="esSort(this)" title="sort">{html.escape(str(c))}</th>' for c in frame.columns
    )
    body = []
    for _, row in frame.iterrows():
        cells = []
        for c in frame.columns:
            text, sort, cls = _cell(row[c])
            title = (
                ' title="null: not measured or not applicable; see the status columns"'
                if cls == "null"
                else ""
            )
            cells.append(
                f'<td class="{cls}" data-v="{html.escape(sort)}"{title}>{html.escape(text)}</td>'
            )
        cls = row_class(row) if row_class else ""
        body.append(f'<tr class="{cls}">' + "".join(cells) + "</tr>")
    return (
        f'<div class="wrap"><table class="es"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def _page(title: str, body: str) -> str:
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>{body}<script>{_SCRIPT}</script></body></html>"
    )


def _invalid(row) -> str:
    v = str(row.get("valid", "")).strip().lower()
    return "invalid" if v in ("false", "0", "no") else ""


EMULATED_BANNER = (
    '<p class="emulated"><b>EMULATED GPU NODE: not a measurement of hardware.</b> The GPU energy '
    "here was read from energysweep's emulated GPU node (<code>measurement.device: emulated</code>"
    "{profile}), whose power follows the ranks' CPU activity: it tests the measurement method "
    "against a known truth. No point is valid (reason <code>emulated</code>); cite nothing.</p>"
)


def emulated_banner(summary: pd.DataFrame, env: pd.DataFrame | None = None) -> str:
    """The banner for results measured on the emulated node ("" otherwise)."""
    reasons = summary.get("invalid_reasons", pd.Series(dtype=object)).astype(str)
    profiles = []
    if env is not None and "emulated_gpu_profile" in env:
        profiles = sorted(env["emulated_gpu_profile"].dropna().unique())
    if not profiles and not reasons.str.contains("emulated").any():
        return ""
    return EMULATED_BANNER.format(profile=f", profile {', '.join(profiles)}" if profiles else "")


def summary_page(summary: pd.DataFrame) -> str:
    """The whole summary (one row per grid point) as a sortable, filterable table."""
    lead = [c for c in LEADING_COLUMNS if c in summary]
    frame = summary[lead + [c for c in summary.columns if c not in lead]]
    n_invalid = int((frame.apply(_invalid, axis=1) == "invalid").sum()) if len(frame) else 0
    body = emulated_banner(summary) + (
        f'<p class="meta">{len(frame)} grid points, {len(frame.columns)} columns'
        + (f", {n_invalid} invalid (red rows)" if "valid" in frame else "")
        + ". Click a header to sort; type to filter rows. — means null: not measured or not "
        "applicable, and the matching <code>*_status</code> column says which. The same table "
        "is <code>results/summary.csv</code>.</p>"
        '<p><input type="search" placeholder="filter rows…" oninput="esFilter(this)" '
        'aria-label="filter rows"></p>' + table_html(frame, _invalid)
    )
    return _page("energysweep summary (results/summary.csv)", body)


def _distinct(env: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    cols = [c for c in columns if c in env]
    return env[cols].drop_duplicates().reset_index(drop=True) if cols else pd.DataFrame()


# The environment page's GPU and job tables: which columns, in order.
GPU_COLUMNS = (
    "host", "gpu_name", "gpu_uuid", "gpu_pci_bus_id", "driver", "cuda_driver_version",
    "gpu_memory_total_bytes", "gpu_power_limit_mw", "gpu_max_sm_clock_mhz",
    "emulated_gpu_profile",
)  # fmt: skip
JOB_COLUMNS = (
    "job_id", "config_hash", "code_version", "git_commit", "gpu_count", "host_count",
    "slurm_job_id", "slurm_partition", "slurm_nodelist", "seed",
)  # fmt: skip


def _sweep_facts(env: pd.DataFrame, record: dict) -> pd.DataFrame:
    """The sweep's hash, code version and counts of jobs and distinct GPUs."""
    return pd.DataFrame(
        [
            {"item": "sweep hash", "value": record.get("sweep_hash")},
            {"item": "code version", "value": record.get("code_version")},
            {"item": "jobs", "value": len(env["job_id"].unique()) if "job_id" in env else 0},
            {
                "item": "GPUs used (distinct UUIDs)",
                "value": int(env["gpu_uuid"].nunique()) if "gpu_uuid" in env else 0,
            },
        ]
    )


def environment_page(
    env: pd.DataFrame,
    record: dict,
    skipped: pd.DataFrame | None = None,
    jobs: pd.DataFrame | None = None,
) -> str:
    """What a methods section needs: sweep hash, code version, GPUs, driver, engine versions,
    hosts, jobs and the validated config.

    Args:
        env: results/environment.parquet (one row per job and GPU).
        record: results/config.yaml (``sweep_hash``, ``code_version``, ``config``).
        skipped: results/grid/skipped.tsv (grid points not run, with the reason).
        jobs: results/grid/jobs.tsv.
    """
    banner = emulated_banner(pd.DataFrame(), env)
    parts = [banner, "<h2>Sweep</h2>", table_html(_sweep_facts(env, record))]
    gpus = _distinct(env, list(GPU_COLUMNS))
    parts.append("<h2>GPUs and driver</h2>")
    if "gpu_uuid" in env and env["gpu_uuid"].notna().any():
        parts.append(table_html(gpus[gpus["gpu_uuid"].notna()]))
    else:
        parts.append(
            "<p>No GPU was used by any job (CPU ranks): no GPU, driver or CUDA "
            "facts to record, and no GPU energy was measured.</p>"
        )
    version_cols = [c for c in env.columns if c.endswith("_version") and c != "code_version"]
    software = [
        "host",
        "cpu_model",
        "torch_cuda",
        "torch_build",
        *version_cols,
        "env_lock",
        "env_lock_sha256",
        "env_torch_from",
    ]
    parts += [
        "<h2>Hosts and software versions</h2>",
        table_html(_distinct(env, software)),
        '<p class="meta">— means the package is not installed in that job\'s '
        "environment (e.g. vLLM in a PyTorch-only environment). env_lock: the lock file the "
        "ranks' environment was installed from (its sha256 beside it); — where it was not "
        "installed from one.</p>",
    ]
    parts += [
        "<h2>Jobs</h2>",
        table_html(_distinct(env, list(JOB_COLUMNS))),
    ]
    if jobs is not None:
        parts += ["<h2>Grid: layouts run</h2>", table_html(jobs)]
    if skipped is not None:
        parts.append("<h2>Grid: points not run</h2>")
        parts.append(table_html(skipped) if len(skipped) else "<p>None.</p>")
    config = yaml.safe_dump(record.get("config", {}), sort_keys=False)
    parts += ["<h2>Validated config (defaults filled)</h2>", f"<pre>{html.escape(config)}</pre>"]
    return _page("energysweep environment", "".join(parts))


def write_pages(
    summary_csv: str | Path,
    environment_parquet: str | Path,
    config_yaml: str | Path,
    jobs_tsv: str | Path,
    skipped_tsv: str | Path,
    summary_out: str | Path,
    environment_out: str | Path,
) -> None:
    """Read the pipeline's tables and write :func:`summary_page` and :func:`environment_page`."""
    summary = pd.read_csv(summary_csv)
    env = pd.read_parquet(environment_parquet)
    record = yaml.safe_load(Path(config_yaml).read_text()) or {}
    jobs = pd.read_csv(jobs_tsv, sep="\t")
    skipped = pd.read_csv(skipped_tsv, sep="\t")
    write_text_atomic(summary_page(summary), summary_out)
    write_text_atomic(environment_page(env, record, skipped, jobs), environment_out)
