"""The tiny random Llama: deterministic, atomic, and loadable like any checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from energysweep.sweep import tinymodel
from energysweep.sweep.tinymodel import DEFAULT_SPEC, SPEC_FILE, build_tiny_model, main

PROMPTS = ["Hello", "Why is the sky blue on a clear afternoon in summer?"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def _files(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_default_spec_values():
    assert DEFAULT_SPEC == {
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 512,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
        "seed": 0,
    }


def test_build_twice_is_byte_identical(tmp_path, model_dir):
    again = build_tiny_model(tmp_path / "again")
    first, second = _files(model_dir), _files(again)
    assert {"model.safetensors", "tokenizer.json", "config.json", SPEC_FILE} <= set(first)
    assert first["model.safetensors"] == second["model.safetensors"]
    assert first["tokenizer.json"] == second["tokenizer.json"]
    assert first == second


def test_seed_changes_weights_only(tmp_path, model_dir):
    other = build_tiny_model(tmp_path / "seed1", {"seed": 1})
    assert (other / "model.safetensors").read_bytes() != (
        model_dir / "model.safetensors"
    ).read_bytes()
    assert (other / "tokenizer.json").read_bytes() == (model_dir / "tokenizer.json").read_bytes()


def test_config_matches_spec(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    cfg = model.config
    assert cfg.model_type == "llama"
    for key, value in DEFAULT_SPEC.items():
        if key != "seed":
            assert getattr(cfg, key) == value, key
    assert json.loads((model_dir / SPEC_FILE).read_text()) == DEFAULT_SPEC
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_tokenizer_special_tokens(model_dir):
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<s>", "</s>", "<pad>")
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (0, 1, 2)
    assert len({tok.bos_token_id, tok.eos_token_id, tok.pad_token_id}) == 3
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(model.config, name) == getattr(tok, name)
    assert tok.padding_side == "left"
    assert len(tok) == DEFAULT_SPEC["vocab_size"]
    ids = tok("Energy per token, in joules.")["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == "Energy per token, in joules."


def test_generate_left_padded_is_deterministic(model_dir):
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    batch = tok(PROMPTS, return_tensors="pt", padding=True)
    # Left padding: the shorter prompt is padded at the front, so every row ends with a token.
    assert batch["attention_mask"][0, 0] == 0 and batch["attention_mask"][:, -1].all()
    assert batch["input_ids"][0, 0] == tok.pad_token_id

    def run(m):
        with torch.inference_mode():
            out = m.generate(
                **batch,
                max_new_tokens=8,
                min_new_tokens=8,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
            )
        return out[:, batch["input_ids"].shape[1] :]

    first, second = run(model), run(model)
    assert first.shape == (2, 8)
    assert torch.equal(first, second)
    assert torch.equal(run(AutoModelForCausalLM.from_pretrained(model_dir).eval()), first)


def test_greedy_outputs_differ_across_prompts(model_dir):
    """Different prompts give different tokens: otherwise a prompt-routing bug (dp shards, the
    serving path) would pass every token-equality test unseen."""
    from energysweep.scenarios.prompts import load_prompts

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    prompts = load_prompts()[:16]
    batch = tok(prompts, return_tensors="pt", padding=True)
    with torch.inference_mode():
        out = model.generate(
            **batch, max_new_tokens=8, min_new_tokens=8, do_sample=False,
            pad_token_id=tok.pad_token_id,
        )  # fmt: skip
    rows = {tuple(r) for r in out[:, batch["input_ids"].shape[1] :].tolist()}
    assert len(rows) >= 3 * len(prompts) // 4, (
        f"{len(rows)} distinct outputs for {len(prompts)} prompts"
    )
    # The first generated token alone already tells many prompts apart (15 distinct outputs and
    # 11 distinct first tokens for these 16 prompts, seed 0).
    assert len({r[0] for r in rows}) >= 6


def test_does_not_disturb_global_rng(tmp_path):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model(tmp_path / "m")
    assert torch.equal(torch.rand(3), expected)


def test_spec_overrides(tmp_path):
    d = build_tiny_model(tmp_path / "m", {"num_hidden_layers": 2, "tie_word_embeddings": 1})
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 2
    assert cfg["tie_word_embeddings"] is True
    assert json.loads((d / SPEC_FILE).read_text()) == {
        **DEFAULT_SPEC,
        "num_hidden_layers": 2,
        "tie_word_embeddings": True,
    }


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"hidden_layers": 2}, "unknown keys"),
        ({"hidden_size": 65}, "divisible by num_attention_heads"),
        ({"num_key_value_heads": 3}, "divisible by num_key_value_heads"),
        ({"vocab_size": 100}, "vocab_size must be >= 259"),
        ({"num_hidden_layers": 0}, "num_hidden_layers must be >= 1"),
        ({"num_hidden_layers": True}, "must be int"),
        ({"hidden_size": 64.0}, "must be int"),
    ],
)
def test_bad_spec_is_rejected_before_writing(tmp_path, spec, message):
    with pytest.raises(ValueError, match=message):
        build_tiny_model(tmp_path / "m", spec)
    assert list(tmp_path.iterdir()) == []


def test_failed_build_leaves_nothing(tmp_path, monkeypatch):
    def half_write(tmp, spec):
        (tmp / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(tinymodel, "_write", half_write)
    with pytest.raises(KeyboardInterrupt):
        build_tiny_model(tmp_path / "m")
    assert list(tmp_path.iterdir()) == []


def test_failed_rebuild_keeps_previous(tmp_path, monkeypatch):
    d = build_tiny_model(tmp_path / "m")
    before = _files(d)
    monkeypatch.setattr(tinymodel, "_write", lambda tmp, spec: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        build_tiny_model(d)
    assert _files(d) == before
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_rebuild_replaces_and_cleans_up(tmp_path):
    d = build_tiny_model(tmp_path / "m", {"num_hidden_layers": 1})
    (d / "stale.txt").write_text("old")
    build_tiny_model(d)
    assert not (d / "stale.txt").exists()
    assert json.loads((d / SPEC_FILE).read_text()) == DEFAULT_SPEC
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_files_are_not_private(model_dir):
    # Ranks under another account or a cluster's shared filesystem must be able to read them.
    for p in model_dir.iterdir():
        assert p.stat().st_mode & 0o044 == (model_dir.stat().st_mode & 0o044), p.name


def test_cli(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(tinymodel.CACHE_ENV, str(tmp_path / "cache"))
    assert main([str(tmp_path / "m"), "--spec-json", '{"num_hidden_layers": 2}']) == 0
    said = capsys.readouterr().out.strip().splitlines()
    assert said[-1] == str(tmp_path / "m") and "kept in the cache" in said[0], said
    assert json.loads((tmp_path / "m" / "config.json").read_text())["num_hidden_layers"] == 2
    assert main([str(tmp_path / "n"), "--no-cache"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "n")


# The cache of built checkpoints: a copy is the build's bytes, checked, under a key that changes
# with whatever the bytes depend on.
@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A cache holding the default spec's checkpoint, built there once."""
    root = tmp_path_factory.mktemp("cache")
    build_tiny_model(root / "first", cache=root / "models")
    return root / "models"


