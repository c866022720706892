"""The whole pipeline on the local profile: real Snakemake, real torchrun (gloo), real Parquet."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

from energysweep.figures import FIGURES
from energysweep.results import unexplained_nulls
from energysweep.sweep.tinymodel import CACHE_ENV, MANIFEST, SPEC_FILE, cache_key

from conftest import ROOT, test_env, workflow_copy
from headless_chromium import Chromium

pytestmark = [pytest.mark.integration]

# `local_run` (the default sweep at SMALL, with its HTML report) is a session fixture in
# tests/conftest.py: tests/integration/test_slurm_pipeline.py compares its Slurm sweep with it.


def snakemake(wf, *args, timeout=600):
    return subprocess.run(
        ["snakemake", "--profile", "profiles/local", *args],
        cwd=wf,
        env=test_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def write_config(wf, over: dict, name="test.yaml"):
    path = wf / "config" / name
    path.write_text(yaml.safe_dump(over))
    return f"config/{name}"


@pytest.mark.timeout(900)
def test_outputs_and_second_run_is_noop(local_run):
    wf, cfg = local_run
    # energy.parquet is a hive-partitioned dataset directory (see test_merged_dataset.py)
    assert list((wf / "results" / "energy.parquet").glob("model=*/backend=*/*.parquet"))
    for out in [
        "summary.csv",
        *(f"plots/{name}.png" for name in FIGURES),
        "report/summary.html",
        "report/environment.html",
        "report.html",
        "config.yaml",
        "grid/skipped.tsv",
        "grid/jobs.tsv",
    ]:
        assert (wf / "results" / out).is_file(), out
    again = snakemake(wf, f"--configfile={cfg}")
    assert again.returncode == 0
    assert "Nothing to be done" in again.stdout + again.stderr
    html = (wf / "results" / "report.html").read_text(errors="replace")
    assert "energy_per_token.png" in html
    # The checkpoint came from the session's model cache, or was built and kept there: its files
    # are the cache entry's, the entry named by its spec's key (energysweep.sweep.tinymodel).
    log = (wf / "logs" / "build_model" / "tiny-llama.log").read_text()
    model = wf / "resources" / "models" / "tiny-llama"
    entry = Path(os.environ[CACHE_ENV]) / cache_key(json.loads((model / SPEC_FILE).read_text()))
    assert f"kept in the cache, {entry}" in log or f"copied from the cache, {entry}" in log, log
    files = [p for p in model.iterdir() if p.name != ".snakemake_timestamp"]  # Snakemake's own
    assert sorted(p.name for p in files) == sorted(json.loads((entry / MANIFEST).read_text()))
    for path in files:
        assert path.read_bytes() == (entry / path.name).read_bytes(), path.name


@pytest.mark.timeout(900)
def test_rows_are_honest(local_run):
    wf, _ = local_run
    e = pd.read_parquet(wf / "results" / "energy.parquet")
    assert len(e) and (e["status"] == "ok").all()
    # Every row names its GPU or says no GPU energy was available; nothing unmeasured is 0.
    named = e["gpu_uuid"].notna()
    unavailable = e["gpu_energy_status"].eq("unavailable") & e["gpu_energy_mj"].isna()
    assert (named | unavailable).all()
    assert not (e["gpu_energy_mj"].eq(0) & ~e["gpu_energy_status"].eq("short-window")).any()
    assert e["gpu_energy_detail"][unavailable].str.len().gt(0).all()
    assert e["config_hash"].str.len().gt(0).all() and e["code_version"].str.len().gt(0).all()
    assert set(e["phase"]) == {"generate", "prefill", "train"}
    s = pd.read_csv(wf / "results" / "summary.csv")
    assert unexplained_nulls(s) == []  # every null in the summary has a status saying why
    for col in [
        "energy_per_output_token_j_ci_low",
        "energy_per_output_token_j_ci_high",
        "output_tokens_per_s_ci_low",
        "output_tokens_per_s_ci_high",
        "ci_status",
        "decode_energy_per_output_token_j",
        "prefill_energy_per_request_j",
        "prefill_decode_status",
    ]:
        assert col in s.columns, col
    assert set(s["dp"]) == {1, 2} and set(s["batch_size"]) == {1, 4}
    for job in (wf / "results" / "shards").glob("**/job.json"):
        assert (job.parent / "power.parquet").is_file()
        timing = json.loads(job.read_text())["timing"]
        # Cooldowns run only where an energy source reads the windows (GPU counter or RAPL).
        rows = pd.read_parquet(job.with_name("shards.parquet"))
        measured = rows[["gpu_energy_status", "host_energy_status"]].eq("measured").any(axis=None)
        assert (timing["cooldown_skipped"] is None) == measured, timing["cooldown_skipped"]
        if "scenario~training" in str(job):
            assert timing["model_load_s"] is None  # loaded per grid point: never a fake 0
        else:
            assert timing["model_load_s"] > 0
    inference, training = s[s["scenario"] == "inference"], s[s["scenario"] == "training"]
    assert inference["output_tokens_per_s"].gt(0).all()
    # The default config's training sweep: one row per layout and batch size, with energy per
    # training token (null on CPU, gpu_energy_status says why) and the window's loss.
    assert len(training) == len(inference) and (training["status"] == "ok").all()
    assert training["train_tokens_per_s"].gt(0).all() and training["loss"].notna().all()
    assert "energy_per_train_token_j" in s.columns
    assert training["energy_per_output_token_j"].isna().all()
    assert s.loc[s["energy_per_output_token_j"].isna(), "gpu_energy_status"].ne("measured").all()


@pytest.mark.timeout(900)
def test_job_table_holds_exactly_the_jobs_shards(local_run):
    """Each job's shards.parquet (what the merge reads) is its per-window shards, row for row."""
    wf, _ = local_run
    jobs = list((wf / "results" / "shards").glob("**/job.json"))
    assert len(jobs) == 8  # 4 layouts x 2 scenarios
    merged = 0
    for job in jobs:
        table = pd.read_parquet(job.with_name("shards.parquet"))
        parts = pd.concat(
            [pd.read_parquet(p) for p in sorted(job.parent.glob("bs~*/rep~*.parquet"))]
        )
        key = ["batch_size", "repetition", "phase", "rank", "gpu_uuid"]
        a = table.sort_values(key).reset_index(drop=True)
        b = parts.sort_values(key).reset_index(drop=True)
        pd.testing.assert_frame_equal(a, b)
        merged += len(table)
    assert merged == len(pd.read_parquet(wf / "results" / "energy.parquet"))


