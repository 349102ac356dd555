"""Degenerate samples, by the rule docs/method.md#metrics sets (2026-12-05, before the records it
judges): a row's samples are degenerate on a seed iff their mean per-sample unigram entropy lies
more than `ENTROPY_MARGIN` nats below the held-out text's on the same seed.

The rule reads entropies alone, numbers every record since the first one holds, so it applies to
the committed records as well as to new ones.
"""

from __future__ import annotations

import math

#: ln(4/3): exp(H), a sample's effective number of distinct tokens, a quarter below natural text's.
#: The same size as the gap between the unigram reference and the held-out text on the committed
#: 64-token diagnostic seeds (0.25-0.29 nats), mirrored below the held-out text.
ENTROPY_MARGIN = math.log(4 / 3)


def entropy_floor(held_out_entropy: float) -> float:
    """The lowest mean per-sample entropy (nats) a row may have and not be degenerate."""
    return held_out_entropy - ENTROPY_MARGIN


def is_degenerate(entropy: float | None, held_out_entropy: float | None) -> bool | None:
    """Whether samples of mean per-sample unigram entropy ``entropy`` are degenerate beside held-out
    text of ``held_out_entropy`` (same seed, length and tokenizer); None where either is missing."""
    if not _number(entropy) or not _number(held_out_entropy):
        return None
    return entropy < entropy_floor(held_out_entropy)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
