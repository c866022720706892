import math

import pandas as pd

from energysweep import aggregate, results
from energysweep.tables import shards
from energysweep.tables.environment import environment_table

from tests_rows import row


def _agg(rows):
    return aggregate.windows(shards.to_table(rows).to_pandas())


def test_distinct_gpus_summed_once():
    # Two ranks report the same GPU (e.g. a launcher and a worker): counted once.
    w = _agg([row(rank=0, pid=1), row(rank=1, pid=2, is_writer=False)])
    assert w.loc[0, "gpu_energy_j"] == 128.0
    assert w.loc[0, "n_gpus"] == 1 and w.loc[0, "n_processes"] == 2
    assert w.loc[0, "energy_per_output_token_j"] == 2.0
    assert w.loc[0, "mean_gpu_power_w"] == 64.0


def test_two_node_job_counts_all_gpus():
    rows = [
        row(rank=r, pid=10 + r, host=f"node{r // 2}", gpu_uuid=f"GPU-{r}", gpu_energy_mj=1000.0)
        for r in range(4)
    ]
    w = _agg(rows)
    assert w.loc[0, "gpu_energy_j"] == 4.0 and w.loc[0, "n_gpus"] == 4


def test_unavailable_is_null_not_zero():
    r = row(
        gpu_uuid=None,
        gpu_index=None,
        gpu_pci_bus_id=None,
        gpu_name=None,
        gpu_energy_mj=None,
        gpu_energy_status="unavailable",
        gpu_energy_method="nvml",
        gpu_energy_detail="no GPU in use (device=cpu)",
        device="cpu",
    )
    w = _agg([r])
    assert math.isnan(w.loc[0, "gpu_energy_j"])
    assert w.loc[0, "gpu_energy_status"] == "unavailable"
    assert math.isnan(w.loc[0, "energy_per_output_token_j"])
    assert w.loc[0, "output_tokens_per_s"] == 32.0


def test_partial_window_is_null():
    rows = [
        row(),
        row(rank=1, pid=2, gpu_uuid="GPU-b", gpu_energy_mj=None, gpu_energy_status="unavailable"),
    ]
    w = _agg(rows)
    assert math.isnan(w.loc[0, "gpu_energy_j"]) and w.loc[0, "gpu_energy_status"] == "partial"


def test_summary_medians_and_status():
    rows = [
        row(repetition=0),
        row(repetition=1, gpu_energy_mj=192_000.0),
        row(
            repetition=0,
            batch_size=8,
            status="oom",
            error="OOM",
            window_start_ns=None,
            window_end_ns=None,
            iterations=None,
            requests=None,
            input_tokens=None,
            output_tokens=None,
            gpu_uuid=None,
            gpu_energy_mj=None,
            gpu_energy_status="unavailable",
        ),
    ]
    s = aggregate.summarize(_agg(rows)).set_index("batch_size")
    assert s.loc[4, "status"] == "ok" and s.loc[4, "energy_per_output_token_j"] == 2.5
    assert s.loc[8, "status"] == "oom" and pd.isna(s.loc[8, "energy_per_output_token_j"])


def test_same_cuda_index_on_two_nodes_counted_twice_same_uuid_once():
    # Each node numbers its GPUs from 0: the UUID, not the index, tells them apart. Rank 2
    # re-reports node0's GPU (e.g. a launcher process): counted once.
    rows = [
        row(rank=0, pid=1, host="node0", gpu_uuid="GPU-n0", gpu_index=0, gpu_energy_mj=1000.0),
        row(rank=1, pid=2, host="node1", gpu_uuid="GPU-n1", gpu_index=0, gpu_energy_mj=3000.0),
        row(rank=2, pid=3, host="node0", gpu_uuid="GPU-n0", gpu_index=0, gpu_energy_mj=1000.0),
    ]
    w = _agg(rows)
    assert w.loc[0, "gpu_energy_j"] == 4.0 and w.loc[0, "n_gpus"] == 2
    assert w.loc[0, "n_hosts"] == 2


