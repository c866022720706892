"""Fake ``vllm`` and ``tensorrt_llm`` modules for the backend flow tests (no GPU, no engine).

They implement only what energysweep's backends call, with the attribute names of the real
libraries (vLLM 0.32.0, checked in tests/unit/test_vllm_backend.py's contract tests when vllm is
importable; TensorRT-LLM 1.x from its LLM API docs). Each fake LLM records its kwargs and every
generate call, and "generates" ``max_tokens`` deterministic token ids per prompt.
"""

from __future__ import annotations

import datetime
import types
from dataclasses import dataclass, field


def _fake_tokens(prompt_ids: list[int], n: int) -> list[int]:
    return [(prompt_ids[-1] + k + 1) % 512 for k in range(n)]


# ----------------------------------------------------------------------------------------- vLLM
VLLM_VERSION = "0.32.0"  # the version whose API this fake mirrors (tests/unit/test_vllm_backend.py)


@dataclass
class VllmSamplingParams:
    n: int = 1
    temperature: float = 1.0
    max_tokens: int | None = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    detokenize: bool = True


@dataclass
class RequestStateStats:  # vllm.v1.metrics.stats.RequestStateStats (subset)
    num_generation_tokens: int = 0
    arrival_time: float = 0.0
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0
    first_token_latency: float = 0.0


@dataclass
class VllmCompletion:
    token_ids: list[int]
    finish_reason: str = "length"


@dataclass
class VllmRequestOutput:
    prompt_token_ids: list[int]
    outputs: list[VllmCompletion]
    metrics: RequestStateStats | None = None


class VllmLLM:
    instances: list = []

    def __init__(self, model: str, **kwargs):
        self.kwargs = {"model": model, **kwargs}
        self.calls: list = []
        VllmLLM.instances.append(self)

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True):
        self.calls.append((prompts, sampling_params))
        out = []
        for i, p in enumerate(prompts):
            ids = p["prompt_token_ids"]
            toks = _fake_tokens(ids, sampling_params.max_tokens)
            stats = None
            if self.kwargs.get("disable_log_stats") is False:
                # 50 ms to the first token, then 10 ms per token.
                first = 100.0 + i
                stats = RequestStateStats(
                    num_generation_tokens=len(toks),
                    first_token_ts=first,
                    last_token_ts=first + 0.01 * (len(toks) - 1),
                    first_token_latency=0.05,
                )
            out.append(VllmRequestOutput(ids, [VllmCompletion(toks)], stats))
        return out


def make_vllm():
    VllmLLM.instances = []
    parallel_state = types.ModuleType("vllm.distributed.parallel_state")
    parallel_state.destroyed = []
    parallel_state.destroy_model_parallel = lambda: parallel_state.destroyed.append(True)
    distributed = types.ModuleType("vllm.distributed")
    distributed.parallel_state = parallel_state
    mod = types.ModuleType("vllm")
    mod.__version__ = VLLM_VERSION
    mod.LLM = VllmLLM
    mod.SamplingParams = VllmSamplingParams
    mod.distributed = distributed
    return {
        "vllm": mod,
        "vllm.distributed": distributed,
        "vllm.distributed.parallel_state": parallel_state,
    }


# --------------------------------------------------------------------------------- TensorRT-LLM
@dataclass
class TrtSamplingParams:
    max_tokens: int = 32  # TensorRT-LLM's default
    min_tokens: int | None = None
    ignore_eos: bool = False
    top_k: int | None = None
    detokenize: bool = True
    return_perf_metrics: bool = False


@dataclass
class TimingMetrics:  # RequestPerfMetrics.timing_metrics (subset), timedeltas on a steady clock
    arrival_time: datetime.timedelta
    first_scheduled_time: datetime.timedelta
    first_token_time: datetime.timedelta
    last_token_time: datetime.timedelta


@dataclass
class TrtCompletion:
    index: int
    token_ids: list[int]
    request_perf_metrics: object = None


@dataclass
class TrtRequestOutput:
    prompt_token_ids: list[int]
    outputs: list[TrtCompletion] = field(default_factory=list)


class TrtLLM:
    instances: list = []

    def __init__(self, model: str, **kwargs):
        self.kwargs = {"model": model, **kwargs}
        self.calls: list = []
        self.shut_down = False
        TrtLLM.instances.append(self)

    def generate(self, inputs, sampling_params=None, use_tqdm=True):
        self.calls.append((inputs, sampling_params))
        out = []
        for ids in inputs:
            toks = _fake_tokens(ids, sampling_params.max_tokens)
            perf = None
            if sampling_params.return_perf_metrics:
                s = datetime.timedelta
                perf = types.SimpleNamespace(
                    timing_metrics=TimingMetrics(
                        s(seconds=10),
                        s(seconds=10.01),
                        s(seconds=10.05),
                        s(seconds=10.05 + 0.02 * (len(toks) - 1)),
                    )
                )
            out.append(TrtRequestOutput(ids, [TrtCompletion(0, toks, perf)]))
        return out

    def shutdown(self):
        self.shut_down = True


def make_tensorrt_llm():
    TrtLLM.instances = []
    mod = types.ModuleType("tensorrt_llm")
    mod.LLM = TrtLLM
    mod.SamplingParams = TrtSamplingParams
    return {"tensorrt_llm": mod}
