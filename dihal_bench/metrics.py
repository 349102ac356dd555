"""What a metric reads, and how the evaluator LM scores and featurises text.

A metric plugin (hook `register_metrics`) registers `fn(samples: SampleSet, ctx: MetricContext)
-> dict[str, float | int | str | None]`. The built-in ones live in `dihal_builtin.metrics`;
this module holds the contract and the two evaluator passes they share:

- `score_texts`: the summed next-token NLL of each text under the evaluator (Gen.PPL);
- `evaluator_features`: the evaluator's last-layer hidden state at each text's last token
  (MAUVE's featurisation).

Both re-tokenise the decoded text with the evaluator's own tokenizer, as MDLM does
(`kuleshov-group/mdlm:diffusion.py`, `eval_retokenize`), so every method is scored on its
text, whatever tokenizer generated it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from dihal_bench.errors import DihalError

#: Texts with fewer scored tokens than this are left out of Gen.PPL (see `score_texts`).
MIN_SCORED_TOKENS = 2
#: Target id of positions that predict nothing (cross_entropy gives them NLL 0).
IGNORED = -100


class Evaluator(Protocol):
    """The part of a backbone that metrics use (`dihal_bench.backbone.Backbone` has it)."""

    tokenizer: Any  # a Hugging Face tokenizer
    device: torch.device

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, T) ids and mask -> (B, T, V) next-token logits."""

    def final_hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, T) ids and mask -> (B, T, d) last layer's hidden state, after the final norm."""


@dataclass
class SampleSet:
    """One method's generations.

    `texts[i]` is sample i decoded to text; `token_ids[i]` is the same sample as the
    generating model's token ids, without padding.
    """

    method: str
    texts: list[str]
    token_ids: list[list[int]]

    def __post_init__(self) -> None:
        if len(self.texts) != len(self.token_ids):
            raise DihalError(
                f"samples of {self.method!r}: {len(self.texts)} texts but {len(self.token_ids)} token-id lists"
            )


@dataclass
class MetricContext:
    """What a metric may use besides the samples.

    `evaluator` is the LM that scores and featurises text (None when the run has none;
    metrics that need it raise). `references` are held-out human texts, the P side of MAUVE.
    `max_length` caps the evaluator's input length in tokens, BOS included.
    """

    evaluator: Evaluator | None
    references: list[str]
    seed: int
    batch_size: int = 8
    max_length: int = 1024


def score_texts(
    evaluator: Evaluator, texts: Sequence[str], *, batch_size: int = 8, max_length: int = 1024
) -> tuple[np.ndarray, np.ndarray]:
    """Summed next-token NLL (nats) of each text under the evaluator, and how many tokens it covers.

    Each text is re-tokenised without special tokens and truncated to `max_length` ids;
    the tokenizer's BOS id, if it has one, is prepended so that the text's first token is
    scored too. A tokenizer without BOS leaves the first token unscored (it has no
    context), which is MDLM's convention. Tokens past `max_length` are not scored.

    A text with fewer than 2 scored tokens (an empty or one-token sample) is excluded:
    its NLL and count are 0, so corpus-level sums skip it and callers can drop it with
    `counts > 0`. A one-token perplexity says nothing about fluency.

    Returns float64 `nll_sums` and int64 `counts`, both of shape (len(texts),). Each batch
    holds (batch_size, T, vocab) logits, so `batch_size` bounds memory (a 262k vocabulary
    at T = 1024 is 1 GiB per sequence in float32).
    """
    nll_sums = np.zeros(len(texts), dtype=np.float64)
    counts = np.zeros(len(texts), dtype=np.int64)
    encoded = _encode(evaluator.tokenizer, texts, max_length=max_length)
    # Position t predicts token t+1, so a sequence of k ids scores k-1 tokens.
    scorable = [i for i, ids in enumerate(encoded) if len(ids) - 1 >= MIN_SCORED_TOKENS]
    with torch.no_grad():
        for rows, input_ids, attention_mask in _batches(encoded, scorable, batch_size, evaluator.device):
            logits = evaluator.logits(input_ids, attention_mask).float()
            # Position t is scored against token t+1; the last position and padding have no
            # target. Every position stays in the (B·T, V) view, vocabulary last and no copy
            # of the logits made: torch's CPU log-softmax over a middle dimension (B, V, T)
            # sums the exponentials less exactly, which biased Gen.PPL low by up to 7e-4.
            scored = attention_mask[:, 1:].bool()
            targets = torch.full_like(input_ids, IGNORED)
            targets[:, :-1] = input_ids[:, 1:].masked_fill(~scored, IGNORED)
            token_nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                        ignore_index=IGNORED, reduction="none")
            # summed in float64: a sequence's sum of float32 NLLs would round at its length × eps32
            nll_sums[rows] = token_nll.view(input_ids.shape).double().sum(dim=1).cpu().numpy()
            counts[rows] = scored.sum(dim=1).cpu().numpy()
    return nll_sums, counts


