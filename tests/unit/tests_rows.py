"""A complete shard row for tests (every column, realistic values)."""


def row(**over) -> dict:
    base = {
        "schema_version": 3, "job_id": "j1", "config_hash": "h", "code_version": "0.1.0+gabc",
        "model": "tiny", "backend": "pytorch", "scenario": "inference",
        "tp": 1, "pp": 1, "dp": 1, "world_size": 1, "launch_mode": "torchrun",
        "launcher_processes": 1, "gpu_workers": 1,
        "batch_size": 4, "global_batch_size": 4, "repetition": 0, "phase": "generate",
        "status": "ok", "error": None,
        "window_start_ns": 1_000_000_000, "window_end_ns": 3_000_000_000, "iterations": 2,
        "requests": 8, "input_tokens": 100, "output_tokens": 64,
        "rank": 0, "local_rank": 0, "pid": 1, "host": "h", "device": "cuda:0",
        "dp_rank": 0, "pp_rank": 0, "tp_rank": 0, "is_writer": True,
        "gpu_uuid": "GPU-a", "gpu_index": 0, "gpu_pci_bus_id": "00000000:18:00.0",
        "gpu_name": "H100", "gpu_energy_mj": 128_000.0, "gpu_energy_status": "measured",
        "gpu_energy_method": "nvml-total-energy-counter", "gpu_energy_detail": None,
        "cpu_time_s": 1.5, "slurm_job_id": None, "slurm_partition": None,
        "slurm_nodelist": None, "allocated_gpus": None,
        # schema v2 (measurement integrity)
        "min_window_s": 0.5, "energy_source": "nvml", "gpu_energy_mj_zeus": None,
        "gpu_energy_zeus_status": "not-requested", "idle_window_s": 1.0,
        "idle_gpu_power_w": None, "idle_gpu_power_status": "skipped",
        "host_energy_mj": None, "host_dram_energy_mj": None, "host_energy_status": "unavailable",
        "host_energy_detail": "RAPL not available", "idle_host_power_w": None,
        "idle_host_power_status": "unavailable", "model_parameters": None,
        "model_parameters_method": "unavailable", "flops_estimate": None, "loss": None,
    }
    base.update(over)
    return base
