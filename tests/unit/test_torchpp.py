"""Pure logic of energysweep.torchpp (TP/PP toolkit); its one-process decode against HF generate."""

from __future__ import annotations

import functools

import pytest
import torch

from energysweep.job.layout import ParallelLayout
from energysweep.torchpp import decode, load, tp
from energysweep.torchpp import stage as stage_fwd

# Left padding: 3 pads, 0 pads, 5 pads.
PAD_MASK = torch.tensor(
    [
        [0, 0, 0, 1, 1, 1],
        [1, 1, 1, 1, 1, 1],
        [0, 0, 0, 0, 0, 1],
    ]
)
PROMPTS = [
    "def f(x):",
    "import os\nimport sys\nclass Foo(object):\n    pass",
    "hello",
    "The quick brown fox jumps over",
]


def _brute_force_allowed(padding_mask: torch.Tensor, q_len: int) -> torch.Tensor:
    b, kv = padding_mask.shape
    past = kv - q_len
    out = torch.zeros(b, 1, q_len, kv, dtype=torch.bool)
    for bi in range(b):
        for i in range(q_len):
            for j in range(kv):
                out[bi, 0, i, j] = bool(padding_mask[bi, j]) and j <= past + i
    return out


def test_position_ids_count_real_tokens_from_zero():
    pos = stage_fwd.position_ids_from_mask(PAD_MASK)
    assert pos.tolist() == [[0, 0, 0, 0, 1, 2], [0, 1, 2, 3, 4, 5], [0, 0, 0, 0, 0, 0]]


def test_position_ids_of_a_decode_step_continue_each_sequence():
    grown = torch.cat([PAD_MASK, torch.ones(3, 1, dtype=PAD_MASK.dtype)], dim=-1)
    last = stage_fwd.position_ids_from_mask(grown)[:, -1:]
    assert last.tolist() == [[3], [6], [1]]


def test_position_ids_match_hf_generate():
    from transformers import GenerationMixin

    hf = GenerationMixin._prepare_position_ids_for_generation(
        None, PAD_MASK, {"attention_mask": PAD_MASK}
    )
    assert torch.equal(stage_fwd.position_ids_from_mask(PAD_MASK), hf)


@pytest.mark.parametrize("q_len", [6, 1, 2])
def test_sdpa_mask_is_causal_and_hides_padding(q_len):
    mask = stage_fwd.stage_attention_mask(PAD_MASK, q_len, "sdpa", torch.float32)
    assert mask.dtype == torch.bool
    assert torch.equal(mask, _brute_force_allowed(PAD_MASK, q_len))


@pytest.mark.parametrize("q_len", [6, 1])
def test_sdpa_mask_is_none_where_sdpa_is_causal_is_exact(q_len):
    assert stage_fwd.stage_attention_mask(torch.ones(2, 6), q_len, "sdpa", torch.float32) is None


def test_sdpa_mask_kept_for_a_chunk_after_a_cache_even_without_padding():
    mask = stage_fwd.stage_attention_mask(torch.ones(1, 5), 2, "sdpa", torch.float32)
    assert torch.equal(mask, _brute_force_allowed(torch.ones(1, 5), 2))


def test_eager_mask_is_additive():
    mask = stage_fwd.stage_attention_mask(PAD_MASK, 6, "eager", torch.bfloat16)
    allowed = _brute_force_allowed(PAD_MASK, 6)
    assert mask.dtype == torch.bfloat16
    assert (mask[allowed] == 0).all()
    assert (mask[~allowed] == torch.finfo(torch.bfloat16).min).all()


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("q_len", [6, 1])
@pytest.mark.parametrize("padded", [True, False])
def test_masks_equal_transformers_own(impl, q_len, padded):
    """Contract with transformers.masking_utils: same mask (or None) for a cache of past tokens."""
    from transformers.masking_utils import eager_mask, sdpa_mask

    pad = PAD_MASK if padded else torch.ones_like(PAD_MASK)
    kv = pad.shape[1]
    theirs = (sdpa_mask if impl == "sdpa" else eager_mask)(
        batch_size=pad.shape[0],
        q_length=q_len,
        kv_length=kv,
        q_offset=kv - q_len,
        attention_mask=pad.bool(),
        dtype=torch.float32,
    )
    ours = stage_fwd.stage_attention_mask(pad, q_len, impl, torch.float32)
    if theirs is None:
        assert ours is None
    else:
        assert torch.equal(ours, theirs)


def test_unsupported_attention_is_refused():
    with pytest.raises(ValueError, match="flash_attention_2"):
        stage_fwd.stage_attention_mask(PAD_MASK, 1, "flash_attention_2", torch.float32)


def test_checkpoint_key_maps_local_layers_to_global():
    layers = range(2, 4)
    assert load.checkpoint_key("model.layers.0.mlp.up_proj.weight", layers) == (
        "model.layers.2.mlp.up_proj.weight"
    )
    assert load.checkpoint_key("model.layers.1.self_attn.q_proj.weight", layers) == (
        "model.layers.3.self_attn.q_proj.weight"
    )
    assert load.checkpoint_key("lm_head.weight", layers) == "lm_head.weight"


# ---------------------------------------------------------------------------------------------
# With a real tiny checkpoint


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from energysweep.sweep.tinymodel import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("m") / "tiny")


@pytest.fixture(scope="module")
def tied_dir(tmp_path_factory):
    from energysweep.sweep.tinymodel import build_tiny_model

    return build_tiny_model(
        tmp_path_factory.mktemp("m") / "tied", {"tie_word_embeddings": True, "seed": 3}
    )


