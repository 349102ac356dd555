"""What a metric reads, which samples count, and how the evaluator LM scores and featurises text.

A metric plugin (hook `register_metrics`) registers `fn(samples: SampleSet, ctx: MetricContext)
-> dict[str, float | int | str | None]`. The built-in metrics are registered the same way, by
the default plugin; this module holds the contract, the validity rule they share (`invalid_reason`) and the
evaluator passes:

- `evaluate_texts`: one forward pass per text giving its summed next-token NLL (Gen.PPL) and
  its last-token final hidden state (MAUVE's featurisation of a generation);
- `prefix_features` / `evaluator_features`: the featurisation alone, for MAUVE's references,
  at every truncation of each text from one pass.

Both re-tokenise the decoded text with the evaluator's own tokenizer, as MDLM does
(`kuleshov-group/mdlm:diffusion.py`, `eval_retokenize`), so every method is scored on its
text, whatever tokenizer generated it. See docs/method.md#metrics.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from dihal_bench.errors import DihalError

if TYPE_CHECKING:
    from dihal_bench.api.corpus import Corpus

#: A text the evaluator scores on fewer tokens than this is invalid for Gen.PPL and MAUVE.
MIN_SCORED_TOKENS = 2
#: A text whose most frequent whitespace word is more than this share of its words is degenerate.
MAX_WORD_SHARE = 0.5
#: Rows × padded length of one evaluator batch, by default: 8 rows at the default max_length
#: of 1024, the largest batch the fixed 8-row batching produced, so peak memory is unchanged
#: while short texts share a batch (a 262k vocabulary is 1 GiB of float32 logits per 1024 tokens).
DEFAULT_MAX_BATCH_TOKENS = 8192
#: The most logits one scoring batch holds (rows × padded length × vocabulary): 2**27, 512 MiB of float32.
#: Under a 262k vocabulary a batch of DEFAULT_MAX_BATCH_TOKENS made 8 GiB of logits and as much again for
#: the log-softmax; the pass then ran memory-bound, its process grew to 16 GiB resident and a metrics job
#: of the ladder suite took ~105 s for 8,000 tokens of Gemma-3-270M on 2 cores, ~62 s within this bound
#: (the jobs' stored seconds, 2026-12-06), to the same sums but for float rounding. Side by side:
#: benchmarks/evaluator_batching_bench.py.
MAX_BATCH_LOGITS = 2**27
#: Target id of positions that predict nothing (cross_entropy gives them NLL 0).
IGNORED = -100


def invalid_reason(text: str, scored_tokens: int | None = None) -> str | None:
    """Why a sample does not count, or None if it is valid.

    A sample is invalid when its text is empty or whitespace only, or degenerate: its most
    frequent whitespace word makes up more than `MAX_WORD_SHARE` of its words (a one-word
    text is degenerate). With `scored_tokens` (the evaluator's count for this text) it is
    also invalid below `MIN_SCORED_TOKENS`, where a perplexity says nothing about fluency.
    """
    words = text.split()
    if not words:
        return "empty"
    # Human text is far from this line: the most frequent English word ("the") is about 6% of
    # running words, and even a short window rarely has one word above a quarter of its words.
    # Over half flags only collapse (one token, or one word between rare others, repeated), so
    # the rule drops garbage without judging quality; diversity and MAUVE judge quality.
    word, count = Counter(words).most_common(1)[0]
    if count / len(words) > MAX_WORD_SHARE:
        return f"degenerate: {word!r} is {count} of its {len(words)} words"
    if scored_tokens is not None and scored_tokens < MIN_SCORED_TOKENS:
        return f"too short: the evaluator scores {scored_tokens} of its tokens, under {MIN_SCORED_TOKENS}"
    return None


class Evaluator(Protocol):
    """The part of a backbone that metrics use (`dihal_bench.api.backbone.Backbone` has it)."""

    tokenizer: Any  # a Hugging Face tokenizer
    device: torch.device

    def logits_and_final_hidden(self, input_ids: torch.Tensor,
                                attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T) ids and mask -> (B, T, V) next-token logits and (B, T, d) final hidden state."""

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

    def invalid_reasons(self, scored_tokens: Sequence[int] | None = None) -> list[str | None]:
        """`invalid_reason` of each sample; `scored_tokens[i]`, if given, is sample i's evaluator count."""
        if scored_tokens is None:
            return [invalid_reason(text) for text in self.texts]
        if len(scored_tokens) != len(self.texts):
            raise DihalError(f"samples of {self.method!r}: {len(self.texts)} texts but {len(scored_tokens)} counts")
        return [invalid_reason(text, int(count)) for text, count in zip(self.texts, scored_tokens)]

    def valid_indices(self, scored_tokens: Sequence[int] | None = None) -> list[int]:
        """Indices of the valid samples, in order (see `invalid_reasons`)."""
        return [i for i, reason in enumerate(self.invalid_reasons(scored_tokens)) if reason is None]


#: side values that count something: a non-negative int each
COUNT_KEYS = ("n", "n_valid", "n_invalid")
#: how the side values that hold one entry per sample end: as many entries as samples
PER_SAMPLE_SUFFIX = "_per_sample"


def metric_value_problem(metric: str, values: Any, n_samples: int) -> str | None:
    """What makes ``values``, a metric's return value for ``n_samples`` samples, unfit for a
    record, or None. The contract (docs/plugins.md): a dict of str keys; the metric's own value
    (key ``metric``) a finite number or None (no value, with a reason under ``warning``); every
    other value None, text, a finite number, or a list of them; counts (``n``, ``n_valid``,
    ``n_invalid``, ``*_n``) non-negative ints; ``*_per_sample`` lists one entry per sample.
    A NaN or an infinity is never a result: a metric without a value returns None."""
    if not isinstance(values, dict):
        return f"returned a {type(values).__name__}, not a dict of values"
    for key, value in values.items():
        if not isinstance(key, str):
            return f"returned a key {key!r:.60} that is not a string"
        where = f"value {key!r}"
        if key == metric and not (value is None or _is_number(value)):
            return f"{where} is {_shown(value)}, not a number or None"
        if key in COUNT_KEYS or key.endswith("_n"):
            if value is not None and not (_is_number(value) and float(value).is_integer() and value >= 0):
                return f"{where} is {_shown(value)}, not a count (an integer >= 0)"
        if isinstance(value, (list, tuple)):
            if key.endswith(PER_SAMPLE_SUFFIX) and len(value) != n_samples:
                return f"{where} has {len(value)} entries for {n_samples} samples"
            bad = next((item for item in value if not _fits_record(item)), _FITS)
            if bad is not _FITS:
                return f"{where} holds {_shown(bad)}, not a finite number, text or None"
        elif not _fits_record(value):
            return f"{where} is {_shown(value)}, not a finite number, text or None"
    return None


_FITS = object()


def _is_number(value: Any) -> bool:
    # bool is an int subclass; numpy scalars are Real
    import numbers

    return isinstance(value, numbers.Real) and not isinstance(value, bool) and np.isfinite(float(value))


def _fits_record(value: Any) -> bool:
    return value is None or isinstance(value, (str, bool)) or _is_number(value)


def _shown(value: Any) -> str:
    import numbers

    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return repr(value.item() if hasattr(value, "item") else value)
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'…' if len(text) > 60 else ''}"