@pytest.mark.timeout(900)
def test_pytorch_jobs_run_one_process_per_rank_and_record_no_requests(local_run):
    """PyTorch's launch mode (the engines' are in test_engine_backends_fake.py): torchrun, one
    process per rank, each the GPU worker the audit counted; requests.parquet is empty (PyTorch
    reports no per-request metrics) and job.json has no engine options."""
    wf, _ = local_run
    e = pd.read_parquet(wf / "results" / "energy.parquet")
    got = (
        e[e["scenario"] == "inference"]
        .groupby(["tp", "pp", "dp"])
        .agg(
            mode=("launch_mode", "first"),
            pids=("pid", "nunique"),
            launchers=("launcher_processes", "first"),
            workers=("gpu_workers", "first"),
            dps=("dp_rank", "nunique"),
        )
    )
    assert got.loc[(2, 1, 1)].tolist() == ["torchrun", 2, 2, 2, 1]
    assert got.loc[(1, 1, 2)].tolist() == ["torchrun", 2, 2, 2, 2]
    for job in (wf / "results" / "shards").rglob("job.json"):
        assert pd.read_parquet(job.with_name("requests.parquet")).empty
        assert json.loads(job.read_text())["engine"] is None


@pytest.mark.timeout(900)
def test_dp2_ran_two_processes_with_identical_tokens(local_run):
    wf, _ = local_run
    e = pd.read_parquet(wf / "results" / "energy.parquet")
    dp2 = e[e["dp"] == 2]
    # Every dp=2 window (inference and training jobs) ran on two processes, one per replica.
    per_window = dp2.groupby(["scenario", "phase", "batch_size", "repetition"]).agg(
        ranks=("rank", "nunique"), pids=("pid", "nunique"), dp_ranks=("dp_rank", "nunique")
    )
    assert (per_window == 2).all().all()
    jobs = wf / "results" / "shards" / "model~tiny-llama" / "backend~pytorch" / "scenario~inference"
    g1 = pd.read_parquet(jobs / "tp~1" / "pp~1" / "dp~1" / "generations.parquet")
    g2 = pd.read_parquet(jobs / "tp~1" / "pp~1" / "dp~2" / "generations.parquet")
    assert set(g2["dp_rank"]) == {0, 1}
    m = g1.merge(g2, on=["batch_size", "prompt_index"], suffixes=("_1", "_2"))
    assert len(m) >= len(g1)  # every dp=1 prompt was also generated by dp=2
    for a, b in zip(m["token_ids_1"], m["token_ids_2"], strict=True):
        assert list(a) == list(b)


