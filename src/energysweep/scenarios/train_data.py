"""Training data: the job's fixed-length token sequences (``training.data``) and their dataset."""

from __future__ import annotations

import torch

from energysweep.job.sections import Training


class TokenDataset(torch.utils.data.Dataset):
    """``length`` fixed-length token sequences; sample ``i`` is ``samples[i % len(samples)]``.

    Every layout reads the same samples by global index, so a global batch is the same data
    whether one process or ``dp`` replicas train on it.
    """

    def __init__(self, samples: torch.Tensor, length: int):
        self.samples = samples
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        if not 0 <= index < self.length:
            raise IndexError(index)
        return self.samples[index % len(self.samples)]


def synthetic_samples(vocab_size: int, seq_len: int, seed: int, n: int = 256) -> torch.Tensor:
    """``n`` sequences of uniformly random token ids from a seeded generator (same on all ranks)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (n, seq_len), generator=gen, dtype=torch.long)


def packed_prompt_samples(prompts: list[str], tokenizer, seq_len: int) -> torch.Tensor:
    """The prompts tokenized, joined with EOS, and cut into full ``seq_len`` chunks (no padding).

    Raises:
        ValueError: the prompts hold fewer than ``seq_len`` tokens.
    """
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for text in prompts:
        ids += tokenizer(text, add_special_tokens=False)["input_ids"]
        if eos is not None:
            ids.append(int(eos))
    n = len(ids) // seq_len
    if n == 0:
        raise ValueError(
            f"the prompts hold {len(ids)} tokens, fewer than training.seq_len={seq_len}; "
            "lower seq_len or use training.data: synthetic"
        )
    return torch.tensor(ids[: n * seq_len], dtype=torch.long).view(n, seq_len)


def load_samples(cfg: Training, model_dir: str, prompts: list[str], seed: int) -> torch.Tensor:
    """The job's unique training sequences (``training.data``: prompts or synthetic)."""
    if cfg.data == "synthetic":
        from transformers import AutoConfig

        vocab = AutoConfig.from_pretrained(model_dir).vocab_size
        return synthetic_samples(vocab, cfg.seq_len, seed)
    if cfg.data == "prompts":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        return packed_prompt_samples(prompts, tokenizer, cfg.seq_len)
    raise ValueError(f"training.data {cfg.data!r} is not prompts or synthetic")
