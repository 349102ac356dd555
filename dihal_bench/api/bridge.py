"""The hidden-state bridge contract (docs/method.md#bridge).

A bridge maps a condition c (the embedding output h_0 of the input tokens, shape
(n, T, d)) to an estimate ĥ of the hidden state h_ℓ at the insertion layer (same shape).
It replaces the backbone's layers 1..ℓ in the hybrid LM, so it must be *causal in
positions*: its output at position t may depend only on the condition at positions ≤ t,
which is what lets the hybrid generate autoregressively.

Both sides are standardised per dimension with statistics of the training tokens, kept
as buffers so that they travel with the weights in every checkpoint. Plugins implement
this class and register a factory ``factory(width, **options)`` through the
``register_bridges`` hook.

Generating with the hybrid appends one position at a time. Causality fixes every earlier
position's ĥ once computed, so a bridge may also offer *incremental sampling*
(:meth:`HiddenStateBridge.new_sample_cache` and :meth:`HiddenStateBridge.sample_step`):
keep what it computed for the positions seen so far and compute only the new ones. A
bridge that does not is still correct: the hybrid then re-samples the whole prefix at
every token, at a cost that grows with the prefix.

Position 0, the attention sink, is never estimated: under causal attention its h_ℓ depends
on the first token alone, so the caller can compute it exactly (``HybridLM.sink_state``), and
it is given to the bridge in training (it is in ``target``) and in sampling (``sink``). A
bridge conditions its other positions on that exact state, the same in both, and returns it
unchanged at position 0 (docs/method.md#bridge).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor, nn

from dihal_bench.errors import DihalError

# A standard deviation below this marks a constant dimension: it is centred but left unscaled,
# since dividing by ~0 would blow up any variation it shows on unseen tokens.
MIN_STD = 1e-6


class HiddenStateBridge(nn.Module, ABC):
    """Base class of every bridge: holds the standardiser, declares loss/sample/config.

    Shapes: ``cond`` and ``target`` are (n, T, width) float tensors; ``mask`` is an (n, T)
    bool tensor, True at the tokens that count (the caller leaves out position 0, the
    attention sink, and padding). ``sink`` is the exact, de-standardised h_ℓ at position 0,
    (n, 1, width).

    ``max_len`` is the most positions the bridge takes (learned positions, say), or None for
    no limit: evaluations that feed long windows (lm-eval's rolling perplexity) stay within it.
    """

    max_len: int | None = None

    def __init__(self, width: int):
        super().__init__()
        self.width = width
        self.register_buffer("cond_mean", torch.zeros(width))
        self.register_buffer("cond_std", torch.ones(width))
        self.register_buffer("target_mean", torch.zeros(width))
        self.register_buffer("target_std", torch.ones(width))

    @torch.no_grad()
    def fit_standardizer(self, cond: Tensor, target: Tensor, mask: Tensor) -> None:
        """Set the per-dimension mean and (population) std of condition and target,
        computed over the tokens where ``mask`` is True."""
        if not mask.any():
            raise DihalError("cannot fit the bridge standardiser: the mask selects no tokens")
        self.set_standardizer(masked_moments(cond, mask, "cond"), masked_moments(target, mask, "target"))

    @torch.no_grad()
    def set_standardizer(self, cond: tuple[Tensor, Tensor], target: tuple[Tensor, Tensor]) -> None:
        """Set the standardiser from (mean, std) of condition and target; a std under
        ``MIN_STD`` (a constant dimension) becomes 1."""
        for name, (mean, std) in (("cond", cond), ("target", target)):
            getattr(self, f"{name}_mean").copy_(mean)
            getattr(self, f"{name}_std").copy_(torch.where(std < MIN_STD, 1.0, std))

    def standardize_cond(self, cond: Tensor) -> Tensor:
        return (cond - self.cond_mean) / self.cond_std

    def standardize_target(self, target: Tensor) -> Tensor:
        return (target - self.target_mean) / self.target_std

    def destandardize_target(self, standardized: Tensor) -> Tensor:
        return standardized * self.target_std + self.target_mean

    @abstractmethod
    def loss(self, cond: Tensor, target: Tensor, mask: Tensor, generator: torch.Generator) -> Tensor:
        """Scalar training objective on one batch; all randomness drawn from ``generator``.
        ``target[:, 0]`` is the exact sink state, which sampling is given as ``sink``."""

    @abstractmethod
    def sample(
        self,
        cond: Tensor,
        steps: int | None = None,
        generator: torch.Generator | None = None,
        stochastic: bool = False,
        sink: Tensor | None = None,
    ) -> Tensor:
        """De-standardised ĥ for ``cond``, shape (n, T, width). ``steps`` overrides the
        bridge's default number of sampling steps; ``stochastic`` asks for a stochastic
        sampler. Any randomness comes from ``generator``, so that the same generator state
        gives the same sample (a bridge may take a default seed without one).

        With ``sink`` (n, 1, width) the sample is conditioned on the exact position-0 state, as
        in training, and holds it at position 0. Without it the bridge estimates position 0
        too, a state it was not trained on (the no-sink-passthrough ablation)."""

    def new_sample_cache(self, steps: int | None = None, sink: Tensor | None = None,
                         generator: torch.Generator | None = None) -> SampleCache | None:
        """An empty cache for :meth:`sample_step` with ``steps`` sampling steps (None: the
        bridge's default), the exact position-0 state ``sink`` and ``generator`` (as in
        :meth:`sample`), or None where the bridge only samples whole sequences (this
        default): callers then re-run :meth:`sample` on the whole prefix."""
        return None

    def sample_step(self, cond_new: Tensor, cache: SampleCache) -> Tensor:
        """De-standardised ĥ (n, T_new, width) for the positions ``cond_new`` (n, T_new, width)
        that follow the ``cache.length`` positions the cache has seen, which it then holds too.

        Up to float rounding, the result equals ``sample(all conditions so far, cache.steps,
        generator, sink=cache.sink)[:, -T_new:]`` for the arguments the cache was made with
        (a stochastic bridge must therefore key its noise by position, not by call): batched
        over other positions, the same arithmetic may round differently. Only bridges whose
        :meth:`new_sample_cache` returns a cache implement it."""
        raise NotImplementedError(f"{type(self).__name__} samples whole sequences only (no sample cache)")

    @abstractmethod
    def config(self) -> dict:
        """JSON-able constructor options: ``factory(**config())`` rebuilds the architecture."""


class SampleCache:
    """What a bridge keeps between :meth:`HiddenStateBridge.sample_step` calls for one batch
    of sequences: ``steps``, the sampling steps every call uses, ``sink``, the exact
    position-0 state or None, and ``length``, the number of positions seen so far (the
    absolute position of the next one). Bridges subclass it to add their state."""

    def __init__(self, steps: int, sink: Tensor | None = None):
        self.steps, self.sink, self.length = steps, sink, 0

    def advance(self, new_positions: int, limit: int | None = None) -> int:
        """Count ``new_positions`` more positions and return where they start; refuse to go
        past ``limit`` positions in all (a bridge's learned positions)."""
        start, end = self.length, self.length + new_positions
        if limit is not None and end > limit:
            raise DihalError(f"sequence of {end} tokens exceeds the bridge's max_len {limit}")
        self.length = end
        return start


class MaskedMoments:
    """Per-dimension mean and population std over the tokens where a mask is True, accumulated
    in float64 from any number of (n, T, d) chunks: the standardiser's statistics whether the
    states are stored (:func:`masked_moments`) or computed a batch at a time (streamed targets)."""

    def __init__(self, width: int, name: str, device: torch.device | str = "cpu"):
        self.name, self.count = name, 0
        self.total = torch.zeros(width, dtype=torch.float64, device=device)
        self.squares = torch.zeros_like(self.total)

    def add(self, states: Tensor, mask: Tensor) -> None:
        tokens = states[mask.to(states.device)].double().to(self.total.device)
        if not torch.isfinite(tokens).all():
            raise DihalError(f"bridge {self.name} hidden states contain NaN or inf")
        self.total += tokens.sum(0)
        self.squares += tokens.pow(2).sum(0)
        self.count += len(tokens)

    def result(self) -> tuple[Tensor, Tensor]:
        if not self.count:
            raise DihalError(f"cannot fit the bridge standardiser: no {self.name} tokens")
        mean = self.total / self.count
        return mean, (self.squares / self.count - mean.pow(2)).clamp_min(0).sqrt()


def masked_moments(states: Tensor, mask: Tensor, name: str, chunk: int = 256) -> tuple[Tensor, Tensor]:
    """Per-dimension mean and population std of ``states`` (n, T, d) over the tokens where
    ``mask`` (n, T) is True, accumulated in float64 a chunk of sequences at a time so that
    memory stays bounded for large training sets."""
    moments = MaskedMoments(states.shape[-1], name, states.device)
    for start in range(0, states.shape[0], chunk):
        moments.add(states[start : start + chunk], mask[start : start + chunk])
    return moments.result()


def hold_sink(states: Tensor, sink: Tensor) -> Tensor:
    """``states`` (n, T, d) with position 0 replaced by the sink state ``sink`` (n, 1, d)."""
    return torch.cat([sink, states[:, 1:]], dim=1)


def training_loss(bridge: HiddenStateBridge, batch: dict[str, Tensor], generator: torch.Generator) -> Tensor:
    """A ``dihal_bench.training.loop.train`` loss function for bridges: the batch holds
    ``cond``, ``target`` and ``mask`` as in ``HiddenStateBridge.loss``."""
    return bridge.loss(batch["cond"], batch["target"], batch["mask"], generator)