@pytest.mark.timeout(300)
def test_malformed_config_fails_before_any_job(tmp_path):
    wf = workflow_copy(tmp_path)
    cfg = write_config(wf, {"workload": {"batch_sizes": [4, -1]}})
    proc = snakemake(wf, f"--configfile={cfg}")
    assert proc.returncode != 0
    assert "workload.batch_sizes[1]" in proc.stderr + proc.stdout
    assert not (wf / "results").exists() and not (wf / "logs").exists()


@pytest.mark.timeout(300)
def test_shell_characters_rejected_before_any_job(tmp_path):
    wf = workflow_copy(tmp_path)
    cfg = write_config(wf, {"models": [{"name": "m", "path": "$(touch /tmp/pwned)"}]})
    proc = snakemake(wf, f"--configfile={cfg}", "-n")
    assert proc.returncode != 0
    assert "models[0].path" in proc.stderr + proc.stdout
    assert not (wf / "results").exists()


@pytest.mark.timeout(300)
def test_unrunnable_layouts_listed_not_scheduled(tmp_path):
    wf = workflow_copy(tmp_path)
    cfg = write_config(
        wf, {"parallel": {"tp": [1, 3], "pp": [1, 8], "dp": [1], "max_gpus_per_job": 32}}
    )
    proc = snakemake(wf, f"--configfile={cfg}", "results/grid/skipped.tsv", "results/grid/jobs.tsv")
    assert proc.returncode == 0, proc.stderr[-3000:]
    skipped = pd.read_csv(wf / "results" / "grid" / "skipped.tsv", sep="\t")
    reasons = {(r.tp, r.pp): r.reason for r in skipped.itertuples()}
    assert "num_attention_heads=4" in reasons[(3, 1)]
    assert "exceeds num_hidden_layers=4" in reasons[(1, 8)]
    jobs = pd.read_csv(wf / "results" / "grid" / "jobs.tsv", sep="\t")
    assert set(zip(jobs.tp, jobs.pp, strict=True)) == {(1, 1)}
    dry = snakemake(wf, f"--configfile={cfg}", "-n")
    assert "tp~3" not in dry.stdout and "pp~8" not in dry.stdout