def test_host_energy_once_per_host_from_local_rank_zero():
    measured = dict(
        host_energy_status="measured",
        host_energy_detail="zones package-0",
        idle_host_power_status="measured",
        idle_host_power_w=20.0,
    )
    rows = [
        row(rank=0, pid=1, host="node0", gpu_uuid="GPU-0", host_energy_mj=50_000.0, **measured),
        row(
            rank=1,
            pid=2,
            host="node0",
            gpu_uuid="GPU-1",
            host_energy_status="not-read",
            idle_host_power_status="not-read",
        ),
        row(rank=2, pid=3, host="node1", gpu_uuid="GPU-2", host_energy_mj=30_000.0, **measured),
    ]
    w = _agg(rows)
    assert w.loc[0, "host_energy_j"] == 80.0 and w.loc[0, "host_energy_status"] == "measured"
    assert w.loc[0, "idle_host_power_w"] == 40.0
    assert w.loc[0, "host_energy_idle_adjusted_j"] == 80.0 - 40.0 * 2.0
    # A host whose local rank 0 could not read RAPL: no partial sum.
    rows[2].update(host_energy_mj=None, host_energy_status="unavailable")
    w = _agg(rows)
    assert math.isnan(w.loc[0, "host_energy_j"]) and w.loc[0, "host_energy_status"] == "partial"


def test_idle_adjusted_columns_keep_gross_energy():
    rows = [
        row(gpu_uuid="GPU-a", idle_gpu_power_w=30.0, idle_gpu_power_status="measured"),
        row(
            rank=1, pid=2, gpu_uuid="GPU-b", idle_gpu_power_w=34.0, idle_gpu_power_status="measured"
        ),
    ]
    w = _agg(rows)
    # 2 s window, 2 x 128 J gross, 64 W idle in total.
    assert w.loc[0, "gpu_energy_j"] == 256.0
    assert w.loc[0, "gpu_energy_idle_adjusted_j"] == 256.0 - 64.0 * 2.0
    assert w.loc[0, "energy_per_output_token_idle_adjusted_j"] == (256.0 - 128.0) / 64
    assert w.loc[0, "idle_status"] == "measured"
    skipped = _agg([row(idle_gpu_power_status="skipped")])
    assert math.isnan(skipped.loc[0, "gpu_energy_idle_adjusted_j"])
    assert skipped.loc[0, "idle_status"] == "skipped"


def _rep(rep, gen_mj, pre_mj, **over):
    """A generate window (4 iterations x 4 requests x 16 tokens) and its prefill window."""
    gen = row(
        **{
            "repetition": rep,
            "iterations": 4,
            "requests": 16,
            "output_tokens": 256,
            "gpu_energy_mj": gen_mj,
            **over,
        }
    )
    pre = row(
        **{
            "repetition": rep,
            "phase": "prefill",
            "iterations": 8,
            "requests": 32,
            "output_tokens": 32,
            "window_end_ns": 2_000_000_000,
            "gpu_energy_mj": pre_mj,
            **over,
        }
    )
    return [gen, pre]


def test_prefill_decode_split_per_output_token():
    rows = _rep(0, 160_000.0, 80_000.0) + _rep(1, 160_000.0, 80_000.0)
    s = aggregate.summarize(_agg(rows)).iloc[0]
    # Per iteration: generate 40 J, prefill 10 J for 4 requests; 4 x 15 decode tokens.
    assert s["prefill_energy_per_request_j"] == 2.5
    assert s["decode_energy_per_output_token_j"] == 0.5
    assert s["prefill_energy_fraction"] == 0.25
    assert s["prefill_decode_status"] == "ok"
    assert s["energy_per_output_token_j"] == 160.0 / 256  # the headline is the generate window
    assert s["repetitions"] == 2
    # 0.5 s per generate iteration, 0.125 s per prefill iteration: 60 tokens in 0.375 s.
    assert s["decode_output_tokens_per_s"] == 160.0


def test_prefill_decode_without_energy_or_prefill_says_why():
    cpu = dict(
        gpu_uuid=None,
        gpu_energy_status="unavailable",
        gpu_energy_detail="no GPU in use (device=cpu)",
        device="cpu",
    )
    s = aggregate.summarize(_agg(_rep(0, None, None, **cpu))).iloc[0]
    assert math.isnan(s["decode_energy_per_output_token_j"])
    assert s["prefill_decode_status"] == "energy-unavailable"
    assert s["decode_output_tokens_per_s"] == 160.0  # time is still measured
    only_gen = aggregate.summarize(_agg([row()])).iloc[0]
    assert only_gen["prefill_decode_status"].startswith("no-prefill-window")


