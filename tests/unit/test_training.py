"""Pure logic of the training scenario (energysweep.scenarios) and its summary columns."""

from __future__ import annotations

import math

import pytest
import torch
import yaml
from jobspec import FAST_TRAINING, launched_job

from energysweep import aggregate, results
from energysweep.dist import LayoutMismatch
from energysweep.job.layout import ParallelLayout
from energysweep.job.sections import SCHEMA_PATH, JobSpecError, Training
from energysweep.job.spec import LaunchedJob
from energysweep.scenarios import accelerate_world, train_data, trainers, training
from energysweep.scenarios.base import prompt_indices
from energysweep.tables import shards
from energysweep.torchpp.stage import TrainStage

from tests_rows import row


def view(rank, n=2, index=None, dtype="MULTI_CPU", device="cpu:0"):
    return {"rank": rank, "num_processes": n, "process_index": rank if index is None else index,
            "distributed_type": dtype, "device": device}  # fmt: skip


def test_accelerate_path_only_for_pure_dp():
    assert trainers.uses_accelerate(ParallelLayout(1, 1, 4))
    assert trainers.uses_accelerate(ParallelLayout(1, 1, 1))
    assert not trainers.uses_accelerate(ParallelLayout(2, 1, 2))
    assert not trainers.uses_accelerate(ParallelLayout(1, 2, 1))


def test_accelerate_world_that_matches_passes():
    accelerate_world.check_accelerate_world(
        [view(0), view(1)], ParallelLayout(1, 1, 2), ["cpu", "cpu"]
    )
    single = [view(0, n=1, dtype="NO", device="cpu")]
    accelerate_world.check_accelerate_world(single, ParallelLayout(), ["cpu"])


def test_accelerate_without_cpu_flag_is_refused_naming_both_world_sizes():
    # What Accelerator() reports on every rank under torchrun on CPU without cpu=True.
    views = [view(0, n=1, index=0, dtype="NO"), view(1, n=1, index=0, dtype="NO")]
    with pytest.raises(LayoutMismatch) as err:
        accelerate_world.check_accelerate_world(views, ParallelLayout(1, 1, 2), ["cpu", "cpu"])
    msg = str(err.value)
    assert "expects Accelerate world size 2" in msg and "observed world size 1" in msg
    assert "NO" in msg and "cpu=True" in msg


def test_accelerate_rank_order_and_device_checked():
    with pytest.raises(LayoutMismatch, match="process indices"):
        accelerate_world.check_accelerate_world(
            [view(0, index=1), view(1, index=0)], ParallelLayout(1, 1, 2), ["cpu", "cpu"]
        )
    with pytest.raises(LayoutMismatch, match="other devices"):
        accelerate_world.check_accelerate_world(
            [view(0, n=1, dtype="NO", device="cuda:1")], ParallelLayout(), ["cuda:0"]
        )


def test_same_device():
    assert accelerate_world.same_device("cpu:0", "cpu")
    assert accelerate_world.same_device("cuda", "cuda:0")
    assert not accelerate_world.same_device("cuda:1", "cuda:0")
    assert not accelerate_world.same_device("cpu", "cuda:0")


@pytest.mark.parametrize(
    ("bs", "requested", "expected"),
    [(8, 2, 2), (8, 3, 2), (1, 2, 1), (6, 4, 3), (4, 8, 4), (7, 4, 1)],
)
def test_effective_microbatches_divide_the_batch(bs, requested, expected):
    got = trainers.effective_microbatches(bs, requested)
    assert got == expected and bs % got == 0


def test_effective_microbatches_rejects_zero():
    with pytest.raises(ValueError):
        trainers.effective_microbatches(0, 2)


def test_window_loss_means_replicas_then_steps():
    mean, per_step = trainers.window_loss([[2.0, 4.0], [4.0, 6.0]])
    assert per_step == [3.0, 5.0] and mean == 4.0
    with pytest.raises(ValueError, match="different step counts"):
        trainers.window_loss([[1.0], [1.0, 2.0]])
    with pytest.raises(ValueError):
        trainers.window_loss([])


def test_causal_lm_loss_is_next_token_cross_entropy():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7)
    ids = torch.randint(0, 7, (2, 5))
    expected = (
        sum(-torch.log_softmax(logits[b, t], -1)[ids[b, t + 1]] for b in range(2) for t in range(4))
        / 8
    )
    assert torch.allclose(trainers.causal_lm_loss(logits, ids), expected)


def test_synthetic_samples_are_seeded_and_in_vocabulary():
    a = train_data.synthetic_samples(50, 16, seed=3)
    assert torch.equal(a, train_data.synthetic_samples(50, 16, seed=3))
    assert not torch.equal(a, train_data.synthetic_samples(50, 16, seed=4))
    assert a.shape == (256, 16) and a.min() >= 0 and a.max() < 50


class _Tok:
    eos_token_id = 1

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}


