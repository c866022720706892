"""TensorRT-LLM backend: one process per DP replica; the LLM API spawns its tp*pp GPU workers.

How a layout maps onto TensorRT-LLM 1.x (names from the reference doc and the TensorRT-LLM LLM API
docs; the package cannot be installed here, see docs/backends.md):
- ``tensorrt_llm.LLM(model=path, tensor_parallel_size=tp, pipeline_parallel_size=pp, ...)``, the
  PyTorch execution path (the 1.x default, so no ``backend`` argument is passed);
- one node (launch mode ``direct``): ``python -m energysweep.run`` per replica; the LLM API starts
  tp*pp MPI workers itself (mpi4py), which re-import the entry module: energysweep.run only runs
  under ``if __name__ == "__main__"``. dp > 1: energysweep.launch starts one process per replica
  under torchrun (the only process group is ours, on gloo) and gives each a disjoint GPU set;
- more than one node (launch mode ``mpi``, dp == 1): ``srun --mpi=pmix ... trtllm-llmapi-launch
  python -m energysweep.run``; MPI ranks == tp*pp; our code runs in MPI rank 0;
- ``SamplingParams(max_tokens=..., min_tokens=..., ignore_eos=True)``: ``max_tokens`` defaults to
  32, so it is always set; greedy (``top_k=1``); ``return_perf_metrics=True`` for per-request
  timing (requests.parquet).

Energy: the process measures every GPU of its replica (:meth:`TrtllmBackend.gpu_uuids`). GPUs of a
multi-node replica on other nodes cannot be read from rank 0: they are reported as unavailable
(:meth:`TrtllmBackend.wrap_energy_source`), which makes the window's energy null, never a partial
sum presented as a total.
"""

from __future__ import annotations

import os

from energysweep.backends.engine_common import EngineBackend, max_batch_size, max_model_len
from energysweep.job.layout import ParallelLayout
from energysweep.job.spec import JobSpec, LaunchedJob

DOC_VERSION = (
    "1.2"  # TensorRT-LLM release the parameter names were taken for (not installable here)
)
METRICS_SOURCE = "tensorrt_llm CompletionOutput.request_perf_metrics.timing_metrics"


def llm_kwargs(job: JobSpec, model_dir: str) -> dict:
    """Keyword arguments of ``tensorrt_llm.LLM(...)`` for one replica."""
    return {
        "model": model_dir,
        "tensor_parallel_size": job.layout.tp,
        "pipeline_parallel_size": job.layout.pp,
        "dtype": job.dtype,
        # We pass token ids and never read text back.
        "skip_tokenizer_init": True,
        # The engine is built once per job: it must admit the largest swept batch and the longest
        # sequence (truncated prompt + fixed output).
        "max_batch_size": max_batch_size(job),
        "max_seq_len": max_model_len(job),
    }


def sampling_kwargs(output_tokens: int) -> dict:
    """Keyword arguments of ``tensorrt_llm.SamplingParams(...)``: greedy, exactly n new tokens."""
    return {
        "max_tokens": output_tokens,  # the default is 32, whatever the workload says
        "min_tokens": output_tokens,
        "ignore_eos": True,
        "top_k": 1,
        "detokenize": False,
        "return_perf_metrics": True,
    }


def unreadable_gpus(layout: ParallelLayout, gpus_per_node: int) -> int:
    """GPUs of this process's replica on other nodes (mpi launch), which NVML here cannot read."""
    nodes = layout.nodes(gpus_per_node) if layout.dp == 1 else 1
    if nodes == 1:
        return 0
    return layout.ranks_per_replica - layout.ranks_per_replica // nodes


def _seconds(value) -> float | None:
    if value is None:
        return None
    if hasattr(value, "total_seconds"):
        return value.total_seconds()
    return float(value)


def request_timing(completion) -> tuple[float | None, float | None, str] | None:
    """(ttft_s, tpot_s, source) from a completion's perf metrics; None when there are none."""
    from energysweep.backends.request_log import tpot_s

    perf = getattr(completion, "request_perf_metrics", None)
    timing = getattr(perf, "timing_metrics", None)
    if timing is None:
        return None
    arrival = _seconds(getattr(timing, "arrival_time", None))
    first = _seconds(getattr(timing, "first_token_time", None))
    last = _seconds(getattr(timing, "last_token_time", None))
    if first is None or arrival is None:
        return None
    n = len(completion.token_ids)
    return (first - arrival, tpot_s(first, last, n) if last is not None else None, METRICS_SOURCE)


class TrtllmBackend(EngineBackend):
    """One DP replica of TensorRT-LLM (its workers are the engine's MPI processes)."""

    name = "tensorrt-llm"

    def __init__(self, ctx, job: LaunchedJob):
        super().__init__(ctx, job)
        from tensorrt_llm import LLM, SamplingParams

        self.gpus_per_node = job.gpus_per_node
        self.llm = LLM(**llm_kwargs(job, ctx.model_dir))
        self._sampling_cls = SamplingParams

    def generate(self, batch: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        params = self._sampling_cls(**sampling_kwargs(max_new_tokens))
        return self._submit(
            lambda b: self.llm.generate(b, sampling_params=params, use_tqdm=False),
            batch,
            lambda o: request_timing(o.outputs[0]),
        )

    def gpu_uuids(self) -> list[str]:
        """UUIDs of this replica's GPUs on this node (its CUDA_VISIBLE_DEVICES, via NVML).

        Empty where NVML cannot be read: the energy source then records why (never 0).
        """
        from energysweep.hw import nvml as hw_nvml

        try:
            hw_nvml.init()
        except hw_nvml.NVMLError as exc:
            print(f"no GPU energy for this replica: NVML: {exc}")
            return []
        try:
            uuids = hw_nvml.resolve_visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"))
        finally:
            hw_nvml.shutdown()
        local = self.ctx.layout.ranks_per_replica - unreadable_gpus(
            self.ctx.layout, self.gpus_per_node
        )
        return uuids[:local]

    def wrap_energy_source(self, source):
        """``source`` plus unavailable readings for the replica's GPUs on other nodes."""
        missing = unreadable_gpus(self.ctx.layout, self.gpus_per_node)
        if not missing:
            return source
        from energysweep.energy.unreadable import WithUnreadable

        return WithUnreadable(
            source,
            missing,
            f"GPU of a multi-node TensorRT-LLM replica on another node: not readable from MPI "
            f"rank 0 ({missing} of {self.ctx.layout.ranks_per_replica} GPUs)",
        )

    def close(self) -> None:
        self.write_requests()
        self.llm.shutdown()


def load_backend(ctx, job: LaunchedJob) -> TrtllmBackend:
    return TrtllmBackend(ctx, job)