def test_bootstrap_ci_of_the_median():
    lo, hi = aggregate.bootstrap_ci([1.0, 2.0, 3.0, 4.0, 100.0])
    assert 1.0 <= lo <= 3.0 <= hi <= 100.0
    assert aggregate.bootstrap_ci([1.0, 2.0, 3.0, 4.0, 100.0]) == (lo, hi)  # fixed seed
    assert all(math.isnan(v) for v in aggregate.bootstrap_ci([5.0]))
    assert all(math.isnan(v) for v in aggregate.bootstrap_ci([5.0, float("nan")]))


def test_summary_ci_columns_and_status():
    rows = [row(repetition=i, gpu_energy_mj=e) for i, e in enumerate([120e3, 128e3, 136e3])]
    s = aggregate.summarize(_agg(rows)).iloc[0]
    assert s["ci_status"] == "ok"
    assert s["energy_per_output_token_j_ci_low"] <= s["energy_per_output_token_j"]
    assert s["energy_per_output_token_j"] <= s["energy_per_output_token_j_ci_high"]
    assert s["output_tokens_per_s_ci_low"] == s["output_tokens_per_s_ci_high"] == 32.0
    one = aggregate.summarize(_agg([row()])).iloc[0]
    assert math.isnan(one["energy_per_output_token_j_ci_low"])
    assert one["ci_status"].startswith("too-few-repetitions")


def test_cross_check_ratio():
    w = _agg(
        [
            row(
                energy_source="cross-check",
                gpu_energy_mj_zeus=129_280.0,
                gpu_energy_zeus_status="measured",
            )
        ]
    )
    assert w.loc[0, "zeus_nvml_energy_ratio"] == 1.01 and w.loc[0, "zeus_status"] == "measured"
    s = aggregate.summarize(w).iloc[0]
    assert s["energy_source"] == "cross-check" and s["zeus_nvml_energy_ratio"] == 1.01


def test_flops_estimate_columns():
    w = _agg(
        [
            row(
                model_parameters=1000,
                model_parameters_method="counted",
                flops_estimate=2.0 * 1000 * 164,
            )
        ]
    )
    assert w.loc[0, "flops_estimate_per_s"] == 164_000.0
    assert w.loc[0, "flops_estimate_per_j"] == 328_000.0 / 128.0


def test_every_summary_null_has_a_status():
    cpu = dict(
        gpu_uuid=None,
        gpu_energy_status="unavailable",
        gpu_energy_detail="no GPU in use (device=cpu)",
        device="cpu",
    )
    rows = (
        _rep(0, 160e3, 80e3)
        + _rep(1, 160e3, 80e3)
        + [r | {"dp": 2} for r in _rep(0, None, None, **cpu)]
        + [
            row(
                batch_size=8,
                status="oom",
                error="OOM",
                window_start_ns=None,
                window_end_ns=None,
                iterations=None,
                requests=None,
                input_tokens=None,
                output_tokens=None,
                gpu_uuid=None,
                gpu_energy_mj=None,
                gpu_energy_status="unavailable",
                cpu_time_s=None,
            )
        ]
    )
    s = aggregate.summarize(_agg(rows))
    assert len(s) == 3
    assert results.unexplained_nulls(s) == []
    # A null nobody explains is reported.
    bad = s.copy()
    bad.loc[0, "output_tokens_per_s"] = float("nan")
    assert results.unexplained_nulls(bad) == ["output_tokens_per_s[0]"]


def test_environment_table(tmp_path):
    import json

    record = {
        "job_id": "j1",
        "environment": {
            "gpu_count": 1,
            "git_commit": "abc",
            "config_hash": "h",
            "seeds": {"seed": 0},
            "hosts": [{"host": "n0", "cpu_model": "Xeon", "packages": {"torch": "2.13.0"}}],
            "gpus": [{"uuid": "GPU-a", "host": "n0", "name": "H100", "temperature_start_c": 40}],
        },
    }
    (tmp_path / "job.json").write_text(json.dumps(record))
    env = environment_table([tmp_path / "job.json"]).to_pandas()
    assert env.loc[0, "gpu_uuid"] == "GPU-a" and env.loc[0, "torch_version"] == "2.13.0"
    assert env.loc[0, "cpu_model"] == "Xeon" and env.loc[0, "job_id"] == "j1"