@dataclass
class MetricContext:
    """What a metric may use besides the samples.

    `evaluator` is the LM that scores and featurises text (None when the run has none;
    metrics that need it raise). `references` are held-out human texts, the P side of MAUVE.
    `max_length` caps the evaluator's input length in tokens, BOS included; an evaluator
    batch holds at most `max_batch_tokens` rows × padded length (one longer text goes alone), fewer
    when scoring where its logits would pass `MAX_BATCH_LOGITS`.
    A method with fewer than `min_valid` valid samples gets no Gen.PPL or MAUVE, only a
    warning. `mauve_bootstrap` resamples give MAUVE's 95% interval (0: none). `corpus` is the
    run's corpus (None outside a run), for metrics that score samples against the source itself,
    such as the markov corpus's exact metrics (docs/known-answers.md).
    """

    evaluator: Evaluator | None
    references: list[str]
    seed: int
    max_length: int = 1024
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
    min_valid: int = 16
    mauve_bootstrap: int = 50
    corpus: Corpus | None = None

    def __post_init__(self) -> None:
        for name, minimum in (("max_length", 2), ("max_batch_tokens", 1), ("min_valid", 1), ("mauve_bootstrap", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise DihalError(f"metric context: {name} must be an integer >= {minimum}, got {value!r}")


@dataclass(frozen=True)
class EvaluatorPass:
    """What one evaluator pass over n texts gives, each array indexed by text.

    `nll_sums` (float64): summed next-token NLL in nats; `counts` (int64): scored tokens, 0
    for a text left unscored; `text_tokens` (int64): evaluator tokens of the text after
    truncation, BOS not counted; `features` (float32, (n, d)): the final hidden state at the
    text's last token, NaN rows for unscored texts ((n, 0) when none is scored).
    """

    nll_sums: np.ndarray
    counts: np.ndarray
    text_tokens: np.ndarray
    features: np.ndarray


def evaluate_texts(
    evaluator: Evaluator,
    texts: Sequence[str],
    *,
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    max_length: int = 1024,
) -> EvaluatorPass:
    """Score and featurise each text in one evaluator pass (see `EvaluatorPass`).

    Each text is re-tokenised without special tokens and truncated to `max_length` ids;
    the tokenizer's BOS id, if it has one, is prepended so that the text's first token is
    scored too. A tokenizer without BOS leaves the first token unscored (it has no
    context), which is MDLM's convention. Tokens past `max_length` are not scored.

    A text with fewer than `MIN_SCORED_TOKENS` scored tokens (an empty or one-token sample)
    is not run: its NLL and count are 0 and its feature row NaN.

    The feature is MAUVE's reference featurisation (`krishnap25/mauve:src/mauve/utils.py`:
    last layer, last real token, text truncated to `max_length` tokens) with our evaluator
    in place of gpt2-large, taken from the pass that scores the text.
    """
    _check_batch_tokens(max_batch_tokens)
    max_batch_tokens = logits_bounded(max_batch_tokens, evaluator)
    encoded = _encode(evaluator.tokenizer, texts, max_length=max_length)
    bos = 0 if evaluator.tokenizer.bos_token_id is None else 1
    nll_sums = np.zeros(len(texts), dtype=np.float64)
    counts = np.zeros(len(texts), dtype=np.int64)
    text_tokens = np.array([len(ids) - bos for ids in encoded], dtype=np.int64)
    features: dict[int, np.ndarray] = {}
    # Position t predicts token t+1, so a sequence of k ids scores k-1 tokens.
    scorable = [i for i, ids in enumerate(encoded) if len(ids) - 1 >= MIN_SCORED_TOKENS]
    with torch.no_grad():
        for rows, input_ids, attention_mask in _batches(encoded, scorable, max_batch_tokens, evaluator.device):
            logits, hidden = evaluator.logits_and_final_hidden(input_ids, attention_mask)
            nll_sums[rows], counts[rows] = _summed_nll(logits, input_ids, attention_mask)
            features.update(zip(rows, _last_token_states(hidden, attention_mask)))
    width = len(next(iter(features.values()))) if features else 0
    feature_array = np.full((len(texts), width), np.nan, dtype=np.float32)
    for row, feature in features.items():
        feature_array[row] = feature
    return EvaluatorPass(nll_sums, counts, text_tokens, feature_array)


@dataclass(frozen=True)
class PrefixFeatures:
    """The evaluator's final hidden state at every position of each text, from one pass.

    The evaluator is causal, so the state at position k of a text is the state the text
    truncated after k tokens ends on: one pass over the full texts gives every truncation's
    feature, and `at` picks them. MAUVE's references are length-matched to each method's
    generations, so this is what lets one pass serve every method of a run.
    `states[i]` is (k_i, d) float32, k_i = text i's evaluator ids (BOS included).
    """

    states: list[np.ndarray]
    bos: int  # 1 if the evaluator's tokenizer prepends a BOS, else 0

    def head(self, n: int) -> PrefixFeatures:
        """The first `n` texts' features."""
        return PrefixFeatures(self.states[:n], self.bos)

    def at(self, max_tokens: Sequence[int] | None = None) -> np.ndarray:
        """(n, d): text i's feature after at most `max_tokens[i]` text tokens (BOS not
        counted), or after all of them for None; what `evaluator_features` gives."""
        caps = [len(s) for s in self.states] if max_tokens is None else [self.bos + int(c) for c in max_tokens]
        if len(caps) != len(self.states):
            raise DihalError(f"{len(self.states)} texts but {len(caps)} token caps")
        positions = [min(len(s), cap) - 1 for s, cap in zip(self.states, caps)]
        empty = next((i for i, position in enumerate(positions) if position < 0), None)
        if empty is not None:
            raise DihalError(f"cannot featurise text {empty}: it has no tokens and the evaluator's tokenizer no BOS")
        if not self.states:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack([s[position] for s, position in zip(self.states, positions)])


def prefix_features(
    evaluator: Evaluator,
    texts: Sequence[str],
    *,
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    max_length: int = 1024,
) -> PrefixFeatures:
    """`PrefixFeatures` of `texts`, each truncated to `max_length` evaluator ids."""
    _check_batch_tokens(max_batch_tokens)
    encoded = _encode(evaluator.tokenizer, texts, max_length=max_length)
    bos = 0 if evaluator.tokenizer.bos_token_id is None else 1
    states: list[np.ndarray] = [np.zeros((0, 0), dtype=np.float32)] * len(texts)
    with torch.no_grad():
        for rows, input_ids, attention_mask in _batches(encoded, [i for i, ids in enumerate(encoded) if ids],
                                                        max_batch_tokens, evaluator.device):
            hidden = evaluator.final_hidden(input_ids, attention_mask).float().cpu().numpy()
            for row, row_states in zip(rows, hidden):
                states[row] = row_states[: len(encoded[row])]
    return PrefixFeatures(states, bos)


def evaluator_features(
    evaluator: Evaluator,
    texts: Sequence[str],
    *,
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    max_length: int = 1024,
    max_tokens: Sequence[int] | None = None,
) -> np.ndarray:
    """The evaluator's final hidden state at the last real token of each text: (n, d) float32.

    The featurisation of `evaluate_texts`, without scoring, in one call: for a metric plugin that
    needs only features (the built-in MAUVE keeps `prefix_features` of its references, to cut
    them at each generation's length). `max_tokens[i]`, if given, further caps text i to that
    many text tokens (BOS not counted), as references are length-matched to generations. No
    texts give a (0, 0) array.
    """
    return prefix_features(evaluator, texts, max_batch_tokens=max_batch_tokens, max_length=max_length).at(max_tokens)


def _summed_nll(
    logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's summed next-token NLL (float64) and its number of scored tokens."""
    logits = logits.float()
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
    nll_sums = token_nll.view(input_ids.shape).double().sum(dim=1).cpu().numpy()
    return nll_sums, scored.sum(dim=1).cpu().numpy()


def _last_token_states(hidden: torch.Tensor, attention_mask: torch.Tensor) -> np.ndarray:
    """(B, d) float32: each row's hidden state at its last real (unpadded) position."""
    last = attention_mask.sum(dim=1) - 1
    return hidden[torch.arange(len(hidden), device=hidden.device), last].float().cpu().numpy()


def logits_bounded(max_batch_tokens: int, evaluator: Evaluator) -> int:
    """``max_batch_tokens``, lowered so that a scoring batch's logits stay within `MAX_BATCH_LOGITS`
    (the vocabulary: the evaluator's ``vocab_size`` where it has one, else its tokenizer's length)."""
    vocab = getattr(evaluator, "vocab_size", None) or len(evaluator.tokenizer)
    return max(1, min(max_batch_tokens, MAX_BATCH_LOGITS // vocab))


def _check_batch_tokens(max_batch_tokens: int) -> None:
    if isinstance(max_batch_tokens, bool) or not isinstance(max_batch_tokens, int) or max_batch_tokens < 1:
        raise DihalError(f"max_batch_tokens must be a positive integer, got {max_batch_tokens!r}")


def _encode(
    tokenizer: Any, texts: Sequence[str], *, max_length: int, max_tokens: Sequence[int] | None = None
) -> list[list[int]]:
    """Evaluator ids of each text: [BOS] (if the tokenizer has one) + text ids, at most `max_length` in all."""
    prefix = [] if tokenizer.bos_token_id is None else [tokenizer.bos_token_id]
    room = max_length - len(prefix)
    if room < 1:
        raise DihalError(f"max_length={max_length} leaves no room for text tokens")
    text_ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"] if texts else []
    caps = [room] * len(texts) if max_tokens is None else [min(room, int(cap)) for cap in max_tokens]
    return [prefix + list(ids[:cap]) for ids, cap in zip(text_ids, caps)]


def _batches(
    encoded: list[list[int]], rows: Sequence[int], max_batch_tokens: int, device: torch.device
) -> Iterator[tuple[list[int], torch.Tensor, torch.Tensor]]:
    """Right-padded batches of the given rows as (rows, input_ids, attention_mask).

    Rows are taken longest first, so each batch holds similar lengths, little padding, and
    its width is its first row's length; a batch grows while rows × width stays within
    `max_batch_tokens`, which bounds the (rows, width, vocab) logits whatever the lengths.
    Pad positions are masked out of attention and of every sum, so the pad id is arbitrary.
    """
    ordered = sorted(rows, key=lambda row: len(encoded[row]), reverse=True)
    batch: list[int] = []
    for row in ordered:
        if batch and (len(batch) + 1) * len(encoded[batch[0]]) > max_batch_tokens:
            yield _padded(encoded, batch, device)
            batch = []
        batch.append(row)
    if batch:
        yield _padded(encoded, batch, device)


def _padded(
    encoded: list[list[int]], batch: list[int], device: torch.device
) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    width = max(len(encoded[row]) for row in batch)
    input_ids = torch.zeros(len(batch), width, dtype=torch.long)
    attention_mask = torch.zeros(len(batch), width, dtype=torch.long)
    for i, row in enumerate(batch):
        ids = encoded[row]
        input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[i, : len(ids)] = 1
    return batch, input_ids.to(device), attention_mask.to(device)
