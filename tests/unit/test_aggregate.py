import math

import pandas as pd

from energysweep import aggregate, shards
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
    r = row(gpu_uuid=None, gpu_index=None, gpu_pci_bus_id=None, gpu_name=None,
            gpu_energy_mj=None, gpu_energy_status="unavailable", gpu_energy_method="nvml",
            gpu_energy_detail="no GPU in use (device=cpu)", device="cpu")
    w = _agg([r])
    assert math.isnan(w.loc[0, "gpu_energy_j"])
    assert w.loc[0, "gpu_energy_status"] == "unavailable"
    assert math.isnan(w.loc[0, "energy_per_output_token_j"])
    assert w.loc[0, "output_tokens_per_s"] == 32.0


def test_partial_window_is_null():
    rows = [row(), row(rank=1, pid=2, gpu_uuid="GPU-b", gpu_energy_mj=None,
                       gpu_energy_status="unavailable")]
    w = _agg(rows)
    assert math.isnan(w.loc[0, "gpu_energy_j"]) and w.loc[0, "gpu_energy_status"] == "partial"


def test_summary_medians_and_status():
    rows = [row(repetition=0), row(repetition=1, gpu_energy_mj=192_000.0),
            row(repetition=0, batch_size=8, status="oom", error="OOM", window_start_ns=None,
                window_end_ns=None, iterations=None, requests=None, input_tokens=None,
                output_tokens=None, gpu_uuid=None, gpu_energy_mj=None,
                gpu_energy_status="unavailable")]
    s = aggregate.summarize(_agg(rows)).set_index("batch_size")
    assert s.loc[4, "status"] == "ok" and s.loc[4, "energy_per_output_token_j"] == 2.5
    assert s.loc[8, "status"] == "oom" and pd.isna(s.loc[8, "energy_per_output_token_j"])