@pytest.fixture(scope="module")
def hf_model(tiny_dir):
    return _full_model(tiny_dir)


@functools.cache
def _full_model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


def _stage_weights_match(model_dir, pp: int, stage: int):
    full = _full_model(model_dir)
    full_state = full.state_dict()
    layers = ParallelLayout(1, pp, 1).stage_layers(full.config.num_hidden_layers, stage)
    model = load.load_stage_model(
        model_dir, torch.float32, torch.device("cpu"), layers, stage == 0, stage == pp - 1
    )
    inner = model.model
    assert [layer.self_attn.layer_idx for layer in inner.layers] == list(layers)
    assert (inner.embed_tokens is not None) == (stage == 0)
    assert (model.lm_head is not None) == (stage == pp - 1)
    for key, value in model.state_dict().items():
        assert torch.equal(value, full_state[load.checkpoint_key(key, layers)]), key
    # RoPE frequencies are a non-persistent buffer: rebuilt, not read from the checkpoint.
    assert torch.equal(inner.rotary_emb.inv_freq, full.model.rotary_emb.inv_freq)
    return model


@pytest.mark.parametrize(("pp", "stage"), [(1, 0), (2, 0), (2, 1), (3, 0), (3, 1), (3, 2)])
def test_stage_loads_exactly_its_own_tensors(tiny_dir, pp, stage):
    _stage_weights_match(tiny_dir, pp, stage)


def test_tied_head_on_last_stage_reads_the_embedding(tied_dir):
    from safetensors import safe_open

    model = _stage_weights_match(tied_dir, 2, 1)
    with safe_open(str(tied_dir / "model.safetensors"), framework="pt") as f:
        assert "lm_head.weight" not in set(f.keys())
        assert torch.equal(model.lm_head.weight, f.get_tensor("model.embed_tokens.weight"))


def test_whole_model_fallback_gives_the_same_stage(tiny_dir, monkeypatch):
    monkeypatch.setattr(load, "_checkpoint_files", lambda _: None)
    _stage_weights_match(tiny_dir, 2, 1)


@pytest.fixture(scope="module")
def backend(tiny_dir):
    from jobspec import job_spec, rank_context

    from energysweep.backends.pytorch import PyTorchBackend

    return PyTorchBackend(rank_context(job_spec(), "cpu", tiny_dir))


def _hf_generate(model, batch, n, pad_id, **kw):
    with torch.no_grad():
        out = model.generate(
            **batch, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=pad_id, **kw
        )
    return out[:, batch["input_ids"].shape[1] :].tolist()


@pytest.mark.parametrize("n", [1, 8])
def test_one_process_decode_equals_hf_generate(backend, hf_model, n):
    batch = backend.encode(PROMPTS)
    assert not batch["attention_mask"].all(), "the batch must be left-padded"
    ours = backend.generate(batch, n)
    assert ours == _hf_generate(hf_model, batch, n, backend.tokenizer.pad_token_id)
    assert all(len(t) == n for t in ours)


def test_unpadded_single_prompt_equals_hf_generate(backend, hf_model):
    batch = backend.encode(PROMPTS[1:2])
    assert batch["attention_mask"].all()
    assert backend.generate(batch, 6) == _hf_generate(
        hf_model, batch, 6, backend.tokenizer.pad_token_id
    )


def test_eos_suppressed_like_min_new_tokens(backend, hf_model, monkeypatch):
    """Make a token the model would pick the EOS: it must never appear, exactly as in HF."""
    batch = backend.encode(PROMPTS)
    free = backend.generate(batch, 8)
    eos = free[0][0]
    monkeypatch.setattr(backend.runner, "eos", [eos])
    ours = backend.generate(batch, 8)
    assert all(eos not in seq for seq in ours)
    assert ours != free
    assert ours == _hf_generate(
        hf_model, batch, 8, backend.tokenizer.pad_token_id, eos_token_id=eos
    )


def test_prefill_logits_equal_hf_forward(backend, hf_model):
    batch = backend.encode(PROMPTS)
    pos = stage_fwd.position_ids_from_mask(batch["attention_mask"])
    with torch.no_grad():
        ref = hf_model(**batch, position_ids=pos).logits
    ours = backend.prefill_logits(batch)
    assert ours.shape == (len(PROMPTS), batch["input_ids"].shape[1], 512)
    assert (ours - ref).abs().max().item() <= 1e-5


def test_zero_new_tokens(backend):
    assert backend.generate(backend.encode(PROMPTS[:2]), 0) == [[], []]


def test_tp_or_pp_without_mesh_is_refused(hf_model):
    with pytest.raises(ValueError, match="mesh"):
        decode.StageRunner(hf_model, ParallelLayout(1, 2, 1), 0, mesh=None)


class _FakeMesh:
    def __init__(self, size: int):
        self._size = size

    def size(self) -> int:
        return self._size


def test_tp_refuses_unknown_mode(hf_model):
    with pytest.raises(ValueError, match="tp mode"):
        tp.apply_tensor_parallel(hf_model, _FakeMesh(2), mode="fast")


def test_tp_refuses_a_degree_that_does_not_divide_the_heads(hf_model):
    with pytest.raises(ValueError, match="tp=3 does not divide num_attention_heads=4"):
        tp.apply_tensor_parallel(hf_model, _FakeMesh(3))
