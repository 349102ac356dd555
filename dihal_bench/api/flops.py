"""The dense-transformer FLOP count every method's compute account is written in
(docs/method.md#counting-compute).

One multiply-add is two FLOPs. A token's forward pass through a matrix of P weights costs 2P;
attention adds, per layer and token, 2·n_ctx·d for the scores q·kᵀ and 2·n_ctx·d for the
weighted sum of the values (n_ctx keys, d the query width). Embedding lookups, norms,
activations, softmaxes and optimiser updates are not counted (each is O(d) per token, against
O(d²) for the matmuls). A trained matrix's backward pass costs twice its forward (the gradient
with respect to its input and to its weights); a frozen matrix that gradients flow through costs
once its forward (the input gradient only); a frozen matrix below every trained one costs no
backward at all.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

#: forward + backward of a trained matrix, in forward passes
TRAINED = 3
#: forward + the input gradient of a frozen matrix that gradients pass through, in forward passes
FROZEN_THROUGH = 2


def attention(layers: int, width: int, context: float) -> float:
    """Attention's FLOPs per token over ``layers`` layers of query width ``width`` with ``context`` keys."""
    return 4.0 * layers * context * width


def dense(matmul_parameters: float, layers: int, width: int, context: float) -> float:
    """Forward FLOPs per token of a transformer stack: 2 per matmul weight, plus attention."""
    return 2.0 * matmul_parameters + attention(layers, width, context)


def block_parameters(width: int, cross: bool = False) -> int:
    """Matmul weights of one pre-LN block of ``dihal_builtin.layers`` (q, k, v, out, a 4× MLP; a
    cross-attending block has a second set of q, k, v, out)."""
    return (16 if cross else 12) * width * width


@dataclass(frozen=True)
class BackboneFlops:
    """What the FLOPs of a frozen backbone depend on: depth, width, the declared parameter count and
    the vocabulary (None where the plugin does not say: a layer is then counted as a standard
    12·d² block and the head as what the parameters leave)."""

    layers: int
    width: int
    parameters: int
    vocab: int | None = None
    #: whether the head is the embedding table itself (stored, and declared, once)
    tied: bool = True

    @property
    def head(self) -> int:
        """The LM head's weights (a tied head is still a matmul)."""
        if self.vocab is not None:
            return self.vocab * self.width
        return max(self.parameters - self.layers * block_parameters(self.width), 0)

    @property
    def layer(self) -> float:
        """One decoder layer's matmul weights: what the parameters leave after the embedding table."""
        if self.vocab is None:
            return float(block_parameters(self.width))
        tables = 1 if self.tied else 2
        return max(self.parameters - tables * self.vocab * self.width, 0) / self.layers

    def layers_forward(self, count: int, context: float) -> float:
        """Forward FLOPs per token of ``count`` decoder layers with ``context`` keys."""
        return dense(count * self.layer, count, self.width, context)

    def head_forward(self) -> float:
        return 2.0 * self.head

    def forward(self, context: float) -> float:
        """The whole backbone, embedding to logits, per token."""
        return self.layers_forward(self.layers, context) + self.head_forward()


@dataclass(frozen=True)
class MethodWork:
    """What a method's FLOP account is computed from, all of it in a run record: the backbone, the
    trained parameters by role, the budget (steps of ``batch_size`` windows of ``seq_len`` tokens,
    each distinct window seen ``epochs`` times), the sample length and the sampling options the
    row recorded. ``options`` are the method's own options where known (a record stores none: the
    defaults were used)."""

    backbone: BackboneFlops
    parameters: dict[str, int]
    steps: int
    batch_size: int
    seq_len: int
    epochs: int
    sample_len: int
    sampling: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        """Tokens trained on: steps × batch × window."""
        return self.steps * self.batch_size * self.seq_len

    @property
    def distinct_tokens(self) -> int:
        """Tokens of the distinct training windows (what a one-off feature extraction reads)."""
        return -(-self.steps * self.batch_size // max(self.epochs, 1)) * self.seq_len

    def replace(self, **changes) -> MethodWork:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class FlopAccount:
    """A method's compute: training FLOPs in all and inference FLOPs per generated token, with what
    they include, in words."""

    train_flops: float
    inference_flops_per_token: float
    counted: str

    def to_dict(self) -> dict:
        return {"train_flops": float(self.train_flops),
                "inference_flops_per_token": float(self.inference_flops_per_token), "counted": self.counted}


def width_for(total: int, parameters_of) -> int:
    """The width d whose ``parameters_of(d)`` is closest to ``total``: how a record's parameter count,
    which a method sized to its allowance, gives back the width it chose (parameters grow with d)."""
    low, high = 1, 1 << 16
    while low < high:
        middle = (low + high) // 2
        if parameters_of(middle) < total:
            low = middle + 1
        else:
            high = middle
    return min((low - 1, low), key=lambda d: abs(parameters_of(max(d, 1)) - total)) or 1