@pytest.mark.timeout(300)
def test_validity_recheck_and_stages_on_cpu_are_honest(local_run, tmp_path):
    """On CPU no point may claim valid energy; the re-check recomputes from published data."""
    wf, _ = local_run
    s = pd.read_csv(wf / "results" / "summary.csv", keep_default_na=False, na_values=[""])
    assert s["valid"].dtype == bool and not s["valid"].any()
    reasons = s["invalid_reasons"].str.split(";")
    assert reasons.map(lambda r: "no_gpu_energy" in r).all()
    # The run's short windows and 2 repetitions fail the published-figure thresholds too.
    assert reasons.map(lambda r: {"window_short", "few_repetitions"} <= set(r)).all()
    assert s["validity_unchecked"].str.contains("recheck_mismatch").all()
    assert (s["recheck_status"] == "not-applicable (no GPU energy)").all()
    assert (s["gpu_count"] == s["tp"] * s["pp"] * s["dp"]).all()
    pp2 = s[s["pp"] == 2]
    assert len(pp2) and pp2["stage_cpu_time_max_min_ratio"].ge(1).all()
    assert pp2["stage_status"].str.startswith("no-stage-energy").all()
    stages = pd.read_csv(wf / "results" / "stages.csv")
    assert stages["gpu_energy_j"].isna().all() and stages["cpu_time_s"].gt(0).all()
    assert set(stages.loc[stages["pp"] == 2, "pp_rank"]) == {0, 1}
    # Each stage's CPU time is its own processes' (os.times in every rank, energy.parquet):
    # the median over repetitions of the sum over that stage's distinct processes.
    point = ["model", "backend", "scenario", "tp", "pp", "dp", "batch_size", "phase", "pp_rank"]
    e = pd.read_parquet(wf / "results" / "energy.parquet")
    e = e[e["status"].eq("ok")].drop_duplicates(["job_id", *point, "repetition", "host", "pid"])
    own = e.groupby([*point, "repetition"])["cpu_time_s"].sum().groupby(level=point).median()
    for r in stages.itertuples():
        key = tuple(getattr(r, k) for k in point)
        assert r.cpu_time_s == pytest.approx(own[key], rel=1e-6), (key, own[key])
    published = pd.read_parquet(wf / "results" / "validation.parquet")
    assert (published["status"] == "no-counter-energy").all()
    out = tmp_path / "validation.parquet"
    proc = subprocess.run(
        [
            "python",
            "-m",
            "energysweep.validity.recheck",
            "results/energy.parquet",
            "results/shards",
            "-o",
            str(out),
        ],
        cwd=wf,
        env=test_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    again = pd.read_parquet(out)
    key = ["scope", "job_id", "batch_size", "repetition", "phase", "gpu_uuid"]
    pd.testing.assert_frame_equal(
        published.sort_values(key).reset_index(drop=True),
        again.sort_values(key).reset_index(drop=True),
    )


@pytest.mark.timeout(300)
def test_preflight_target_on_cpu(local_run):
    wf, cfg = local_run
    proc = snakemake(wf, f"--configfile={cfg}", "preflight")
    assert proc.returncode == 0, proc.stderr[-3000:]
    verdict = (wf / "results" / "preflight" / "verdict.txt").read_text()
    assert "no GPU that NVML can read" in verdict and "PASSED" in verdict
    node = json.loads((wf / "results" / "preflight" / "node~0.json").read_text())
    assert node["has_gpu"] is False and node["required"] == "none"
    assert (wf / "results" / "preflight" / f"{node['host']}.json").is_file()


# Clicks a result's "view" button in the Snakemake report (the row holding its label).
_VIEW = """(() => {
  const row = [...document.querySelectorAll('#app tr')].find(
      r => r.textContent.trim().startsWith(%s));
  if (!row) return 'no row';
  row.querySelector('a[iconname=eye]').click();
  return 'ok';
})()"""
# Clicks the link whose text is exactly the given one (a category, or "Results" to go back up).
_CLICK_LINK = """(() => {
  const a = [...document.querySelectorAll('#app a')].find(e => e.textContent.trim() === %s);
  if (!a) return 'no link';
  a.click();
  return 'ok';
})()"""
# The shown result: a loaded <img> (its pixel width) or an <iframe> (its data URI).
_SHOWN = """new Promise(done => setTimeout(() => {
  const img = [...document.querySelectorAll('#app img')].find(i => i.src === %s);
  const frame = [...document.querySelectorAll('#app iframe')].find(f => f.src === %s);
  if (img) (img.complete ? Promise.resolve() : img.decode()).then(
      () => done({img: img.naturalWidth}), () => done({img: -1}));
  else done({frame: !!frame});
}, 300))"""


@pytest.mark.timeout(300)
def test_report_renders_in_headless_chromium(local_run, tmp_path):
    """The report of the pipeline run opens in Debian's chromium with no console error, and
    every figure and both tables are in it and display when clicked, as a reader would."""
    wf, _ = local_run
    report = wf / "results" / "report.html"
    summary = pd.read_csv(wf / "results" / "summary.csv")
    expected = {f"{n}.png" for n in FIGURES} | {"summary.html", "environment.html"}
    with Chromium(tmp_path / "profile", timeout_s=60) as browser:
        page = browser.open_page(report.resolve().as_uri())
        results = browser.evaluate(
            page,
            "Object.values(results).map(r => ({name: r.name, "
            "mime: r.mime_type, caption: r.caption, uri: r.data_uri, "
            "label: r.labels.figure, category: r.category}))",
        )
        categories = browser.evaluate(page, "Object.keys(categories)")
        assert {r["name"] for r in results} == expected
        for r in results:
            assert r["mime"] == ("image/png" if r["name"].endswith(".png") else "text/html")
            assert len(r["caption"]) > 300, r["name"]  # what, how measured, caveats
            if r["name"].endswith(".png"):
                assert "Caveats." in r["caption"], r["name"]
        # Click through the report as a reader: category, then each result's view button.
        shown = {}
        for category in categories:
            if category != categories[0]:  # back to the list of categories first
                assert browser.evaluate(page, _CLICK_LINK % json.dumps("Results")) == "ok"
            assert browser.evaluate(page, _CLICK_LINK % json.dumps(category)) == "ok"
            for r in results:
                listed = browser.evaluate(
                    page,
                    "[...document.querySelectorAll('#app tr')].some(row => "
                    f"row.textContent.trim().startsWith({json.dumps(r['label'])}))",
                )
                if not listed:
                    continue
                assert browser.evaluate(page, _VIEW % json.dumps(r["label"])) == "ok"
                shown[r["name"]] = browser.evaluate(
                    page, _SHOWN % (json.dumps(r["uri"]), json.dumps(r["uri"]))
                )
                # the category's list again, for its next result
                assert browser.evaluate(page, _CLICK_LINK % json.dumps(category)) == "ok"
        assert set(shown) == expected
        for name, view in shown.items():
            if name.endswith(".png"):
                assert view.get("img", 0) > 300, (name, view)  # decoded pixels, not a stub
            else:
                assert view == {"frame": True}, (name, view)
        # The table pages themselves (as the report embeds them): rows, columns, sorting.
        uri = next(r["uri"] for r in results if r["name"] == "summary.html")
        table = browser.open_page(uri)
        assert browser.evaluate(
            table, "document.querySelectorAll('table.es tbody tr').length"
        ) == len(summary)
        headers = browser.evaluate(
            table, "[...document.querySelectorAll('th')].map(t => t.textContent)"
        )
        assert set(summary.columns) <= set(headers)
        col = headers.index("batch_size")
        sorted_desc = browser.evaluate(
            table,
            f"""(() => {{
            const th = document.querySelectorAll('th')[{col}];
            th.click(); th.click();  // ascending, then descending
            return [...document.querySelectorAll('table.es tbody tr')].map(
                r => Number(r.cells[{col}].textContent));
        }})()""",
        )
        assert sorted_desc == sorted(summary["batch_size"], reverse=True)
        env_uri = next(r["uri"] for r in results if r["name"] == "environment.html")
        env = browser.open_page(env_uri)
        text = browser.evaluate(env, "document.body.innerText")
        code_version = summary["code_version"].iloc[0]
        # The lock the ranks' environment (.venv) was installed from, with its hash.
        lock_sha256 = hashlib.sha256((ROOT / "envs" / "venv.lock").read_bytes()).hexdigest()
        environment = pd.read_parquet(wf / "results" / "environment.parquet")
        assert set(environment["env_lock"]) == {"envs/venv.lock"}
        assert set(environment["env_lock_sha256"]) == {lock_sha256}
        sweep_hash = yaml.safe_load((wf / "results" / "config.yaml").read_text())["sweep_hash"]
        for needle in (
            f"sweep hash\t{sweep_hash}",
            code_version,
            lock_sha256,
            "torch",
            "GPUs and driver",
            "Validated config",
        ):
            assert needle in text, needle
        assert browser.errors() == []


@pytest.mark.timeout(300)
def test_report_first_screen_answers_the_sweep_question_on_cpu(local_run, tmp_path):
    """Before the workflow graph, the opening page says what the sweep found: on CPU that no
    GPU energy was measured (every point no_gpu_energy), the CPU-time leaders, the valid and
    invalid counts and the GPU setting banner; the ladder's rungs are null with statuses."""
    wf, _ = local_run
    summary = pd.read_csv(wf / "results" / "summary.csv")
    rungs = ("boundary_gpu", "boundary_gpu_host", "boundary_node", "boundary_idle_net")
    for rung in rungs:
        assert summary[f"{rung}_j_per_token"].isna().all()
        assert summary[f"{rung}_status"].str.startswith("unavailable (").all(), rung
    assert summary["co2e_estimate_status"].str.contains("not estimated|unavailable").all()
    assert (summary["power_limit_w"] == "unset").all()
    e = pd.read_parquet(wf / "results" / "energy.parquet")
    assert set(e["node_energy_status"]) <= {"unavailable", "not-read"}
    assert e["node_energy_mj"].isna().all()
    with Chromium(tmp_path / "profile", timeout_s=60) as browser:
        page = browser.open_page((wf / "results" / "report.html").resolve().as_uri())
        browser.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False},
            session=page,
        )
        where = browser.evaluate(
            page,
            """(() => {
            const h = document.getElementById('es-headline');
            const graph = document.querySelector('canvas, svg.rulegraph, #rulegraph');
            if (!h) return null;
            const r = h.getBoundingClientRect();
            return {top: r.top, bottom: r.bottom, height: window.innerHeight,
                    text: h.innerText,
                    before_graph: graph ? !!(h.compareDocumentPosition(graph)
                                  & Node.DOCUMENT_POSITION_FOLLOWING) : null};
            })()""",
        )
        assert where is not None, "the report's opening page has no headline"
        assert 0 <= where["top"] < 200 and where["before_graph"] is True, where
        text = where["text"]
        n = len(summary)
        assert f"{n} points: 0 valid, {n} invalid" in text
        assert f"every point ({n} of {n}) is no_gpu_energy" in text
        assert "CPU s per output token" in text and "CPU s per training token" in text
        assert "GPU setting: node default" in text
        assert browser.errors() == []


