"""The stand-in engine's registry entry: one pure-data record, registered from outside the
package (energysweep.job.backends.register_backend). With :mod:`standin.engine` it is the whole
engine: tests/integration/test_standin_engine.py dry-runs a sweep of it."""

from __future__ import annotations

from energysweep.job.backends import SERVING, BackendInfo, Unsupported, register_backend

STANDIN = register_backend(
    BackendInfo(
        name="standin",
        impl="standin.engine",
        module="standin.engine",
        install_hint="put tests/ on PYTHONPATH (the stand-in lives in tests/standin)",
        dims=frozenset({"tp", "dp"}),
        scenarios=frozenset({"inference", SERVING}),
        engine=True,
        server_argv=(
            "{python}",
            "-m",
            "standin.engine",
            "--model",
            "{model_dir}",
            "--name",
            "{name}",
            "--port",
            "{port}",
            "--tp",
            "{tp}",
            "--dp",
            "{dp}",
            "--batch",
            "{max_num_seqs}",
        ),  # fmt: skip
        server_argv_if=(("enforce_eager", ("--eager",)),),
        server_env_drop=("STANDIN_OFFLINE",),
        server_env=(("on_cpu", "STANDIN_KV_GIB", "{cpu_kvcache_gib}"),),
        server_metrics=(("running", "standin_running"), ("waiting", "standin_waiting")),
        unsupported=(
            Unsupported(
                frozenset({"tp>1", "on_cpu"}),
                "standin cannot split a layer on CPUs (tp={tp}); set parallel.tp: [1]",
                scenarios=frozenset({"inference", SERVING}),
            ),
        ),
        multi_node_serving="nothing: the stand-in serves on one node",
    )
)
