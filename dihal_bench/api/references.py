"""Reference rows that cost no training: the floor and the ceiling a method's metrics sit between.

- `unigram_samples`: i.i.d. draws from the training split's unigram distribution, the floor
  (text with the corpus's word frequencies and no sequence structure at all);
- `held_out_windows`: a seeded random subset of a held-out split's windows. The runner scores
  validation windows as the human row, the ceiling, and takes MAUVE's references (its P side)
  from the test split: a set compared with itself scores MAUVE 1 whatever its size, so the
  human row and the references must not share a window. See docs/method.md#metrics.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dihal_bench.errors import DihalError


def unigram_distribution(train_token_ids: torch.Tensor | Sequence[Sequence[int]],
                         banned: Sequence[int] = ()) -> torch.Tensor:
    """(V,) float64 probabilities of each token id in the training ids, `banned` ids set to 0.

    `train_token_ids` is a tensor of ids of any shape ((N, T) packed windows) or a list of
    id lists (documents, ragged); V is the largest id + 1.
    """
    ids = _flat_ids(train_token_ids)
    counts = torch.bincount(ids).double()
    banned_ids = [i for i in banned if 0 <= i < len(counts)]
    counts[banned_ids] = 0.0
    total = counts.sum()
    if total == 0:
        raise DihalError(f"unigram distribution: every training token is banned ({len(set(banned))} banned ids)")
    return counts / total


def unigram_samples(
    train_token_ids: torch.Tensor | Sequence[Sequence[int]],
    n: int,
    seq_len: int,
    seed: int,
    banned: Sequence[int] = (),
) -> torch.Tensor:
    """(n, seq_len) int64 token ids drawn i.i.d. from the training split's unigram distribution.

    The floor of the methods table: each position is an independent draw with the
    training frequency of each id (`unigram_distribution`), so the samples have the corpus's
    word frequencies and no structure beyond them. `banned` ids (the tokenizer's special
    tokens, which decoding would drop) are never drawn. Same seed, same samples.
    """
    _check_count("unigram samples: n", n)
    _check_count("unigram samples: seq_len", seq_len)
    probabilities = unigram_distribution(train_token_ids, banned)
    generator = torch.Generator().manual_seed(seed)
    draws = torch.multinomial(probabilities, n * seq_len, replacement=True, generator=generator)
    return draws.view(n, seq_len)


def held_out_windows(windows: torch.Tensor, n: int, seed: int, what: str = "held-out") -> torch.Tensor:
    """`n` of `windows` (N, T), without replacement, by one seeded permutation: a uniformly random
    subset in random order, so that `n` windows cover the split's documents rather than its
    first few. The first `n` rows of the permutation, so a smaller `n` takes a prefix of a larger
    one's. Same seed, same windows."""
    if not isinstance(windows, torch.Tensor) or windows.dim() != 2:
        raise DihalError(f"{what} windows: expected a 2-D tensor of token windows, got {_describe(windows)}")
    _check_count(f"{what} windows: n", n)
    if n > len(windows):
        raise DihalError(f"{what} windows: asked for {n}, but the split has {len(windows)}")
    order = torch.randperm(len(windows), generator=torch.Generator().manual_seed(seed))
    return windows[order[:n]]


def _flat_ids(train_token_ids: torch.Tensor | Sequence[Sequence[int]]) -> torch.Tensor:
    if isinstance(train_token_ids, torch.Tensor):
        if train_token_ids.dtype.is_floating_point or train_token_ids.dtype == torch.bool:
            raise DihalError(f"unigram distribution: token ids must be integers, got {train_token_ids.dtype}")
        ids = train_token_ids.reshape(-1).long().cpu()
    else:
        ids = torch.tensor([int(i) for row in train_token_ids for i in row], dtype=torch.long)
    if ids.numel() == 0:
        raise DihalError("unigram distribution: the training split has no tokens")
    if ids.min() < 0:
        raise DihalError(f"unigram distribution: token ids must be >= 0, found {int(ids.min())}")
    return ids


def _check_count(what: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DihalError(f"{what} must be a positive integer, got {value!r}")


def _describe(value) -> str:
    return f"a {value.dim()}-D tensor" if isinstance(value, torch.Tensor) else type(value).__name__