def check_phases(path) -> dict:
    """One job.json's timing.phases_s: every phase named once, adding up to rank 0's wall within
    1 s; the window phase is the windows' own edges' total. Returns the record."""
    from energysweep.tables.phases import JOB_PHASES

    rec = json.loads(path.read_text())
    t = rec["timing"]
    phases = t["phases_s"]
    assert list(phases) == [p.value for p in JOB_PHASES], path
    assert all(s >= 0 for s in phases.values()), phases
    assert abs(sum(phases.values()) - t["rank0_wall_s"]) < 1.0, (path, phases, t)
    # The window phase runs from each start edge to its end edge, as window_s does.
    assert abs(phases["window"] - t["window_s"]) < 1.0, (path, phases, t)
    assert phases["window"] > 0 and phases["start"] > 0, phases
    if rec["job"]["scenario"] == "serving":
        assert phases["server_start"] > 0 and phases["ramp"] > 0, phases
        # Every batch cap's server start, spawn to healthy, is in it (not only the first's).
        started = sum(s["start_s"] for s in t["serving"]["servers"])
        assert phases["server_start"] >= started, (path, phases, t["serving"]["servers"])
    return rec


def check_job_phases(wf) -> list[dict]:
    """check_phases on every job of the sweep in ``wf``, and the summary carries the same
    figures. Returns the jobs' timings (the vLLM offline and serving sweeps of
    test_vllm_real.py and test_serving_real.py are checked with it too)."""
    summary = pd.read_csv(wf / "results" / "summary.csv")
    timings = []
    for path in sorted((wf / "results" / "shards").rglob("job.json")):
        rec = check_phases(path)
        t, phases = rec["timing"], rec["timing"]["phases_s"]
        k = rec["job"]
        mine = summary[
            summary["backend"].eq(k["backend"])
            & summary["scenario"].eq(k["scenario"])
            & summary["tp"].eq(k["tp"])
            & summary["pp"].eq(k["pp"])
            & summary["dp"].eq(k["dp"])
        ]
        assert len(mine) and (mine["job_time_status"] == "counted").all()
        assert mine["job_window_s"].iloc[0] == pytest.approx(phases["window"])
        assert mine["job_wall_s"].iloc[0] == pytest.approx(t["rank0_wall_s"])
        timings.append({"job": k, **t})
    return timings


@pytest.mark.timeout(900)
def test_every_second_of_every_job_is_in_a_phase(local_run):
    wf, _ = local_run
    timings = check_job_phases(wf)
    # local_run is the PyTorch sweep; the default sweep's vLLM and serving jobs are checked the
    # same way in test_vllm_real.py and test_serving_real.py.
    assert {t["job"]["scenario"] for t in timings} == {"inference", "training"}
