"""The one next-token sampler every autoregressive decoder of the suite uses (DiHAL's
hybrid, the intact backbone, LD4LG's and CoDAR's decoders, the lm-eval adapter), so that
methods differ in their models and not in how tokens are drawn (docs/method.md#metrics)."""

from __future__ import annotations

import torch
from torch import Tensor

from dihal_bench.errors import DihalError

#: the precision of the probabilities `sample_next_token` draws from (what a row that draws through it records)
NEXT_TOKEN_PRECISION = "float32"
#: what a row records that draws no token from a distribution (its tokens are an argmax: rounding)
NO_DRAW = "argmax"


def check_sampling(temperature: float, top_p: float) -> None:
    if temperature < 0:
        raise DihalError(f"temperature must be ≥ 0 (0 is greedy), got {temperature}")
    if not 0 < top_p <= 1:
        raise DihalError(f"top_p must be in (0, 1], got {top_p}")


def special_ids(tokenizer) -> list[int]:
    """The ids of the tokenizer's special tokens (BOS, EOS, padding, chat markers, ...), which
    a decoder of plain text never emits: a sample is a window of running text."""
    return sorted(set(getattr(tokenizer, "all_special_ids", None) or []))


def sample_next_token(logits: Tensor, temperature: float, top_p: float, generator: torch.Generator,
                      banned: Tensor | list[int] | None = None) -> Tensor:
    """One token per row of ``logits`` (B, V): argmax at temperature 0, else a draw from
    softmax(logits / temperature) restricted to the nucleus, the most probable tokens whose
    mass before them is still below ``top_p`` (Holtzman et al. 2020; the top token always
    stays). Ids in ``banned`` (e.g. :func:`special_ids`) get probability 0 before either."""
    if banned is not None and len(banned):
        logits = logits.clone()
        logits[:, torch.as_tensor(banned, dtype=torch.long, device=logits.device)] = float("-inf")
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs.masked_fill(mass_before >= top_p, 0.0))
    return torch.multinomial(probs, 1, generator=generator)[:, 0]