def test_a_cached_checkpoint_is_the_builds_bytes_and_skips_the_build(
    tmp_path, model_dir, cache, monkeypatch, capsys
):
    monkeypatch.setattr(tinymodel, "_write", lambda tmp, spec: 1 / 0)
    copy = build_tiny_model(tmp_path / "m", cache=cache)
    assert _files(copy) == _files(model_dir)  # model_dir: built without a cache
    (entry,) = cache.iterdir()
    assert entry.name == tinymodel.cache_key(tinymodel.resolve_spec(None))
    assert f"copied from the cache, {entry}" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no temp left beside it


def test_a_damaged_cache_entry_is_rebuilt_and_replaced(tmp_path, model_dir, capsys):
    cache = tmp_path / "cache"
    build_tiny_model(tmp_path / "a", cache=cache)
    (entry,) = cache.iterdir()
    weights = entry / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    capsys.readouterr()
    rebuilt = build_tiny_model(tmp_path / "b", cache=cache)
    said = capsys.readouterr().out
    assert "cache entry unusable: model.safetensors does not match its sha256" in said, said
    assert _files(rebuilt) == _files(model_dir)
    assert weights.read_bytes() == (model_dir / "model.safetensors").read_bytes()  # replaced
    (entry / tinymodel.MANIFEST).unlink()  # an entry without its hashes is not used either
    build_tiny_model(tmp_path / "c", cache=cache)
    assert "cache entry unusable" in capsys.readouterr().out


def test_the_cache_key_changes_with_what_the_bytes_depend_on(monkeypatch):
    spec = tinymodel.resolve_spec(None)
    key = tinymodel.cache_key(spec)
    assert tinymodel.cache_key(dict(spec)) == key
    assert tinymodel.cache_key({**spec, "seed": 1}) != key
    real = tinymodel.metadata.version
    for name in tinymodel.KEY_LIBRARIES:
        monkeypatch.setattr(
            tinymodel.metadata, "version", lambda n, name=name: "0.0" if n == name else real(n)
        )
        assert tinymodel.cache_key(spec) != key, name
    monkeypatch.setattr(tinymodel.metadata, "version", real)
    monkeypatch.setattr(tinymodel.sys, "version", "3.0.0 (another build)")
    assert tinymodel.cache_key(spec) != key


def test_a_cache_that_cannot_be_written_costs_only_the_copy(tmp_path, model_dir, capsys):
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache directory should be")
    d = build_tiny_model(tmp_path / "m", cache=blocked)
    assert _files(d) == _files(model_dir)
    assert "built; not cached:" in capsys.readouterr().out


def test_the_default_cache_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(tinymodel.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tinymodel.default_cache() == tmp_path / "energysweep" / "tiny-models"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert tinymodel.default_cache() == tmp_path / "home" / ".cache/energysweep/tiny-models"
    monkeypatch.setenv(tinymodel.CACHE_ENV, str(tmp_path / "mine"))
    assert tinymodel.default_cache() == tmp_path / "mine"
    for off in ("off", ""):
        monkeypatch.setenv(tinymodel.CACHE_ENV, off)
        assert tinymodel.default_cache() is None


@pytest.mark.parametrize("spec_json", ["{not json", "[1, 2]", '{"bogus": 1}'])
def test_cli_bad_spec(tmp_path, spec_json):
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "m"), "--spec-json", spec_json])
    assert exc.value.code == 2
    assert not (tmp_path / "m").exists()


def test_module_import_is_cheap():
    # Snakemake and config validation import this module for DEFAULT_SPEC alone.
    code = (
        "import sys, energysweep.sweep.tinymodel;"
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