def test_prompts_are_packed_into_full_sequences_with_eos():
    samples = train_data.packed_prompt_samples(["abc", "de"], _Tok(), seq_len=3)
    # a b c EOS d e EOS -> 7 tokens -> 2 full sequences, the tail dropped (no padding)
    assert samples.tolist() == [[97, 98, 99], [1, 100, 101]]
    with pytest.raises(ValueError, match="fewer than training.seq_len"):
        train_data.packed_prompt_samples(["a"], _Tok(), seq_len=8)


def test_dataset_cycles_and_is_bounded():
    ds = train_data.TokenDataset(torch.arange(6).view(3, 2), length=7)
    assert len(ds) == 7 and ds[4].tolist() == [2, 3]
    with pytest.raises(IndexError):
        ds[7]


@pytest.mark.parametrize(("dp", "bs"), [(2, 3), (3, 2), (1, 4)])
def test_accelerate_dataloader_sharding_is_the_contiguous_split(dp, bs):
    """Accelerate's shard of an unshuffled loader == base.prompt_indices (the mesh path's split)."""
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler, SequentialSampler

    steps, n = 5, 10_000
    base = BatchSampler(SequentialSampler(range(steps * bs * dp)), bs, drop_last=False)
    for d in range(dp):
        shard = list(BatchSamplerShard(base, num_processes=dp, process_index=d))
        assert shard == [prompt_indices(s, bs, dp, d, n) for s in range(steps)]


def test_training_config_names_the_missing_section(tmp_path):
    with pytest.raises(ValueError, match="get_job_spec"):
        training.training_config(launched_job(tmp_path, scenario="inference"))


def test_schema_defaults_fill_the_training_section(tmp_path):
    t = training.training_config(launched_job(tmp_path, scenario="training"))
    schema = yaml.safe_load(SCHEMA_PATH.read_text())["properties"]["training"]["properties"]
    # jobspec asks for fewer steps than the schema's 32 (FAST_TRAINING), the rest is the schema's.
    assert t == Training(**{**{k: p["default"] for k, p in schema.items()}, **FAST_TRAINING})


def test_a_training_section_with_a_missing_key_is_refused(tmp_path):
    data = launched_job(tmp_path, scenario="training").to_json()
    del data["training"]["lr"]
    with pytest.raises(JobSpecError, match=r"training: .*missing keys \['lr'\]"):
        LaunchedJob.from_json(data)


def test_train_stage_matches_the_hf_model(tmp_path):
    """The stage forward every layout runs == HF's forward, and its loss == HF's LM loss."""
    from transformers import AutoModelForCausalLM

    from energysweep.sweep.tinymodel import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "tiny", {"num_hidden_layers": 2})
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = train_data.synthetic_samples(model.config.vocab_size, 12, seed=1, n=3)
    stage = TrainStage(model, first=True, last=True)
    with torch.no_grad():
        ours = stage(ids)
        hf = model(ids, labels=ids)
    assert (ours - hf.logits).abs().max().item() < 1e-5
    assert abs(trainers.causal_lm_loss(ours, ids).item() - hf.loss.item()) < 1e-5


def _train_row(**over):
    base = dict(scenario="training", phase="train", output_tokens=None, requests=16,
                input_tokens=1024, loss=2.5, iterations=4)  # fmt: skip
    return row(**{**base, **over})


def test_summary_has_energy_per_training_token_and_says_why_output_figures_are_null():
    rows = [_train_row(repetition=0), _train_row(repetition=1, loss=2.0)]
    rows += [row(repetition=0), row(repetition=1)]  # an inference point of the same layout
    w = aggregate.windows(shards.to_table(rows).to_pandas())
    s = aggregate.summarize(w).set_index("scenario")
    t, i = s.loc["training"], s.loc["inference"]
    # 128 J over 1024 tokens trained on, 2 s windows, 16 sequences
    assert t["energy_per_train_token_j"] == 0.125
    assert t["train_tokens_per_s"] == 512.0 and t["samples_per_s"] == 8.0
    assert t["loss"] == 2.25 and t["training_status"] == "ok"
    assert math.isnan(t["energy_per_output_token_j"]) and math.isnan(t["output_tokens_per_s"])
    assert "training" in t["output_token_status"] and "training" in t["prefill_decode_status"]
    assert i["output_token_status"] == "ok" and "inference" in i["training_status"]
    assert math.isnan(i["energy_per_train_token_j"]) and math.isnan(i["loss"])
    assert i["energy_per_output_token_j"] == 2.0
    assert results.unexplained_nulls(s.reset_index()) == []


def test_training_energy_unavailable_is_null_with_status():
    r = _train_row(gpu_uuid=None, gpu_energy_mj=None, gpu_energy_status="unavailable",
                   gpu_energy_detail="no GPU in use (device=cpu)", device="cpu")  # fmt: skip
    s = aggregate.summarize(aggregate.windows(shards.to_table([r]).to_pandas()))
    assert math.isnan(s.loc[0, "energy_per_train_token_j"])
    assert s.loc[0, "gpu_energy_status"] == "unavailable"
    assert s.loc[0, "train_tokens_per_s"] == 512.0
