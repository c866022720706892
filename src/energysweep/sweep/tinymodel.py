"""A tiny random Llama checkpoint, built offline and deterministically.

The result is an ordinary Hugging Face checkpoint directory (config.json, model.safetensors,
tokenizer files), so every backend loads it with `AutoModelForCausalLM.from_pretrained` and
`AutoTokenizer.from_pretrained` exactly as it would load a downloaded model.

Usage: python -m energysweep.sweep.tinymodel OUT_DIR [--spec-json '{"num_hidden_layers": 2}']
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

from energysweep.tables.io import atomic_path

# head_dim = hidden_size / num_attention_heads = 32: vLLM's CPU attention supports head_dim 32,
# 64, 80, 96, 112, 128, ... only (16 fails with "Unsupported CPU attention configuration").
DEFAULT_SPEC: dict = {
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

SPEC_FILE = "energysweep_spec.json"

# Special tokens take the first ids, in this order: bos = 0, eos = 1, pad = 2.
# pad is its own token (not eos) so padding can never be mistaken for an end of sequence.
BOS, EOS, PAD = "<s>", "</s>", "<pad>"

# The tokenizer is trained on these stdlib sources, read from disk without importing them.
# The vocabulary therefore depends on these files: it is identical for a given Python version
# but may differ between versions. The weights do not depend on it.
CORPUS_MODULES = ("textwrap", "argparse", "difflib", "string")

# 256 byte symbols + the special tokens: a smaller vocabulary cannot encode every input.
_MIN_VOCAB = 256 + 3


def resolve_spec(spec: dict | None = None) -> dict:
    """Merge `spec` over DEFAULT_SPEC and check it.

    Args:
        spec: Overrides of DEFAULT_SPEC keys; None means the defaults.

    Returns:
        The complete spec.

    Raises:
        ValueError: On an unknown key, a wrong type, or an inconsistent shape.
    """
    spec = dict(spec or {})
    unknown = sorted(set(spec) - set(DEFAULT_SPEC))
    if unknown:
        raise ValueError(f"tiny model spec: unknown keys {unknown}; known: {sorted(DEFAULT_SPEC)}")
    full = {**DEFAULT_SPEC, **spec}
    for key, value in full.items():
        want = type(DEFAULT_SPEC[key])
        if want is bool and type(value) is int and value in (0, 1):
            # The config schema types every spec value as an integer: accept 0/1 for flags.
            value = full[key] = bool(value)
        # bool is a subclass of int: keep the two apart so `True` is not a layer count.
        if type(value) is not want:
            raise ValueError(f"tiny model spec: {key} must be {want.__name__}, got {value!r}")
        if want is int and key != "seed" and value < 1:
            raise ValueError(f"tiny model spec: {key} must be >= 1, got {value}")
    if full["seed"] < 0:
        raise ValueError(f"tiny model spec: seed must be >= 0, got {full['seed']}")
    if full["hidden_size"] % full["num_attention_heads"]:
        raise ValueError(
            "tiny model spec: hidden_size must be divisible by num_attention_heads "
            f"({full['hidden_size']} % {full['num_attention_heads']} != 0)"
        )
    if full["num_attention_heads"] % full["num_key_value_heads"]:
        raise ValueError(
            "tiny model spec: num_attention_heads must be divisible by num_key_value_heads "
            f"({full['num_attention_heads']} % {full['num_key_value_heads']} != 0)"
        )
    if full["vocab_size"] < _MIN_VOCAB:
        raise ValueError(
            f"tiny model spec: vocab_size must be >= {_MIN_VOCAB} (256 bytes + 3 special "
            f"tokens), got {full['vocab_size']}"
        )
    return full


def _corpus() -> list[str]:
    texts = []
    for name in CORPUS_MODULES:
        found = importlib.util.find_spec(name)
        origin = found.origin if found else None
        if not origin or not origin.endswith(".py") or not os.path.isfile(origin):
            raise RuntimeError(
                f"cannot read the source of stdlib module {name!r} to train the tiny "
                "tokenizer (is this a Python install without .py files?)"
            )
        texts.append(Path(origin).read_text(encoding="utf-8"))
    return texts


def _build_tokenizer(spec: dict):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec["vocab_size"],
        special_tokens=[BOS, EOS, PAD],
        # All 256 bytes up front, so any text encodes without an unknown token.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    # Prepend BOS like real Llama tokenizers, so prompt token counts include it as they would.
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        padding_side="left",
        model_max_length=spec["max_position_embeddings"],
    )


def _write(tmp: Path, spec: dict) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    tokenizer = _build_tokenizer(spec)
    tokenizer.save_pretrained(tmp)
    # transformers 5 records the class as "TokenizersBackend", which transformers 4 (still pinned
    # by some engines) cannot resolve; "PreTrainedTokenizerFast" loads the same way in both.
    tok_cfg_file = tmp / "tokenizer_config.json"
    tok_cfg = json.loads(tok_cfg_file.read_text(encoding="utf-8"))
    tok_cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    tok_cfg_file.write_text(json.dumps(tok_cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    config = LlamaConfig(
        hidden_size=spec["hidden_size"],
        intermediate_size=spec["intermediate_size"],
        num_hidden_layers=spec["num_hidden_layers"],
        num_attention_heads=spec["num_attention_heads"],
        num_key_value_heads=spec["num_key_value_heads"],
        vocab_size=spec["vocab_size"],
        max_position_embeddings=spec["max_position_embeddings"],
        tie_word_embeddings=spec["tie_word_embeddings"],
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    # fork_rng: seeding must not change the caller's global RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec["seed"])
        # Initialise in float32 whatever the caller's default dtype, so the values are too.
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.float32)
        try:
            model = LlamaForCausalLM(config)
        finally:
            torch.set_default_dtype(previous)
    model.eval()
    # The shard progress bar is noise in job logs for a single sub-megabyte file.
    bar_was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(tmp, safe_serialization=True)
    finally:
        if bar_was_on:
            hf_logging.enable_progress_bar()
    (tmp / SPEC_FILE).write_text(json.dumps(spec, indent=2, sort_keys=True) + "\n")
    # Some writers create private (0600) files; give every file the mode the umask gives new
    # files, read off the directory that mkdir() created under the same umask.
    file_mode = tmp.stat().st_mode & 0o666
    for path in tmp.iterdir():
        path.chmod(file_mode)


def build_tiny_model(out_dir: str | Path, spec: dict | None = None) -> Path:
    """Build a tiny random Llama checkpoint with its tokenizer into `out_dir`.

    The same spec gives byte-identical weights and tokenizer.json (for one Python and library
    version). The directory appears complete or not at all: it is written under a temporary
    sibling name and renamed into place; an existing `out_dir` is replaced.

    The tokenizer learns at most about 3,800 tokens from its corpus; a larger `vocab_size` still
    gives the model that many embedding rows (as real checkpoints pad theirs), so generated ids
    may lie beyond the tokenizer's vocabulary.

    Args:
        out_dir: Checkpoint directory to create.
        spec: Overrides of DEFAULT_SPEC keys; None means the defaults.

    Returns:
        The checkpoint directory.
    """
    spec = resolve_spec(spec)
    out = Path(out_dir).absolute()
    # Written beside its final name (the rename is atomic) and renamed into place; an existing
    # checkpoint is replaced whole.
    with atomic_path(out, directory=True) as tmp:
        _write(tmp, spec)
    return out


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m energysweep.sweep.tinymodel",
        description="Build a tiny random Llama checkpoint (offline, deterministic).",
    )
    parser.add_argument("out_dir", help="checkpoint directory to create (replaced if present)")
    parser.add_argument(
        "--spec-json",
        default=None,
        help=f"JSON object of overrides of the default spec {json.dumps(DEFAULT_SPEC)}",
    )
    args = parser.parse_args(argv)
    spec = None
    if args.spec_json is not None:
        try:
            spec = json.loads(args.spec_json)
        except json.JSONDecodeError as exc:
            parser.error(f"--spec-json is not valid JSON: {exc}")
        if not isinstance(spec, dict):
            parser.error("--spec-json must be a JSON object")
    try:
        out = build_tiny_model(args.out_dir, spec)
    except ValueError as exc:
        parser.error(str(exc))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