def evaluator_features(
    evaluator: Evaluator,
    texts: Sequence[str],
    *,
    batch_size: int = 8,
    max_length: int = 1024,
    max_tokens: Sequence[int] | None = None,
) -> np.ndarray:
    """The evaluator's final hidden state at the last real token of each text: (n, d) float32.

    This is MAUVE's reference featurisation (`krishnap25/mauve:src/mauve/utils.py`: last
    layer, last real token, text truncated to `max_length` tokens) with our evaluator in
    place of gpt2-large. Texts are tokenised as in `score_texts` (BOS prepended when the
    tokenizer has one). `max_tokens[i]`, if given, further caps text i to that many text
    tokens (BOS not counted): this is how references are length-matched to generations.
    No texts give a (0, 0) array.
    """
    encoded = _encode(evaluator.tokenizer, texts, max_length=max_length, max_tokens=max_tokens)
    empty = [i for i, ids in enumerate(encoded) if not ids]
    if empty:
        raise DihalError(f"cannot featurise text {empty[0]}: it has no tokens and the evaluator's tokenizer no BOS")
    features: list[np.ndarray | None] = [None] * len(texts)
    with torch.no_grad():
        for rows, input_ids, attention_mask in _batches(encoded, range(len(texts)), batch_size, evaluator.device):
            hidden = evaluator.final_hidden(input_ids, attention_mask)
            last = attention_mask.sum(dim=1) - 1
            picked = hidden[torch.arange(len(rows), device=hidden.device), last].float().cpu().numpy()
            for row, feature in zip(rows, picked):
                features[row] = feature
    return np.stack(features) if features else np.zeros((0, 0), dtype=np.float32)


def _encode(
    tokenizer: Any, texts: Sequence[str], *, max_length: int, max_tokens: Sequence[int] | None = None
) -> list[list[int]]:
    """Evaluator ids of each text: [BOS] (if the tokenizer has one) + text ids, at most `max_length` in all."""
    prefix = [] if tokenizer.bos_token_id is None else [tokenizer.bos_token_id]
    room = max_length - len(prefix)
    if room < 1:
        raise DihalError(f"max_length={max_length} leaves no room for text tokens")
    text_ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"] if texts else []
    caps = [room] * len(texts) if max_tokens is None else [min(room, cap) for cap in max_tokens]
    return [prefix + list(ids[:cap]) for ids, cap in zip(text_ids, caps)]


def _batches(
    encoded: list[list[int]], rows: Sequence[int], batch_size: int, device: torch.device
) -> Iterator[tuple[list[int], torch.Tensor, torch.Tensor]]:
    """Right-padded batches of the given rows as (rows, input_ids, attention_mask).

    Rows are taken longest first so each batch holds similar lengths and little padding.
    Pad positions are masked out of attention and of every sum, so the pad id is arbitrary.
    """
    ordered = sorted(rows, key=lambda row: len(encoded[row]), reverse=True)
    for start in range(0, len(ordered), batch_size):
        batch = ordered[start : start + batch_size]
        width = len(encoded[batch[0]])
        input_ids = torch.zeros(len(batch), width, dtype=torch.long)
        attention_mask = torch.zeros(len(batch), width, dtype=torch.long)
        for i, row in enumerate(batch):
            ids = encoded[row]
            input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            attention_mask[i, : len(ids)] = 1
        yield batch, input_ids.to(device), attention_mask.to(device)
