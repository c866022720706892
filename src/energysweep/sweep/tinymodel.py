"""A tiny random Llama checkpoint, built offline and deterministically.

The result is an ordinary Hugging Face checkpoint directory (config.json, model.safetensors,
tokenizer files), so every backend loads it with `AutoModelForCausalLM.from_pretrained` and
`AutoTokenizer.from_pretrained` exactly as it would load a downloaded model.

A built checkpoint can be kept in a cache (:func:`default_cache`, on for the workflow's
``build_tiny_model`` step and the command line) and copied from there the next time: the same spec
gives the same bytes for one Python and one set of library versions (and this module's code), and
those are the cache key; every copy is checked against the hashes stored with it.

Usage: python -m energysweep.sweep.tinymodel OUT_DIR [--spec-json '{"num_hidden_layers": 2}']
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import sys
from importlib import metadata
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


# The cache of built checkpoints (default_cache); `off` (or empty) turns it off.
CACHE_ENV = "ENERGYSWEEP_MODEL_CACHE"
# Beside a cache entry's files: their sha256, checked on every copy out of the cache.
MANIFEST = "manifest.json"
# What the bytes depend on besides the spec and Python: the key changes with any of them.
KEY_LIBRARIES = ("torch", "transformers", "tokenizers", "safetensors")


def default_cache() -> Path | None:
    """The cache directory of built checkpoints: $ENERGYSWEEP_MODEL_CACHE (``off`` or empty: no
    cache), by default ``$XDG_CACHE_HOME/energysweep/tiny-models`` (``~/.cache/...``)."""
    value = os.environ.get(CACHE_ENV)
    if value is not None:
        return None if value.strip() in ("", "off") else Path(value)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "energysweep" / "tiny-models"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def cache_key(spec: dict) -> str:
    """The cache key of a resolved ``spec``: everything its checkpoint's bytes depend on (the spec,
    Python and its stdlib corpus, the libraries that write it, this module's code)."""
    versions: dict[str, str | None] = {}
    for name in KEY_LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    parts = {
        "spec": spec,
        "python": sys.version,
        "corpus": _sha256("\0".join(_corpus()).encode()),
        "libraries": versions,
        "code": _sha256(Path(__file__).read_bytes()),
    }
    return _sha256(json.dumps(parts, sort_keys=True).encode())[:32]


def _copy_cached(entry: Path, tmp: Path) -> str | None:
    """Copy cache ``entry``'s files into ``tmp``, each checked against its stored hash: None, or
    why the entry cannot be used (``tmp`` is then emptied)."""
    try:
        hashes = json.loads((entry / MANIFEST).read_text(encoding="utf-8"))
        for name, digest in hashes.items():
            data = (entry / name).read_bytes()
            if _sha256(data) != digest:
                raise ValueError(f"{name} does not match its sha256")
            (tmp / name).write_bytes(data)
        if not hashes:
            raise ValueError("no files")
    except (OSError, ValueError, AttributeError) as exc:
        for path in tmp.iterdir():
            path.unlink()
        return str(exc)
    return None


def _store(tmp: Path, entry: Path) -> str | None:
    """Keep the checkpoint built in ``tmp`` as cache ``entry`` (atomically): None, or why not."""
    try:
        with atomic_path(entry, directory=True) as staged:
            hashes = {}
            for path in sorted(tmp.iterdir()):
                data = path.read_bytes()
                (staged / path.name).write_bytes(data)
                hashes[path.name] = _sha256(data)
            (staged / MANIFEST).write_text(json.dumps(hashes, indent=2, sort_keys=True) + "\n")
    except OSError as exc:  # a read-only or full cache costs the next build, nothing else
        return str(exc)
    return None


def build_tiny_model(
    out_dir: str | Path, spec: dict | None = None, cache: str | Path | None = None
) -> Path:
    """Build a tiny random Llama checkpoint with its tokenizer into `out_dir`.

    The same spec gives byte-identical weights and tokenizer.json (for one Python and library
    version). The directory appears complete or not at all: it is written under a temporary
    sibling name and renamed into place; an existing `out_dir` is replaced.

    With a ``cache`` directory, a checkpoint of the same key (:func:`cache_key`) is copied from it
    (its files checked against their stored sha256; a damaged entry is rebuilt and replaced), and
    a new build is stored there. One line says which, on stdout.

    The tokenizer learns at most about 3,800 tokens from its corpus; a larger `vocab_size` still
    gives the model that many embedding rows (as real checkpoints pad theirs), so generated ids
    may lie beyond the tokenizer's vocabulary.

    Args:
        out_dir: Checkpoint directory to create.
        spec: Overrides of DEFAULT_SPEC keys; None means the defaults.
        cache: The cache directory (:func:`default_cache`), or None to always build.

    Returns:
        The checkpoint directory.
    """
    spec = resolve_spec(spec)
    out = Path(out_dir).absolute()
    entry = Path(cache) / cache_key(spec) if cache is not None else None
    # Written beside its final name (the rename is atomic) and renamed into place; an existing
    # checkpoint is replaced whole.
    with atomic_path(out, directory=True) as tmp:
        damaged = _copy_cached(entry, tmp) if entry is not None and entry.is_dir() else "absent"
        if entry is not None and damaged is None:
            print(f"tiny model: copied from the cache, {entry}")
            return out
        _write(tmp, spec)
        if entry is not None:
            kept = _store(tmp, entry)
            what = "built" if damaged == "absent" else f"built (cache entry unusable: {damaged})"
            where = f"kept in the cache, {entry}" if kept is None else f"not cached: {kept}"
            print(f"tiny model: {what}; {where}")
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
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help=f"always build; by default a checkpoint is copied from (and kept in) ${CACHE_ENV}, "
        "or ~/.cache/energysweep/tiny-models",
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
        out = build_tiny_model(args.out_dir, spec, cache=None if args.no_cache else default_cache())
    except ValueError as exc:
        parser.error(str(exc))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
